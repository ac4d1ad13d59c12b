//! Text generation, a capability of language-model families: `mopt-train generate` loads a
//! model (a run's checkpoint folder, or a file the family reads, such as a GGUF) with its
//! tokenizer, continues a prompt and says how fast, the prompt's pass apart from the decoding
//! steps.

use std::path::Path;

use crate::error::StageError;

/// How to continue a prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateSettings {
    /// At most this many new tokens (fewer when the model writes its end-of-text token).
    pub max_new_tokens: usize,
    /// 0 (the default): greedy, the most likely token each step; above 0: a draw from the
    /// tempered softmax.
    pub temperature: f32,
    /// Draws among the `top_k` most likely tokens (0: all of them).
    pub top_k: usize,
    /// Seeds the draws (the same seed, the same text).
    pub seed: u64,
}

/// A prompt's continuation.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// The prompt's tokens.
    pub prompt_tokens: Vec<u32>,
    /// The new tokens.
    pub tokens: Vec<u32>,
    /// The new tokens as text.
    pub text: String,
    /// Seconds of the prompt's pass (its first new token included).
    pub prompt_secs: f64,
    /// Seconds of the other new tokens, one decoding step each.
    pub decode_secs: f64,
    /// The model's linear layers that ran in integers (int8 weights packed once; 0 for a
    /// float model).
    pub integer_layers: usize,
}

impl Generation {
    /// Prompt tokens a second through the prompt's pass.
    pub fn prompt_tokens_per_sec(&self) -> f64 {
        self.prompt_tokens.len() as f64 / self.prompt_secs.max(1e-9)
    }

    /// New tokens a second over the decoding steps (the first, written by the prompt's pass,
    /// not counted).
    pub fn decode_tokens_per_sec(&self) -> f64 {
        self.tokens.len().saturating_sub(1) as f64 / self.decode_secs.max(1e-9)
    }
}

/// A family's `generate` capability.
pub trait CanGenerate: Send + Sync {
    /// Continue `prompt` with the model at `source` (a checkpoint folder of the family, or a
    /// model file it reads) and the tokenizer that comes with it.
    fn generate(
        &self,
        source: &Path,
        prompt: &str,
        settings: &GenerateSettings,
    ) -> Result<Generation, StageError>;
}
