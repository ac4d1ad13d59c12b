//! The training-memory estimate `--check` prints.

use serde::Serialize;

/// Estimated bytes of training memory in f32 with AdamW.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct MemoryEstimate {
    /// Bytes of the parameters.
    pub weights: u64,
    /// Bytes of their gradients.
    pub grads: u64,
    /// Bytes of AdamW's two moments.
    pub adam_moments: u64,
    /// Bytes of the activations the backward pass keeps.
    pub activations: u64,
}

impl MemoryEstimate {
    /// Weights, gradients and two AdamW moments (16 bytes a parameter) of `params` parameters,
    /// plus `activation_floats` f32 values the backward pass keeps for one micro-batch.
    pub fn adamw_f32(params: usize, activation_floats: u64) -> Self {
        let p = params as u64;
        Self {
            weights: 4 * p,
            grads: 4 * p,
            adam_moments: 8 * p,
            activations: 4 * activation_floats,
        }
    }

    /// The sum of the parts, in bytes.
    pub fn total(&self) -> u64 {
        self.weights + self.grads + self.adam_moments + self.activations
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adamw_counts_sixteen_bytes_a_parameter() {
        let m = MemoryEstimate::adamw_f32(1000, 10);
        assert_eq!(m.weights + m.grads + m.adam_moments, 16_000);
        assert_eq!(m.total(), 16_040);
    }
}
