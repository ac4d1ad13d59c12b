//! Structured pruning of the Llama decoder (`mopt_models::llama::prune`), through mopt's generic
//! removal (`mopt_prune::prune`), on a random 3-layer model with 6 query heads over 2 KV heads
//! (groups of 3), FFN 40, hidden 32, vocabulary 64, and RMSNorm weights drawn around one.
//!
//! Every kind is checked against an unpruned reference: heads, KV groups, FFN channels and
//! layers against the same model with the removed units' output contributions zeroed (their
//! `o_proj` rows, `down_proj` rows, or a whole layer's `o_proj` and `down_proj`, which makes the
//! layer the identity). Hidden channels cannot be checked that way: RMSNorm divides by the root
//! mean square over all channels, and zeros still count in the mean, so the pruned model (which
//! averages over the kept channels only) is compared with (a) the model built by hand from the
//! kept slices of every tensor and (b) the zeroed model with every RMSNorm weight scaled by
//! `√(d'/d)` and its `eps` by `d'/d`, which is the same function (both shown to differ from
//! plain zeroing). Logits agree within 1e-5 relative to the largest |logit| (5.8-7.7 here, so
//! within about 6e-5 absolute); every comparison but (b) measures exactly 0, (b) about 1e-5
//! (its arithmetic differs: scaled weights and `eps`). The differences are printed
//! (`--nocapture`).

use burn::module::Param;
use burn::nn::Linear;
use burn::prelude::*;
use burn::tensor::activation::log_softmax;
use burn::tensor::Distribution;
use mopt_core::prune::{ActivationStat, GroupKind, GroupScores, Keep, Prunable, UnitLimits};
use mopt_core::{Checkpoint, Classifier, Examples, ModelConfig, ParamTable};
use mopt_data::{TokenWindows, WindowSplit};
use mopt_models::llama::{Heads, LlamaConfig, LlamaForCausalLM};
use mopt_prune::{Criterion, Progress, Ranking, Reduce};

const TOL: f32 = 1e-5;

fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec().unwrap()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// 3 layers, 6 query heads of 8 over 2 KV heads, FFN 40, hidden 32, vocabulary 64.
fn config(tied: bool) -> LlamaConfig {
    LlamaConfig {
        num_hidden_layers: 3,
        num_attention_heads: 6,
        num_key_value_heads: Some(2),
        head_dim: Some(8),
        intermediate_size: 40,
        initializer_range: 0.3,
        tie_word_embeddings: tied,
        ..LlamaConfig::tiny(64)
    }
}

/// A seeded random model; RMSNorm weights ~ N(1, 0.5) so that slicing them wrongly shows.
fn model(c: &LlamaConfig) -> LlamaForCausalLM {
    let dev = Device::flex();
    dev.seed(7);
    let mut m = LlamaForCausalLM::new(c, &dev);
    let norm = |w: &mut Param<Tensor<1>>| {
        let d = w.val().dims()[0];
        *w = Param::from_tensor(Tensor::random([d], Distribution::Normal(1.0, 0.5), &dev));
    };
    for layer in m.model.layers.iter_mut() {
        norm(&mut layer.input_layernorm.weight);
        norm(&mut layer.post_attention_layernorm.weight);
    }
    norm(&mut m.model.norm.weight);
    m
}

fn stream(n: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 37 + i / 5 + 5) % 64) as u32).collect()
}

/// Two windows of 7 tokens.
fn windows() -> TokenWindows {
    let split = WindowSplit::pack(&stream(40), 7, None).unwrap();
    split.batch(&[0, 3], &Device::flex())
}

fn logits(m: &LlamaForCausalLM) -> Vec<f32> {
    values(m.logits(&windows()))
}

fn prune(m: &LlamaForCausalLM, c: &LlamaConfig, k: &Keep) -> (LlamaForCausalLM, LlamaConfig) {
    mopt_prune::prune(m, c, k, &Device::flex())
}

fn keep(kinds: &[(&str, Vec<Vec<usize>>)]) -> Keep {
    kinds
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

/// `got` equals `want` within [`TOL`] relative to the largest logit (absolute below one) and
/// differs from `unpruned` (so the test is not vacuous).
fn same(what: &str, got: &[f32], want: &[f32], unpruned: &[f32]) {
    let d = max_abs_diff(got, want);
    let scale = want.iter().fold(0f32, |a, x| a.max(x.abs()));
    let moved = max_abs_diff(got, unpruned);
    println!("{what}: max |pruned - reference| = {d:.3e} (max |logit| {scale:.2}, pruned moved the logits by up to {moved:.3})");
    assert!(d <= TOL * scale.max(1.0), "{what}: {d} > {TOL} x {scale}");
    assert!(moved > 1e-2, "{what}: pruning changed nothing ({moved})");
}

/// The pruned config is valid, counts the parameters the model holds, and keeps GQA whole.
fn consistent(p: &LlamaForCausalLM, c: &LlamaConfig) {
    assert!(c.check().is_ok(), "{:?}", c.check());
    let held: usize = ParamTable::weights(p)
        .0
        .values()
        .map(|a| a.data.len())
        .sum();
    assert_eq!(ModelConfig::num_params(c), held);
    for l in 0..c.num_hidden_layers {
        assert_eq!(c.heads(l) % c.kv_heads(l), 0, "layer {l}");
        let a = &p.model.layers[l].self_attn;
        assert_eq!((a.num_heads, a.num_kv_heads), (c.heads(l), c.kv_heads(l)));
    }
}

/// Zero rows `rows` of a linear layer's `[d_in, d_out]` weight (its inputs `rows` then count
/// for nothing).
fn zero_rows(l: &mut Linear, rows: &[usize]) {
    let w = l.weight.val();
    let r = w.dims()[0];
    let keep: Vec<f32> = (0..r)
        .map(|i| if rows.contains(&i) { 0.0 } else { 1.0 })
        .collect();
    let mask = Tensor::<1>::from_data(TensorData::new(keep, [r]), &w.device());
    l.weight = Param::from_tensor(w * mask.unsqueeze_dim::<2>(1));
}

/// Rows of heads `heads` (of width 8).
fn head_rows(heads: impl IntoIterator<Item = usize>) -> Vec<usize> {
    heads.into_iter().flat_map(|h| h * 8..(h + 1) * 8).collect()
}

#[test]
fn removing_query_heads_equals_zeroing_their_outputs() {
    let c = config(true);
    let m = model(&c);
    // Groups {0,1,2} and {3,4,5}: two kept in each, one in each, all.
    let heads = vec![vec![1, 2, 3, 5], vec![0, 4], (0..6).collect()];
    let (p, pc) = prune(&m, &c, &keep(&[("heads", heads.clone())]));
    assert_eq!(
        (pc.layer_heads(), pc.layer_kv_heads()),
        (vec![4, 2, 6], vec![2, 2, 2])
    );
    consistent(&p, &pc);
    assert_eq!(p.model.layers[1].self_attn.q_proj.weight.dims(), [32, 16]);
    assert_eq!(p.model.layers[1].self_attn.o_proj.weight.dims(), [16, 32]);
    // The kept heads' Q columns, in order: layer 1 keeps heads 0 and 4.
    let q = |m: &LlamaForCausalLM, cols: std::ops::Range<usize>| {
        values(
            m.model.layers[1]
                .self_attn
                .q_proj
                .weight
                .val()
                .slice([0..32, cols]),
        )
    };
    assert_eq!(q(&p, 8..16), q(&m, 32..40));
    let mut r = m.clone();
    for (l, layer) in r.model.layers.iter_mut().enumerate() {
        let gone = (0..6).filter(|h| !heads[l].contains(h));
        zero_rows(&mut layer.self_attn.o_proj, &head_rows(gone));
    }
    same("heads", &logits(&p), &logits(&r), &logits(&m));
}

#[test]
fn removing_kv_groups_takes_their_query_heads_along() {
    let c = config(true);
    let m = model(&c);
    let groups = vec![vec![1], vec![0, 1], vec![0]];
    let (p, pc) = prune(&m, &c, &keep(&[("kv-groups", groups)]));
    assert_eq!(
        (pc.layer_heads(), pc.layer_kv_heads()),
        (vec![3, 6, 3], vec![1, 2, 1])
    );
    consistent(&p, &pc);
    // Layer 0 keeps KV head 1 (K/V columns 8..16) and its query heads 3, 4, 5 (Q columns
    // 24..48); the query heads of group 0 are gone.
    let (a, b) = (&p.model.layers[0].self_attn, &m.model.layers[0].self_attn);
    assert_eq!(a.q_proj.weight.dims(), [32, 24]);
    assert_eq!(
        values(a.q_proj.weight.val()),
        values(b.q_proj.weight.val().slice([0..32, 24..48]))
    );
    assert_eq!(
        values(a.k_proj.weight.val()),
        values(b.k_proj.weight.val().slice([0..32, 8..16]))
    );
    assert_eq!(
        values(a.o_proj.weight.val()),
        values(b.o_proj.weight.val().slice([24..48, 0..32]))
    );
    let mut r = m.clone();
    zero_rows(&mut r.model.layers[0].self_attn.o_proj, &head_rows(0..3));
    zero_rows(&mut r.model.layers[2].self_attn.o_proj, &head_rows(3..6));
    same("kv-groups", &logits(&p), &logits(&r), &logits(&m));
}

#[test]
fn removing_ffn_channels_equals_zeroing_their_down_rows() {
    let c = config(false);
    let m = model(&c);
    let ffn = vec![
        (0..40).step_by(3).collect(),
        vec![5, 9, 39],
        (0..40).collect(),
    ];
    let (p, pc) = prune(&m, &c, &keep(&[("ffn", ffn.clone())]));
    assert_eq!(pc.layer_ffn(), [14, 3, 40]);
    consistent(&p, &pc);
    let mlp = &p.model.layers[1].mlp;
    assert_eq!(
        (mlp.gate_proj.weight.dims(), mlp.up_proj.weight.dims()),
        ([32, 3], [32, 3])
    );
    assert_eq!(mlp.down_proj.weight.dims(), [3, 32]);
    let mut r = m.clone();
    for (l, layer) in r.model.layers.iter_mut().enumerate() {
        let gone: Vec<usize> = (0..40).filter(|j| !ffn[l].contains(j)).collect();
        zero_rows(&mut layer.mlp.down_proj, &gone);
    }
    same("ffn", &logits(&p), &logits(&r), &logits(&m));
}

#[test]
fn removing_layers_equals_making_them_the_identity() {
    let c = config(true);
    let m = model(&c);
    // Layer 2 is narrowed first: its FFN width must follow it to its new place.
    let k = keep(&[
        (
            "ffn",
            vec![(0..40).collect(), (0..40).collect(), (0..10).collect()],
        ),
        ("layers", vec![vec![0, 2]]),
    ]);
    let (p, pc) = prune(&m, &c, &k);
    assert_eq!((pc.num_hidden_layers, pc.layer_ffn()), (2, vec![40, 10]));
    consistent(&p, &pc);
    assert_eq!(
        values(p.model.layers[1].self_attn.q_proj.weight.val()),
        values(m.model.layers[2].self_attn.q_proj.weight.val())
    );
    let mut r = m.clone();
    let skipped = &mut r.model.layers[1];
    zero_rows(&mut skipped.self_attn.o_proj, &(0..48).collect::<Vec<_>>());
    zero_rows(&mut skipped.mlp.down_proj, &(0..40).collect::<Vec<_>>());
    zero_rows(
        &mut r.model.layers[2].mlp.down_proj,
        &(10..40).collect::<Vec<_>>(),
    );
    same("layers", &logits(&p), &logits(&r), &logits(&m));
}

#[test]
fn every_kind_but_hidden_at_once_equals_zeroing_them_all() {
    let c = config(true);
    let m = model(&c);
    let k = keep(&[
        (
            "heads",
            vec![vec![1, 2, 3, 5], (0..6).collect(), vec![0, 2, 3, 5]],
        ),
        ("kv-groups", vec![vec![1], vec![0, 1], vec![0, 1]]),
        (
            "ffn",
            vec![
                (0..40).collect(),
                (0..20).collect(),
                (0..40).step_by(2).collect(),
            ],
        ),
        ("layers", vec![vec![0, 2]]),
    ]);
    let (p, pc) = prune(&m, &c, &k);
    // Layer 0: group 1 survives with its kept heads 3 and 5; layer 1 goes; layer 2 keeps
    // heads 0, 2 (group 0) and 3, 5 (group 1).
    assert_eq!(pc.layer_heads(), [2, 4]);
    assert_eq!(pc.layer_kv_heads(), [1, 2]);
    assert_eq!(pc.layer_ffn(), [40, 20]);
    consistent(&p, &pc);
    let mut r = m.clone();
    let ls = &mut r.model.layers;
    zero_rows(&mut ls[0].self_attn.o_proj, &head_rows([0, 1, 2, 4]));
    zero_rows(&mut ls[1].self_attn.o_proj, &head_rows(0..6));
    zero_rows(&mut ls[1].mlp.down_proj, &(0..40).collect::<Vec<_>>());
    zero_rows(&mut ls[2].self_attn.o_proj, &head_rows([1, 4]));
    let odd: Vec<usize> = (1..40).step_by(2).collect();
    zero_rows(&mut ls[2].mlp.down_proj, &odd);
    same(
        "heads + kv-groups + ffn + layers",
        &logits(&p),
        &logits(&r),
        &logits(&m),
    );
}

/// Channels `kept` of every tensor that reads or writes the residual stream, by hand.
fn kept_slices(m: &LlamaForCausalLM, kept: &[usize]) -> LlamaForCausalLM {
    let dev = Device::flex();
    let ids: Vec<i64> = kept.iter().map(|&i| i as i64).collect();
    let idx = Tensor::<1, Int>::from_data(TensorData::new(ids, [kept.len()]), &dev);
    let sel1 = |p: &mut Param<Tensor<1>>| *p = Param::from_tensor(p.val().select(0, idx.clone()));
    let sel2 = |l: &mut Linear, axis: usize| {
        l.weight = Param::from_tensor(l.weight.val().select(axis, idx.clone()))
    };
    let mut h = m.clone();
    let e = &mut h.model.embed_tokens.weight;
    *e = Param::from_tensor(e.val().select(1, idx.clone()));
    for layer in h.model.layers.iter_mut() {
        sel1(&mut layer.input_layernorm.weight);
        sel1(&mut layer.post_attention_layernorm.weight);
        let a = &mut layer.self_attn;
        for l in [&mut a.q_proj, &mut a.k_proj, &mut a.v_proj] {
            sel2(l, 0);
        }
        sel2(&mut a.o_proj, 1);
        sel2(&mut layer.mlp.gate_proj, 0);
        sel2(&mut layer.mlp.up_proj, 0);
        sel2(&mut layer.mlp.down_proj, 1);
    }
    sel1(&mut h.model.norm.weight);
    if let Some(head) = h.lm_head.as_mut() {
        sel2(head, 0);
    }
    h
}

/// The unpruned model with channels not in `kept` zeroed where they enter the residual
/// stream (embedding columns, `o_proj`/`down_proj` columns) and in every RMSNorm weight; with
/// `rescale`, every RMSNorm weight × √(d'/d) and `eps` × d'/d as well.
fn zeroed_hidden(m: &LlamaForCausalLM, kept: &[usize], rescale: bool) -> LlamaForCausalLM {
    let dev = Device::flex();
    let d = m.model.norm.weight.dims()[0];
    let ratio = kept.len() as f64 / d as f64;
    let scale = if rescale { ratio.sqrt() as f32 } else { 1.0 };
    let mask: Vec<f32> = (0..d)
        .map(|i| if kept.contains(&i) { 1.0 } else { 0.0 })
        .collect();
    let mask = Tensor::<1>::from_data(TensorData::new(mask, [d]), &dev);
    let cols = |w: Tensor<2>| w * mask.clone().unsqueeze_dim::<2>(0);
    let mut r = m.clone();
    let e = &mut r.model.embed_tokens.weight;
    *e = Param::from_tensor(cols(e.val()));
    let norm = |n: &mut mopt_models::llama::LlamaRmsNorm| {
        n.weight = Param::from_tensor(n.weight.val() * mask.clone() * scale);
        n.eps *= if rescale { ratio } else { 1.0 };
    };
    for layer in r.model.layers.iter_mut() {
        norm(&mut layer.input_layernorm);
        norm(&mut layer.post_attention_layernorm);
        for l in [&mut layer.self_attn.o_proj, &mut layer.mlp.down_proj] {
            l.weight = Param::from_tensor(cols(l.weight.val()));
        }
    }
    norm(&mut r.model.norm);
    r
}

fn hidden_case(tied: bool) {
    let c = config(tied);
    let m = model(&c);
    let kept: Vec<usize> = (0..32).filter(|i| i % 4 != 1).collect();
    let (p, pc) = prune(&m, &c, &keep(&[("hidden", vec![kept.clone()])]));
    assert_eq!((pc.hidden_size, pc.head_dim()), (24, 8));
    assert_eq!(pc.layer_heads(), [6, 6, 6]);
    consistent(&p, &pc);
    assert_eq!(p.model.embed_tokens.weight.dims(), [64, 24]);
    let unpruned = logits(&m);
    let what = if tied { "tied" } else { "untied" };
    let by_hand = logits(&kept_slices(&m, &kept));
    same(
        &format!("hidden ({what}) vs kept slices"),
        &logits(&p),
        &by_hand,
        &unpruned,
    );
    let rescaled = logits(&zeroed_hidden(&m, &kept, true));
    same(
        &format!("hidden ({what}) vs zeroed + RMSNorm rescaled"),
        &logits(&p),
        &rescaled,
        &unpruned,
    );
    // Plain zeroing is another function: RMSNorm still averages over all 32 channels.
    let zeroed = logits(&zeroed_hidden(&m, &kept, false));
    let off = max_abs_diff(&logits(&p), &zeroed);
    println!("hidden ({what}): plain zeroing differs by up to {off:.3}");
    assert!(off > 1e-2);
}

#[test]
fn removing_hidden_channels_equals_the_model_of_the_kept_slices() {
    hidden_case(true);
    hidden_case(false);
}

#[test]
fn the_schedule_keeps_every_kv_group_equal_with_its_own_best_heads() {
    let c = config(true);
    let mut m = model(&c);
    // Group 0's heads (Q columns and O rows 0..24) weigh three times more in layers 0 and 1:
    // the layer's best four heads would be three of group 0 and one of group 1.
    let w3: Vec<f32> = (0..48).map(|i| if i < 24 { 3.0 } else { 1.0 }).collect();
    let w3 = Tensor::<1>::from_data(TensorData::new(w3, [48]), &Device::flex());
    for layer in m.model.layers.iter_mut().take(2) {
        let a = &mut layer.self_attn;
        a.q_proj.weight = Param::from_tensor(a.q_proj.weight.val() * w3.clone().unsqueeze_dim(0));
        a.o_proj.weight = Param::from_tensor(a.o_proj.weight.val() * w3.clone().unsqueeze_dim(1));
    }
    let kinds: Vec<&dyn GroupKind<Config = LlamaConfig>> = vec![&Heads];
    let w = ParamTable::weights(&m);
    let s = mopt_prune::scores(&w, &c, &kinds, Criterion::L1, Reduce::Sum, None, 0);
    let orig = mopt_prune::units(&kinds, &c);
    let limits = UnitLimits {
        values: Default::default(),
        ignore_layers: vec![2],
        scopes: Vec::new(),
    };
    // Local: 34% of 6 heads leaves 4, two a group. Global: half of layers 0 and 1 (12 heads)
    // goes, group 1's six heads by score: three a layer, rounded to two a group.
    for (ranking, progress) in [(Ranking::Local, 0.34), (Ranking::Global, 0.5)] {
        let at = Progress {
            orig: &orig,
            origin: &[0, 1, 2],
            progress,
            target: progress,
        };
        let rule = Heads.rule(&limits);
        let k = mopt_prune::select(&[(kinds[0], rule)], &s, &c, &at, &limits, ranking);
        assert_eq!(
            k["heads"][2],
            (0..6).collect::<Vec<_>>(),
            "layer 2 is ignored"
        );
        for l in 0..2 {
            let kept = &k["heads"][l];
            let n = kept.iter().filter(|&&h| h < 3).count();
            assert_eq!((n, kept.len()), (2, 4), "{ranking:?} layer {l}: {kept:?}");
            // Each group keeps its own n best-scored heads.
            for g in 0..2 {
                let mut order: Vec<usize> = (3 * g..3 * g + 3).collect();
                order.sort_by(|&a, &b| s["heads"][l][b].total_cmp(&s["heads"][l][a]));
                let mut best = order[..n].to_vec();
                best.sort_unstable();
                let mine: Vec<usize> = kept.iter().copied().filter(|h| h / 3 == g).collect();
                assert_eq!(mine, best, "{ranking:?} layer {l} group {g}");
            }
        }
        let (p, pc) = prune(&m, &c, &k);
        consistent(&p, &pc);
    }
}

/// A model pruned by every kind (hidden included).
fn pruned_everywhere() -> (LlamaForCausalLM, LlamaConfig) {
    let c = config(false);
    let k = keep(&[
        (
            "heads",
            vec![vec![1, 2, 3, 5], (0..6).collect(), vec![0, 2, 3, 5]],
        ),
        ("kv-groups", vec![vec![1], vec![0, 1], vec![0, 1]]),
        (
            "ffn",
            vec![
                (0..40).collect(),
                (0..20).collect(),
                (0..40).step_by(2).collect(),
            ],
        ),
        ("hidden", vec![(0..32).filter(|i| i % 4 != 1).collect()]),
        ("layers", vec![vec![0, 2]]),
    ]);
    prune(&model(&c), &c, &k)
}

#[test]
fn a_pruned_checkpoint_saves_and_reloads_with_identical_logits() {
    let (p, pc) = pruned_everywhere();
    assert_eq!(
        (
            pc.hidden_size,
            pc.layer_heads(),
            pc.layer_kv_heads(),
            pc.layer_ffn()
        ),
        (24, vec![2, 4], vec![1, 2], vec![40, 20])
    );
    let dir = tempfile::tempdir().unwrap();
    p.save(&pc, dir.path()).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap())
            .unwrap();
    assert_eq!(json["model_type"], "llama");
    assert_eq!(json["mopt_layer_kv_heads"], serde_json::json!([1, 2]));
    let (q, qc) = LlamaForCausalLM::load(dir.path(), &Device::flex()).unwrap();
    assert_eq!(qc, pc);
    let (a, b) = (logits(&p), logits(&q));
    println!(
        "checkpoint: max |reloaded - saved| = {:.3e}",
        max_abs_diff(&a, &b)
    );
    assert_eq!(a, b);
    let fresh = LlamaForCausalLM::init(&qc, &Device::flex());
    assert!(max_abs_diff(&logits(&fresh), &a) > 1e-2);
}

#[test]
fn bad_checkpoint_files_are_errors_not_panics() {
    let (p, pc) = pruned_everywhere();
    let dir = tempfile::tempdir().unwrap();
    p.save(&pc, dir.path()).unwrap();
    let dev = Device::flex();
    let err = |d: &std::path::Path| LlamaForCausalLM::load(d, &dev).expect_err("an error");
    // Weights cut short.
    let bpk = dir.path().join("model.bpk");
    let bytes = std::fs::read(&bpk).unwrap();
    std::fs::write(&bpk, &bytes[..bytes.len() / 2]).unwrap();
    let e = err(dir.path());
    assert!(e.input && e.to_string().contains("model.bpk"), "{e}");
    // Whole weights, but a config of another shape (the unpruned one).
    std::fs::write(&bpk, &bytes).unwrap();
    config(false).save(&dir.path().join("config.json")).unwrap();
    assert!(err(dir.path()).input);
    // A config that breaks grouped-query attention.
    let bad = LlamaConfig {
        mopt_layer_heads: Some(vec![2, 3]),
        ..pc.clone()
    };
    std::fs::write(
        dir.path().join("config.json"),
        serde_json::to_string(&bad).unwrap(),
    )
    .unwrap();
    let e = err(dir.path());
    assert!(
        e.input && e.to_string().contains("layer 1: 3 query heads"),
        "{e}"
    );
    // No folder at all.
    assert!(!err(&dir.path().join("missing")).input);
}

#[test]
fn evaluate_scores_every_position_and_gives_a_finite_perplexity() {
    let dev = Device::flex();
    let c = config(true);
    let m = model(&c);
    let split = WindowSplit::pack(&stream(300), 8, None).unwrap();
    assert_eq!(split.len(), 37); // (300 - 9) / 8 + 1
    let out = mopt_train::trainer::evaluate(&m, &split, 5, 64, &dev);
    assert_eq!(out.metrics.examples, 37);
    // The mean next-token cross-entropy over all 37 × 8 rows, by hand.
    let all: Vec<usize> = (0..split.len()).collect();
    let b = split.batch(&all, &dev);
    let logp = log_softmax(m.logits(&b), 1);
    let n = b.targets.dims()[0];
    let picked = logp.gather(1, b.targets.clone().reshape([n, 1]));
    let want = -values(picked).iter().map(|&x| x as f64).sum::<f64>() / n as f64;
    let ppl = out.metrics.loss.exp();
    println!(
        "evaluate: loss {:.6} (by hand {want:.6}), perplexity {ppl:.3}, accuracy {:.4}",
        out.metrics.loss, out.metrics.accuracy
    );
    assert!(
        (out.metrics.loss - want).abs() < 1e-5 * want,
        "{} vs {want}",
        out.metrics.loss
    );
    assert!(ppl.is_finite() && ppl > 1.0);
    // Example 3's kept logits are its own 8 rows.
    let one = values(m.logits(&split.batch(&[3], &dev)));
    assert!(max_abs_diff(&out.logits[3], &one) < 1e-5);
    // The pruned model evaluates too, to another finite perplexity.
    let (p, _) = pruned_everywhere();
    let pruned = mopt_train::trainer::evaluate(&p, &split, 5, 64, &dev)
        .metrics
        .loss
        .exp();
    println!("evaluate: pruned perplexity {pruned:.3}");
    assert!(pruned.is_finite() && (pruned - ppl).abs() > 1e-3);
}

#[test]
fn prunable_declares_five_kinds_and_counts_layers() {
    let names: Vec<&str> = LlamaForCausalLM::group_kinds()
        .iter()
        .map(|k| k.name())
        .collect();
    assert_eq!(names, ["heads", "kv-groups", "ffn", "hidden", "layers"]);
    let c = config(true);
    assert_eq!(<LlamaForCausalLM as Prunable>::layers(&c), 3);
    let units: Vec<usize> = LlamaForCausalLM::group_kinds()
        .iter()
        .map(|k| k.units(&c, 0))
        .collect();
    assert_eq!(units, [6, 2, 40, 32, 3]);
    let b = LlamaForCausalLM::bench_batch(&c, 2, 5, &Device::flex()).unwrap();
    assert_eq!((b.inputs.dims(), b.targets.dims()), ([2, 5], [10]));
    assert_eq!(model(&c).logits(&b).dims(), [10, 64]);
}

/// Column `j` of a linear layer's `[d_in, d_out]` weight times `factors[j]` (1 where absent):
/// output `j` scales by it.
fn scale_cols(l: &mut Linear, factors: &[(usize, f32)]) {
    let w = l.weight.val();
    let [_, cols] = w.dims();
    let f: Vec<f32> = (0..cols)
        .map(|j| factors.iter().find(|(c, _)| *c == j).map_or(1.0, |x| x.1))
        .collect();
    let f = Tensor::<1>::from_data(TensorData::new(f, [cols]), &w.device());
    l.weight = Param::from_tensor(w * f.unsqueeze_dim::<2>(0));
}

fn activations(m: &LlamaForCausalLM, c: &LlamaConfig, stat: ActivationStat) -> GroupScores {
    m.activation_scores(c, windows().inputs, stat)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-5 * a.abs().max(b.abs()).max(1e-3)
}

/// Minitron's activation-based importance: each unit's score follows what the unit emits.
/// A KV group scores as its query heads together; tripling a KV head's values triples its
/// query heads' scores (their contexts) and leaves the other group's alone; a neuron with a
/// zeroed up projection scores 0 and a doubled one twice as much; a layer whose output
/// projections are zero (the identity) has block influence 0; a hidden channel zeroed in every
/// RMSNorm scores 0. The FFN scores of layer 0 equal the statistic computed here from the
/// layer's own pieces, both statistics.
#[test]
fn activation_scores_follow_what_each_unit_emits() {
    let c = config(true);
    let m = model(&c);
    let _ = logits(&m); // draw every parameter before the model is cloned
    let l2 = activations(&m, &c, ActivationStat::L2);
    let mean = activations(&m, &c, ActivationStat::Mean);
    let shape = |s: &GroupScores, k: &str| -> Vec<usize> { s[k].iter().map(Vec::len).collect() };
    assert_eq!(shape(&l2, "heads"), [6, 6, 6]);
    assert_eq!(shape(&l2, "kv-groups"), [2, 2, 2]);
    assert_eq!(shape(&l2, "ffn"), [40, 40, 40]);
    assert_eq!(
        (shape(&l2, "hidden"), shape(&l2, "layers")),
        (vec![32], vec![3])
    );
    for s in [&l2, &mean] {
        for (heads, groups) in s["heads"].iter().zip(&s["kv-groups"]) {
            assert!(close(groups[0], heads[..3].iter().sum()));
            assert!(close(groups[1], heads[3..].iter().sum()));
        }
    }
    // Per unit, the root mean square is at least the mean magnitude (summed over sequences).
    let pairs = l2["ffn"].iter().flatten().zip(mean["ffn"].iter().flatten());
    assert!(pairs.clone().all(|(a, b)| *a >= *b - 1e-9));
    assert!(pairs.clone().any(|(a, b)| *a > *b * 1.01));

    // Layer 0's neurons, from its own pieces: x -> attention -> post-norm -> gated values.
    let ids = windows().inputs;
    let layer = &m.model.layers[0];
    let x = m.model.embed_tokens.forward(ids.clone());
    let (cos, sin) = m.model.rope.tables(0, 7, &Device::flex());
    let bias = mopt_models::llama::causal_bias(7, 7, &Device::flex());
    let attn = layer.self_attn.forward(
        layer.input_layernorm.forward(x.clone()),
        (&cos, &sin),
        bias,
        None,
    );
    let gated = values(
        layer
            .mlp
            .gated(layer.post_attention_layernorm.forward(x + attn)),
    );
    for j in [0, 17, 39] {
        let (mut want_mean, mut want_l2) = (0.0, 0.0);
        for b in 0..2 {
            let a: Vec<f64> = (0..7).map(|t| gated[(b * 7 + t) * 40 + j] as f64).collect();
            want_mean += a.iter().map(|v| v.abs()).sum::<f64>() / 7.0;
            want_l2 += (a.iter().map(|v| v * v).sum::<f64>() / 7.0).sqrt();
        }
        assert!(
            close(mean["ffn"][0][j], want_mean),
            "{} vs {want_mean}",
            mean["ffn"][0][j]
        );
        assert!(
            close(l2["ffn"][0][j], want_l2),
            "{} vs {want_l2}",
            l2["ffn"][0][j]
        );
    }

    let mut r = m.clone();
    scale_cols(
        &mut r.model.layers[0].self_attn.v_proj,
        &(8..16).map(|j| (j, 3.0)).collect::<Vec<_>>(),
    );
    let s = activations(&r, &c, ActivationStat::L2);
    for h in 0..6 {
        let want = if h >= 3 { 3.0 } else { 1.0 } * l2["heads"][0][h];
        assert!(
            close(s["heads"][0][h], want),
            "head {h}: {} vs {want}",
            s["heads"][0][h]
        );
    }
    // Layer 1's neurons see layer 0's output, which its own FFN does not change.
    let mut r = m.clone();
    scale_cols(&mut r.model.layers[1].mlp.up_proj, &[(5, 0.0), (6, 2.0)]);
    let skipped = &mut r.model.layers[2];
    zero_rows(&mut skipped.self_attn.o_proj, &(0..48).collect::<Vec<_>>());
    zero_rows(&mut skipped.mlp.down_proj, &(0..40).collect::<Vec<_>>());
    let s = activations(&r, &c, ActivationStat::L2);
    assert_eq!(s["ffn"][1][5], 0.0);
    assert!(close(s["ffn"][1][6], 2.0 * l2["ffn"][1][6]));
    assert!(close(s["ffn"][1][7], l2["ffn"][1][7]));
    assert!(s["layers"][0][2].abs() < 1e-6, "{:?}", s["layers"]);
    assert!(
        s["layers"][0][..2].iter().all(|&bi| bi > 1e-3),
        "{:?}",
        s["layers"]
    );

    let mut r = m.clone();
    let zero = |w: &mut Param<Tensor<1>>| {
        let v = w.val();
        let mask: Vec<f32> = (0..32).map(|i| if i == 9 { 0.0 } else { 1.0 }).collect();
        *w = Param::from_tensor(
            v * Tensor::<1>::from_data(TensorData::new(mask, [32]), &Device::flex()),
        );
    };
    for layer in r.model.layers.iter_mut() {
        zero(&mut layer.input_layernorm.weight);
        zero(&mut layer.post_attention_layernorm.weight);
    }
    zero(&mut r.model.norm.weight);
    let s = activations(&r, &c, ActivationStat::Mean);
    assert_eq!(s["hidden"][0][9], 0.0);
    assert!(s["hidden"][0]
        .iter()
        .enumerate()
        .all(|(i, &v)| i == 9 || v > 0.0));
}
