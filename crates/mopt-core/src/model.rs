//! The model contracts: a config that describes the model, a classifier module, checkpoints.

use std::path::Path;

use burn::module::{Module, ModuleDisplay};
use burn::prelude::*;

use crate::error::ModelFault;
use crate::memory::MemoryEstimate;

/// A model's configuration: everything needed to build it again (Burn's Config → init →
/// Module), and what the plan, the report and the model card say about it.
pub trait ModelConfig: Clone + Send + Sync + 'static {
    /// The family's name as a recipe writes it (`[model] arch`).
    fn arch(&self) -> &'static str;

    /// Number of parameters.
    fn num_params(&self) -> usize;

    /// Number of classes the head predicts.
    fn num_labels(&self) -> usize;

    /// Floating-point operations of one forward pass of one example of `size` (a text's
    /// sequence length; ignored by fixed-shape inputs). Multiply-adds count as two.
    fn flops(&self, size: usize) -> f64;

    /// The shape in a few words, in order (`layers = 3`, `hidden = 384`, …).
    fn summary(&self) -> Vec<(String, String)>;

    /// The shape on one line, without the parameter count (`--check` and the pruning rounds
    /// add it). By default the [`summary`](ModelConfig::summary) pairs.
    fn describe(&self) -> String {
        let parts: Vec<String> = self
            .summary()
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        parts.join(", ")
    }

    /// The shape as JSON fields for records (a pruning round's `heads`, `ffn`, …). By default
    /// the [`summary`](ModelConfig::summary) pairs as strings.
    fn facts(&self) -> serde_json::Map<String, serde_json::Value> {
        self.summary()
            .into_iter()
            .map(|(k, v)| (k, serde_json::Value::String(v)))
            .collect()
    }

    /// Whether the config describes a quantized model (its fake-quant nodes are part of it):
    /// pruning refuses one. False by default.
    fn is_quantized(&self) -> bool {
        false
    }

    /// Training memory of one micro-batch of `batch` examples of `size`.
    fn training_memory(&self, batch: usize, size: usize) -> MemoryEstimate;

    /// Rows of logits one example of `size` yields ([`Classifier::logits`]): one for a
    /// classifier (the default), one a position for a model of per-token outputs.
    fn logit_rows(&self, _size: usize) -> usize {
        1
    }
}

/// A classifier: a Burn module whose forward pass turns a batch into rows of logits, one row a
/// prediction: one an example for a sequence or image classifier, one a position for a model
/// of per-token outputs (a language model's next-token logits, `[batch × positions, vocab]`),
/// the batch's [`crate::Labeled::labels`] one a row. Fine-tuning (cross-entropy a row),
/// evaluation (accuracy, macro-F1, loss and perplexity over rows), the gates and the golden
/// reference need nothing else.
pub trait Classifier: Module + ModuleDisplay + 'static {
    /// What [`logits`](Classifier::logits) reads.
    type Batch: Clone + Send + 'static;

    /// # Shapes
    /// - output: `[rows, num_labels]`, rows a whole number an example (`[batch, num_labels]`
    ///   for a classifier)
    fn logits(&self, batch: &Self::Batch) -> Tensor<2>;
}

/// A model that saves itself with its config and loads back with its own shape (a pruned model
/// reloads pruned).
pub trait Checkpoint: Classifier + Sized {
    /// The configuration the model is built from and saved with.
    type Config: ModelConfig;

    /// A freshly initialised model of the shape `config` describes, on `device`.
    fn init(config: &Self::Config, device: &Device) -> Self;

    /// Write the model and its config into the folder `dir` (which exists and is empty).
    fn save(&self, config: &Self::Config, dir: &Path) -> Result<(), ModelFault>;

    /// Read a folder written by [`save`](Checkpoint::save) onto `device`.
    fn load(dir: &Path, device: &Device) -> Result<(Self, Self::Config), ModelFault>;

    /// A synthetic batch of `batch` examples of `size` (tokens, ignored by fixed-shape inputs)
    /// for latency measurements; `None` (the default): the model is not timed.
    fn bench_batch(
        _config: &Self::Config,
        _batch: usize,
        _size: usize,
        _device: &Device,
    ) -> Option<Self::Batch> {
        None
    }
}
