//! CPU inference latency: warm-up, then many timed runs at a fixed shape; percentiles.

use std::time::Instant;

use burn::prelude::*;
use mopt_core::Checkpoint;
use serde::Serialize;

/// Latency percentiles of one shape, in milliseconds.
#[derive(Debug, Clone, Copy, Serialize, serde::Deserialize)]
pub struct LatencyStats {
    /// Examples a run.
    pub batch: usize,
    /// Tokens an example (0 for images).
    pub seq_len: usize,
    /// Timed runs.
    pub runs: usize,
    /// Median, ms.
    pub p50_ms: f64,
    /// 90th percentile, ms.
    pub p90_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Mean, ms.
    pub mean_ms: f64,
}

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Time `model`'s forward pass on its [`Checkpoint::bench_batch`] of `batch` examples of
/// `size` (a text's tokens); `None` when the model declares no benchmark batch.
pub fn measure<M: Checkpoint>(
    model: &M,
    config: &M::Config,
    (batch, size): (usize, usize),
    (warmup, runs): (usize, usize),
    device: &Device,
) -> Option<LatencyStats> {
    let input = M::bench_batch(config, batch, size, device)?;
    let run = || {
        let _ = model.logits(&input).into_data();
    };
    for _ in 0..warmup {
        run();
    }
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            run();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(|a, b| a.total_cmp(b));
    Some(LatencyStats {
        batch,
        seq_len: size,
        runs,
        p50_ms: percentile(&times, 50.0),
        p90_ms: percentile(&times, 90.0),
        p99_ms: percentile(&times, 99.0),
        mean_ms: times.iter().sum::<f64>() / times.len().max(1) as f64,
    })
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(|x| x as f64).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 90.0), 90.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&[3.0], 99.0), 3.0);
    }
}
