//! Writing a Llama as a GGUF file (llama.cpp's format) through `mopt-gguf`: the inverse of
//! [`super::gguf`]. What [`write_gguf`] writes, [`load_gguf`](super::load_gguf) reads back as
//! the same model, bit for bit in F32, so that a pruned model runs in llama.cpp.
//!
//! - Metadata: `general.architecture = llama`, `general.file_type` (llama.cpp's `llama_ftype`:
//!   0 F32, 1 F16, 7 Q8_0), `general.quantization_version = 2`, and the `llama.*` keys
//!   [`config_from_gguf`](super::config_from_gguf) reads: `vocab_size`, `context_length`,
//!   `embedding_length`, `block_count`, `feed_forward_length`, `attention.head_count`,
//!   `attention.head_count_kv` (each a u32, or a u32 array of one per layer when the layers
//!   differ, as after pruning), `rope.dimension_count` (the head width: Llama rotates all of
//!   it), `attention.key_length` and `attention.value_length` (only when the head width is not
//!   `embedding_length / head_count`, llama.cpp's default), `attention.layer_norm_rms_epsilon`
//!   and `rope.freq_base` (f32, the type llama.cpp reads). Then the tokenizer: every
//!   `tokenizer.*` key of the file the model came from, with the bos/eos ids the config holds.
//! - Tensors: `token_embd`, `blk.{i}.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm,
//!   ffn_gate, ffn_up, ffn_down}`, `output_norm`, and `output` only when the head is not tied.
//!   Burn's `[in, out]` weights are written as PyTorch's `[out, in]` rows (GGUF dims `[in,
//!   out]`), the rows of Q and K permuted within each head with [`permute_rows`] for llama.cpp's
//!   interleaved RoPE (the loader's [`unpermute_rows`](super::gguf::unpermute_rows) undoes it).
//!   Norms are always F32; the embedding table and every projection are written in the type
//!   asked for: F32 (exact), F16 (nearest, ties to even) or Q8_0 (ggml's
//!   `quantize_row_q8_0_ref`, which needs rows of a multiple of 32 values).
//! - Everything a [`LlamaConfig`] holds, GGUF holds: per-layer query heads, KV heads and FFN
//!   widths, a head width other than `hidden / heads`, a tied or untied head. The config read
//!   back differs only where GGUF stores less: `rms_norm_eps` and `rope_theta` become f32 (the
//!   model computes with them in f32, so the logits do not move), a uniform per-layer list comes
//!   back as one number, `initializer_range` is not stored. What a *model* can hold beyond its
//!   config is refused by name ([`ModelError::Inexpressible`]) before anything is written: a
//!   projection with a bias, an RMSNorm epsilon or a RoPE other than the config's, a layer
//!   whose heads, head width or tensor shapes differ from the config's (GGUF has one head width
//!   and one hidden width for all layers), and a quantized model (a `ptq` / `qat` output): its
//!   fake-quant scales have no place in this writer, and its float weights alone are not the
//!   model that was evaluated.

use std::path::Path;

use burn::module::Param;
use burn::nn::Linear;
use burn::prelude::*;
use mopt_gguf::{Array, GgmlType, GgufError, GgufWriter, Value};

use super::config::LlamaConfig;
use super::gguf::permute_rows;
use super::model::{LlamaDecoderLayer, LlamaForCausalLM, LlamaRmsNorm};
use crate::error::ModelError;
use mopt_core::Quantizable;

const TOKENS: &str = "tokenizer.ggml.tokens";
const MODEL: &str = "tokenizer.ggml.model";
const BOS: &str = "tokenizer.ggml.bos_token_id";
const EOS: &str = "tokenizer.ggml.eos_token_id";

/// Where a tensor's values come from.
enum Source<'m> {
    /// An RMSNorm weight, as it is (always F32).
    Norm(&'m Param<Tensor<1>>),
    /// The embedding table `[vocab, hidden]`: already GGUF's rows.
    Table(&'m Param<Tensor<2>>),
    /// A Burn `[in, out]` weight, written as `[out, in]` rows; Q and K rows permuted for RoPE.
    Linear { linear: &'m Linear, rope: bool },
}

/// One tensor to write: its GGUF name, the Burn module it comes from, and the Burn shape the
/// config says it has.
struct Planned<'m> {
    name: String,
    module: String,
    shape: Vec<usize>,
    source: Source<'m>,
}

impl Planned<'_> {
    /// The GGUF dims (`ne[0]` first): Burn's `[in, out]` for a projection, the table's
    /// `[vocab, hidden]` reversed.
    fn dims(&self) -> Vec<u64> {
        let dims = self.shape.iter().map(|&d| d as u64);
        match self.source {
            Source::Table(_) => dims.rev().collect(),
            _ => dims.collect(),
        }
    }

    fn burn_shape(&self) -> Vec<usize> {
        match self.source {
            Source::Norm(p) => p.val().dims().to_vec(),
            Source::Table(p) => p.val().dims().to_vec(),
            Source::Linear { linear, .. } => linear.weight.val().dims().to_vec(),
        }
    }
}

fn refuse(path: &Path, what: impl Into<String>, reason: impl Into<String>) -> ModelError {
    ModelError::Inexpressible {
        path: path.to_path_buf(),
        what: what.into(),
        reason: reason.into(),
    }
}

/// A `mopt-gguf` error while writing, without repeating the path it already put first.
fn save_error(path: &Path, e: GgufError) -> ModelError {
    match e {
        GgufError::Io { source, .. } => ModelError::Io {
            path: path.to_path_buf(),
            source,
        },
        e => {
            let message = e.to_string();
            let prefix = format!("{}: ", path.display());
            ModelError::Save {
                path: path.to_path_buf(),
                message: message
                    .strip_prefix(&prefix)
                    .unwrap_or(&message)
                    .to_string(),
            }
        }
    }
}

/// `x` as the u32 GGUF stores counts in.
fn u32_of(path: &Path, what: &str, x: usize) -> Result<u32, ModelError> {
    u32::try_from(x).map_err(|_| refuse(path, what, format!("{x} does not fit a u32")))
}

/// `x` as the f32 llama.cpp reads: positive and finite.
fn f32_of(path: &Path, what: &str, x: f64) -> Result<f32, ModelError> {
    let y = x as f32;
    if !(y > 0.0 && y.is_finite()) {
        return Err(refuse(path, what, format!("{x} is {y} as an f32")));
    }
    Ok(y)
}

/// `llama_ftype` of a file whose weights are all `dtype`.
fn file_type(path: &Path, dtype: GgmlType) -> Result<u32, ModelError> {
    match dtype {
        GgmlType::F32 => Ok(0),
        GgmlType::F16 => Ok(1),
        GgmlType::Q8_0 => Ok(7),
        other => Err(refuse(
            path,
            format!("weights as {other}"),
            "only F32, F16 and Q8_0 are written",
        )),
    }
}

/// The `general.*` and `llama.*` metadata of `c`.
fn llama_metadata(
    c: &LlamaConfig,
    dtype: GgmlType,
    path: &Path,
) -> Result<Vec<(String, Value)>, ModelError> {
    let n = |key: &str, x: usize| u32_of(path, key, x).map(Value::U32);
    // One number when every layer has it, else one per layer (what the reader turns into
    // per-layer widths).
    let per_layer = |key: &str, v: Vec<usize>, default: usize| -> Result<Value, ModelError> {
        match v.first() {
            Some(&first) if v.iter().any(|&x| x != first) => {
                let v = v.into_iter().map(|x| u32_of(path, key, x));
                Ok(Value::Array(Array::U32(v.collect::<Result<_, _>>()?)))
            }
            first => n(key, first.copied().unwrap_or(default)),
        }
    };
    let (d, heads) = (c.head_dim(), c.layer_heads());
    let heads0 = heads.first().copied().unwrap_or(c.num_attention_heads);
    let mut m = vec![
        ("general.architecture", Value::from("llama")),
        ("general.file_type", Value::U32(file_type(path, dtype)?)),
        ("general.quantization_version", Value::U32(2)),
        ("llama.vocab_size", n("vocab_size", c.vocab_size)?),
        (
            "llama.context_length",
            n("max_position_embeddings", c.max_position_embeddings)?,
        ),
        ("llama.embedding_length", n("hidden_size", c.hidden_size)?),
        (
            "llama.block_count",
            n("num_hidden_layers", c.num_hidden_layers)?,
        ),
        (
            "llama.feed_forward_length",
            per_layer("intermediate_size", c.layer_ffn(), c.intermediate_size)?,
        ),
        (
            "llama.attention.head_count",
            per_layer("num_attention_heads", heads, c.num_attention_heads)?,
        ),
        (
            "llama.attention.head_count_kv",
            per_layer(
                "num_key_value_heads",
                c.layer_kv_heads(),
                c.kv_heads_default(),
            )?,
        ),
        ("llama.rope.dimension_count", n("head_dim", d)?),
        (
            "llama.attention.layer_norm_rms_epsilon",
            Value::F32(f32_of(path, "rms_norm_eps", c.rms_norm_eps)?),
        ),
        (
            "llama.rope.freq_base",
            Value::F32(f32_of(path, "rope_theta", c.rope_theta)?),
        ),
    ];
    if heads0.checked_mul(d) != Some(c.hidden_size) {
        m.push(("llama.attention.key_length", n("head_dim", d)?));
        m.push(("llama.attention.value_length", n("head_dim", d)?));
    }
    Ok(m.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

/// The `tokenizer.*` keys of `source` (others skipped), bos/eos replaced by the config's when it
/// has them, checked as llama.cpp needs them.
fn tokenizer_metadata<'a>(
    source: impl IntoIterator<Item = (&'a str, &'a Value)>,
    c: &LlamaConfig,
    path: &Path,
) -> Result<Vec<(String, Value)>, ModelError> {
    let mut keys: Vec<(String, Value)> = source
        .into_iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    for (key, id) in [(BOS, c.bos_token_id), (EOS, c.eos_token_id)] {
        let Some(id) = id else { continue };
        match keys.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = Value::U32(id),
            None => keys.push((key.to_string(), Value::U32(id))),
        }
    }
    check_tokenizer(&keys, c.vocab_size, path)?;
    Ok(keys)
}

/// llama.cpp needs `tokenizer.ggml.model`, one token a row of the embedding table, per-token
/// arrays of the same length, and special token ids that are u32s inside the vocabulary.
fn check_tokenizer(keys: &[(String, Value)], vocab: usize, path: &Path) -> Result<(), ModelError> {
    let get = |key: &str| keys.iter().find(|(k, _)| k == key).map(|(_, v)| v);
    let hint = "pass the tokenizer metadata of the GGUF file the model came from";
    match get(MODEL) {
        Some(Value::String(_)) => {}
        Some(v) => {
            return Err(refuse(
                path,
                MODEL,
                format!("a string, not {}", v.describe()),
            ))
        }
        None => return Err(refuse(path, MODEL, format!("missing: {hint}"))),
    }
    match get(TOKENS) {
        Some(Value::Array(Array::String(t))) if t.len() == vocab => {}
        Some(Value::Array(Array::String(t))) => {
            let reason = format!(
                "{} tokens, but the embedding table has {vocab} rows (llama.cpp needs one each)",
                t.len()
            );
            return Err(refuse(path, TOKENS, reason));
        }
        Some(v) => {
            let reason = format!("an array of strings, not {}", v.describe());
            return Err(refuse(path, TOKENS, reason));
        }
        None => return Err(refuse(path, TOKENS, format!("missing: {hint}"))),
    }
    for (key, value) in keys {
        let per_token = key.ends_with(".scores") || key.ends_with(".token_type");
        let special = key.ends_with("_token_id");
        let reason = match value {
            Value::Array(a) if per_token && a.len() != vocab => {
                format!("{} entries for {vocab} tokens", a.len())
            }
            Value::U32(id) if special && *id as usize >= vocab => {
                format!("id {id} is outside the vocabulary of {vocab}")
            }
            Value::U32(_) => continue,
            v if special => format!("a u32 (what llama.cpp reads), not {}", v.describe()),
            _ => continue,
        };
        return Err(refuse(path, key, reason));
    }
    Ok(())
}

/// A norm's epsilon must be the one GGUF stores for all of them.
fn check_norm(
    n: &LlamaRmsNorm,
    name: &str,
    c: &LlamaConfig,
    path: &Path,
) -> Result<(), ModelError> {
    if n.eps != c.rms_norm_eps {
        let reason = format!(
            "epsilon {} differs from the config's rms_norm_eps {} (GGUF has one for every norm)",
            n.eps, c.rms_norm_eps
        );
        return Err(refuse(path, format!("RMSNorm `{name}`"), reason));
    }
    Ok(())
}

/// Layer `i`'s heads and norms as the config says (GGUF holds no more than the config).
fn check_layer(
    l: &LlamaDecoderLayer,
    i: usize,
    c: &LlamaConfig,
    path: &Path,
) -> Result<(), ModelError> {
    let a = &l.self_attn;
    let got = (a.num_heads, a.num_kv_heads, a.head_dim);
    let want = (c.heads(i), c.kv_heads(i), c.head_dim());
    if got != want {
        let reason = format!(
            "(heads, KV heads, head width) = {got:?}, the config's are {want:?}; GGUF has one \
             head width for every layer"
        );
        return Err(refuse(
            path,
            format!("layer {i} (model.layers.{i}.self_attn)"),
            reason,
        ));
    }
    check_norm(
        &l.input_layernorm,
        &format!("model.layers.{i}.input_layernorm"),
        c,
        path,
    )?;
    let post = format!("model.layers.{i}.post_attention_layernorm");
    check_norm(&l.post_attention_layernorm, &post, c, path)
}

/// A quantized model (its config records a quantization, or a projection holds quantizers) is
/// refused: this writer has no place for fake-quant scales.
fn check_float(m: &LlamaForCausalLM, c: &LlamaConfig, path: &Path) -> Result<(), ModelError> {
    let layer = m.quant_slots_ref().into_iter().find(|s| s.quant.is_some());
    let what = match (&layer, &c.mopt_quant) {
        (Some(s), _) => format!("the quantized projection `{}`", s.path),
        (None, Some(q)) => format!(
            "a quantized model (the config's mopt_quant lists {} projections)",
            q.layers.len()
        ),
        (None, None) => return Ok(()),
    };
    let reason = "fake-quant scales have no place in this GGUF writer (it writes float weights, \
                  or Q8_0 with its own block scales), and the float weights alone are not the \
                  model that was evaluated; write the checkpoint from before the `ptq` / `qat` \
                  stage (as gguf-q8_0 for llama.cpp's 8-bit weights)";
    Err(refuse(path, what, reason))
}

/// What of the model lies outside its config, or outside what GGUF holds.
fn check_model(m: &LlamaForCausalLM, c: &LlamaConfig, path: &Path) -> Result<(), ModelError> {
    c.check().map_err(|e| refuse(path, "the config", e))?;
    check_float(m, c, path)?;
    let layers = m.model.layers.len();
    if layers != c.num_hidden_layers {
        let reason = format!("{layers} layers, the config has {}", c.num_hidden_layers);
        return Err(refuse(path, "the model", reason));
    }
    if m.lm_head.is_none() != c.tie_word_embeddings {
        let reason = format!(
            "the model's head is {}, the config says tie_word_embeddings = {}",
            if m.lm_head.is_none() {
                "tied"
            } else {
                "its own"
            },
            c.tie_word_embeddings
        );
        return Err(refuse(path, "lm_head", reason));
    }
    let rope = &m.model.rope;
    if (rope.head_dim, rope.theta) != (c.head_dim(), c.rope_theta) {
        let reason = format!(
            "head width {} and base {}, the config's are {} and {}",
            rope.head_dim,
            rope.theta,
            c.head_dim(),
            c.rope_theta
        );
        return Err(refuse(path, "RoPE (model.rope)", reason));
    }
    for (i, l) in m.model.layers.iter().enumerate() {
        check_layer(l, i, c, path)?;
    }
    check_norm(&m.model.norm, "model.norm", c, path)
}

/// The tensors of layer `i`, with the shapes the config gives them.
fn plan_layer<'m>(l: &'m LlamaDecoderLayer, i: usize, c: &LlamaConfig) -> Vec<Planned<'m>> {
    let (h, d) = (c.hidden_size, c.head_dim());
    let (q, kv, f) = (c.heads(i) * d, c.kv_heads(i) * d, c.ffn(i));
    let (a, mlp) = (&l.self_attn, &l.mlp);
    let at = |part: &str, module: &str, shape: Vec<usize>, source| Planned {
        name: format!("blk.{i}.{part}.weight"),
        module: format!("model.layers.{i}.{module}"),
        shape,
        source,
    };
    let lin = |linear, rope| Source::Linear { linear, rope };
    vec![
        at(
            "attn_norm",
            "input_layernorm",
            vec![h],
            Source::Norm(&l.input_layernorm.weight),
        ),
        at(
            "attn_q",
            "self_attn.q_proj",
            vec![h, q],
            lin(&a.q_proj, true),
        ),
        at(
            "attn_k",
            "self_attn.k_proj",
            vec![h, kv],
            lin(&a.k_proj, true),
        ),
        at(
            "attn_v",
            "self_attn.v_proj",
            vec![h, kv],
            lin(&a.v_proj, false),
        ),
        at(
            "attn_output",
            "self_attn.o_proj",
            vec![q, h],
            lin(&a.o_proj, false),
        ),
        at(
            "ffn_norm",
            "post_attention_layernorm",
            vec![h],
            Source::Norm(&l.post_attention_layernorm.weight),
        ),
        at(
            "ffn_gate",
            "mlp.gate_proj",
            vec![h, f],
            lin(&mlp.gate_proj, false),
        ),
        at(
            "ffn_up",
            "mlp.up_proj",
            vec![h, f],
            lin(&mlp.up_proj, false),
        ),
        at(
            "ffn_down",
            "mlp.down_proj",
            vec![f, h],
            lin(&mlp.down_proj, false),
        ),
    ]
}

/// Every tensor of the model, in the order written.
fn plan<'m>(m: &'m LlamaForCausalLM, c: &LlamaConfig) -> Vec<Planned<'m>> {
    let (h, vocab) = (c.hidden_size, c.vocab_size);
    let one = |name: &str, module: &str, shape: Vec<usize>, source| Planned {
        name: name.to_string(),
        module: module.to_string(),
        shape,
        source,
    };
    let mut out = vec![one(
        "token_embd.weight",
        "model.embed_tokens",
        vec![vocab, h],
        Source::Table(&m.model.embed_tokens.weight),
    )];
    for (i, l) in m.model.layers.iter().enumerate() {
        out.extend(plan_layer(l, i, c));
    }
    let norm = Source::Norm(&m.model.norm.weight);
    out.push(one("output_norm.weight", "model.norm", vec![h], norm));
    if let Some(head) = &m.lm_head {
        let source = Source::Linear {
            linear: head,
            rope: false,
        };
        out.push(one("output.weight", "lm_head", vec![h, vocab], source));
    }
    out
}

/// Shapes as the config says, no biases, rows Q8_0 can hold.
fn check_plan(plan: &[Planned], dtype: GgmlType, path: &Path) -> Result<(), ModelError> {
    for t in plan {
        let what = || format!("tensor `{}` ({})", t.name, t.module);
        let got = t.burn_shape();
        if got != t.shape {
            let reason = format!(
                "Burn shape {got:?}, the config needs {:?} (GGUF has one hidden width and one \
                 head width for every layer)",
                t.shape
            );
            return Err(refuse(path, what(), reason));
        }
        if let Source::Linear { linear, .. } = t.source {
            if linear.bias.is_some() {
                let bias = t.name.replace(".weight", ".bias");
                let reason =
                    "Llama's projections have no bias: the GGUF reader has no place for it";
                return Err(refuse(
                    path,
                    format!("`{bias}` ({}.bias)", t.module),
                    reason,
                ));
            }
        }
        let row = t.dims()[0];
        let quantized = !matches!(t.source, Source::Norm(_)) && dtype == GgmlType::Q8_0;
        if quantized && !row.is_multiple_of(32) {
            let reason = format!(
                "rows of {row} values; Q8_0 needs a multiple of 32 (prune with ffn/hidden \
                 multiples of 32, or write F16)"
            );
            return Err(refuse(path, format!("{} as Q8_0", what()), reason));
        }
    }
    Ok(())
}

/// A tensor's values on the host, as f32, in row-major order.
fn host<const D: usize>(t: Tensor<D>, module: &str, path: &Path) -> Result<Vec<f32>, ModelError> {
    t.try_to_vec_as::<f32>().map_err(|e| ModelError::Save {
        path: path.to_path_buf(),
        message: format!("reading the weight of {module}: {e}"),
    })
}

/// The values of `t` in GGUF's storage order.
fn gguf_values(t: &Planned, head_dim: usize, path: &Path) -> Result<Vec<f32>, ModelError> {
    match t.source {
        Source::Norm(p) => host(p.val(), &t.module, path),
        Source::Table(p) => host(p.val(), &t.module, path),
        Source::Linear { linear, rope } => {
            let rows = host(linear.weight.val().transpose(), &t.module, path)?;
            let cols = t.shape[0];
            Ok(if rope {
                permute_rows(&rows, cols, head_dim)
            } else {
                rows
            })
        }
    }
}

/// Write `model` (of `config`) to `path` as a llama.cpp GGUF file: the metadata and tensors the
/// module documentation lists, the embedding table and projections as `dtype` (F32, F16 or
/// Q8_0), the norms as F32, and the `tokenizer.*` keys of `tokenizer` (keys outside
/// `tokenizer.` are skipped, so a whole source file's metadata may be passed:
/// `gguf.metadata()` of the [`mopt_gguf::Gguf`] the model was loaded from). The config's bos and
/// eos ids, when it has them, replace the tokenizer's. The file is written atomically (a
/// temporary file renamed over `path`).
///
/// ```no_run
/// use burn::prelude::*;
/// use mopt_gguf::{GgmlType, Gguf};
/// use mopt_models::llama::{load_gguf, write_gguf};
///
/// let source = std::path::Path::new("datasets/data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
/// let (config, model) = load_gguf(source, &Device::flex())?;
/// // ... prune, fine-tune ...
/// let out = std::path::Path::new("smollm2-pruned.Q8_0.gguf");
/// write_gguf(&model, &config, Gguf::open(source)?.metadata(), out, GgmlType::Q8_0)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
///
/// [`ModelError::Inexpressible`], before anything is written, naming what cannot be written: a
/// `dtype` other than F32, F16 or Q8_0; an invalid config; a quantized model (fake-quant
/// scales have no place here); a model whose layer count, head
/// (tied or not), RoPE, per-layer heads or head width, RMSNorm epsilons or tensor shapes differ
/// from its config; a projection with a bias; a Q8_0 tensor whose rows are not a multiple of 32
/// values; a count above `u32::MAX` or an epsilon or RoPE base that is 0 or infinite as an f32;
/// tokenizer metadata without `tokenizer.ggml.model`, with a `tokenizer.ggml.tokens` of another
/// length than the vocabulary, per-token arrays of another length, or a special token id that
/// is not a u32 inside the vocabulary. [`ModelError::Save`] when a weight cannot be read back
/// from the device or the writer refuses a key (one given twice); [`ModelError::Io`] when the
/// file cannot be written.
pub fn write_gguf<'a>(
    model: &LlamaForCausalLM,
    config: &LlamaConfig,
    tokenizer: impl IntoIterator<Item = (&'a str, &'a Value)>,
    path: &Path,
    dtype: GgmlType,
) -> Result<(), ModelError> {
    file_type(path, dtype)?;
    check_model(model, config, path)?;
    let tensors = plan(model, config);
    check_plan(&tensors, dtype, path)?;
    let mut metadata = llama_metadata(config, dtype, path)?;
    metadata.extend(tokenizer_metadata(tokenizer, config, path)?);
    let mut w = GgufWriter::new(path);
    for (key, value) in metadata {
        w.metadata(&key, value).map_err(|e| save_error(path, e))?;
    }
    for t in &tensors {
        let values = gguf_values(t, config.head_dim(), path)?;
        let ty = match t.source {
            Source::Norm(_) => GgmlType::F32,
            _ => dtype,
        };
        w.tensor(&t.name, &t.dims(), &values, ty)
            .map_err(|e| save_error(path, e))?;
    }
    w.write().map_err(|e| save_error(path, e))
}
