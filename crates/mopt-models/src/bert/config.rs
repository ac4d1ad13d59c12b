//! BERT configuration, read from (and written as) a Hugging Face `config.json`.
//!
//! Per-layer head counts and FFN widths are first-class so that structured pruning can shrink
//! individual layers; they are stored under `mopt_layer_heads` / `mopt_layer_intermediate_sizes`
//! next to the standard HF keys.

use std::path::Path;

use mopt_kernels::GeluKind;
use serde::{Deserialize, Serialize};

use crate::error::ModelError;

/// The shape of a BERT encoder with a classification head.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BertConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Encoder layers.
    pub num_hidden_layers: usize,
    /// Attention heads a layer (unless `mopt_layer_heads` says otherwise).
    pub num_attention_heads: usize,
    /// FFN width (unless `mopt_layer_intermediate_sizes` says otherwise).
    pub intermediate_size: usize,
    #[serde(default = "default_max_pos")]
    /// Longest sequence the position table holds.
    pub max_position_embeddings: usize,
    #[serde(default = "default_type_vocab")]
    /// Token-type (segment) vocabulary size.
    pub type_vocab_size: usize,
    #[serde(default = "default_eps")]
    /// LayerNorm epsilon.
    pub layer_norm_eps: f64,
    #[serde(default = "default_dropout")]
    /// Dropout on the residual stream.
    pub hidden_dropout_prob: f64,
    #[serde(default = "default_dropout")]
    /// Dropout on the attention probabilities.
    pub attention_probs_dropout_prob: f64,
    #[serde(default = "default_act")]
    /// The FFN activation: `gelu` (exact) or `gelu_new` (tanh approximation).
    pub hidden_act: String,
    #[serde(default)]
    /// Token id of padding.
    pub pad_token_id: usize,
    /// Standard deviation of the normal initialiser for weights and embeddings of a randomly
    /// initialised model (HF BERT's `initializer_range`); biases start at zero.
    #[serde(default = "default_init_range")]
    pub initializer_range: f64,
    /// Size of one attention head; defaults to `hidden_size / num_attention_heads`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_head_size: Option<usize>,
    /// Attention heads per layer (pruned models); defaults to `num_attention_heads` everywhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mopt_layer_heads: Option<Vec<usize>>,
    /// FFN width per layer (pruned models); defaults to `intermediate_size` everywhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mopt_layer_intermediate_sizes: Option<Vec<usize>>,
    /// Number of classes of the classification head.
    #[serde(default = "default_labels")]
    pub num_labels: usize,
    /// Class names by id (HF's `id2label` is a map; we keep the ordered list too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mopt_labels: Option<Vec<String>>,
    /// Quantized models: where and how (the scales are in the weights file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mopt_quant: Option<mopt_quant::node::QuantConfig>,
    /// Vocabulary-pruned models: the word-table row of every token id the tokenizer gives (its
    /// length is the tokenizer's vocabulary; `vocab_size` is the rows kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mopt_vocab_map: Option<Vec<u32>>,
}

fn default_max_pos() -> usize {
    512
}
fn default_type_vocab() -> usize {
    2
}
fn default_eps() -> f64 {
    1e-12
}
fn default_dropout() -> f64 {
    0.1
}
fn default_act() -> String {
    "gelu".into()
}
fn default_init_range() -> f64 {
    0.02
}
fn default_labels() -> usize {
    2
}

impl BertConfig {
    /// Read an HF `config.json`; unknown HF keys are ignored.
    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let cfg: BertConfig = serde_json::from_str(&text).map_err(|e| ModelError::Config {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        cfg.check().map_err(|message| ModelError::Config {
            path: path.to_path_buf(),
            message,
        })?;
        Ok(cfg)
    }

    /// A tiny random config for tests and smoke runs.
    pub fn tiny(vocab_size: usize, num_labels: usize) -> Self {
        Self {
            vocab_size,
            hidden_size: 32,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            intermediate_size: 64,
            max_position_embeddings: 128,
            type_vocab_size: 2,
            layer_norm_eps: 1e-12,
            hidden_dropout_prob: 0.1,
            attention_probs_dropout_prob: 0.1,
            hidden_act: "gelu".into(),
            pad_token_id: 0,
            initializer_range: 0.02,
            attention_head_size: None,
            mopt_layer_heads: None,
            mopt_layer_intermediate_sizes: None,
            num_labels,
            mopt_labels: None,
            mopt_quant: None,
            mopt_vocab_map: None,
        }
    }

    /// Size of one attention head.
    pub fn head_size(&self) -> usize {
        self.attention_head_size
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Attention heads of every layer.
    pub fn layer_heads(&self) -> Vec<usize> {
        (0..self.num_hidden_layers).map(|i| self.heads(i)).collect()
    }

    /// FFN width of every layer.
    pub fn layer_ffn(&self) -> Vec<usize> {
        (0..self.num_hidden_layers).map(|i| self.ffn(i)).collect()
    }

    /// Token ids the model reads: the tokenizer's vocabulary (`vocab_size` unless the
    /// vocabulary was pruned: then `mopt_vocab_map`'s length).
    pub fn input_vocab(&self) -> usize {
        self.mopt_vocab_map
            .as_ref()
            .map_or(self.vocab_size, Vec::len)
    }

    /// Heads of layer `i`.
    pub fn heads(&self, i: usize) -> usize {
        self.mopt_layer_heads
            .as_ref()
            .map_or(self.num_attention_heads, |v| v[i])
    }

    /// FFN width of layer `i`.
    pub fn ffn(&self, i: usize) -> usize {
        self.mopt_layer_intermediate_sizes
            .as_ref()
            .map_or(self.intermediate_size, |v| v[i])
    }

    /// The FFN's GELU: `gelu` (exact, BERT's) or `gelu_new` / `gelu_pytorch_tanh` (the tanh
    /// approximation, which ONNX Runtime runs as `FastGelu`).
    pub fn gelu_kind(&self) -> Result<GeluKind, String> {
        match self.hidden_act.as_str() {
            "gelu" => Ok(GeluKind::Erf),
            "gelu_new" | "gelu_pytorch_tanh" => Ok(GeluKind::Tanh),
            other => Err(format!(
                "hidden_act `{other}` is not supported (`gelu`, exact as in BERT, or `gelu_new` / \
                 `gelu_pytorch_tanh`, its tanh approximation)"
            )),
        }
    }

    /// Internal consistency; the message says what to fix.
    pub fn check(&self) -> Result<(), String> {
        self.gelu_kind()?;
        if self.attention_head_size.is_none()
            && !self
                .hidden_size
                .is_multiple_of(self.num_attention_heads.max(1))
        {
            return Err(format!(
                "hidden_size {} is not divisible by num_attention_heads {}; set attention_head_size",
                self.hidden_size, self.num_attention_heads
            ));
        }
        crate::check_layer_lists(
            self.num_hidden_layers,
            &[
                ("mopt_layer_heads", &self.mopt_layer_heads),
                (
                    "mopt_layer_intermediate_sizes",
                    &self.mopt_layer_intermediate_sizes,
                ),
            ],
        )?;
        if let Some(map) = &self.mopt_vocab_map {
            if let Some(&row) = map.iter().find(|&&r| r as usize >= self.vocab_size) {
                return Err(format!(
                    "mopt_vocab_map sends an id to row {row} but vocab_size is {}",
                    self.vocab_size
                ));
            }
        }
        if self.num_labels < 1 {
            return Err("num_labels must be at least 1".into());
        }
        Ok(())
    }

    /// Number of parameters the model built from this config holds.
    pub fn num_params(&self) -> usize {
        let layers: usize = (0..self.num_hidden_layers)
            .map(|i| {
                let (attn, ffn) = self.layer_params(i);
                attn + ffn
            })
            .sum();
        self.embedding_params() + layers + self.head_params()
    }

    /// Parameters of the embeddings: word, position and token-type tables and their LayerNorm.
    pub fn embedding_params(&self) -> usize {
        let h = self.hidden_size;
        (self.vocab_size + self.max_position_embeddings + self.type_vocab_size) * h + 2 * h
    }

    /// Parameters of layer `i`: (attention block with its output projection and LayerNorm, FFN
    /// block with its LayerNorm).
    pub fn layer_params(&self, i: usize) -> (usize, usize) {
        let h = self.hidden_size;
        let a = self.heads(i) * self.head_size();
        let f = self.ffn(i);
        (
            3 * (h * a + a) + (a * h + h) + 2 * h,
            (h * f + f) + (f * h + h) + 2 * h,
        )
    }

    /// Parameters of the pooler and the classifier.
    pub fn head_params(&self) -> usize {
        let h = self.hidden_size;
        (h * h + h) + (h * self.num_labels + self.num_labels)
    }

    /// Forward FLOPs (2 per multiply-add) of layer `i` for one example of `seq` tokens:
    /// (attention: Q/K/V and output projections plus scores and context; FFN: both projections).
    pub fn layer_flops(&self, i: usize, seq: usize) -> (u64, u64) {
        let (s, h) = (seq as u64, self.hidden_size as u64);
        let a = (self.heads(i) * self.head_size()) as u64;
        let f = self.ffn(i) as u64;
        (2 * s * (4 * h * a) + 4 * s * s * a, 2 * s * (2 * h * f))
    }

    /// Forward FLOPs of the pooler and classifier for one example (the embeddings are lookups).
    pub fn head_flops(&self) -> u64 {
        let h = self.hidden_size as u64;
        2 * (h * h + h * self.num_labels as u64)
    }

    /// Forward FLOPs of the whole model for one example of `seq` tokens.
    pub fn forward_flops(&self, seq: usize) -> u64 {
        (0..self.num_hidden_layers)
            .map(|i| {
                let (a, f) = self.layer_flops(i, seq);
                a + f
            })
            .sum::<u64>()
            + self.head_flops()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flops_count_every_matmul() {
        // hidden 32, 4 heads x 8, FFN 64, 2 labels, 10 tokens: Q/K/V/O 4·32·32 MACs a token,
        // scores and context 2·10·32 a token, FFN 2·32·64 a token, pooler 32·32 + head 32·2.
        let c = BertConfig {
            num_labels: 2,
            ..BertConfig::tiny(100, 2)
        };
        let (attn, ffn) = c.layer_flops(0, 10);
        assert_eq!(attn, 2 * 10 * (4 * 32 * 32 + 2 * 10 * 32));
        assert_eq!(ffn, 2 * 10 * 2 * 32 * 64);
        assert_eq!(
            c.forward_flops(10),
            2 * (attn + ffn) + 2 * (32 * 32 + 32 * 2)
        );
        let mut pruned = c.clone();
        pruned.mopt_layer_heads = Some(vec![2, 4]);
        assert!(pruned.forward_flops(10) < c.forward_flops(10));
        let (a, f) = c.layer_params(0);
        assert_eq!(
            c.num_params(),
            c.embedding_params() + 2 * (a + f) + c.head_params()
        );
    }

    #[test]
    fn per_layer_shapes_default_and_override() {
        let mut c = BertConfig::tiny(100, 2);
        assert_eq!(c.heads(1), 4);
        assert_eq!(c.head_size(), 8);
        c.mopt_layer_heads = Some(vec![4, 2]);
        c.mopt_layer_intermediate_sizes = Some(vec![64, 16]);
        assert_eq!(c.heads(1), 2);
        assert_eq!(c.ffn(1), 16);
        assert!(c.check().is_ok());
        c.mopt_layer_heads = Some(vec![4]);
        assert!(c
            .check()
            .unwrap_err()
            .contains("mopt_layer_heads has 1 entries"));
    }
}
