//! Writing a Llama as GGUF (`mopt_models::llama::write_gguf`) and reading it back with
//! `load_gguf`, on random 3-layer models (hidden 32, 4 query heads of 8 over 2 KV heads, FFN
//! 64, vocabulary 64, RMSNorm weights around one) and a pruned one (hidden 24, heads [4, 2, 2],
//! KV heads [2, 2, 1], FFN [64, 20, 40]).
//!
//! - F32 gives the same logits bit for bit (max |diff| exactly 0), tied and untied, unpruned and
//!   pruned, with the per-layer widths rebuilt from the metadata.
//! - F16 and Q8_0 give every weight as the format rounds it (F16: the nearest half, bit for
//!   bit; Q8_0: within half a step `d = max|x|/127` of its block plus 127 × the f16 rounding of
//!   `d`), norms exactly, and logits within a measured tolerance. Max |diff| / max |logit|
//!   measures 5.6e-3 / 5.4e-3 (tied / untied) for F16 and 7.2e-2 / 7.8e-2 for Q8_0, 2.7e-3 for
//!   the pruned model in F16; asserted at most 1e-2 (F16) and 0.12 (Q8_0). These random models
//!   (weights ~ N(0, 0.3), logits up to ~10) amplify weight noise more than a trained model
//!   does. Every weight 5 % too large (a Q8_0 scale 5 % off) moves the logits by 0.14-0.16,
//!   half as large by 0.78-0.89: past the Q8_0 bound.
//! - What GGUF cannot hold is refused by name, and nothing is written.
//!
//! The measured numbers are printed (`--nocapture`).

use std::sync::Mutex;

use burn::module::{Module, ModuleVisitor, Param};
use burn::prelude::*;
use burn::tensor::Distribution;
use mopt_core::prune::Keep;
use mopt_gguf::ggml::{f16_to_f32, f32_to_f16};
use mopt_gguf::{Array, GgmlType, Gguf, GgufTokenizer, Value};
use mopt_models::llama::{load_gguf, write_gguf, LlamaConfig, LlamaForCausalLM};
use mopt_models::ModelError;

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

/// max |a − b| / max |a|.
fn relative(a: &[f32], b: &[f32]) -> f32 {
    max_abs_diff(a, b) / a.iter().fold(0f32, |m, x| m.max(x.abs()))
}

/// 3 layers, hidden 32, 4 query heads of 8 over 2 KV heads, FFN 64, vocabulary 64: every row
/// a multiple of 32 (Q8_0 can hold it).
fn config(tied: bool) -> LlamaConfig {
    LlamaConfig {
        num_hidden_layers: 3,
        initializer_range: 0.3,
        rope_theta: 5e5,
        max_position_embeddings: 4096,
        tie_word_embeddings: tied,
        ..LlamaConfig::tiny(64)
    }
}

/// The device's random generator is shared by the tests running in parallel: one model is
/// drawn (or built by pruning) at a time, so that a seed gives the same model in every run.
static DRAW: Mutex<()> = Mutex::new(());

/// Burn initialises a parameter when it is first read: [`drawn`] reads them all (under
/// [`DRAW`]), not later while another test draws.
struct Materialize;

impl ModuleVisitor for Materialize {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let _ = param.val();
    }
}

fn drawn(m: LlamaForCausalLM) -> LlamaForCausalLM {
    m.visit(&mut Materialize);
    m
}

/// A seeded random model; RMSNorm weights ~ N(1, 0.5) so that a misplaced norm shows.
fn model(c: &LlamaConfig, seed: u64) -> LlamaForCausalLM {
    let _one_at_a_time = DRAW.lock().unwrap_or_else(|e| e.into_inner());
    let dev = Device::flex();
    dev.seed(seed);
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
    drawn(m)
}

/// The untied model pruned by heads, KV groups, FFN channels and hidden channels: hidden 24
/// (not heads × head_dim), heads [4, 2, 2], KV heads [2, 2, 1], FFN [64, 20, 40].
fn pruned() -> (LlamaForCausalLM, LlamaConfig) {
    let c = config(false);
    let keep: Keep = [
        (
            "heads",
            vec![(0..4).collect(), vec![0, 2], (0..4).collect()],
        ),
        ("kv-groups", vec![vec![0, 1], vec![0, 1], vec![1]]),
        (
            "ffn",
            vec![
                (0..64).collect(),
                (0..64).step_by(3).take(20).collect(),
                (0..40).collect(),
            ],
        ),
        ("hidden", vec![(0..32).filter(|i| i % 4 != 1).collect()]),
    ]
    .into_iter()
    .map(|(k, v): (&str, Vec<Vec<usize>>)| (k.to_string(), v))
    .collect();
    let m = model(&c, 11);
    // Pruning builds the smaller model with a random init before it copies the kept weights in.
    let _one_at_a_time = DRAW.lock().unwrap_or_else(|e| e.into_inner());
    let (p, pc) = mopt_prune::prune(&m, &c, &keep, &Device::flex());
    let p = drawn(p);
    assert_eq!(
        (
            pc.hidden_size,
            pc.layer_heads(),
            pc.layer_kv_heads(),
            pc.layer_ffn()
        ),
        (24, vec![4, 2, 2], vec![2, 2, 1], vec![64, 20, 40])
    );
    (p, pc)
}

/// A byte-level BPE tokenizer of 64 tokens as a source GGUF holds it (`a`…`z`, `A`…`Z`,
/// `0`…`7`, `ab`, `cd`, `abcd`, `<|end|>`), with a key outside `tokenizer.` that is not copied.
fn tokenizer_source() -> Vec<(String, Value)> {
    let mut tokens: Vec<String> = ('a'..='z')
        .chain('A'..='Z')
        .chain('0'..='7')
        .map(String::from)
        .collect();
    tokens.extend(["ab", "cd", "abcd", "<|end|>"].map(String::from));
    assert_eq!(tokens.len(), 64);
    let types: Vec<i32> = (0..64).map(|i| if i == 63 { 3 } else { 1 }).collect();
    let scores: Vec<f32> = (0..64).map(|i| -(i as f32)).collect();
    let merges = vec!["a b".to_string(), "c d".into(), "ab cd".into()];
    [
        ("general.name", Value::from("the source model")),
        ("tokenizer.ggml.model", Value::from("gpt2")),
        ("tokenizer.ggml.pre", Value::from("smollm")),
        ("tokenizer.ggml.tokens", Value::Array(Array::String(tokens))),
        ("tokenizer.ggml.token_type", Value::from(types)),
        ("tokenizer.ggml.scores", Value::from(scores)),
        ("tokenizer.ggml.merges", Value::Array(Array::String(merges))),
        ("tokenizer.ggml.bos_token_id", Value::U32(63)),
        ("tokenizer.ggml.eos_token_id", Value::U32(63)),
        ("tokenizer.chat_template", Value::from("{{ messages }}")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

fn write(
    m: &LlamaForCausalLM,
    c: &LlamaConfig,
    src: &[(String, Value)],
    path: &std::path::Path,
    dtype: GgmlType,
) -> Result<(), ModelError> {
    write_gguf(m, c, src.iter().map(|(k, v)| (k.as_str(), v)), path, dtype)
}

/// Three windows of 9 tokens in one batch, and one window of 5.
fn logits(m: &LlamaForCausalLM) -> Vec<f32> {
    let dev = Device::flex();
    let ids = |n: usize, salt: usize| -> Vec<i64> {
        (0..n)
            .map(|i| ((i * 37 + salt * 11 + 5) % 64) as i64)
            .collect()
    };
    let three: Vec<i64> = (0..3).flat_map(|s| ids(9, s)).collect();
    let batch = Tensor::<2, Int>::from_data(TensorData::new(three, [3, 9]), &dev);
    let one = Tensor::<2, Int>::from_data(TensorData::new(ids(5, 7), [1, 5]), &dev);
    let mut out = values(m.forward(batch));
    out.extend(values(m.forward(one)));
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The config read back has the widths, head, RoPE and norm of the one written.
fn same_shape(back: &LlamaConfig, c: &LlamaConfig) {
    assert_eq!(
        (
            back.vocab_size,
            back.hidden_size,
            back.num_hidden_layers,
            back.head_dim()
        ),
        (
            c.vocab_size,
            c.hidden_size,
            c.num_hidden_layers,
            c.head_dim()
        )
    );
    assert_eq!(back.layer_heads(), c.layer_heads());
    assert_eq!(back.layer_kv_heads(), c.layer_kv_heads());
    assert_eq!(back.layer_ffn(), c.layer_ffn());
    assert_eq!(back.tie_word_embeddings, c.tie_word_embeddings);
    assert_eq!(back.rope_theta, f64::from(c.rope_theta as f32));
    assert_eq!(back.rms_norm_eps, f64::from(c.rms_norm_eps as f32));
    assert_eq!(back.max_position_embeddings, c.max_position_embeddings);
}

#[test]
fn f32_round_trip_gives_the_same_logits_bit_for_bit() {
    let dev = Device::flex();
    let dir = tempfile::tempdir().unwrap();
    let src = tokenizer_source();
    for tied in [true, false] {
        let c = config(tied);
        let m = model(&c, 3);
        let path = dir.path().join(format!("tied-{tied}.gguf"));
        write(&m, &c, &src, &path, GgmlType::F32).unwrap();
        let (back_c, back) = load_gguf(&path, &dev).unwrap();
        same_shape(&back_c, &c);
        assert_eq!(
            (back_c.bos_token_id, back_c.eos_token_id),
            (Some(63), Some(63))
        );
        let (a, b) = (logits(&m), logits(&back));
        println!("F32, tied {tied}: max |diff| = {:e}", max_abs_diff(&a, &b));
        assert!(
            a.iter().fold(0f32, |x, y| x.max(y.abs())) > 1.0,
            "logits spread"
        );
        assert_eq!(bits(&a), bits(&b), "tied {tied}");
        // The file as llama.cpp reads it: uniform widths as numbers, no key_length (32 = 4 × 8),
        // norms in F32, the head only when untied.
        let g = Gguf::open(&path).unwrap();
        assert_eq!(g.get_str("general.architecture").unwrap(), "llama");
        assert_eq!(g.get_u32("general.file_type").unwrap(), 0);
        assert_eq!(g.get_u32("llama.attention.head_count").unwrap(), 4);
        assert_eq!(g.get_u32("llama.attention.head_count_kv").unwrap(), 2);
        assert_eq!(g.get_u32("llama.feed_forward_length").unwrap(), 64);
        assert_eq!(g.get_u32("llama.rope.dimension_count").unwrap(), 8);
        assert!(g.get("llama.attention.key_length").is_none());
        assert_eq!(g.get_f32("llama.rope.freq_base").unwrap(), 5e5);
        assert_eq!(g.tensor("output.weight").is_some(), !tied);
        assert_eq!(g.tensors().len(), 1 + 9 * 3 + 1 + usize::from(!tied));
        let q = g.tensor("blk.0.attn_q.weight").unwrap();
        assert_eq!((q.dims(), q.ggml_type()), (&[32u64, 32][..], GgmlType::F32));
        let k = g.tensor("blk.2.attn_k.weight").unwrap();
        assert_eq!(k.dims(), [32, 16]);
        assert_eq!(g.tensor("token_embd.weight").unwrap().dims(), [32, 64]);
    }
}

#[test]
fn the_tokenizer_is_copied_with_the_configs_special_ids() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.gguf");
    let c = LlamaConfig {
        eos_token_id: Some(62),
        ..config(true)
    };
    write(&model(&c, 1), &c, &tokenizer_source(), &path, GgmlType::F32).unwrap();
    let g = Gguf::open(&path).unwrap();
    for (key, value) in tokenizer_source()
        .iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
    {
        if key != "tokenizer.ggml.eos_token_id" {
            assert_eq!(g.get(key), Some(value), "{key}");
        }
    }
    assert_eq!(g.get_u32("tokenizer.ggml.eos_token_id").unwrap(), 62);
    assert!(g.get("general.name").is_none());
    let t = GgufTokenizer::from_gguf(&g).unwrap();
    assert_eq!(t.encode("abcd<|end|>ab").unwrap(), [62, 63, 60]);
    let (back, _) = load_gguf(&path, &Device::flex()).unwrap();
    assert_eq!((back.bos_token_id, back.eos_token_id), (Some(63), Some(62)));
}

#[test]
fn a_pruned_model_round_trips_exactly_with_its_per_layer_widths() {
    let (p, pc) = pruned();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pruned.gguf");
    write(&p, &pc, &tokenizer_source(), &path, GgmlType::F32).unwrap();
    let g = Gguf::open(&path).unwrap();
    let arr = |k: &str| g.get_u32_array(k).unwrap().to_vec();
    assert_eq!(arr("llama.attention.head_count"), [4, 2, 2]);
    assert_eq!(arr("llama.attention.head_count_kv"), [2, 2, 1]);
    assert_eq!(arr("llama.feed_forward_length"), [64, 20, 40]);
    // 24 ≠ 4 × 8: the head width is written, for keys and values.
    assert_eq!(g.get_u32("llama.attention.key_length").unwrap(), 8);
    assert_eq!(g.get_u32("llama.attention.value_length").unwrap(), 8);
    assert_eq!(g.tensor("blk.2.attn_k.weight").unwrap().dims(), [24, 8]);
    assert_eq!(g.tensor("blk.1.ffn_down.weight").unwrap().dims(), [20, 24]);
    let (back_c, back) = load_gguf(&path, &Device::flex()).unwrap();
    same_shape(&back_c, &pc);
    let (a, b) = (logits(&p), logits(&back));
    println!("F32, pruned: max |diff| = {:e}", max_abs_diff(&a, &b));
    assert_eq!(bits(&a), bits(&b));
    // The pruned model is another function than the unpruned one.
    assert!(max_abs_diff(&a, &logits(&model(&config(false), 11))) > 1e-2);
}

/// Every 2-D weight of `m` as GGUF stores it: rows of `[out, in]` (the table as it is).
fn gguf_rows(m: &LlamaForCausalLM) -> Vec<(String, Vec<f32>)> {
    let mut out = vec![(
        "embed".to_string(),
        values(m.model.embed_tokens.weight.val()),
    )];
    for (i, l) in m.model.layers.iter().enumerate() {
        let (a, f) = (&l.self_attn, &l.mlp);
        for (n, lin) in [
            ("q", &a.q_proj),
            ("k", &a.k_proj),
            ("v", &a.v_proj),
            ("o", &a.o_proj),
            ("gate", &f.gate_proj),
            ("up", &f.up_proj),
            ("down", &f.down_proj),
        ] {
            out.push((format!("{i}.{n}"), values(lin.weight.val().transpose())));
        }
    }
    if let Some(head) = &m.lm_head {
        out.push(("head".into(), values(head.weight.val().transpose())));
    }
    out
}

/// F16: every weight the nearest half of the original. Q8_0: every weight within half a step
/// `d = max|x|/127` of its block of 32, plus 127 × the f16 rounding of `d`. Norms exact.
fn check_weights(m: &LlamaForCausalLM, back: &LlamaForCausalLM, dtype: GgmlType) {
    for ((name, a), (_, b)) in gguf_rows(m).iter().zip(gguf_rows(back)) {
        if dtype == GgmlType::F16 {
            let rounded: Vec<f32> = a.iter().map(|&x| f16_to_f32(f32_to_f16(x))).collect();
            assert_eq!(bits(&b), bits(&rounded), "{name}");
            continue;
        }
        for (k, (x, y)) in a.chunks_exact(32).zip(b.chunks_exact(32)).enumerate() {
            let d = x.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            let bound = d * 0.5 * (1.0 + 1e-6) + 127.0 * (d - f16_to_f32(f32_to_f16(d))).abs();
            let err = max_abs_diff(x, y);
            assert!(err <= bound, "{name} block {k}: {err} > {bound}");
        }
    }
    let norms = |m: &LlamaForCausalLM| {
        let mut v = values(m.model.norm.weight.val());
        for l in &m.model.layers {
            v.extend(values(l.input_layernorm.weight.val()));
            v.extend(values(l.post_attention_layernorm.weight.val()));
        }
        v
    };
    assert_eq!(bits(&norms(m)), bits(&norms(back)));
}

/// `m` with every 2-D weight × `f`.
fn scaled(m: &LlamaForCausalLM, f: f32) -> LlamaForCausalLM {
    let mut s = m.clone();
    let e = &mut s.model.embed_tokens.weight;
    *e = Param::from_tensor(e.val() * f);
    for l in s.model.layers.iter_mut() {
        let (a, mlp) = (&mut l.self_attn, &mut l.mlp);
        for lin in [
            &mut a.q_proj,
            &mut a.k_proj,
            &mut a.v_proj,
            &mut a.o_proj,
            &mut mlp.gate_proj,
            &mut mlp.up_proj,
            &mut mlp.down_proj,
        ] {
            lin.weight = Param::from_tensor(lin.weight.val() * f);
        }
    }
    if let Some(h) = s.lm_head.as_mut() {
        h.weight = Param::from_tensor(h.weight.val() * f);
    }
    s
}

#[test]
fn f16_and_q8_0_round_trips_stay_within_their_measured_tolerance() {
    const F16_BOUND: f32 = 1e-2;
    const Q8_0_BOUND: f32 = 0.12;
    let dev = Device::flex();
    let dir = tempfile::tempdir().unwrap();
    for tied in [true, false] {
        let c = config(tied);
        let m = model(&c, 5);
        let exact = logits(&m);
        for (dtype, bound) in [(GgmlType::F16, F16_BOUND), (GgmlType::Q8_0, Q8_0_BOUND)] {
            let path = dir.path().join(format!("{dtype}-{tied}.gguf"));
            write(&m, &c, &tokenizer_source(), &path, dtype).unwrap();
            let g = Gguf::open(&path).unwrap();
            assert_eq!(g.tensor("blk.1.ffn_up.weight").unwrap().ggml_type(), dtype);
            assert_eq!(g.tensor("token_embd.weight").unwrap().ggml_type(), dtype);
            assert_eq!(
                g.tensor("blk.1.ffn_norm.weight").unwrap().ggml_type(),
                GgmlType::F32
            );
            let (back_c, back) = load_gguf(&path, &dev).unwrap();
            same_shape(&back_c, &c);
            check_weights(&m, &back, dtype);
            let rel = relative(&exact, &logits(&back));
            println!(
                "{dtype}, tied {tied}: max |diff| / max |logit| = {rel:.3e} (bound {bound:e})"
            );
            assert!(rel > 0.0 && rel <= bound, "{dtype}, tied {tied}: {rel:e}");
        }
        // A Q8_0 scale 5 % off (every weight × 1.05), or half what it should be, moves the
        // logits past the Q8_0 bound. (One 1/127 off, × 128/127, moves them by about 2e-2,
        // less than Q8_0's own rounding: `check_weights` catches that one.)
        for f in [1.05, 0.5] {
            let wrong = relative(&exact, &logits(&scaled(&m, f)));
            println!("weights × {f}, tied {tied}: {wrong:.3e}");
            assert!(wrong > Q8_0_BOUND, "× {f}: {wrong:e}");
        }
    }
}

/// `f` on a fresh model of `c` gives an [`ModelError::Inexpressible`] whose message names
/// `what`, and writes nothing.
fn refused(
    c: &LlamaConfig,
    dtype: GgmlType,
    src: &[(String, Value)],
    what: &str,
    change: impl FnOnce(&mut LlamaForCausalLM),
) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.gguf");
    let mut m = model(c, 2);
    change(&mut m);
    let e = write(&m, c, src, &path, dtype).unwrap_err();
    let msg = e.to_string();
    println!("refused: {msg}");
    assert!(matches!(e, ModelError::Inexpressible { .. }), "{msg}");
    assert!(msg.contains(what), "`{what}` in {msg}");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing written"
    );
}

#[test]
fn what_gguf_cannot_hold_is_refused_by_name() {
    let dev = Device::flex();
    let (c, src) = (config(true), tokenizer_source());
    let same = |_: &mut LlamaForCausalLM| {};
    refused(
        &c,
        GgmlType::F32,
        &src,
        "`blk.1.attn_q.bias` (model.layers.1.self_attn.q_proj.bias)",
        |m| {
            m.model.layers[1].self_attn.q_proj.bias =
                Some(Param::from_tensor(Tensor::zeros([32], &dev)));
        },
    );
    // 8 heads of 4 in layer 2: the same tensors, another head width.
    refused(
        &c,
        GgmlType::F32,
        &src,
        "layer 2 (model.layers.2.self_attn)",
        |m| {
            let a = &mut m.model.layers[2].self_attn;
            (a.num_heads, a.num_kv_heads, a.head_dim) = (8, 4, 4);
        },
    );
    // A layer reading a narrower residual stream than the others.
    refused(
        &c,
        GgmlType::F32,
        &src,
        "tensor `blk.0.attn_q.weight`",
        |m| {
            let q = &mut m.model.layers[0].self_attn.q_proj;
            q.weight = Param::from_tensor(Tensor::zeros([24, 32], &dev));
        },
    );
    refused(
        &c,
        GgmlType::F32,
        &src,
        "RMSNorm `model.layers.0.post_attention_layernorm`",
        |m| {
            m.model.layers[0].post_attention_layernorm.eps = 1e-6;
        },
    );
    refused(&c, GgmlType::F32, &src, "RoPE", |m| {
        m.model.rope.theta = 1e4
    });
    let untied = LlamaConfig {
        tie_word_embeddings: false,
        ..c.clone()
    };
    let dir = tempfile::tempdir().unwrap();
    let e = write(
        &model(&c, 2),
        &untied,
        &src,
        &dir.path().join("x"),
        GgmlType::F32,
    );
    assert!(e.unwrap_err().to_string().contains("cannot export lm_head"));
    refused(&c, GgmlType::Q4_1, &src, "weights as Q4_1", same);
    // Tokenizers llama.cpp could not load.
    let without = |key: &str| -> Vec<(String, Value)> {
        src.iter().filter(|(k, _)| k != key).cloned().collect()
    };
    refused(
        &c,
        GgmlType::F32,
        &without("tokenizer.ggml.tokens"),
        "tokenizer.ggml.tokens: missing",
        same,
    );
    refused(
        &c,
        GgmlType::F32,
        &without("tokenizer.ggml.model"),
        "tokenizer.ggml.model: missing",
        same,
    );
    let small = LlamaConfig {
        vocab_size: 60,
        ..c.clone()
    };
    refused(
        &small,
        GgmlType::F32,
        &src,
        "64 tokens, but the embedding table has 60 rows",
        same,
    );
    let mut bad_id = src.clone();
    bad_id.push(("tokenizer.ggml.padding_token_id".into(), Value::I32(3)));
    refused(
        &c,
        GgmlType::F32,
        &bad_id,
        "tokenizer.ggml.padding_token_id: a u32",
        same,
    );
    let mut outside = src.clone();
    outside.push(("tokenizer.ggml.unknown_token_id".into(), Value::U32(64)));
    let what = "tokenizer.ggml.unknown_token_id: id 64 is outside the vocabulary of 64";
    refused(&c, GgmlType::F32, &outside, what, same);
    let short: Vec<(String, Value)> = src
        .iter()
        .map(|(k, v)| match k.as_str() {
            "tokenizer.ggml.scores" => (k.clone(), Value::from(vec![0f32; 63])),
            _ => (k.clone(), v.clone()),
        })
        .collect();
    let what = "tokenizer.ggml.scores: 63 entries for 64 tokens";
    refused(&c, GgmlType::F32, &short, what, same);
}

/// Q8_0 needs rows of a multiple of 32 values: the pruned model (hidden 24) is refused, naming
/// the first tensor; F16 holds it.
#[test]
fn q8_0_refuses_rows_that_are_not_whole_blocks() {
    let (p, pc) = pruned();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q8.gguf");
    let e = write(&p, &pc, &tokenizer_source(), &path, GgmlType::Q8_0).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, ModelError::Inexpressible { .. }), "{msg}");
    assert!(
        msg.contains("tensor `token_embd.weight` (model.embed_tokens) as Q8_0")
            && msg.contains("rows of 24 values; Q8_0 needs a multiple of 32"),
        "{msg}"
    );
    assert!(!path.exists());
    write(&p, &pc, &tokenizer_source(), &path, GgmlType::F16).unwrap();
    let (_, back) = load_gguf(&path, &Device::flex()).unwrap();
    let rel = relative(&logits(&p), &logits(&back));
    println!("F16, pruned: max |diff| / max |logit| = {rel:.3e}");
    assert!(rel <= 1e-2, "{rel:e}");
}
