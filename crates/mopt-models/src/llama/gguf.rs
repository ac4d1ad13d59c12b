//! Loading a Llama from a GGUF file (llama.cpp's format) through `mopt-gguf`, every weight
//! dequantized to f32.
//!
//! - The config comes from the `llama.*` metadata: `block_count`, `embedding_length`,
//!   `feed_forward_length`, `attention.head_count`, `attention.head_count_kv` (each a number, or
//!   an array of one per layer, which becomes the per-layer widths), `attention.key_length`
//!   (else `embedding_length / head_count`), `attention.layer_norm_rms_epsilon`,
//!   `rope.freq_base`, `context_length`; bos/eos from `tokenizer.ggml.*`. A file without
//!   `output.weight` has its head tied to `token_embd.weight`.
//! - Tensor names: `token_embd`, `blk.{i}.{attn_norm, attn_q, attn_k, attn_v, attn_output,
//!   ffn_norm, ffn_gate, ffn_up, ffn_down}`, `output_norm`, `output`. Every shape is checked
//!   against the config, and a tensor the model does not use is an error (for instance
//!   `rope_freqs`, Llama 3's RoPE scaling, which this model does not implement).
//! - GGUF dims are fastest-first: a PyTorch `[out, in]` weight reads back row-major as `[out,
//!   in]` ([`mopt_gguf::TensorInfo::shape`]) and is transposed to Burn's `[in, out]`.
//! - llama.cpp's converter permutes the rows of Q and K inside every head for its interleaved
//!   RoPE (pairs `(2i, 2i + 1)`); [`unpermute_rows`] restores the "rotate half" layout (pairs
//!   `(i, i + d/2)`) of Hugging Face and of this model, as transformers' GGUF loader does
//!   (`reverse_permute_weights`).

use std::collections::BTreeSet;
use std::path::Path;

use burn::module::Param;
use burn::nn::{Embedding, Linear};
use burn::prelude::*;
use mopt_gguf::{Array, Gguf, GgufError, Value};

use super::config::LlamaConfig;
use super::model::{
    LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM, LlamaMlp, LlamaModel, LlamaRmsNorm,
    RotaryEmbedding,
};
use crate::error::ModelError;

/// Where in a head row `r` of the Hugging Face layout sits in llama.cpp's: with `half = d/2`,
/// HF row `j·half + t` (`j ∈ {0, 1}`, `t < half`) is GGUF row `2t + j`.
fn gguf_row(r: usize, head_dim: usize) -> usize {
    let (head, within) = (r / head_dim, r % head_dim);
    let half = head_dim / 2;
    head * head_dim + 2 * (within % half) + within / half
}

/// llama.cpp's `permute` of a Q or K weight (`convert_hf_to_gguf.py`): rows of `[rows, cols]`
/// (row-major, PyTorch's `[out, in]`) reordered within each head of `head_dim` rows from the
/// "rotate half" layout to the interleaved one.
pub fn permute_rows(w: &[f32], cols: usize, head_dim: usize) -> Vec<f32> {
    let mut out = vec![0.0; w.len()];
    for (r, row) in w.chunks_exact(cols).enumerate() {
        let g = gguf_row(r, head_dim);
        out[g * cols..(g + 1) * cols].copy_from_slice(row);
    }
    out
}

/// The inverse of [`permute_rows`]: a GGUF Q or K weight back to the "rotate half" layout
/// (transformers' `reverse_permute_weights`).
pub fn unpermute_rows(w: &[f32], cols: usize, head_dim: usize) -> Vec<f32> {
    let rows = w.len() / cols;
    let mut out = Vec::with_capacity(w.len());
    for r in 0..rows {
        let g = gguf_row(r, head_dim);
        out.extend_from_slice(&w[g * cols..(g + 1) * cols]);
    }
    out
}

/// A load error naming the file, without repeating the path `mopt-gguf` already put first.
fn load_error(path: &Path, message: String, hint: &str) -> ModelError {
    let prefix = format!("{}: ", path.display());
    let message = message
        .strip_prefix(&prefix)
        .map(str::to_string)
        .unwrap_or(message);
    ModelError::Load {
        path: path.to_path_buf(),
        message,
        hint: hint.to_string(),
    }
}

const HINT: &str = "check that the file is a Llama GGUF (general.architecture = llama) \
                    with F32, F16, BF16, Q8_0, Q4_0 or Q4_1 tensors";

fn from_gguf(path: &Path, e: GgufError) -> ModelError {
    match e {
        GgufError::Io { source, .. } => ModelError::Io {
            path: path.to_path_buf(),
            source,
        },
        e => load_error(path, e.to_string(), HINT),
    }
}

/// A metadata number as an integer, whatever its stored type.
fn integer(v: &Value) -> Option<u64> {
    match *v {
        Value::U8(x) => Some(x.into()),
        Value::U16(x) => Some(x.into()),
        Value::U32(x) => Some(x.into()),
        Value::U64(x) => Some(x),
        Value::I8(x) => u64::try_from(x).ok(),
        Value::I16(x) => u64::try_from(x).ok(),
        Value::I32(x) => u64::try_from(x).ok(),
        Value::I64(x) => u64::try_from(x).ok(),
        _ => None,
    }
}

/// An integer array's elements.
fn integers(a: &Array) -> Option<Vec<u64>> {
    let v: Vec<u64> = match a {
        Array::U8(v) => v.iter().map(|&x| x.into()).collect(),
        Array::U16(v) => v.iter().map(|&x| x.into()).collect(),
        Array::U32(v) => v.iter().map(|&x| x.into()).collect(),
        Array::U64(v) => v.clone(),
        Array::I8(v) => v
            .iter()
            .map(|&x| u64::try_from(x).ok())
            .collect::<Option<_>>()?,
        Array::I16(v) => v
            .iter()
            .map(|&x| u64::try_from(x).ok())
            .collect::<Option<_>>()?,
        Array::I32(v) => v
            .iter()
            .map(|&x| u64::try_from(x).ok())
            .collect::<Option<_>>()?,
        Array::I64(v) => v
            .iter()
            .map(|&x| u64::try_from(x).ok())
            .collect::<Option<_>>()?,
        _ => return None,
    };
    Some(v)
}

/// A width of every layer: the first layer's, and the per-layer list when the layers differ.
type Width = (usize, Option<Vec<usize>>);

/// Reads the metadata of one file, each error naming the key.
struct Meta<'a> {
    gguf: &'a Gguf,
}

impl Meta<'_> {
    fn path(&self) -> &Path {
        self.gguf.path()
    }

    fn bad(&self, key: &str, what: String) -> ModelError {
        load_error(self.path(), format!("metadata key `{key}`: {what}"), HINT)
    }

    fn usize(&self, key: &str) -> Result<Option<usize>, ModelError> {
        match self.gguf.get(key) {
            None => Ok(None),
            Some(v) => integer(v)
                .and_then(|x| usize::try_from(x).ok())
                .map(Some)
                .ok_or_else(|| {
                    self.bad(key, format!("expected an integer, found {}", v.describe()))
                }),
        }
    }

    fn required(&self, key: &str) -> Result<usize, ModelError> {
        self.usize(key)?
            .ok_or_else(|| self.bad(key, "missing".to_string()))
    }

    fn float(&self, key: &str) -> Result<Option<f64>, ModelError> {
        match self.gguf.get(key) {
            None => Ok(None),
            Some(&Value::F32(x)) => Ok(Some(x.into())),
            Some(&Value::F64(x)) => Ok(Some(x)),
            Some(v) => Err(self.bad(key, format!("expected a float, found {}", v.describe()))),
        }
    }

    /// A width given once for every layer or as an array of one per layer.
    fn per_layer(&self, key: &str, layers: usize) -> Result<Option<Width>, ModelError> {
        let Some(v) = self.gguf.get(key) else {
            return Ok(None);
        };
        if let Value::Array(a) = v {
            let list: Vec<usize> = integers(a)
                .ok_or_else(|| self.bad(key, format!("expected integers, found {}", v.describe())))?
                .into_iter()
                .map(|x| x as usize)
                .collect();
            if list.len() != layers || list.is_empty() {
                return Err(self.bad(key, format!("{} entries for {layers} layers", list.len())));
            }
            let uniform = list.iter().all(|&x| x == list[0]);
            return Ok(Some((list[0], (!uniform).then_some(list))));
        }
        Ok(self.usize(key)?.map(|x| (x, None)))
    }
}

/// A metadata error for what plain Llama does not implement.
fn unsupported(path: &Path, key: &str, what: String) -> ModelError {
    load_error(
        path,
        format!("metadata key `{key}`: {what}"),
        "this model implements plain Llama: dense FFN, full-width RoPE without scaling",
    )
}

impl Meta<'_> {
    /// The file describes a plain Llama: its architecture, no experts, no RoPE scaling.
    fn check_plain(&self) -> Result<(), ModelError> {
        let arch = self
            .gguf
            .get_str("general.architecture")
            .map_err(|e| from_gguf(self.path(), e))?;
        if arch != "llama" {
            return Err(self.bad("general.architecture", format!("`{arch}` is not `llama`")));
        }
        if let Some(n) = self.usize("llama.expert_count")?.filter(|&n| n > 0) {
            let what = format!("{n} experts (mixture of experts)");
            return Err(unsupported(self.path(), "llama.expert_count", what));
        }
        if let Some(Value::String(kind)) = self.gguf.get("llama.rope.scaling.type") {
            if kind != "none" {
                let what = format!("RoPE scaling `{kind}`");
                return Err(unsupported(self.path(), "llama.rope.scaling.type", what));
            }
        }
        Ok(())
    }

    /// The head width: `key_length`, else `hidden / heads`; values and RoPE must span it all.
    fn head_dim(&self, hidden: usize, heads: usize) -> Result<usize, ModelError> {
        let head_dim = match self.usize("llama.attention.key_length")? {
            Some(d) => d,
            None => hidden / heads,
        };
        if let Some(v) = self
            .usize("llama.attention.value_length")?
            .filter(|&v| v != head_dim)
        {
            let what = format!("{v}, not the key length {head_dim}");
            return Err(unsupported(
                self.path(),
                "llama.attention.value_length",
                what,
            ));
        }
        if let Some(r) = self
            .usize("llama.rope.dimension_count")?
            .filter(|&r| r != head_dim)
        {
            let what = format!("RoPE on {r} of {head_dim} dims (partial rotary)");
            return Err(unsupported(self.path(), "llama.rope.dimension_count", what));
        }
        Ok(head_dim)
    }

    /// The vocabulary: the rows of `token_embd.weight` (`[vocab, hidden]`), which
    /// `llama.vocab_size` must agree with.
    fn vocab(&self, hidden: usize) -> Result<usize, ModelError> {
        let path = self.path();
        let embd = self
            .gguf
            .tensor_info("token_embd.weight")
            .map_err(|e| from_gguf(path, e))?;
        let vocab = match embd.shape().as_slice() {
            &[rows, cols] if cols as usize == hidden => rows as usize,
            other => {
                let what = format!(
                    "metadata key `llama.embedding_length` is {hidden}, but tensor \
                     `token_embd.weight` has shape {other:?} (row-major), not [vocab, {hidden}]"
                );
                let hint = "the metadata and the tensors disagree: the file is inconsistent; \
                            convert the model to GGUF again";
                return Err(load_error(path, what, hint));
            }
        };
        if let Some(v) = self.usize("llama.vocab_size")?.filter(|&v| v != vocab) {
            let what = format!("{v}, but token_embd.weight has {vocab} rows");
            return Err(self.bad("llama.vocab_size", what));
        }
        Ok(vocab)
    }
}

/// The Llama config a GGUF file describes (uniform widths unless its metadata gives them per
/// layer).
pub fn config_from_gguf(gguf: &Gguf) -> Result<LlamaConfig, ModelError> {
    let m = Meta { gguf };
    m.check_plain()?;
    let layers = m.required("llama.block_count")?;
    let hidden = m.required("llama.embedding_length")?;
    let (heads, layer_heads) = m
        .per_layer("llama.attention.head_count", layers)?
        .ok_or_else(|| m.bad("llama.attention.head_count", "missing".into()))?;
    let (kv_heads, layer_kv) = m
        .per_layer("llama.attention.head_count_kv", layers)?
        .unwrap_or((heads, layer_heads.clone()));
    let (ffn, layer_ffn) = m
        .per_layer("llama.feed_forward_length", layers)?
        .ok_or_else(|| m.bad("llama.feed_forward_length", "missing".into()))?;
    if heads == 0 {
        return Err(m.bad("llama.attention.head_count", "0 heads".into()));
    }
    let token =
        |key: &str| -> Result<Option<u32>, ModelError> { Ok(m.usize(key)?.map(|x| x as u32)) };
    let config = LlamaConfig {
        vocab_size: m.vocab(hidden)?,
        hidden_size: hidden,
        intermediate_size: ffn,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: Some(kv_heads),
        head_dim: Some(m.head_dim(hidden, heads)?),
        max_position_embeddings: m.usize("llama.context_length")?.unwrap_or(2048),
        rms_norm_eps: m
            .float("llama.attention.layer_norm_rms_epsilon")?
            .ok_or_else(|| m.bad("llama.attention.layer_norm_rms_epsilon", "missing".into()))?,
        rope_theta: m.float("llama.rope.freq_base")?.unwrap_or(10000.0),
        hidden_act: "silu".into(),
        tie_word_embeddings: gguf.tensor("output.weight").is_none(),
        bos_token_id: token("tokenizer.ggml.bos_token_id")?,
        eos_token_id: token("tokenizer.ggml.eos_token_id")?,
        initializer_range: 0.02,
        mopt_layer_heads: layer_heads,
        mopt_layer_kv_heads: layer_kv,
        mopt_layer_intermediate_sizes: layer_ffn,
        mopt_quant: None,
    };
    config.check().map_err(|e| {
        let what = format!("the metadata describes no valid model: {e}");
        load_error(gguf.path(), what, HINT)
    })?;
    Ok(config)
}

/// Reads tensors of one file into Burn parameters, checking shapes and recording which
/// tensors were used.
struct Tensors<'a> {
    gguf: &'a Gguf,
    device: &'a Device,
    used: BTreeSet<String>,
}

impl Tensors<'_> {
    /// Tensor `name` dequantized, row-major, after checking its shape.
    fn read(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>, ModelError> {
        let path = self.gguf.path();
        let info = self
            .gguf
            .tensor_info(name)
            .map_err(|e| from_gguf(path, e))?;
        let got: Vec<usize> = info.shape().iter().map(|&d| d as usize).collect();
        if got != shape {
            return Err(load_error(
                path,
                format!(
                    "tensor `{name}` has shape {got:?} (row-major), the config needs {shape:?}"
                ),
                "the metadata and the tensors disagree: the file is inconsistent",
            ));
        }
        self.used.insert(name.to_string());
        self.gguf.read_f32(name).map_err(|e| from_gguf(path, e))
    }

    fn vector(&mut self, name: &str, n: usize) -> Result<Param<Tensor<1>>, ModelError> {
        let v = self.read(name, &[n])?;
        Ok(Param::from_tensor(Tensor::from_data(
            TensorData::new(v, [n]),
            self.device,
        )))
    }

    fn norm(&mut self, name: &str, n: usize, eps: f64) -> Result<LlamaRmsNorm, ModelError> {
        Ok(LlamaRmsNorm {
            weight: self.vector(name, n)?,
            eps,
        })
    }

    /// A `[out, in]` weight as a bias-free Burn `Linear` (`[in, out]`), Q/K rows un-permuted
    /// when `rope_head_dim` is given.
    fn linear(
        &mut self,
        name: &str,
        d_in: usize,
        d_out: usize,
        rope_head_dim: Option<usize>,
    ) -> Result<Linear, ModelError> {
        let mut w = self.read(name, &[d_out, d_in])?;
        if let Some(d) = rope_head_dim {
            w = unpermute_rows(&w, d_in, d);
        }
        let mut t = vec![0.0f32; w.len()];
        for (r, row) in w.chunks_exact(d_in).enumerate() {
            for (c, &x) in row.iter().enumerate() {
                t[c * d_out + r] = x;
            }
        }
        Ok(Linear {
            weight: Param::from_tensor(Tensor::from_data(
                TensorData::new(t, [d_in, d_out]),
                self.device,
            )),
            bias: None,
        })
    }

    fn layer(&mut self, c: &LlamaConfig, i: usize) -> Result<LlamaDecoderLayer, ModelError> {
        let (h, d, eps) = (c.hidden_size, c.head_dim(), c.rms_norm_eps);
        let (q, kv, f) = (c.heads(i) * d, c.kv_heads(i) * d, c.ffn(i));
        let n = |part: &str| format!("blk.{i}.{part}.weight");
        Ok(LlamaDecoderLayer {
            self_attn: LlamaAttention {
                q_proj: self.linear(&n("attn_q"), h, q, Some(d))?,
                k_proj: self.linear(&n("attn_k"), h, kv, Some(d))?,
                v_proj: self.linear(&n("attn_v"), h, kv, None)?,
                o_proj: self.linear(&n("attn_output"), q, h, None)?,
                q_proj_quant: None,
                k_proj_quant: None,
                v_proj_quant: None,
                o_proj_quant: None,
                num_heads: c.heads(i),
                num_kv_heads: c.kv_heads(i),
                head_dim: d,
            },
            mlp: LlamaMlp {
                gate_proj: self.linear(&n("ffn_gate"), h, f, None)?,
                up_proj: self.linear(&n("ffn_up"), h, f, None)?,
                down_proj: self.linear(&n("ffn_down"), f, h, None)?,
                gate_proj_quant: None,
                up_proj_quant: None,
                down_proj_quant: None,
            },
            input_layernorm: self.norm(&n("attn_norm"), h, eps)?,
            post_attention_layernorm: self.norm(&n("ffn_norm"), h, eps)?,
        })
    }
}

/// The model of `config` with every weight read from `gguf`, dequantized to f32.
///
/// # Errors
/// [`ModelError::Load`] naming the tensor for a missing tensor, a shape other than the
/// config's, a ggml type `mopt-gguf` cannot dequantize, or a tensor the model has no place for.
pub fn model_from_gguf(
    gguf: &Gguf,
    config: &LlamaConfig,
    device: &Device,
) -> Result<LlamaForCausalLM, ModelError> {
    let c = config;
    c.check()
        .map_err(|e| load_error(gguf.path(), format!("invalid config: {e}"), HINT))?;
    let mut t = Tensors {
        gguf,
        device,
        used: BTreeSet::new(),
    };
    let table = t.read("token_embd.weight", &[c.vocab_size, c.hidden_size])?;
    let embed_tokens = Embedding {
        weight: Param::from_tensor(Tensor::from_data(
            TensorData::new(table, [c.vocab_size, c.hidden_size]),
            device,
        )),
    };
    let layers = (0..c.num_hidden_layers)
        .map(|i| t.layer(c, i))
        .collect::<Result<Vec<_>, _>>()?;
    let norm = t.norm("output_norm.weight", c.hidden_size, c.rms_norm_eps)?;
    let lm_head = if c.tie_word_embeddings {
        None
    } else {
        Some(t.linear("output.weight", c.hidden_size, c.vocab_size, None)?)
    };
    let unused: Vec<&str> = gguf
        .tensors()
        .iter()
        .map(|i| i.name())
        .filter(|n| !t.used.contains(*n))
        .collect();
    if !unused.is_empty() {
        return Err(load_error(
            gguf.path(),
            format!("tensors this model has no place for: {}", unused.join(", ")),
            "the file holds a Llama variant this model does not implement (e.g. `rope_freqs`: \
             Llama 3 RoPE scaling), or a head that the config ties to the embeddings",
        ));
    }
    Ok(LlamaForCausalLM {
        model: LlamaModel {
            embed_tokens,
            layers,
            norm,
            rope: RotaryEmbedding {
                head_dim: c.head_dim(),
                theta: c.rope_theta,
            },
        },
        lm_head,
    })
}

/// Open a GGUF file and build its config and model.
///
/// # Errors
/// [`ModelError::Io`] when the file cannot be read; [`ModelError::Load`] naming the key or
/// tensor for anything else ([`config_from_gguf`], [`model_from_gguf`]).
pub fn load_gguf(
    path: &Path,
    device: &Device,
) -> Result<(LlamaConfig, LlamaForCausalLM), ModelError> {
    let gguf = Gguf::open(path).map_err(|e| from_gguf(path, e))?;
    let config = config_from_gguf(&gguf)?;
    let model = model_from_gguf(&gguf, &config, device)?;
    Ok((config, model))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The permutation is llama.cpp's `reshape(n_head, 2, d/2, cols).swapaxes(1, 2)` and the
    /// inverse undoes it.
    #[test]
    fn permutation_is_llama_cpps_and_inverts() {
        // 2 heads of 4 rows, 1 column: HF rows [h0: a0 a1 b0 b1 | h1: ...] with pairs (a_t, b_t)
        // → interleaved [a0 b0 a1 b1].
        let w: Vec<f32> = (0..8).map(|x| x as f32).collect();
        let p = permute_rows(&w, 1, 4);
        assert_eq!(p, [0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0]);
        let w: Vec<f32> = (0..3 * 8 * 5).map(|x| x as f32).collect();
        assert_eq!(unpermute_rows(&permute_rows(&w, 5, 8), 5, 8), w);
    }
}
