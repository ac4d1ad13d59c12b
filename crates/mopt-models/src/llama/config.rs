//! Llama configuration, read from (and written as) JSON with Hugging Face `LlamaConfig`'s keys.
//!
//! Per-layer widths are first-class so that structured pruning can shrink individual layers
//! and the pruned model rebuilds from its config alone: query heads, key/value heads and FFN
//! width per layer live under `mopt_layer_heads` / `mopt_layer_kv_heads` /
//! `mopt_layer_intermediate_sizes` next to the standard keys, and `head_dim` is kept explicit so
//! that the hidden width (`hidden_size`) can shrink without changing the heads.

use std::path::Path;

use mopt_quant::node::QuantConfig;
use serde::{Deserialize, Serialize};

use crate::error::ModelError;

/// The shape of a Llama decoder with its language-model head.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlamaConfig {
    /// Vocabulary size (rows of the embedding table and of the head).
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// FFN width (unless `mopt_layer_intermediate_sizes` says otherwise).
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads a layer (unless `mopt_layer_heads` says otherwise).
    pub num_attention_heads: usize,
    /// Key/value heads a layer (grouped-query attention; unless `mopt_layer_kv_heads` says
    /// otherwise); defaults to `num_attention_heads` (plain multi-head attention).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_key_value_heads: Option<usize>,
    /// Width of one head; defaults to `hidden_size / num_attention_heads`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    /// Context length the model was trained for (informational: RoPE itself has no limit).
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
    /// RMSNorm epsilon.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// RoPE base.
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    /// The FFN's gate activation (`silu`, the only one supported).
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// Whether the head reuses the embedding table (`logits = h · Eᵀ`); without it the model
    /// holds its own `lm_head`. HF's default, `false`, when absent.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Token id of beginning-of-sequence, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bos_token_id: Option<u32>,
    /// Token id of end-of-sequence, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos_token_id: Option<u32>,
    /// Standard deviation of the normal initialiser of a randomly initialised model's weights
    /// and embeddings (HF's `initializer_range`); RMSNorm weights start at one.
    #[serde(default = "default_init_range")]
    pub initializer_range: f64,
    /// Query heads per layer (pruned models); defaults to `num_attention_heads` everywhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mopt_layer_heads: Option<Vec<usize>>,
    /// Key/value heads per layer (pruned models); defaults to `num_key_value_heads` everywhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mopt_layer_kv_heads: Option<Vec<usize>>,
    /// FFN width per layer (pruned models); defaults to `intermediate_size` everywhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mopt_layer_intermediate_sizes: Option<Vec<usize>>,
    /// A quantized model (a `ptq` / `qat` stage's output): the scheme and the quantized
    /// projections, from which the model rebuilds its fake-quant nodes before their scales load
    /// from the weights. Absent from a float model's config (and from HF's keys).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mopt_quant: Option<QuantConfig>,
}

fn default_max_pos() -> usize {
    2048
}
fn default_eps() -> f64 {
    1e-6
}
fn default_theta() -> f64 {
    10000.0
}
fn default_act() -> String {
    "silu".into()
}
fn default_init_range() -> f64 {
    0.02
}

impl LlamaConfig {
    /// Read a JSON config (HF `config.json` keys plus mopt's per-layer ones); unknown keys are
    /// ignored, the result is checked ([`LlamaConfig::from_json`]).
    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json(&text).map_err(|message| ModelError::Config {
            path: path.to_path_buf(),
            message,
        })
    }

    /// Parse and check a JSON config. transformers 5 writes the RoPE base as
    /// `rope_parameters.rope_theta` (4.x as `rope_theta`): either is read. RoPE scaling
    /// (`rope_scaling`, or a `rope_type` other than `default`) is refused, not ignored.
    pub fn from_json(text: &str) -> Result<Self, String> {
        let raw: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let mut cfg: LlamaConfig =
            serde_json::from_value(raw.clone()).map_err(|e| e.to_string())?;
        if raw.get("rope_scaling").is_some_and(|v| !v.is_null()) {
            return Err("`rope_scaling` is not supported (plain RoPE only)".into());
        }
        if let Some(params) = raw.get("rope_parameters").filter(|v| !v.is_null()) {
            let kind = params.get("rope_type").and_then(|v| v.as_str());
            if kind.is_some_and(|k| k != "default") {
                return Err(format!(
                    "rope_parameters.rope_type `{}` is not supported (only `default`)",
                    kind.unwrap_or_default()
                ));
            }
            if raw.get("rope_theta").is_none() {
                if let Some(theta) = params.get("rope_theta").and_then(|v| v.as_f64()) {
                    cfg.rope_theta = theta;
                }
            }
        }
        cfg.check()?;
        Ok(cfg)
    }

    /// Write the config as pretty JSON (what [`LlamaConfig::from_file`] reads back).
    pub fn save(&self, path: &Path) -> Result<(), ModelError> {
        let text = serde_json::to_string_pretty(self).expect("a config always serializes");
        std::fs::write(path, text).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })
    }

    /// A tiny random config for tests and smoke runs: 2 layers, hidden 32, 4 query heads of 8
    /// sharing 2 key/value heads, FFN 64, tied embeddings.
    pub fn tiny(vocab_size: usize) -> Self {
        Self {
            vocab_size,
            hidden_size: 32,
            intermediate_size: 64,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: Some(2),
            head_dim: Some(8),
            max_position_embeddings: 128,
            rms_norm_eps: 1e-5,
            rope_theta: 10000.0,
            hidden_act: "silu".into(),
            tie_word_embeddings: true,
            bos_token_id: None,
            eos_token_id: None,
            initializer_range: 0.02,
            mopt_layer_heads: None,
            mopt_layer_kv_heads: None,
            mopt_layer_intermediate_sizes: None,
            mopt_quant: None,
        }
    }

    /// Width of one head.
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Key/value heads a layer unless overridden per layer.
    pub fn kv_heads_default(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// Query heads of layer `i`.
    pub fn heads(&self, i: usize) -> usize {
        self.mopt_layer_heads
            .as_ref()
            .map_or(self.num_attention_heads, |v| v[i])
    }

    /// Key/value heads of layer `i`.
    pub fn kv_heads(&self, i: usize) -> usize {
        self.mopt_layer_kv_heads
            .as_ref()
            .map_or(self.kv_heads_default(), |v| v[i])
    }

    /// FFN width of layer `i`.
    pub fn ffn(&self, i: usize) -> usize {
        self.mopt_layer_intermediate_sizes
            .as_ref()
            .map_or(self.intermediate_size, |v| v[i])
    }

    /// Query heads of every layer.
    pub fn layer_heads(&self) -> Vec<usize> {
        (0..self.num_hidden_layers).map(|i| self.heads(i)).collect()
    }

    /// Key/value heads of every layer.
    pub fn layer_kv_heads(&self) -> Vec<usize> {
        (0..self.num_hidden_layers)
            .map(|i| self.kv_heads(i))
            .collect()
    }

    /// FFN width of every layer.
    pub fn layer_ffn(&self) -> Vec<usize> {
        (0..self.num_hidden_layers).map(|i| self.ffn(i)).collect()
    }

    /// Internal consistency; the message says what to fix.
    pub fn check(&self) -> Result<(), String> {
        if self.hidden_act != "silu" {
            return Err(format!(
                "hidden_act `{}` is not supported (only `silu`, as in Llama)",
                self.hidden_act
            ));
        }
        if self.vocab_size == 0 || self.hidden_size == 0 || self.num_attention_heads == 0 {
            return Err(
                "vocab_size, hidden_size and num_attention_heads must be at least 1".into(),
            );
        }
        if self.head_dim.is_none() && !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err(format!(
                "hidden_size {} is not divisible by num_attention_heads {}; set head_dim",
                self.hidden_size, self.num_attention_heads
            ));
        }
        let d = self.head_dim();
        if d == 0 || !d.is_multiple_of(2) {
            return Err(format!(
                "head_dim {d} must be even and at least 2 (RoPE rotates pairs)"
            ));
        }
        if !(self.rms_norm_eps > 0.0 && self.rope_theta > 0.0) {
            return Err(format!(
                "rms_norm_eps ({}) and rope_theta ({}) must be positive",
                self.rms_norm_eps, self.rope_theta
            ));
        }
        crate::check_layer_lists(
            self.num_hidden_layers,
            &[
                ("mopt_layer_heads", &self.mopt_layer_heads),
                ("mopt_layer_kv_heads", &self.mopt_layer_kv_heads),
                (
                    "mopt_layer_intermediate_sizes",
                    &self.mopt_layer_intermediate_sizes,
                ),
            ],
        )?;
        for i in 0..self.num_hidden_layers {
            let (h, kv, f) = (self.heads(i), self.kv_heads(i), self.ffn(i));
            if kv == 0 || h == 0 || !h.is_multiple_of(kv) {
                return Err(format!(
                    "layer {i}: {h} query heads cannot share {kv} key/value heads \
                     (both at least 1, queries a multiple of key/values)"
                ));
            }
            if f == 0 {
                return Err(format!("layer {i}: FFN width must be at least 1"));
            }
        }
        Ok(())
    }

    /// Number of parameters the model built from this config holds (the tied head counts once).
    pub fn num_params(&self) -> usize {
        let h = self.hidden_size;
        let embed = self.vocab_size * h;
        let head = if self.tie_word_embeddings { 0 } else { embed };
        let layers: usize = (0..self.num_hidden_layers)
            .map(|i| self.layer_params(i))
            .sum();
        embed + layers + h + head
    }

    /// Parameters of layer `i`: Q, K, V, O projections, gate/up/down projections, two RMSNorms.
    pub fn layer_params(&self, i: usize) -> usize {
        let (h, d) = (self.hidden_size, self.head_dim());
        let (q, kv) = (self.heads(i) * d, self.kv_heads(i) * d);
        2 * h * q + 2 * h * kv + 3 * h * self.ffn(i) + 2 * h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_layer_widths_default_and_override() {
        let mut c = LlamaConfig::tiny(64);
        assert_eq!((c.heads(1), c.kv_heads(1), c.ffn(1)), (4, 2, 64));
        assert_eq!(c.head_dim(), 8);
        c.mopt_layer_heads = Some(vec![4, 3]);
        c.mopt_layer_kv_heads = Some(vec![2, 1]);
        c.mopt_layer_intermediate_sizes = Some(vec![64, 20]);
        assert!(c.check().is_ok(), "{:?}", c.check());
        assert_eq!(c.layer_heads(), [4, 3]);
        assert_eq!(c.layer_kv_heads(), [2, 1]);
        assert_eq!(c.layer_ffn(), [64, 20]);
        c.mopt_layer_kv_heads = Some(vec![2, 2]);
        assert!(c.check().unwrap_err().contains("layer 1: 3 query heads"));
        c.mopt_layer_kv_heads = Some(vec![2]);
        assert!(c
            .check()
            .unwrap_err()
            .contains("mopt_layer_kv_heads has 1 entries"));
    }

    #[test]
    fn params_count_every_tensor() {
        let c = LlamaConfig::tiny(64);
        // embeddings 64·32; per layer Q,O 32·32, K,V 32·16, FFN 3·32·64, norms 2·32; final norm.
        let layer = 2 * 32 * 32 + 2 * 32 * 16 + 3 * 32 * 64 + 2 * 32;
        assert_eq!(c.num_params(), 64 * 32 + 2 * layer + 32);
        let untied = LlamaConfig {
            tie_word_embeddings: false,
            ..c.clone()
        };
        assert_eq!(untied.num_params(), c.num_params() + 64 * 32);
    }

    #[test]
    fn hf_config_json_reads_with_defaults() {
        let json = r#"{"vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 3, "num_attention_heads": 4, "model_type": "llama"}"#;
        let c: LlamaConfig = serde_json::from_str(json).unwrap();
        assert_eq!((c.head_dim(), c.kv_heads(2), c.ffn(0)), (16, 4, 128));
        assert_eq!((c.rope_theta, c.rms_norm_eps), (10000.0, 1e-6));
        assert!(!c.tie_word_embeddings);
        assert!(c.check().is_ok());
        // transformers 5 keeps the base under `rope_parameters`; scaled RoPE is refused.
        let v5 = json.replace(
            "\"model_type\"",
            "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 100000.0}, \"model_type\"",
        );
        assert_eq!(LlamaConfig::from_json(&v5).unwrap().rope_theta, 1e5);
        let scaled = json.replace(
            "\"model_type\"",
            "\"rope_scaling\": {\"factor\": 8.0}, \"model_type\"",
        );
        assert!(LlamaConfig::from_json(&scaled)
            .unwrap_err()
            .contains("rope_scaling"));
    }
}
