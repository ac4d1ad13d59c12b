//! The Llama decoder: KV-cache decoding against full recomputation, the causal mask, configs
//! with per-layer widths, GGUF loading (a tiny model written with llama.cpp's layout, and the
//! real SmolLM2-135M-Instruct against Hugging Face transformers).
//!
//! The SmolLM2 tests need `datasets/fetch.sh --small` and fail, never skip, without it. Their
//! reference, `tests/fixtures/smollm2_reference.json`, comes from transformers 5.24.0 / torch
//! 2.15.0 loading the same GGUF in float32 (`tests/fixtures/smollm2_reference.py`).

use std::path::{Path, PathBuf};

use burn::prelude::*;
use mopt_gguf::{GgmlType, Gguf, GgufTokenizer, GgufWriter, Value};
use mopt_models::llama::gguf::permute_rows;
use mopt_models::llama::{
    generate, load_gguf, token_ids, GenerateConfig, LlamaConfig, LlamaForCausalLM,
};

fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().try_to_vec().unwrap()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn max_abs(a: &[f32]) -> f32 {
    a.iter().map(|x| x.abs()).fold(0.0, f32::max)
}

/// The tiny config with weights large enough that the logits spread over several units (the
/// HF default of 0.02 would leave them near zero, where any comparison passes).
fn tiny() -> LlamaConfig {
    LlamaConfig {
        initializer_range: 0.3,
        ..LlamaConfig::tiny(64)
    }
}

/// Different heads, KV heads and FFN width in each layer, and a hidden width (24) that is not
/// heads × head_dim, as pruning leaves them.
fn pruned() -> LlamaConfig {
    LlamaConfig {
        hidden_size: 24,
        num_hidden_layers: 3,
        mopt_layer_heads: Some(vec![4, 2, 3]),
        mopt_layer_kv_heads: Some(vec![2, 1, 3]),
        mopt_layer_intermediate_sizes: Some(vec![64, 24, 8]),
        ..tiny()
    }
}

fn ids(n: usize, vocab: usize, salt: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 37 + salt * 11 + 5) % vocab) as u32)
        .collect()
}

fn batch(rows: &[Vec<u32>], device: &Device) -> Tensor<2, Int> {
    let flat: Vec<i64> = rows.iter().flatten().map(|&i| i64::from(i)).collect();
    Tensor::from_data(TensorData::new(flat, [rows.len(), rows[0].len()]), device)
}

/// Decode `rows` on the cache in chunks of `chunks` tokens; the logits of every position,
/// `[batch, seq, vocab]` flattened.
fn cached_logits(model: &LlamaForCausalLM, rows: &[Vec<u32>], chunks: &[usize]) -> Vec<f32> {
    let device = Device::flex();
    let mut cache = model.new_cache();
    let mut parts = Vec::new();
    let mut start = 0;
    for &n in chunks {
        let chunk: Vec<Vec<u32>> = rows.iter().map(|r| r[start..start + n].to_vec()).collect();
        parts.push(model.forward_cached(batch(&chunk, &device), &mut cache));
        start += n;
    }
    assert_eq!(start, rows[0].len());
    assert_eq!(cache.len(), start);
    values(Tensor::cat(parts, 1))
}

/// Prompt of 4 tokens at once, then 1 at a time, a chunk of 3 on top of the cache (its
/// causal mask offset by the past), then 1 more: the logits of one full pass, within 1e-5.
#[test]
fn kv_cache_decoding_equals_full_recomputation() {
    let device = Device::flex();
    for config in [tiny(), pruned()] {
        let model = LlamaForCausalLM::new(&config, &device);
        let rows = vec![ids(10, 64, 0), ids(10, 64, 1)];
        let full = values(model.forward(batch(&rows, &device)));
        let cached = cached_logits(&model, &rows, &[4, 1, 1, 3, 1]);
        let err = max_abs_diff(&full, &cached);
        assert!(max_abs(&full) > 1.0, "logits spread: {}", max_abs(&full));
        assert!(err <= 1e-5, "KV cache vs full: max |diff| {err}");
    }
}

/// Changing token 6 leaves the logits of positions 0..6 exactly as they were and changes the
/// later ones.
#[test]
fn causal_mask_hides_later_tokens() {
    let device = Device::flex();
    let model = LlamaForCausalLM::new(&tiny(), &device);
    let a = ids(10, 64, 0);
    let mut b = a.clone();
    b[6] = (b[6] + 1) % 64;
    let la = values(model.forward(token_ids(&a, &device)));
    let lb = values(model.forward(token_ids(&b, &device)));
    let v = 64;
    assert_eq!(
        max_abs_diff(&la[..6 * v], &lb[..6 * v]),
        0.0,
        "positions before the change"
    );
    for p in 6..10 {
        let d = max_abs_diff(&la[p * v..(p + 1) * v], &lb[p * v..(p + 1) * v]);
        assert!(d > 1e-3, "position {p} sees the change: {d}");
    }
}

#[test]
fn config_json_round_trips_and_rebuilds_the_same_shapes() {
    let config = pruned();
    let json = serde_json::to_string(&config).unwrap();
    for key in [
        "\"mopt_layer_heads\":[4,2,3]",
        "\"mopt_layer_kv_heads\":[2,1,3]",
        "\"mopt_layer_intermediate_sizes\":[64,24,8]",
        "\"head_dim\":8",
        "\"rope_theta\":10000.0",
    ] {
        assert!(json.contains(key), "{key} in {json}");
    }
    assert_eq!(serde_json::from_str::<LlamaConfig>(&json).unwrap(), config);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    config.save(&path).unwrap();
    let back = LlamaConfig::from_file(&path).unwrap();
    assert_eq!(back, config);
    let device = Device::flex();
    let (a, b) = (
        LlamaForCausalLM::new(&config, &device),
        LlamaForCausalLM::new(&back, &device),
    );
    assert_eq!(a.num_params(), b.num_params());
    assert_eq!(a.num_params(), config.num_params());
    // A bad per-layer list is refused with its key named.
    std::fs::write(
        &path,
        json.replace(
            "\"mopt_layer_kv_heads\":[2,1,3]",
            "\"mopt_layer_kv_heads\":[2,1,2]",
        ),
    )
    .unwrap();
    let err = LlamaConfig::from_file(&path).unwrap_err().to_string();
    assert!(
        err.contains("bad model config") && err.contains("layer 2: 3 query heads cannot share 2"),
        "{err}"
    );
}

/// Every layer's own widths reach its modules, and the model runs end to end.
#[test]
fn non_uniform_config_builds_and_runs() {
    let device = Device::flex();
    let config = pruned();
    let model = LlamaForCausalLM::new(&config, &device);
    for (i, layer) in model.model.layers.iter().enumerate() {
        let a = &layer.self_attn;
        assert_eq!(
            (a.num_heads, a.num_kv_heads),
            (config.heads(i), config.kv_heads(i))
        );
        assert_eq!(a.q_proj.weight.dims(), [24, config.heads(i) * 8]);
        assert_eq!(a.k_proj.weight.dims(), [24, config.kv_heads(i) * 8]);
        assert_eq!(a.o_proj.weight.dims(), [config.heads(i) * 8, 24]);
        assert_eq!(layer.mlp.down_proj.weight.dims(), [config.ffn(i), 24]);
    }
    assert_eq!(model.num_params(), config.num_params());
    let logits = model.forward(token_ids(&ids(7, 64, 2), &device));
    assert_eq!(logits.dims(), [1, 7, 64]);
    assert!(values(logits).iter().all(|x| x.is_finite()));
}

/// Greedy generation on the cache picks, at every step, the argmax of a full pass over the
/// prompt and the tokens so far; seeded sampling repeats for its seed.
#[test]
fn generation_on_the_cache_follows_full_passes() {
    let device = Device::flex();
    let model = LlamaForCausalLM::new(&tiny(), &device);
    let prompt = ids(5, 64, 3);
    let new = generate(&model, &prompt, &GenerateConfig::greedy(8));
    assert_eq!(new.len(), 8);
    let mut seq = prompt.clone();
    for &t in &new {
        let logits = values(model.forward(token_ids(&seq, &device)));
        let last = &logits[(seq.len() - 1) * 64..];
        let best = last
            .iter()
            .enumerate()
            .fold(0, |b, (i, &x)| if x > last[b] { i } else { b });
        assert_eq!(t as usize, best, "after {seq:?}");
        seq.push(t);
    }
    // Stopping after a token ends at its first occurrence, included.
    let first = new.iter().position(|&t| t == new[2]).unwrap();
    let stop = GenerateConfig::greedy(8).with_stop_tokens([new[2]]);
    assert_eq!(generate(&model, &prompt, &stop), new[..=first]);
    let sampled = |seed| generate(&model, &prompt, &GenerateConfig::sampled(12, 1.5, 10, seed));
    assert_eq!(sampled(1), sampled(1));
    assert_ne!(sampled(1), sampled(2));
}

/// Transposed `[out, in]` row-major rows of a Burn `[in, out]` weight.
fn out_in(w: Tensor<2>) -> Vec<f32> {
    values(w.transpose())
}

/// Write `model` as llama.cpp does: GGUF names, dims fastest-first, Q and K rows permuted for
/// the interleaved RoPE, F32 tensors; per-layer widths as metadata arrays when they differ.
fn write_llama_gguf(model: &LlamaForCausalLM, c: &LlamaConfig, path: &Path) {
    let mut w = GgufWriter::new(path);
    let u32s = |v: Vec<usize>| Value::from(v.into_iter().map(|x| x as u32).collect::<Vec<_>>());
    let per_layer = |v: Vec<usize>| {
        if v.iter().all(|&x| x == v[0]) {
            Value::U32(v[0] as u32)
        } else {
            u32s(v)
        }
    };
    w.metadata("general.architecture", "llama").unwrap();
    w.metadata("llama.block_count", c.num_hidden_layers as u32)
        .unwrap();
    w.metadata("llama.embedding_length", c.hidden_size as u32)
        .unwrap();
    w.metadata("llama.context_length", c.max_position_embeddings as u32)
        .unwrap();
    w.metadata("llama.feed_forward_length", per_layer(c.layer_ffn()))
        .unwrap();
    w.metadata("llama.attention.head_count", per_layer(c.layer_heads()))
        .unwrap();
    w.metadata(
        "llama.attention.head_count_kv",
        per_layer(c.layer_kv_heads()),
    )
    .unwrap();
    w.metadata("llama.attention.key_length", c.head_dim() as u32)
        .unwrap();
    w.metadata("llama.rope.freq_base", c.rope_theta as f32)
        .unwrap();
    w.metadata(
        "llama.attention.layer_norm_rms_epsilon",
        c.rms_norm_eps as f32,
    )
    .unwrap();
    let (h, d) = (c.hidden_size as u64, c.head_dim());
    let mut put = |name: &str, dims: &[u64], v: Vec<f32>| {
        w.tensor(name, dims, &v, GgmlType::F32).unwrap();
    };
    let m = &model.model;
    put(
        "token_embd.weight",
        &[h, c.vocab_size as u64],
        values(m.embed_tokens.weight.val()),
    );
    for (i, l) in m.layers.iter().enumerate() {
        let lin = |x: &burn::nn::Linear| {
            let [d_in, d_out] = x.weight.dims();
            ([d_in as u64, d_out as u64], out_in(x.weight.val()), d_in)
        };
        let a = &l.self_attn;
        for (part, linear, rope) in [
            ("attn_q", &a.q_proj, true),
            ("attn_k", &a.k_proj, true),
            ("attn_v", &a.v_proj, false),
            ("attn_output", &a.o_proj, false),
            ("ffn_gate", &l.mlp.gate_proj, false),
            ("ffn_up", &l.mlp.up_proj, false),
            ("ffn_down", &l.mlp.down_proj, false),
        ] {
            let (dims, mut v, cols) = lin(linear);
            if rope {
                v = permute_rows(&v, cols, d);
            }
            put(&format!("blk.{i}.{part}.weight"), &dims, v);
        }
        put(
            &format!("blk.{i}.attn_norm.weight"),
            &[h],
            values(l.input_layernorm.weight.val()),
        );
        put(
            &format!("blk.{i}.ffn_norm.weight"),
            &[h],
            values(l.post_attention_layernorm.weight.val()),
        );
    }
    put("output_norm.weight", &[h], values(m.norm.weight.val()));
    if let Some(head) = &model.lm_head {
        put(
            "output.weight",
            &[h, c.vocab_size as u64],
            out_in(head.weight.val()),
        );
    }
    w.write().unwrap();
}

/// A model written in llama.cpp's layout (Q/K permuted) loads back with the same config and
/// the same logits: the loader undoes the permutation and the transposes. Tied and untied
/// heads, uniform and per-layer widths.
#[test]
fn gguf_in_llama_cpp_layout_loads_back_exactly() {
    let device = Device::flex();
    let dir = tempfile::tempdir().unwrap();
    let untied = LlamaConfig {
        tie_word_embeddings: false,
        ..pruned()
    };
    for (n, config) in [tiny(), untied].into_iter().enumerate() {
        let model = LlamaForCausalLM::new(&config, &device);
        let path = dir.path().join(format!("tiny{n}.gguf"));
        write_llama_gguf(&model, &config, &path);
        let (back_config, back) = load_gguf(&path, &device).unwrap();
        assert_eq!(back_config.layer_heads(), config.layer_heads());
        assert_eq!(back_config.layer_kv_heads(), config.layer_kv_heads());
        assert_eq!(back_config.layer_ffn(), config.layer_ffn());
        assert_eq!(back_config.tie_word_embeddings, config.tie_word_embeddings);
        assert_eq!(back_config.rope_theta, config.rope_theta);
        let input = token_ids(&ids(9, 64, 4), &device);
        let err = max_abs_diff(
            &values(model.forward(input.clone())),
            &values(back.forward(input)),
        );
        assert!(err <= 1e-6, "config {n}: {err}");
    }
    // A file that is not a Llama GGUF names the problem.
    let bad = dir.path().join("bad.gguf");
    std::fs::write(&bad, b"not a gguf").unwrap();
    let err = load_gguf(&bad, &device).unwrap_err().to_string();
    assert!(err.contains("not a GGUF file"), "{err}");
}

// ---- The real file ----------------------------------------------------------------------

/// The SmolLM2 file; fails (never skips) with the command that fetches it.
fn smollm2() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../datasets/data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.is_file(),
        "test data missing ({}): run `datasets/fetch.sh --small` first",
        p.display()
    );
    p
}

fn reference() -> serde_json::Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/smollm2_reference.json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap()
}

fn u32s(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The prompt's ids from mopt's tokenizer, checked against transformers'.
fn prompt(path: &Path, fixture: &serde_json::Value) -> Vec<u32> {
    let tokenizer = GgufTokenizer::from_gguf(&Gguf::open(path).unwrap()).unwrap();
    let ids = tokenizer.encode(fixture["text"].as_str().unwrap()).unwrap();
    assert_eq!(ids, u32s(&fixture["input_ids"]), "token ids");
    ids
}

#[test]
fn smollm2_config_from_gguf() {
    let (config, model) = load_gguf(&smollm2(), &Device::flex()).unwrap();
    assert_eq!(
        (
            config.num_hidden_layers,
            config.hidden_size,
            config.intermediate_size
        ),
        (30, 576, 1536)
    );
    assert_eq!(
        (config.heads(29), config.kv_heads(29), config.head_dim()),
        (9, 3, 64)
    );
    assert_eq!((config.vocab_size, config.rope_theta), (49152, 1e5));
    assert_eq!(config.rms_norm_eps, f64::from(1e-5f32));
    assert!(config.tie_word_embeddings && model.lm_head.is_none());
    assert_eq!(
        (config.bos_token_id, config.eos_token_id),
        (Some(1), Some(2))
    );
    assert_eq!(model.num_params(), config.num_params());
    assert_eq!(config.num_params(), 134_515_008);
}

/// Logits on a Shakespeare line against transformers': at every position, our logits at
/// transformers' top-50 tokens within 1e-4 of the largest (relative), the same top token, and
/// the sum of all 49,152 logits within 1e-4 of their absolute sum.
#[test]
fn smollm2_logits_match_transformers() {
    let path = smollm2();
    let fixture = reference();
    let ids = prompt(&path, &fixture);
    let device = Device::flex();
    let (_, model) = load_gguf(&path, &device).unwrap();
    let start = std::time::Instant::now();
    let logits = values(model.forward(token_ids(&ids, &device)));
    let took = start.elapsed();
    let vocab = 49152;
    let (mut worst_err, mut worst_scale) = (0.0f64, 0.0f64);
    let mut worst_sum = 0.0f64;
    for pos in fixture["positions"].as_array().unwrap() {
        let p = pos["position"].as_u64().unwrap() as usize;
        let row = &logits[p * vocab..(p + 1) * vocab];
        let top = u32s(&pos["top_indices"]);
        let want: Vec<f64> = pos["top_logits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        for (&i, &w) in top.iter().zip(&want) {
            worst_err = worst_err.max((f64::from(row[i as usize]) - w).abs());
            worst_scale = worst_scale.max(w.abs());
        }
        let argmax = row
            .iter()
            .enumerate()
            .fold(0, |b, (i, &x)| if x > row[b] { i } else { b });
        assert_eq!(argmax as u32, top[0], "top token at position {p}");
        let sum: f64 = row.iter().map(|&x| f64::from(x)).sum();
        let rel = (sum - pos["sum"].as_f64().unwrap()).abs() / pos["abs_sum"].as_f64().unwrap();
        worst_sum = worst_sum.max(rel);
    }
    let rel = worst_err / worst_scale;
    println!(
        "SmolLM2 vs transformers over {} positions: max |a-b| / max |b| = {rel:.3e} \
         (max |a-b| {worst_err:.3e}); worst |sum a - sum b| / sum |b| = {worst_sum:.3e}; \
         forward of {} tokens {took:?}",
        ids.len(),
        ids.len()
    );
    assert!(rel <= 1e-4, "relative logit error {rel:.3e}");
    assert!(worst_sum <= 1e-4, "logit sums differ: {worst_sum:.3e}");
}

/// Greedy generation of 32 tokens on the KV cache: transformers' tokens exactly.
#[test]
fn smollm2_greedy_generation_matches_transformers() {
    let path = smollm2();
    let fixture = reference();
    let ids = prompt(&path, &fixture);
    let device = Device::flex();
    let (config, model) = load_gguf(&path, &device).unwrap();
    let want = u32s(&fixture["greedy_new_tokens"]);
    let max_new = fixture["max_new_tokens"].as_u64().unwrap() as usize;
    let eos = fixture["eos_token_id"].as_u64().unwrap() as u32;
    assert_eq!(config.eos_token_id, Some(eos));
    let start = std::time::Instant::now();
    let got = generate(
        &model,
        &ids,
        &GenerateConfig::greedy(max_new).with_stop_tokens([eos]),
    );
    println!("generated {} tokens in {:?}", got.len(), start.elapsed());
    let tokenizer = GgufTokenizer::from_gguf(&Gguf::open(&path).unwrap()).unwrap();
    assert_eq!(
        got,
        want,
        "ours: {:?}\ntransformers': {:?}",
        tokenizer.decode(&got).unwrap(),
        fixture["greedy_text"]
    );
}
