//! Linear warmup then cosine decay, built from Burn's schedulers.

use burn::lr_scheduler::cosine::CosineAnnealingLrSchedulerConfig;
use burn::lr_scheduler::linear::LinearLrSchedulerConfig;
use burn::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
use burn::lr_scheduler::sequential::SequentialLrSchedulerConfig;
use burn::lr_scheduler::LrSchedulerConfig;

/// Warmup from `peak / warmup_steps` to `peak` over `warmup_steps`, then cosine to
/// `peak · final_ratio` at `total_steps`.
pub fn warmup_cosine(
    peak: f64,
    total_steps: usize,
    warmup_fraction: f64,
    final_ratio: f64,
) -> ModuleLrScheduler {
    let total = total_steps.max(2);
    let warmup = ((total as f64 * warmup_fraction).round() as usize).min(total - 1);
    let cosine =
        CosineAnnealingLrSchedulerConfig::new(peak, total - warmup).with_min_lr(peak * final_ratio);
    // A one-step warmup already starts at `peak / 1`: the cosine alone is the same schedule.
    if warmup <= 1 {
        let cosine =
            CosineAnnealingLrSchedulerConfig::new(peak, total).with_min_lr(peak * final_ratio);
        return cosine.init().expect("valid cosine schedule");
    }
    SequentialLrSchedulerConfig::new(
        vec![
            LrSchedulerConfig::Linear(LinearLrSchedulerConfig::new(
                peak / warmup as f64,
                peak,
                warmup - 1,
            )),
            LrSchedulerConfig::Cosine(cosine),
        ],
        vec![warmup],
    )
    .init()
    .expect("valid warmup+cosine schedule")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warms_up_then_decays_to_final_ratio() {
        let mut s = warmup_cosine(1e-3, 100, 0.1, 0.1);
        let lrs: Vec<f64> = (0..100).map(|_| s.step().base()).collect();
        assert!((lrs[0] - 1e-4).abs() < 1e-9, "first step {}", lrs[0]);
        assert!(lrs[..10].windows(2).all(|w| w[1] >= w[0]), "warmup rises");
        let peak = lrs.iter().cloned().fold(0.0, f64::max);
        assert!((peak - 1e-3).abs() < 1e-9);
        assert!(
            lrs[10..].windows(2).all(|w| w[1] <= w[0] + 1e-15),
            "cosine decays"
        );
        assert!(
            (lrs[99] - 1e-4).abs() < 2e-6,
            "ends near 10% of peak: {}",
            lrs[99]
        );
    }

    #[test]
    fn short_runs_have_valid_schedules() {
        for total in 1..30 {
            let mut s = warmup_cosine(1e-3, total, 0.1, 0.0);
            let first = s.step().base();
            assert!(first > 0.0 && first <= 1e-3, "total {total}: {first}");
        }
    }
}
