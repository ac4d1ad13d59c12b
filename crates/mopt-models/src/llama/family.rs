//! The Llama decoder as a model family: the contracts of `mopt-core` for [`LlamaForCausalLM`].
//! An example is a window of token ids ([`TokenWindows`]); its rows of logits are the
//! next-token predictions at every position, `[batch × len, vocab]`, so the "classes" are the
//! vocabulary and the evaluation's loss is the mean next-token cross-entropy (perplexity its
//! `exp`).

use std::path::Path;

use burn::prelude::*;
use mopt_core::{Checkpoint, Classifier, MemoryEstimate, ModelConfig, ModelFault};
use mopt_data::TokenWindows;

use super::config::LlamaConfig;
use super::model::LlamaForCausalLM;
use crate::burnpack::{load_burnpack, save_burnpack};
use crate::ModelError;

impl LlamaConfig {
    /// Forward FLOPs of layer `i` for one window of `seq` tokens (multiply-adds count two):
    /// the Q/K/V/O projections, the scores and the context over all `seq` keys (the causal
    /// mask is applied to a full score matrix), and the three FFN projections.
    pub fn layer_flops(&self, i: usize, seq: usize) -> u64 {
        let (h, d, s) = (self.hidden_size as u64, self.head_dim() as u64, seq as u64);
        let (q, kv) = (self.heads(i) as u64 * d, self.kv_heads(i) as u64 * d);
        let projections = h * (2 * q + 2 * kv);
        let attention = 2 * s * q;
        let ffn = 3 * h * self.ffn(i) as u64;
        2 * s * (projections + attention + ffn)
    }

    /// Forward FLOPs of the whole model for one window of `seq` tokens: every layer, and the
    /// head onto the vocabulary at every position (the embedding lookup and norms are not
    /// counted).
    pub fn forward_flops(&self, seq: usize) -> u64 {
        let layers: u64 = (0..self.num_hidden_layers)
            .map(|i| self.layer_flops(i, seq))
            .sum();
        layers + 2 * seq as u64 * self.hidden_size as u64 * self.vocab_size as u64
    }
}

impl ModelConfig for LlamaConfig {
    fn arch(&self) -> &'static str {
        "llama"
    }

    fn num_params(&self) -> usize {
        LlamaConfig::num_params(self)
    }

    /// The vocabulary: every position predicts one of its tokens.
    fn num_labels(&self) -> usize {
        self.vocab_size
    }

    /// A window of `size` tokens ([`LlamaConfig::forward_flops`]).
    fn flops(&self, size: usize) -> f64 {
        self.forward_flops(size) as f64
    }

    fn summary(&self) -> Vec<(String, String)> {
        vec![
            ("layers".into(), self.num_hidden_layers.to_string()),
            ("hidden".into(), self.hidden_size.to_string()),
            ("heads".into(), format!("{:?}", self.layer_heads())),
            ("kv-heads".into(), format!("{:?}", self.layer_kv_heads())),
            ("ffn".into(), format!("{:?}", self.layer_ffn())),
            ("vocabulary".into(), self.vocab_size.to_string()),
        ]
    }

    /// `2 layers x 32, heads [4, 4], kv-heads [2, 2], FFN [64, 64]`.
    fn describe(&self) -> String {
        format!(
            "{} layers x {}, heads {:?}, kv-heads {:?}, FFN {:?}",
            self.num_hidden_layers,
            self.hidden_size,
            self.layer_heads(),
            self.layer_kv_heads(),
            self.layer_ffn()
        )
    }

    /// `heads`, `kv_heads` and `ffn` per layer, `hidden`, `layers` (a pruning round's record).
    fn facts(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut m = serde_json::Map::new();
        m.insert("heads".into(), self.layer_heads().into());
        m.insert("kv_heads".into(), self.layer_kv_heads().into());
        m.insert("ffn".into(), self.layer_ffn().into());
        m.insert("hidden".into(), self.hidden_size.into());
        m.insert("layers".into(), self.num_hidden_layers.into());
        m
    }

    /// Whether the config records a quantization (`mopt_quant`).
    fn is_quantized(&self) -> bool {
        self.mopt_quant.is_some()
    }

    /// The activations the backward pass keeps per layer: both RMSNorms' inputs and outputs,
    /// Q, K, V before and after RoPE, the context, the residual sum, the FFN's gate, up, SiLU
    /// and product; the attention scores and probabilities; then the embeddings, the final
    /// norm and the logits with their softmax.
    fn training_memory(&self, batch: usize, seq: usize) -> MemoryEstimate {
        let (b, s, h) = (batch as u64, seq as u64, self.hidden_size as u64);
        let d = self.head_dim() as u64;
        let per_layer: u64 = (0..self.num_hidden_layers)
            .map(|i| {
                let heads = self.heads(i) as u64;
                let (q, kv) = (heads * d, self.kv_heads(i) as u64 * d);
                let f = self.ffn(i) as u64;
                b * s * (5 * h + 3 * q + 4 * kv + 4 * f) + 2 * b * heads * s * s
            })
            .sum();
        let ends = b * s * (3 * h + 2 * self.vocab_size as u64);
        MemoryEstimate::adamw_f32(LlamaConfig::num_params(self), per_layer + ends)
    }

    /// A next-token row at every position of a window.
    fn logit_rows(&self, seq: usize) -> usize {
        seq
    }
}

impl Classifier for LlamaForCausalLM {
    type Batch = TokenWindows;

    /// Next-token logits at every position of every window.
    ///
    /// # Shapes
    /// - batch: inputs `[batch, len]`
    /// - output: `[batch × len, vocab]`, row `b·len + p` predicting the token after position
    ///   `p` of window `b`
    fn logits(&self, batch: &TokenWindows) -> Tensor<2> {
        let out = self.forward(batch.inputs.clone());
        let [b, s, vocab] = out.dims();
        out.reshape([b * s, vocab])
    }
}

impl Checkpoint for LlamaForCausalLM {
    type Config = LlamaConfig;

    fn init(config: &LlamaConfig, device: &Device) -> Self {
        LlamaForCausalLM::new(config, device)
    }

    fn save(&self, config: &LlamaConfig, dir: &Path) -> Result<(), ModelFault> {
        Ok(save_checkpoint(self, config, dir)?)
    }

    fn load(dir: &Path, device: &Device) -> Result<(Self, LlamaConfig), ModelFault> {
        Ok(load_checkpoint(dir, device)?)
    }

    /// Windows of ids spread over the vocabulary, each target the next input.
    fn bench_batch(
        c: &LlamaConfig,
        batch: usize,
        size: usize,
        device: &Device,
    ) -> Option<TokenWindows> {
        let id = |i: usize| ((i * 7919 + 13) % c.vocab_size) as i64;
        let inputs: Vec<i64> = (0..batch * size).map(id).collect();
        let targets: Vec<i64> = (1..=batch * size).map(id).collect();
        Some(TokenWindows {
            inputs: Tensor::from_data(TensorData::new(inputs, [batch, size]), device),
            targets: Tensor::from_data(TensorData::new(targets, [batch * size]), device),
        })
    }
}

/// Save `model` and its config as a mopt checkpoint into `dir` (created; files replaced):
/// `model.bpk` (Burn's format; a quantized model's scales and zero points included) and
/// `config.json` (HF `LlamaConfig` keys, the per-layer widths of a pruned model, the
/// quantization of a quantized one as `mopt_quant`, `model_type = "llama"`).
pub fn save_checkpoint(
    model: &LlamaForCausalLM,
    config: &LlamaConfig,
    dir: &Path,
) -> Result<(), ModelError> {
    std::fs::create_dir_all(dir).map_err(|source| ModelError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    save_burnpack(model, &dir.join("model.bpk"))?;
    let path = dir.join("config.json");
    let mut value = serde_json::to_value(config).expect("a config always serializes");
    value["model_type"] = "llama".into();
    value["architectures"] = serde_json::json!(["LlamaForCausalLM"]);
    let text = serde_json::to_string_pretty(&value).expect("json");
    std::fs::write(&path, text).map_err(|source| ModelError::Io { path, source })
}

/// Load a mopt checkpoint folder (`config.json` + `model.bpk`) onto `device`, in the shape
/// its config describes (a pruned model reloads pruned, a quantized one with its quantizers and
/// their scales). A config that does not parse or
/// check, or weights that are missing, truncated or of another shape, are errors naming the
/// file.
pub fn load_checkpoint(
    dir: &Path,
    device: &Device,
) -> Result<(LlamaForCausalLM, LlamaConfig), ModelError> {
    let config = LlamaConfig::from_file(&dir.join("config.json"))?;
    let mut model = LlamaForCausalLM::new(&config, device);
    load_burnpack(&mut model, &dir.join("model.bpk"))?;
    Ok((model, config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flops_count_every_matmul() {
        // tiny: hidden 32, 4 heads and 2 KV heads of 8, FFN 64, vocabulary 64, 10 tokens.
        let c = LlamaConfig::tiny(64);
        let per_token = 32 * (2 * 32 + 2 * 16) + 2 * 10 * 32 + 3 * 32 * 64;
        assert_eq!(c.layer_flops(0, 10), 2 * 10 * per_token);
        assert_eq!(
            c.forward_flops(10),
            2 * 2 * 10 * per_token + 2 * 10 * 32 * 64
        );
        assert_eq!(ModelConfig::num_labels(&c), 64);
    }

    #[test]
    fn memory_is_16_bytes_a_parameter_plus_activations() {
        let c = LlamaConfig::tiny(64);
        let m = c.training_memory(2, 8);
        assert_eq!(
            m.weights + m.grads + m.adam_moments,
            16 * c.num_params() as u64
        );
        // Doubling the batch doubles the activations.
        assert_eq!(c.training_memory(4, 8).activations, 2 * m.activations);
    }
}
