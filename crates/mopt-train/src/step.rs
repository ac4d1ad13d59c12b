//! The optimizer-step boundary: unscale (fp16), check for overflow, clip, and AdamW at the
//! scheduled learning rate — or skip the step when the loss or a gradient is not finite (fp16:
//! backing the loss scale off; otherwise counting, and stopping after too many in a row).

use burn::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
use burn::optim::{GradientsParams, ModuleOptimizer};
use burn::prelude::*;
use mopt_recipe::TrainSpec;

use crate::amp::{LossScaler, ScaleUpdate};
use crate::clip::unscale_and_clip;
use crate::schedule::warmup_cosine;

/// Optimizer, LR schedule, clipping and (fp16) loss scaling of one training run.
pub struct Stepper {
    optim: ModuleOptimizer,
    sched: ModuleLrScheduler,
    clip: Option<f32>,
    /// `Some` for fp16.
    pub scaler: Option<LossScaler>,
    /// LR of the last applied step.
    pub lr: f64,
    /// Non-finite steps in a row (without loss scaling) before [`step`](Self::step) fails.
    max_nonfinite: usize,
    /// Non-finite steps skipped in a row.
    nonfinite_in_row: usize,
    /// Non-finite steps skipped so far (without loss scaling).
    pub nonfinite_skipped: usize,
}

/// The stepper's state besides the optimizer's moments (saved with the training state).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepperState {
    /// Optimizer steps applied (the LR schedule's position).
    pub applied: usize,
    /// LR of the last applied step.
    pub lr: f64,
    /// Non-finite steps skipped in a row.
    pub nonfinite_in_row: usize,
    /// Non-finite steps skipped so far.
    pub nonfinite_skipped: usize,
    /// The loss scaler (fp16).
    pub scaler: Option<LossScaler>,
}

/// What one optimizer step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepResult {
    /// False when a gradient overflowed and the step was skipped (weights, optimizer state and
    /// LR schedule untouched).
    pub applied: bool,
    /// Global gradient norm before clipping (unscaled); `None` on a skipped step.
    pub grad_norm: Option<f32>,
}

impl Stepper {
    /// AdamW, warmup + cosine over `total_steps`, clipping, loss scaling and the non-finite
    /// guard from `t`.
    pub fn new(t: &TrainSpec, total_steps: usize) -> Self {
        Self {
            max_nonfinite: t.max_nonfinite_steps,
            ..Self::with_optimizer(
                crate::trainer::adamw(t),
                warmup_cosine(t.lr, total_steps, t.warmup_fraction, t.final_lr_ratio),
                t.grad_clip_norm,
                t.loss_scale.as_ref().map(LossScaler::new),
            )
        }
    }

    /// A stepper with this optimizer, schedule, clipping and scaler (the non-finite guard at its default).
    pub fn with_optimizer(
        optim: ModuleOptimizer,
        sched: ModuleLrScheduler,
        clip: Option<f32>,
        scaler: Option<LossScaler>,
    ) -> Self {
        Self {
            optim,
            sched,
            clip,
            scaler,
            lr: 0.0,
            max_nonfinite: mopt_recipe::DEFAULT_MAX_NONFINITE_STEPS,
            nonfinite_in_row: 0,
            nonfinite_skipped: 0,
        }
    }

    /// Its state after `applied` optimizer steps (the optimizer's moments: [`save_optimizer`](Self::save_optimizer)).
    pub fn state(&self, applied: usize) -> StepperState {
        StepperState {
            applied,
            lr: self.lr,
            nonfinite_in_row: self.nonfinite_in_row,
            nonfinite_skipped: self.nonfinite_skipped,
            scaler: self.scaler.clone(),
        }
    }

    /// Write the optimizer's state (AdamW's moments and step counts, a burnpack file).
    pub fn save_optimizer(&self, path: &std::path::Path) -> Result<(), String> {
        self.optim.save(path).map_err(|e| e.to_string())
    }

    /// This stepper where `state` left it: the optimizer's moments read from `optimizer` and
    /// the LR schedule advanced by the steps applied (the schedule is a pure function of them).
    pub fn restore(
        self,
        state: &StepperState,
        optimizer: &std::path::Path,
    ) -> Result<Self, String> {
        let mut s = Self {
            optim: self.optim.load(optimizer).map_err(|e| e.to_string())?,
            ..self
        };
        for _ in 0..state.applied {
            s.sched.step();
        }
        s.lr = state.lr;
        s.nonfinite_in_row = state.nonfinite_in_row;
        s.nonfinite_skipped = state.nonfinite_skipped;
        s.scaler = state.scaler.clone();
        Ok(s)
    }

    /// Multiplier of the loss before `backward` (the loss scale; 1 without scaling).
    pub fn loss_multiplier(&self) -> f32 {
        self.scaler.as_ref().map_or(1.0, LossScaler::scale)
    }

    /// One optimizer step on `grads` (computed from a loss multiplied by
    /// [`loss_multiplier`](Self::loss_multiplier)). `overflowed` marks a step whose loss was
    /// already non-finite. Errors when fp16 gradients keep overflowing at the smallest scale.
    pub fn step<M: Module>(
        &mut self,
        model: M,
        mut grads: GradientsParams,
        overflowed: bool,
    ) -> Result<(M, StepResult), String> {
        let inv = self.scaler.as_ref().map_or(1.0, LossScaler::inv_scale);
        let norm = if overflowed {
            None
        } else {
            unscale_and_clip(&model, &mut grads, inv, self.clip)
        };
        let skipped = StepResult {
            applied: false,
            grad_norm: None,
        };
        if let Some(scaler) = &mut self.scaler {
            if scaler.update(norm.is_some())? == ScaleUpdate::Skipped {
                return Ok((model, skipped));
            }
        } else if norm.is_none() {
            // A NaN or inf in the loss or a gradient: skip the step, weights and optimizer
            // state untouched; too many in a row stop the run.
            self.nonfinite_in_row += 1;
            self.nonfinite_skipped += 1;
            if self.nonfinite_in_row >= self.max_nonfinite {
                return Err(format!(
                    "{} optimizer steps in a row had a non-finite loss or gradient (train.max-nonfinite-steps = {}); \
                     the last good checkpoint is kept. Look for NaN or inf in the data, lower train.lr, or keep train.grad-clip-norm on",
                    self.nonfinite_in_row, self.max_nonfinite
                ));
            }
            return Ok((model, skipped));
        }
        self.nonfinite_in_row = 0;
        self.lr = self.sched.step().base();
        let model = self.optim.step(self.lr, model, grads);
        Ok((
            model,
            StepResult {
                applied: true,
                grad_norm: self.clip.and(norm),
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::nn::{Linear, LinearConfig};
    use mopt_recipe::LossScaleSpec;

    fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data().try_to_vec().unwrap()
    }

    fn setup(scaled: bool) -> (Linear, Stepper) {
        let device = Device::flex().autodiff();
        let model: Linear = LinearConfig::new(3, 2).init(&device);
        let spec = LossScaleSpec {
            init: 1024.0,
            growth_interval: 2,
            growth_factor: 2.0,
            backoff: 0.5,
        };
        let optim = burn::optim::SgdConfig::new().init();
        let stepper = Stepper::with_optimizer(
            optim,
            ModuleLrScheduler::new(0.1f64),
            None,
            scaled.then(|| LossScaler::new(&spec)),
        );
        (model, stepper)
    }

    /// Gradients of `factor · Σ (x·W + b)` for a fixed batch.
    fn grads(model: &Linear, factor: f32) -> GradientsParams {
        let x =
            Tensor::<2>::from_floats([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], &model.weight.device());
        let loss = model.forward(x).sum().mul_scalar(factor);
        GradientsParams::from_grads(loss.backward(), model)
    }

    #[test]
    fn a_skipped_step_leaves_the_weights_untouched() {
        let (model, mut stepper) = setup(true);
        let before = values(model.weight.val());
        let g = grads(&model, f32::INFINITY);
        let (model, r) = stepper.step(model, g, false).unwrap();
        assert!(!r.applied);
        assert_eq!(values(model.weight.val()), before, "bit-identical weights");
        assert_eq!(stepper.scaler.as_ref().unwrap().scale, 512.0);
        // An already non-finite loss skips without looking at the gradients.
        let g = grads(&model, 1.0);
        let (model, r) = stepper.step(model, g, true).unwrap();
        assert!(!r.applied);
        assert_eq!(values(model.weight.val()), before);
        assert_eq!(stepper.scaler.as_ref().unwrap().skipped_steps, 2);
    }

    #[test]
    fn a_scaled_step_equals_the_unscaled_step() {
        // Same model, one step on plain gradients vs one on gradients of a 256× loss, unscaled.
        let (model, mut plain) = setup(false);
        let g = grads(&model, 1.0);
        let (m1, r1) = plain.step(model.clone(), g, false).unwrap();
        let (_, mut scaled) = setup(true);
        scaled.scaler.as_mut().unwrap().scale = 256.0;
        let g = grads(&model, scaled.loss_multiplier());
        let (m2, r2) = scaled.step(model.clone(), g, false).unwrap();
        assert!(r1.applied && r2.applied);
        let (w1, w2) = (values(m1.weight.val()), values(m2.weight.val()));
        assert_ne!(
            w1,
            values(model.weight.val()),
            "the step changed the weights"
        );
        for (a, b) in w1.iter().zip(&w2) {
            assert!((a - b).abs() < 1e-6, "{w1:?} vs {w2:?}");
        }
    }
}
