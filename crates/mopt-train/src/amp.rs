//! Mixed precision: the compute type of a [`Precision`] and dynamic loss scaling for fp16.
//!
//! Burn has no autocast or gradient scaler (its issue #5696). mopt's mixed precision is three
//! parts: [`mopt_kernels::autocast`] runs the model's matrix products in bf16/f16 with f32 master
//! weights; the loss is multiplied by the [`LossScaler`]'s scale before the backward pass so
//! that small f16 gradients do not flush to zero; and at each optimizer step the gradients are
//! checked, unscaled and clipped in one pass ([`crate::clip::unscale_and_clip`]) — or, when one
//! holds an inf or NaN, the step is skipped and the scale backs off.

use burn::tensor::DType;
use mopt_recipe::{LossScaleSpec, Precision};
use serde::{Deserialize, Serialize};

/// The compute type of matrix products for `p` (`None`: f32).
pub fn compute_dtype(p: Precision) -> Option<DType> {
    match p {
        Precision::Fp32 => None,
        Precision::Bf16 => Some(DType::BF16),
        Precision::Fp16 => Some(DType::F16),
    }
}

/// On the CPU, say once per process where bf16 products run when this CPU has no native bf16
/// products (`mopt_kernels::bf16::path`): emulated, they give the same values at f32 speed.
pub fn announce_cpu_path(p: Precision) {
    static SAID: std::sync::Once = std::sync::Once::new();
    if p == Precision::Bf16 && !mopt_kernels::bf16::native() {
        SAID.call_once(|| {
            eprintln!(
                "note: precision = \"bf16\": no native bf16 products on this CPU (AMX, or \
                 AVX512_BF16 on AMD), so they run emulated on f32 kernels (the same values, no \
                 faster than fp32)"
            )
        });
    }
}

/// Consecutive skipped steps at the smallest scale after which training stops with an error:
/// the gradients overflow f16 whatever the scale.
pub const MAX_SKIPS_AT_MIN_SCALE: usize = 10;

/// The smallest scale the backoff goes down to.
pub const MIN_SCALE: f64 = 1.0;

/// Dynamic loss scaling, PyTorch `GradScaler`'s arithmetic. Its state is saved with the
/// training state (`train_state.json` in a run folder).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LossScaler {
    /// The loss is multiplied by this before the backward pass.
    pub scale: f64,
    /// Factor the scale grows by after `growth_interval` clean steps.
    pub growth_factor: f64,
    /// Factor the scale shrinks by on an overflow.
    pub backoff: f64,
    /// Clean steps before the scale grows.
    pub growth_interval: usize,
    /// Clean (finite) steps since the scale last changed.
    pub clean_steps: usize,
    /// Steps skipped so far because a gradient overflowed.
    pub skipped_steps: usize,
    /// Skipped in a row at [`MIN_SCALE`].
    pub skips_at_min: usize,
}

/// What to do with one optimizer step's gradients.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ScaleUpdate {
    /// Gradients were finite: the step was applied. `grew` when the scale was raised after it.
    Applied {
        /// Whether the scale grew after it.
        grew: bool,
    },
    /// A gradient held an inf or NaN: the step was skipped and the scale lowered.
    Skipped,
}

impl LossScaler {
    /// A scaler with the recipe's settings.
    pub fn new(spec: &LossScaleSpec) -> Self {
        Self {
            scale: spec.init,
            growth_factor: spec.growth_factor,
            backoff: spec.backoff,
            growth_interval: spec.growth_interval,
            clean_steps: 0,
            skipped_steps: 0,
            skips_at_min: 0,
        }
    }

    /// Multiplier of the loss before `backward`.
    pub fn scale(&self) -> f32 {
        self.scale as f32
    }

    /// Multiplier that undoes the scale on the gradients.
    pub fn inv_scale(&self) -> f32 {
        (1.0 / self.scale) as f32
    }

    /// Update after a step whose gradients were `finite` (and so applied) or not (skipped).
    /// Errors when the gradients keep overflowing at the smallest scale.
    pub fn update(&mut self, finite: bool) -> Result<ScaleUpdate, String> {
        if finite {
            self.skips_at_min = 0;
            self.clean_steps += 1;
            let grew = self.clean_steps >= self.growth_interval;
            if grew {
                self.scale = (self.scale * self.growth_factor).min(f32::MAX as f64 / 2.0);
                self.clean_steps = 0;
            }
            return Ok(ScaleUpdate::Applied { grew });
        }
        self.skipped_steps += 1;
        self.clean_steps = 0;
        if self.scale <= MIN_SCALE {
            self.skips_at_min += 1;
            if self.skips_at_min >= MAX_SKIPS_AT_MIN_SCALE {
                return Err(format!(
                    "fp16 gradients overflowed in {} steps in a row at loss scale {MIN_SCALE}; \
                     use precision = \"bf16\" or \"fp32\", or lower train.lr",
                    self.skips_at_min
                ));
            }
        }
        self.scale = (self.scale * self.backoff).max(MIN_SCALE);
        Ok(ScaleUpdate::Skipped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(init: f64, interval: usize) -> LossScaleSpec {
        LossScaleSpec {
            init,
            growth_interval: interval,
            growth_factor: 2.0,
            backoff: 0.5,
        }
    }

    #[test]
    fn grows_after_clean_runs_and_backs_off_on_overflow() {
        let mut s = LossScaler::new(&spec(65536.0, 3));
        // Injected pattern: ok ok ok | inf | ok ok inf | ok ok ok ok
        let pattern = [
            true, true, true, false, true, true, false, true, true, true, true,
        ];
        let mut scales = Vec::new();
        let mut outcomes = Vec::new();
        for finite in pattern {
            outcomes.push(s.update(finite).unwrap());
            scales.push(s.scale);
        }
        let k = 65536.0;
        assert_eq!(
            scales,
            vec![
                k,
                k,
                2.0 * k, // third clean step in a row: ×2
                k,       // overflow: ÷2, count reset
                k,
                k,
                k / 2.0, // overflow before the third clean step
                k / 2.0,
                k / 2.0,
                k, // three clean steps again
                k,
            ]
        );
        assert_eq!(s.skipped_steps, 2);
        assert_eq!(s.clean_steps, 1);
        assert_eq!(outcomes[2], ScaleUpdate::Applied { grew: true });
        assert_eq!(outcomes[3], ScaleUpdate::Skipped);
        assert_eq!(outcomes[4], ScaleUpdate::Applied { grew: false });
        assert_eq!(s.scale(), (k) as f32);
        assert_eq!(s.inv_scale(), 1.0 / k as f32);
    }

    #[test]
    fn stops_at_the_floor_and_errors_when_overflow_persists() {
        let mut s = LossScaler::new(&spec(8.0, 100));
        for expect in [4.0, 2.0, 1.0, 1.0] {
            assert_eq!(s.update(false).unwrap(), ScaleUpdate::Skipped);
            assert_eq!(s.scale, expect);
        }
        // One skip at the floor so far; a clean step resets the count.
        assert_eq!(s.skips_at_min, 1);
        s.update(true).unwrap();
        assert_eq!(s.skips_at_min, 0);
        for _ in 0..MAX_SKIPS_AT_MIN_SCALE - 1 {
            s.update(false).unwrap();
        }
        let err = s.update(false).unwrap_err();
        assert!(err.contains("bf16"), "{err}");
    }

    #[test]
    fn state_round_trips_through_json() {
        let mut s = LossScaler::new(&spec(1024.0, 2));
        s.update(true).unwrap();
        s.update(false).unwrap();
        let back: LossScaler = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn precisions_map_to_compute_types() {
        assert_eq!(compute_dtype(Precision::Fp32), None);
        assert_eq!(compute_dtype(Precision::Bf16), Some(DType::BF16));
        assert_eq!(compute_dtype(Precision::Fp16), Some(DType::F16));
    }
}
