//! BERT as a model family: the contracts of `mopt-core` for [`BertForSequenceClassification`].

use std::path::Path;

use burn::prelude::*;
use mopt_core::{
    Checkpoint, Classifier, MemoryEstimate, ModelConfig, ModelFault, TapLayout, TapRequest, Tapped,
    Taps,
};
use mopt_data::TextBatch;

use super::config::BertConfig;
use super::model::BertForSequenceClassification;
use super::weights;

impl ModelConfig for BertConfig {
    fn arch(&self) -> &'static str {
        "bert"
    }

    fn num_params(&self) -> usize {
        BertConfig::num_params(self)
    }

    fn num_labels(&self) -> usize {
        self.num_labels
    }

    fn flops(&self, size: usize) -> f64 {
        self.forward_flops(size) as f64
    }

    fn summary(&self) -> Vec<(String, String)> {
        vec![
            ("layers".into(), self.num_hidden_layers.to_string()),
            ("hidden".into(), self.hidden_size.to_string()),
            ("heads".into(), format!("{:?}", self.layer_heads())),
            ("ffn".into(), format!("{:?}", self.layer_ffn())),
            ("vocabulary".into(), self.vocab_size.to_string()),
        ]
    }

    /// `3 layers x 384, heads [12, 12, 12], FFN [1536, 1536, 1536]`.
    fn describe(&self) -> String {
        format!(
            "{} layers x {}, heads {:?}, FFN {:?}",
            self.num_hidden_layers,
            self.hidden_size,
            self.layer_heads(),
            self.layer_ffn()
        )
    }

    /// `heads` and `ffn` per layer, `hidden`, `layers` (a pruning round's record).
    fn facts(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut m = serde_json::Map::new();
        m.insert("heads".into(), self.layer_heads().into());
        m.insert("ffn".into(), self.layer_ffn().into());
        m.insert("hidden".into(), self.hidden_size.into());
        m.insert("layers".into(), self.num_hidden_layers.into());
        m
    }

    fn is_quantized(&self) -> bool {
        self.mopt_quant.is_some()
    }

    /// The activations the backward pass keeps per layer: inputs of Q/K/V, Q/K/V, context,
    /// residual sums, LayerNorm inputs/outputs, dropout masks, FFN input/pre-activation/
    /// activation, plus attention scores/probabilities/mask.
    fn training_memory(&self, batch: usize, seq: usize) -> MemoryEstimate {
        let (b, s, h) = (batch as u64, seq as u64, self.hidden_size as u64);
        let d = self.head_size() as u64;
        let per_layer: u64 = (0..self.num_hidden_layers)
            .map(|i| {
                let heads = self.heads(i) as u64;
                let f = self.ffn(i) as u64;
                let a = heads * d;
                b * s * (8 * h + 5 * a + 3 * f) + 3 * b * heads * s * s
            })
            .sum();
        let embeddings = 4 * b * s * h;
        MemoryEstimate::adamw_f32(BertConfig::num_params(self), per_layer + embeddings)
    }
}

impl Classifier for BertForSequenceClassification {
    type Batch = TextBatch;

    fn logits(&self, b: &TextBatch) -> Tensor<2> {
        self.forward(
            b.input_ids.clone(),
            b.attention_mask.clone(),
            b.token_type_ids.clone(),
        )
    }
}

impl Tapped for BertForSequenceClassification {
    fn tap_layout(c: &BertConfig) -> TapLayout {
        TapLayout {
            layers: c.num_hidden_layers,
            width: c.hidden_size,
            heads: c.layer_heads(),
        }
    }

    fn forward_taps(&self, b: &TextBatch, request: TapRequest) -> Taps {
        let options = super::ForwardOptions {
            hidden_states: request.hidden_states,
            attentions: request.attentions,
            attention_scores: request.attention_scores,
        };
        let o = self.forward_with(
            b.input_ids.clone(),
            b.attention_mask.clone(),
            b.token_type_ids.clone(),
            options,
        );
        Taps {
            logits: o.logits,
            hidden_states: o.hidden_states,
            attentions: o.attentions,
            attention_scores: o.attention_scores,
        }
    }

    fn token_mask(b: &TextBatch) -> Tensor<2> {
        b.attention_mask.clone()
    }

    fn word_embeddings(&self) -> Option<Tensor<2>> {
        Some(self.bert.embeddings.word_embeddings.weight.val())
    }
}

impl Checkpoint for BertForSequenceClassification {
    type Config = BertConfig;

    fn init(config: &BertConfig, device: &Device) -> Self {
        BertForSequenceClassification::new(config, device)
    }

    fn save(&self, config: &BertConfig, dir: &Path) -> Result<(), ModelFault> {
        Ok(weights::save_checkpoint(self, config, dir)?)
    }

    fn load(dir: &Path, device: &Device) -> Result<(Self, BertConfig), ModelFault> {
        Ok(weights::load_checkpoint(dir, device)?)
    }

    /// `[CLS]` (101), then ids spread over the vocabulary above 1000; no padding.
    fn bench_batch(c: &BertConfig, batch: usize, seq: usize, device: &Device) -> Option<TextBatch> {
        let span = c.vocab_size.checked_sub(1000).filter(|&s| s > 0)?;
        let ids: Vec<i64> = (0..batch * seq)
            .map(|i| match i % seq {
                0 => 101,
                _ => 1000 + ((i * 7919) % span) as i64,
            })
            .collect();
        Some(TextBatch {
            input_ids: Tensor::from_data(TensorData::new(ids, [batch, seq]), device),
            attention_mask: Tensor::ones([batch, seq], device),
            token_type_ids: Tensor::zeros([batch, seq], device),
            labels: Tensor::zeros([batch], device),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn optimizer_state_is_16_bytes_per_parameter() {
        let c = BertConfig::tiny(100, 2);
        let m = c.training_memory(2, 8);
        assert_eq!(
            m.weights + m.grads + m.adam_moments,
            16 * c.num_params() as u64
        );
        let bigger = c.training_memory(4, 8);
        assert_eq!(bigger.activations, 2 * m.activations);
    }
}
