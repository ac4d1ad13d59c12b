//! Memory accounting: a training-memory estimate for `--check` and the process's peak RSS.

use mopt_models::bert::BertConfig;
use serde::Serialize;

/// Estimated bytes of training memory in f32 with AdamW.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct MemoryEstimate {
    pub weights: u64,
    pub grads: u64,
    pub adam_moments: u64,
    pub activations: u64,
}

impl MemoryEstimate {
    pub fn total(&self) -> u64 {
        self.weights + self.grads + self.adam_moments + self.activations
    }

    /// Weights, gradients and two AdamW moments (16 bytes a parameter) plus the activations the
    /// backward pass keeps for one micro-batch of `batch × seq` tokens.
    pub fn for_bert(config: &BertConfig, batch: usize, seq: usize) -> Self {
        let p = config.num_params() as u64;
        let (b, s, h) = (batch as u64, seq as u64, config.hidden_size as u64);
        let d = config.head_size() as u64;
        let per_layer: u64 = (0..config.num_hidden_layers)
            .map(|i| {
                let heads = config.heads(i) as u64;
                let f = config.ffn(i) as u64;
                let a = heads * d;
                // inputs of Q/K/V, Q/K/V, context, residual sums, LayerNorm inputs/outputs,
                // dropout masks, FFN input/pre-activation/activation, plus scores/probs/mask.
                b * s * (8 * h + 5 * a + 3 * f) + 3 * b * heads * s * s
            })
            .sum();
        let embeddings = 4 * b * s * h;
        MemoryEstimate {
            weights: 4 * p,
            grads: 4 * p,
            adam_moments: 8 * p,
            activations: 4 * (per_layer + embeddings),
        }
    }
}

/// Peak resident set size of this process in bytes (Linux `VmHWM`), if known.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// `12.3 MiB`-style formatting.
pub fn human_bytes(b: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < units.len() {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.1} {}", units[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn optimizer_state_is_16_bytes_per_parameter() {
        let c = BertConfig::tiny(100, 2);
        let m = MemoryEstimate::for_bert(&c, 2, 8);
        assert_eq!(
            m.weights + m.grads + m.adam_moments,
            16 * c.num_params() as u64
        );
        let bigger = MemoryEstimate::for_bert(&c, 4, 8);
        assert_eq!(bigger.activations, 2 * m.activations);
        assert_eq!(human_bytes(1536), "1.5 KiB");
    }
}
