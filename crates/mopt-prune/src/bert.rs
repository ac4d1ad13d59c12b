//! BERT's dependency groups, their scores, and physical removal.
//!
//! Burn's `Linear.weight` is `[d_in, d_out]`: a head's Q/K/V slices are *columns*
//! `h·d..(h+1)·d` (and bias entries), its slice of the attention output projection is the same
//! *rows*; an FFN neuron is column `j` of the up-projection (and its bias) and row `j` of the
//! down-projection.

use burn::module::Param;
use burn::nn::Linear;
use burn::prelude::*;
use mopt_models::bert::{BertConfig, BertForSequenceClassification, BertLayer};

use crate::importance::{uniform, Criterion, GroupScores, Reduce};

/// Units a pruned model keeps: `heads[layer]` and `ffn[layer]` are indices into the current
/// model's heads and FFN neurons, ascending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keep {
    pub heads: Vec<Vec<usize>>,
    pub ffn: Vec<Vec<usize>>,
}

/// One layer's prunable tensors as flat row-major values (weights `[d_in, d_out]`).
#[derive(Debug, Clone, Default)]
pub struct LayerTensors {
    pub q: (Vec<f32>, Vec<f32>),
    pub k: (Vec<f32>, Vec<f32>),
    pub v: (Vec<f32>, Vec<f32>),
    pub o: Vec<f32>,
    pub up: (Vec<f32>, Vec<f32>),
    pub down: Vec<f32>,
}

fn vals<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .expect("f32 tensor")
}

fn wb(l: &Linear) -> (Vec<f32>, Vec<f32>) {
    (
        vals(l.weight.val()),
        l.bias.as_ref().map(|b| vals(b.val())).unwrap_or_default(),
    )
}

fn wb_grad(l: &Linear, grads: &burn::tensor::Gradients) -> (Vec<f32>, Vec<f32>) {
    let g = |t: Option<Tensor<2>>| t.map(vals).unwrap_or_default();
    let gb = |t: Option<Tensor<1>>| t.map(vals).unwrap_or_default();
    (
        g(l.weight.val().grad(grads)),
        l.bias
            .as_ref()
            .map(|b| gb(b.val().grad(grads)))
            .unwrap_or_default(),
    )
}

impl LayerTensors {
    /// The layer's weights.
    pub fn weights(layer: &BertLayer) -> Self {
        let a = &layer.attention;
        Self {
            q: wb(&a.self_attn.query),
            k: wb(&a.self_attn.key),
            v: wb(&a.self_attn.value),
            o: vals(a.output.dense.weight.val()),
            up: wb(&layer.intermediate.dense),
            down: vals(layer.output.dense.weight.val()),
        }
    }

    /// The layer's gradients from a backward pass (zeros where a tensor got none).
    pub fn gradients(layer: &BertLayer, grads: &burn::tensor::Gradients) -> Self {
        let a = &layer.attention;
        let w = |l: &Linear| l.weight.val().grad(grads).map(vals).unwrap_or_default();
        Self {
            q: wb_grad(&a.self_attn.query, grads),
            k: wb_grad(&a.self_attn.key, grads),
            v: wb_grad(&a.self_attn.value, grads),
            o: w(&a.output.dense),
            up: wb_grad(&layer.intermediate.dense, grads),
            down: w(&layer.output.dense),
        }
    }

    /// `self += other` elementwise (accumulating gradients over batches).
    pub fn add(&mut self, other: &Self) {
        fn acc(a: &mut Vec<f32>, b: &[f32]) {
            if a.is_empty() {
                *a = b.to_vec();
            } else if !b.is_empty() {
                a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
            }
        }
        for (a, b) in [
            (&mut self.q.0, &other.q.0),
            (&mut self.q.1, &other.q.1),
            (&mut self.k.0, &other.k.0),
            (&mut self.k.1, &other.k.1),
            (&mut self.v.0, &other.v.0),
            (&mut self.v.1, &other.v.1),
            (&mut self.o, &other.o),
            (&mut self.up.0, &other.up.0),
            (&mut self.up.1, &other.up.1),
            (&mut self.down, &other.down),
        ] {
            acc(a, b);
        }
    }
}

/// Columns `cols` of a row-major `[rows, n]` matrix, flattened.
fn columns(w: &[f32], n: usize, cols: std::ops::Range<usize>) -> Vec<f32> {
    w.chunks(n)
        .flat_map(|row| row[cols.clone()].iter().copied())
        .collect()
}

/// Rows `rows` of a row-major `[_, n]` matrix, flattened.
fn rows(w: &[f32], n: usize, rows: std::ops::Range<usize>) -> Vec<f32> {
    w[rows.start * n..rows.end * n].to_vec()
}

fn pick<'a>(g: Option<&'a [f32]>, w: &[f32]) -> Option<&'a [f32]> {
    g.filter(|g| g.len() == w.len())
}

/// Score every head and FFN neuron of a model. `grads[l]`: accumulated gradients of layer `l`
/// (Taylor only). `seed` drives the random criterion.
pub fn scores(
    model: &BertForSequenceClassification,
    config: &BertConfig,
    criterion: Criterion,
    reduce: Reduce,
    grads: Option<&[LayerTensors]>,
    seed: u64,
) -> GroupScores {
    let (h, d) = (config.hidden_size, config.head_size());
    let mut out = GroupScores::default();
    let mut counter = 0u64;
    let mut random = || {
        counter += 1;
        uniform(seed, counter)
    };
    for (l, layer) in model.bert.encoder.layer.iter().enumerate() {
        let w = LayerTensors::weights(layer);
        let g = grads.map(|g| &g[l]);
        let heads = config.heads(l);
        let a = heads * d;
        let member = |wv: &[f32], gv: Option<&Vec<f32>>, slice: &dyn Fn(&[f32]) -> Vec<f32>| {
            let ws = slice(wv);
            let gs = gv.filter(|g| g.len() == wv.len()).map(|g| slice(g));
            criterion.member(&ws, pick(gs.as_deref(), &ws))
        };
        let mut head_scores = Vec::with_capacity(heads);
        for hd in 0..heads {
            if criterion == Criterion::Random {
                head_scores.push(random());
                continue;
            }
            let cols = hd * d..(hd + 1) * d;
            let c = |x: &[f32]| columns(x, a, cols.clone());
            let b = |x: &[f32]| x[cols.clone()].to_vec();
            let r = |x: &[f32]| rows(x, h, cols.clone());
            let parts = [
                member(&w.q.0, g.map(|g| &g.q.0), &c),
                member(&w.q.1, g.map(|g| &g.q.1), &b),
                member(&w.k.0, g.map(|g| &g.k.0), &c),
                member(&w.k.1, g.map(|g| &g.k.1), &b),
                member(&w.v.0, g.map(|g| &g.v.0), &c),
                member(&w.v.1, g.map(|g| &g.v.1), &b),
                member(&w.o, g.map(|g| &g.o), &r),
            ];
            head_scores.push(reduce.apply(&parts));
        }
        let f = config.ffn(l);
        let mut ffn_scores = Vec::with_capacity(f);
        for j in 0..f {
            if criterion == Criterion::Random {
                ffn_scores.push(random());
                continue;
            }
            let c = |x: &[f32]| columns(x, f, j..j + 1);
            let b = |x: &[f32]| x[j..j + 1].to_vec();
            let r = |x: &[f32]| rows(x, h, j..j + 1);
            let parts = [
                member(&w.up.0, g.map(|g| &g.up.0), &c),
                member(&w.up.1, g.map(|g| &g.up.1), &b),
                member(&w.down, g.map(|g| &g.down), &r),
            ];
            ffn_scores.push(reduce.apply(&parts));
        }
        out.heads.push(head_scores);
        out.ffn.push(ffn_scores);
    }
    out
}

fn index(ids: &[usize], device: &Device) -> Tensor<1, Int> {
    Tensor::from_data(
        TensorData::new(
            ids.iter().map(|&i| i as i64).collect::<Vec<_>>(),
            [ids.len()],
        ),
        device,
    )
}

/// `l` keeping output features `out` (columns of the weight, entries of the bias).
fn keep_outputs(l: &Linear, out: &[usize]) -> Linear {
    let dev = l.weight.val().device();
    let idx = index(out, &dev);
    Linear {
        weight: Param::from_tensor(l.weight.val().select(1, idx.clone())),
        bias: l
            .bias
            .as_ref()
            .map(|b| Param::from_tensor(b.val().select(0, idx))),
    }
}

/// `l` keeping input features `inp` (rows of the weight; the bias is untouched).
fn keep_inputs(l: &Linear, inp: &[usize]) -> Linear {
    let dev = l.weight.val().device();
    Linear {
        weight: Param::from_tensor(l.weight.val().select(0, index(inp, &dev))),
        bias: l.bias.clone(),
    }
}

/// Remove every unit not in `keep`: a new, smaller model and its config (per-layer heads and
/// FFN widths). Give it a model on an inference device (no autodiff graph).
pub fn prune(
    model: &BertForSequenceClassification,
    config: &BertConfig,
    keep: &Keep,
) -> (BertForSequenceClassification, BertConfig) {
    let d = config.head_size();
    let mut out = model.clone();
    let mut cfg = config.clone();
    for (l, layer) in out.bert.encoder.layer.iter_mut().enumerate() {
        let cols: Vec<usize> = keep.heads[l]
            .iter()
            .flat_map(|&h| h * d..(h + 1) * d)
            .collect();
        let sa = &mut layer.attention.self_attn;
        sa.query = keep_outputs(&sa.query, &cols);
        sa.key = keep_outputs(&sa.key, &cols);
        sa.value = keep_outputs(&sa.value, &cols);
        sa.num_heads = keep.heads[l].len();
        layer.attention.output.dense = keep_inputs(&layer.attention.output.dense, &cols);
        layer.intermediate.dense = keep_outputs(&layer.intermediate.dense, &keep.ffn[l]);
        layer.output.dense = keep_inputs(&layer.output.dense, &keep.ffn[l]);
    }
    cfg.attention_head_size = Some(d);
    cfg.mopt_layer_heads = Some(keep.heads.iter().map(Vec::len).collect());
    cfg.mopt_layer_intermediate_sizes = Some(keep.ffn.iter().map(Vec::len).collect());
    (out, cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn masked_forward(
        m: &BertForSequenceClassification,
        c: &BertConfig,
        keep: &Keep,
        ids: Tensor<2, Int>,
    ) -> Vec<f32> {
        // The reference: zero the removed units' output columns (Q/K/V would change softmax, so
        // mask the *value* path and the attention output rows instead: a head whose V columns and
        // O rows are zero contributes nothing; an FFN neuron whose down row is zero neither).
        let mut r = m.clone();
        let d = c.head_size();
        for (l, layer) in r.bert.encoder.layer.iter_mut().enumerate() {
            let a = c.heads(l) * d;
            let h = c.hidden_size;
            let mut o = vals(layer.attention.output.dense.weight.val());
            for hd in 0..c.heads(l) {
                if !keep.heads[l].contains(&hd) {
                    for row in hd * d..(hd + 1) * d {
                        o[row * h..(row + 1) * h].iter_mut().for_each(|x| *x = 0.0);
                    }
                }
            }
            let dev = Device::flex();
            layer.attention.output.dense.weight =
                Param::from_tensor(Tensor::from_data(TensorData::new(o, [a, h]), &dev));
            let f = c.ffn(l);
            let mut down = vals(layer.output.dense.weight.val());
            for j in 0..f {
                if !keep.ffn[l].contains(&j) {
                    down[j * h..(j + 1) * h].iter_mut().for_each(|x| *x = 0.0);
                }
            }
            layer.output.dense.weight =
                Param::from_tensor(Tensor::from_data(TensorData::new(down, [f, h]), &dev));
        }
        let [b, s] = ids.dims();
        let dev = Device::flex();
        vals(r.forward(ids, Tensor::ones([b, s], &dev), Tensor::zeros([b, s], &dev)))
    }

    #[test]
    fn removal_is_physical_and_equals_masking() {
        let dev = Device::flex();
        let c = BertConfig {
            hidden_dropout_prob: 0.0,
            attention_probs_dropout_prob: 0.0,
            ..BertConfig::tiny(100, 2)
        };
        dev.seed(3);
        let m = BertForSequenceClassification::new(&c, &dev);
        let keep = Keep {
            heads: vec![vec![0, 2], vec![1]],
            ffn: vec![(0..64).step_by(2).collect(), vec![5, 9, 60]],
        };
        let (p, pc) = prune(&m, &c, &keep);
        assert_eq!(pc.heads(0), 2);
        assert_eq!(pc.heads(1), 1);
        assert_eq!(pc.ffn(1), 3);
        assert!(pc.check().is_ok());
        assert!(pc.num_params() < c.num_params());
        assert_eq!(
            p.bert.encoder.layer[1]
                .attention
                .self_attn
                .query
                .weight
                .val()
                .dims(),
            [32, 8]
        );
        assert_eq!(
            p.bert.encoder.layer[1].output.dense.weight.val().dims(),
            [3, 32]
        );
        let ids = Tensor::<2, Int>::from_data(
            TensorData::new(vec![1i64, 5, 7, 9, 11, 2, 3, 4], [2, 4]),
            &dev,
        );
        let got = vals(p.forward(
            ids.clone(),
            Tensor::ones([2, 4], &dev),
            Tensor::zeros([2, 4], &dev),
        ));
        let want = masked_forward(&m, &c, &keep, ids);
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-5, "pruned {got:?} vs masked {want:?}");
        }
    }

    #[test]
    fn l1_scores_sum_the_group_members() {
        let dev = Device::flex();
        let c = BertConfig::tiny(100, 2);
        let m = BertForSequenceClassification::new(&c, &dev);
        let s = scores(&m, &c, Criterion::L1, Reduce::Sum, None, 0);
        assert_eq!(s.heads.len(), 2);
        assert_eq!(s.heads[0].len(), 4);
        assert_eq!(s.ffn[1].len(), 64);
        // Head 1 of layer 0 by hand: Q/K/V columns 8..16 (+ biases) and O rows 8..16.
        let w = LayerTensors::weights(&m.bert.encoder.layer[0]);
        let l1 = |x: &[f32]| x.iter().map(|v| v.abs() as f64).sum::<f64>();
        let want = l1(&columns(&w.q.0, 32, 8..16))
            + l1(&w.q.1[8..16])
            + l1(&columns(&w.k.0, 32, 8..16))
            + l1(&w.k.1[8..16])
            + l1(&columns(&w.v.0, 32, 8..16))
            + l1(&w.v.1[8..16])
            + l1(&w.o[8 * 32..16 * 32]);
        assert!((s.heads[0][1] - want).abs() < 1e-9 * want.max(1.0));
        // Random scores are seeded: same seed, same scores; another seed, others.
        let r1 = scores(&m, &c, Criterion::Random, Reduce::Sum, None, 1);
        assert_eq!(r1, scores(&m, &c, Criterion::Random, Reduce::Sum, None, 1));
        assert_ne!(r1, scores(&m, &c, Criterion::Random, Reduce::Sum, None, 2));
    }
}
