//! BERT's dependency groups and physical removal.
//!
//! Burn's `Linear.weight` is `[d_in, d_out]`. The four kinds, each a [`GroupKind`]:
//! - [`Heads`]: a head's Q/K/V output columns `h·d..(h+1)·d` and biases, and the same rows of the
//!   attention output projection. Scope: its layer.
//! - [`Ffn`]: an FFN neuron, column `j` of the up-projection (and its bias) and row `j` of the
//!   down-projection. Scope: its layer.
//! - [`Hidden`]: a residual-stream channel: column `i` of the three embedding tables, entry `i`
//!   of every LayerNorm, row `i` of every Q/K/V and up-projection, column `i` (and bias) of every
//!   attention-output and down-projection, the pooler's row and column `i` and the classifier's
//!   row `i`. One scope (the whole model); LayerNorm statistics change, so removal is exact
//!   slicing, not a mask.
//! - [`Layers`]: a whole encoder layer (every tensor under `bert.encoder.layer.N.`); later layers
//!   are renumbered. One scope.
//!
//! Removal (`mopt_prune::prune`) applies a `Keep` in that order (heads, FFN, hidden, layers:
//! unit indices refer to the input model) and rebuilds the model from the shrunken config.

use mopt_core::prune::{GroupKind, Limit, Member, Prunable, Rule, UnitLimits};

use crate::limits::{FFN_MULTIPLE, HIDDEN_MULTIPLE, MIN_HEADS};
use mopt_core::ParamTable;

use super::{BertConfig, BertForSequenceClassification};

fn layer(l: usize) -> String {
    format!("bert.encoder.layer.{l}")
}

fn all(n: usize) -> Vec<usize> {
    (0..n).collect()
}

/// Attention heads.
pub struct Heads;
/// FFN neurons.
pub struct Ffn;
/// Residual-stream (hidden) channels.
pub struct Hidden;
/// Whole encoder layers.
pub struct Layers;

impl Prunable for BertForSequenceClassification {
    fn group_kinds() -> Vec<&'static dyn GroupKind<Config = BertConfig>> {
        vec![&Heads, &Ffn, &Hidden, &Layers]
    }

    fn layers(c: &BertConfig) -> usize {
        c.num_hidden_layers
    }
}

impl GroupKind for Heads {
    type Config = BertConfig;
    fn name(&self) -> &'static str {
        "heads"
    }
    fn scopes(&self, c: &BertConfig) -> usize {
        c.num_hidden_layers
    }
    fn scope_path(&self, l: usize) -> String {
        format!("encoder.layer.{l}.attention")
    }
    fn units(&self, c: &BertConfig, l: usize) -> usize {
        c.heads(l)
    }
    fn members(&self, c: &BertConfig, l: usize, h: usize) -> Vec<Member> {
        let d = c.head_size();
        let cols: Vec<usize> = (h * d..(h + 1) * d).collect();
        let p = layer(l);
        let mut m = Vec::new();
        for x in ["query", "key", "value"] {
            m.push(Member::new(
                format!("{p}.attention.self_attn.{x}.weight"),
                1,
                cols.clone(),
            ));
            m.push(Member::new(
                format!("{p}.attention.self_attn.{x}.bias"),
                0,
                cols.clone(),
            ));
        }
        m.push(Member::new(
            format!("{p}.attention.output.dense.weight"),
            0,
            cols,
        ));
        m
    }
    fn resize(&self, c: &BertConfig, keep: &[Vec<usize>]) -> BertConfig {
        BertConfig {
            attention_head_size: Some(c.head_size()),
            mopt_layer_heads: Some(keep.iter().map(Vec::len).collect()),
            ..c.clone()
        }
    }
    fn limits(&self) -> &'static [&'static Limit] {
        &[&MIN_HEADS]
    }
    fn rule(&self, l: &UnitLimits) -> Rule {
        Rule {
            min_keep: l.get(&MIN_HEADS).max(1),
            multiple: 1,
            frozen_scopes: l.ignore_layers.clone(),
            frozen_units: Vec::new(),
            limit: Some(MIN_HEADS.key),
        }
    }
}

impl GroupKind for Ffn {
    type Config = BertConfig;
    fn name(&self) -> &'static str {
        "ffn"
    }
    fn scopes(&self, c: &BertConfig) -> usize {
        c.num_hidden_layers
    }
    fn scope_path(&self, l: usize) -> String {
        format!("encoder.layer.{l}.ffn")
    }
    fn units(&self, c: &BertConfig, l: usize) -> usize {
        c.ffn(l)
    }
    fn members(&self, _: &BertConfig, l: usize, j: usize) -> Vec<Member> {
        let p = layer(l);
        vec![
            Member::new(format!("{p}.intermediate.dense.weight"), 1, vec![j]),
            Member::new(format!("{p}.intermediate.dense.bias"), 0, vec![j]),
            Member::new(format!("{p}.output.dense.weight"), 0, vec![j]),
        ]
    }
    fn resize(&self, c: &BertConfig, keep: &[Vec<usize>]) -> BertConfig {
        BertConfig {
            mopt_layer_intermediate_sizes: Some(keep.iter().map(Vec::len).collect()),
            ..c.clone()
        }
    }
    fn limits(&self) -> &'static [&'static Limit] {
        &[&FFN_MULTIPLE]
    }
    fn rule(&self, l: &UnitLimits) -> Rule {
        Rule {
            frozen_scopes: l.ignore_layers.clone(),
            ..Rule::multiple_of_limit(&FFN_MULTIPLE, l)
        }
    }
}

impl GroupKind for Hidden {
    type Config = BertConfig;
    fn name(&self) -> &'static str {
        "hidden"
    }
    fn scopes(&self, _: &BertConfig) -> usize {
        1
    }
    fn layer_scoped(&self) -> bool {
        false
    }
    fn scope_path(&self, _: usize) -> String {
        "hidden".into()
    }
    fn units(&self, c: &BertConfig, _: usize) -> usize {
        c.hidden_size
    }
    fn members(&self, c: &BertConfig, _: usize, i: usize) -> Vec<Member> {
        let e = "bert.embeddings";
        let mut m = vec![
            Member::new(format!("{e}.word_embeddings.weight"), 1, vec![i]),
            Member::new(format!("{e}.position_embeddings.weight"), 1, vec![i]),
            Member::new(format!("{e}.token_type_embeddings.weight"), 1, vec![i]),
            Member::new(format!("{e}.layer_norm.gamma"), 0, vec![i]),
            Member::new(format!("{e}.layer_norm.beta"), 0, vec![i]),
        ];
        for l in 0..c.num_hidden_layers {
            let p = layer(l);
            for x in ["query", "key", "value"] {
                m.push(Member::new(
                    format!("{p}.attention.self_attn.{x}.weight"),
                    0,
                    vec![i],
                ));
            }
            m.push(Member::new(
                format!("{p}.intermediate.dense.weight"),
                0,
                vec![i],
            ));
            for out in ["attention.output", "output"] {
                m.push(Member::new(format!("{p}.{out}.dense.weight"), 1, vec![i]));
                m.push(Member::new(format!("{p}.{out}.dense.bias"), 0, vec![i]));
                m.push(Member::new(
                    format!("{p}.{out}.layer_norm.gamma"),
                    0,
                    vec![i],
                ));
                m.push(Member::new(
                    format!("{p}.{out}.layer_norm.beta"),
                    0,
                    vec![i],
                ));
            }
        }
        // The pooler maps hidden to hidden and the config has one size for both: its output
        // channel `i` (and the classifier row it feeds) goes with the residual channel `i`.
        m.push(Member::new("bert.pooler.dense.weight", 0, vec![i]));
        m.push(Member::new("bert.pooler.dense.weight", 1, vec![i]));
        m.push(Member::new("bert.pooler.dense.bias", 0, vec![i]));
        m.push(Member::new("classifier.weight", 0, vec![i]));
        m
    }
    fn resize(&self, c: &BertConfig, keep: &[Vec<usize>]) -> BertConfig {
        BertConfig {
            hidden_size: keep[0].len(),
            attention_head_size: Some(c.head_size()),
            ..c.clone()
        }
    }
    fn limits(&self) -> &'static [&'static Limit] {
        &[&HIDDEN_MULTIPLE]
    }
    fn rule(&self, l: &UnitLimits) -> Rule {
        Rule::multiple_of_limit(&HIDDEN_MULTIPLE, l)
    }
}

/// The tensors of layer `l` and their first-axis lengths.
fn layer_tensors(c: &BertConfig, l: usize) -> Vec<(String, usize)> {
    let (h, a, f) = (c.hidden_size, c.heads(l) * c.head_size(), c.ffn(l));
    let p = layer(l);
    let mut t = Vec::new();
    for x in ["query", "key", "value"] {
        t.push((format!("{p}.attention.self_attn.{x}.weight"), h));
        t.push((format!("{p}.attention.self_attn.{x}.bias"), a));
    }
    t.push((format!("{p}.attention.output.dense.weight"), a));
    t.push((format!("{p}.intermediate.dense.weight"), h));
    t.push((format!("{p}.intermediate.dense.bias"), f));
    t.push((format!("{p}.output.dense.weight"), f));
    for out in ["attention.output", "output"] {
        t.push((format!("{p}.{out}.dense.bias"), h));
        t.push((format!("{p}.{out}.layer_norm.gamma"), h));
        t.push((format!("{p}.{out}.layer_norm.beta"), h));
    }
    t
}

impl GroupKind for Layers {
    type Config = BertConfig;
    fn name(&self) -> &'static str {
        "layers"
    }
    fn scopes(&self, _: &BertConfig) -> usize {
        1
    }
    fn layer_scoped(&self) -> bool {
        false
    }
    fn scope_path(&self, _: usize) -> String {
        "encoder.layers".into()
    }
    fn units(&self, c: &BertConfig, _: usize) -> usize {
        c.num_hidden_layers
    }
    fn members(&self, c: &BertConfig, _: usize, l: usize) -> Vec<Member> {
        layer_tensors(c, l)
            .into_iter()
            .map(|(name, n)| Member::new(name, 0, all(n)))
            .collect()
    }
    fn resize(&self, c: &BertConfig, keep: &[Vec<usize>]) -> BertConfig {
        let kept = &keep[0];
        BertConfig {
            num_hidden_layers: kept.len(),
            attention_head_size: Some(c.head_size()),
            mopt_layer_heads: Some(kept.iter().map(|&l| c.heads(l)).collect()),
            mopt_layer_intermediate_sizes: Some(kept.iter().map(|&l| c.ffn(l)).collect()),
            ..c.clone()
        }
    }
    /// Removed layers' tensors go; kept layer `keep[0][k]` becomes layer `k`.
    fn shrink(&self, c: &BertConfig, table: &mut ParamTable, keep: &[Vec<usize>]) {
        let mut moved = Vec::new();
        for l in 0..c.num_hidden_layers {
            let prefix = format!("{}.", layer(l));
            let names: Vec<String> = table
                .0
                .keys()
                .filter(|k| k.starts_with(&prefix))
                .cloned()
                .collect();
            let new = keep[0].iter().position(|&k| k == l);
            for name in names {
                let a = table.0.remove(&name).expect("listed");
                if let Some(k) = new {
                    let rest = &name[prefix.len()..];
                    moved.push((format!("{}.{rest}", layer(k)), a));
                }
            }
        }
        table.0.extend(moved);
    }
    fn rule(&self, l: &UnitLimits) -> Rule {
        Rule {
            min_keep: 1,
            multiple: 1,
            frozen_scopes: Vec::new(),
            frozen_units: l.ignore_layers.clone(),
            limit: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mopt_core::prune::{GroupScores, Keep};
    use mopt_prune::{Criterion, Reduce};

    type Kinds = Vec<&'static dyn GroupKind<Config = BertConfig>>;

    fn kinds() -> Kinds {
        BertForSequenceClassification::group_kinds()
    }

    fn prune(
        m: &BertForSequenceClassification,
        c: &BertConfig,
        k: &Keep,
    ) -> (BertForSequenceClassification, BertConfig) {
        mopt_prune::prune(m, c, k, &Device::flex())
    }

    fn scores(
        m: &BertForSequenceClassification,
        c: &BertConfig,
        kinds: &[&dyn GroupKind<Config = BertConfig>],
        criterion: Criterion,
        reduce: Reduce,
        grads: Option<&ParamTable>,
        seed: u64,
    ) -> GroupScores {
        let w = ParamTable::weights(m);
        mopt_prune::scores(&w, c, kinds, criterion, reduce, grads, seed)
    }
    use burn::module::Param;
    use burn::nn::Linear;
    use burn::prelude::*;

    fn vals<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
    }

    fn tiny() -> (BertForSequenceClassification, BertConfig) {
        let dev = Device::flex();
        let c = BertConfig {
            hidden_dropout_prob: 0.0,
            attention_probs_dropout_prob: 0.0,
            ..BertConfig::tiny(100, 2)
        };
        dev.seed(3);
        (BertForSequenceClassification::new(&c, &dev), c)
    }

    fn ids() -> Tensor<2, Int> {
        Tensor::from_data(
            TensorData::new(vec![1i64, 5, 7, 9, 11, 2, 3, 4], [2, 4]),
            &Device::flex(),
        )
    }

    fn logits(m: &BertForSequenceClassification) -> Vec<f32> {
        let dev = Device::flex();
        vals(m.forward(
            ids(),
            Tensor::ones([2, 4], &dev),
            Tensor::zeros([2, 4], &dev),
        ))
    }

    fn close(got: &[f32], want: &[f32], tol: f32) {
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < tol, "got {got:?}\nwant {want:?}");
        }
    }

    fn keep(heads: Vec<Vec<usize>>, ffn: Vec<Vec<usize>>) -> Keep {
        Keep::from([("heads".to_string(), heads), ("ffn".to_string(), ffn)])
    }

    /// Zero rows `rows` of a `[rows, cols]` weight.
    fn zero_rows(l: &mut Linear, rows: impl Iterator<Item = usize>) {
        let [r, c] = l.weight.val().dims();
        let mut w = vals(l.weight.val());
        for row in rows {
            w[row * c..(row + 1) * c].iter_mut().for_each(|x| *x = 0.0);
        }
        l.weight = Param::from_tensor(Tensor::from_data(
            TensorData::new(w, [r, c]),
            &Device::flex(),
        ));
    }

    #[test]
    fn removing_heads_and_neurons_equals_masking_them() {
        let (m, c) = tiny();
        let k = keep(
            vec![vec![0, 2], vec![1]],
            vec![(0..64).step_by(2).collect(), vec![5, 9, 60]],
        );
        let (p, pc) = prune(&m, &c, &k);
        assert_eq!((pc.heads(0), pc.heads(1), pc.ffn(1)), (2, 1, 3));
        assert!(pc.check().is_ok());
        assert_eq!(
            pc.num_params(),
            ParamTable::weights(&p)
                .0
                .values()
                .map(|a| a.data.len())
                .sum::<usize>()
        );
        let sa = &p.bert.encoder.layer[1].attention.self_attn;
        assert_eq!((sa.query.weight.val().dims(), sa.num_heads), ([32, 8], 1));
        assert_eq!(
            p.bert.encoder.layer[1].output.dense.weight.val().dims(),
            [3, 32]
        );
        // The reference: a removed head's output-projection rows and a removed neuron's
        // down-projection row zeroed (Q/K/V stay: without its O rows a head contributes nothing).
        let mut r = m.clone();
        let d = c.head_size();
        for (l, layer) in r.bert.encoder.layer.iter_mut().enumerate() {
            let gone = (0..c.heads(l)).filter(|h| !k["heads"][l].contains(h));
            let rows: Vec<usize> = gone.flat_map(|h| h * d..(h + 1) * d).collect();
            zero_rows(&mut layer.attention.output.dense, rows.into_iter());
            let ffn: Vec<usize> = (0..c.ffn(l)).filter(|j| !k["ffn"][l].contains(j)).collect();
            zero_rows(&mut layer.output.dense, ffn.into_iter());
        }
        close(&logits(&p), &logits(&r), 1e-5);
    }

    #[test]
    fn removing_a_layer_equals_skipping_it() {
        let (m, c) = tiny();
        let (p, pc) = prune(&m, &c, &Keep::from([("layers".to_string(), vec![vec![1]])]));
        assert_eq!(pc.num_hidden_layers, 1);
        assert_eq!(p.bert.encoder.layer.len(), 1);
        // Skip layer 0 by hand: embeddings, layer 1, pooler and classifier.
        let dev = Device::flex();
        let x = m
            .bert
            .embeddings
            .forward(ids(), Tensor::zeros([2, 4], &dev));
        let (x, _, _) =
            m.bert.encoder.layer[1].forward(x, Tensor::zeros([2, 1, 1, 4], &dev), false);
        let (_, want) = m.head(x);
        close(&logits(&p), &vals(want), 1e-5);
        // Per-layer shapes follow their layer: prune heads of layer 1 first, then drop layer 0.
        let mut k = keep(vec![vec![0, 1, 2, 3], vec![3]], vec![all(64), all(64)]);
        k.insert("layers".into(), vec![vec![1]]);
        let (_, pc) = prune(&m, &c, &k);
        assert_eq!((pc.num_hidden_layers, pc.heads(0)), (1, 1));
    }

    fn select_linear(l: &Linear, inp: Option<&[usize]>, out: Option<&[usize]>) -> Linear {
        let dev = Device::flex();
        let idx = |v: &[usize]| {
            Tensor::<1, Int>::from_data(
                TensorData::new(v.iter().map(|&i| i as i64).collect::<Vec<_>>(), [v.len()]),
                &dev,
            )
        };
        let mut w = l.weight.val();
        let mut b = l.bias.as_ref().map(|b| b.val());
        if let Some(i) = inp {
            w = w.select(0, idx(i));
        }
        if let Some(o) = out {
            w = w.select(1, idx(o));
            b = b.map(|b| b.select(0, idx(o)));
        }
        Linear {
            weight: Param::from_tensor(w),
            bias: b.map(Param::from_tensor),
        }
    }

    #[test]
    fn removing_hidden_channels_equals_slicing_by_hand() {
        let (m, c) = tiny();
        let kept: Vec<usize> = (0..32).filter(|i| i % 4 != 1).collect();
        let (p, pc) = prune(
            &m,
            &c,
            &Keep::from([("hidden".to_string(), vec![kept.clone()])]),
        );
        assert_eq!((pc.hidden_size, pc.head_size()), (24, 8));
        assert!(pc.check().is_ok());
        // The same model sliced field by field.
        let k = Some(kept.as_slice());
        let dev = Device::flex();
        let idx = Tensor::<1, Int>::from_data(
            TensorData::new(
                kept.iter().map(|&i| i as i64).collect::<Vec<_>>(),
                [kept.len()],
            ),
            &dev,
        );
        let mut h = m.clone();
        let e = &mut h.bert.embeddings;
        for t in [
            &mut e.word_embeddings,
            &mut e.position_embeddings,
            &mut e.token_type_embeddings,
        ] {
            t.weight = Param::from_tensor(t.weight.val().select(1, idx.clone()));
        }
        let ln = |n: &mut burn::nn::LayerNorm| {
            n.gamma = Param::from_tensor(n.gamma.val().select(0, idx.clone()));
            n.beta = n
                .beta
                .as_ref()
                .map(|b| Param::from_tensor(b.val().select(0, idx.clone())));
        };
        ln(&mut e.layer_norm);
        for layer in h.bert.encoder.layer.iter_mut() {
            let sa = &mut layer.attention.self_attn;
            sa.query = select_linear(&sa.query, k, None);
            sa.key = select_linear(&sa.key, k, None);
            sa.value = select_linear(&sa.value, k, None);
            let o = &mut layer.attention.output;
            o.dense = select_linear(&o.dense, None, k);
            ln(&mut o.layer_norm);
            layer.intermediate.dense = select_linear(&layer.intermediate.dense, k, None);
            layer.output.dense = select_linear(&layer.output.dense, None, k);
            ln(&mut layer.output.layer_norm);
        }
        h.bert.pooler.dense = select_linear(&h.bert.pooler.dense, k, k);
        h.classifier = select_linear(&h.classifier, k, None);
        close(&logits(&p), &logits(&h), 1e-6);
        // And it really differs from the unpruned model (LayerNorm sees fewer channels).
        assert!(logits(&p)
            .iter()
            .zip(logits(&m))
            .any(|(a, b)| (a - b).abs() > 1e-4));
    }

    #[test]
    fn l1_and_taylor_scores_equal_a_hand_computation() {
        let (m, c) = tiny();
        let s = scores(&m, &c, &kinds(), Criterion::L1, Reduce::Sum, None, 0);
        assert_eq!(
            (s["heads"].len(), s["heads"][0].len(), s["ffn"][1].len()),
            (2, 4, 64)
        );
        assert_eq!((s["hidden"][0].len(), s["layers"][0].len()), (32, 2));
        // Head 1 of layer 0 by hand: Q/K/V columns 8..16 (+ biases) and O rows 8..16.
        let l0 = &m.bert.encoder.layer[0];
        let sa = &l0.attention.self_attn;
        let l1 = |x: Vec<f32>| x.iter().map(|v| v.abs() as f64).sum::<f64>();
        let cols = |l: &Linear| {
            l1(vals(l.weight.val().slice([0..32, 8..16])))
                + l1(vals(l.bias.as_ref().unwrap().val().slice(8..16)))
        };
        let want = cols(&sa.query)
            + cols(&sa.key)
            + cols(&sa.value)
            + l1(vals(
                l0.attention.output.dense.weight.val().slice([8..16, 0..32]),
            ));
        assert!((s["heads"][0][1] - want).abs() < 1e-9 * want);
        // Taylor, one backward of the summed logits: Σ|w·g| over FFN neuron 5 of layer 1.
        let ad = Device::flex().autodiff();
        let mt = BertForSequenceClassification::new(&c, &ad);
        let mt = ParamTable::weights(&m).load_into(mt).unwrap();
        let out = mt.forward(
            ids().to_device(&ad),
            Tensor::ones([2, 4], &ad),
            Tensor::zeros([2, 4], &ad),
        );
        let grads = out.sum().backward();
        let g = ParamTable::gradients(&mt, &grads);
        let l = &mt.bert.encoder.layer[1];
        let wg = |w: Tensor<2>, r: [std::ops::Range<usize>; 2]| {
            let gw = w.grad(&grads).unwrap().slice(r.clone());
            vals(w.inner().slice(r))
                .iter()
                .zip(vals(gw))
                .map(|(a, b)| (a * b).abs() as f64)
                .sum::<f64>()
        };
        let ub = l.intermediate.dense.bias.as_ref().unwrap().val();
        let want = wg(l.intermediate.dense.weight.val(), [0..32, 5..6])
            + (vals(ub.clone().inner().slice(5..6))[0]
                * vals(ub.grad(&grads).unwrap().slice(5..6))[0])
                .abs() as f64
            + wg(l.output.dense.weight.val(), [5..6, 0..32]);
        let mv = m.clone();
        let t = scores(
            &mv,
            &c,
            &[&Ffn],
            Criterion::Taylor,
            Reduce::Sum,
            Some(&g),
            0,
        );
        assert!(
            want > 0.0 && (t["ffn"][1][5] - want).abs() < 1e-6 * want,
            "{} vs {want}",
            t["ffn"][1][5]
        );
        // Random scores are seeded: same seed, same scores; another seed, others.
        let r = |seed| scores(&m, &c, &kinds(), Criterion::Random, Reduce::Sum, None, seed);
        assert_eq!(r(1), r(1));
        assert_ne!(r(1), r(2));
    }

    #[test]
    fn a_pruned_model_saves_and_reloads_with_identical_logits() {
        let (m, c) = tiny();
        let mut k = keep(
            vec![vec![1, 3], vec![0]],
            vec![(0..16).collect(), (8..48).collect()],
        );
        k.insert("hidden".into(), vec![(0..32).step_by(2).collect()]);
        let (p, pc) = prune(&m, &c, &k);
        let dir = std::env::temp_dir().join(format!("mopt-prune-reload-{}", std::process::id()));
        super::super::weights::save_checkpoint(&p, &pc, &dir).unwrap();
        let (q, qc) = super::super::weights::load_checkpoint(&dir, &Device::flex()).unwrap();
        assert_eq!(qc, pc);
        // (Burnpack tensors are read from the file lazily: compare before removing it.)
        assert_eq!(logits(&q), logits(&p));
        std::fs::remove_dir_all(&dir).ok();
    }
}
