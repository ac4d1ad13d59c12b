//! The tapped contract: a model's intermediate outputs that distillation matches against a
//! teacher's (hidden states and attention maps of sequence models, per layer). Matches are
//! resolved against the [`TapLayout`] of the two configs and read the [`Taps`] of a forward pass;
//! the forward pass computes only what the [`TapRequest`] asks for.

use burn::prelude::*;

use crate::model::Checkpoint;

/// Which intermediate outputs a forward pass also returns (each costs memory: ask only for what
/// a match reads).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TapRequest {
    /// The input embedding's output, then every layer's.
    pub hidden_states: bool,
    /// Every layer's attention probabilities.
    pub attentions: bool,
    /// Every layer's attention scores (before the mask and softmax).
    pub attention_scores: bool,
}

/// The logits of a forward pass and the taps it was asked for (empty lists otherwise).
#[derive(Debug, Clone)]
pub struct Taps {
    /// `[batch, num_labels]`
    pub logits: Tensor<2>,
    /// `layers + 1` tensors `[batch, tokens, width]`: the embedding output, then each layer's.
    pub hidden_states: Vec<Tensor<3>>,
    /// `[batch, heads_l, tokens, tokens]` per layer.
    pub attentions: Vec<Tensor<4>>,
    /// `[batch, heads_l, tokens, tokens]` per layer.
    pub attention_scores: Vec<Tensor<4>>,
}

impl Taps {
    /// Logits alone (a model without taps, or a forward pass that asked for none).
    pub fn of_logits(logits: Tensor<2>) -> Self {
        Self {
            logits,
            hidden_states: Vec::new(),
            attentions: Vec::new(),
            attention_scores: Vec::new(),
        }
    }
}

/// The shapes of a model's taps, which matches are resolved against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TapLayout {
    /// Layers (hidden states are indexed 0 = embeddings … `layers`).
    pub layers: usize,
    /// Width of every hidden state.
    pub width: usize,
    /// Attention heads of every layer.
    pub heads: Vec<usize>,
}

/// A model whose intermediate outputs distillation can match.
pub trait Tapped: Checkpoint {
    /// The taps' shapes for a model of `config`.
    fn tap_layout(config: &Self::Config) -> TapLayout;

    /// The forward pass with the taps `request` asks for.
    fn forward_taps(&self, batch: &Self::Batch, request: TapRequest) -> Taps;

    /// `[batch, tokens]`: 1 for real tokens, 0 for padding (what token-wise matches average
    /// over).
    fn token_mask(batch: &Self::Batch) -> Tensor<2>;

    /// The input embedding table `[vocab, width]`, for word-embedding matches; `None` (the
    /// default): the model has none.
    fn word_embeddings(&self) -> Option<Tensor<2>> {
        None
    }
}
