//! LR range test: an exponential learning-rate sweep over a few hundred steps.
//!
//! The loss is smoothed (EMA 0.98, bias-corrected); the sweep stops early when the smoothed loss
//! exceeds four times its minimum. The suggestion is the learning rate where the smoothed loss
//! falls fastest against log-LR, the usual "steepest descent" pick.

use std::path::Path;

use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::GradientsParams;
use burn::prelude::*;
use mopt_core::{Classifier, Examples, Labeled};
use mopt_data::epoch_order;
use mopt_recipe::{LrFindSpec, TrainSpec};
use serde::Serialize;

use crate::amp::{self, LossScaler};
use crate::clip::unscale_and_clip;
use crate::error::TrainError;
use crate::logging::{Progress, RunLogger};
use mopt_kernels::autocast;

/// One point of the sweep.
#[derive(Debug, Clone, Serialize)]
pub struct LrPoint {
    /// Optimizer step.
    pub step: usize,
    /// Learning rate of the step.
    pub lr: f64,
    /// Its loss.
    pub loss: f64,
    /// The loss, exponentially smoothed.
    pub smoothed: f64,
}

/// Result of the range test.
#[derive(Debug, Clone, Serialize)]
pub struct LrFindResult {
    /// Every step of the sweep.
    pub points: Vec<LrPoint>,
    /// The suggested learning rate: where the smoothed loss falls fastest against log-LR.
    pub suggested_lr: f64,
    /// Whether the sweep stopped early (the smoothed loss passed four times its minimum).
    pub stopped_early: bool,
}

/// Learning rate at step `i` of an exponential sweep from `start` to `end` over `n` steps.
pub fn sweep_lr(start: f64, end: f64, i: usize, n: usize) -> f64 {
    if n <= 1 {
        return start;
    }
    start * (end / start).powf(i as f64 / (n - 1) as f64)
}

/// Steepest descent of the smoothed loss against ln(lr), ignoring the noisy first tenth.
pub fn suggest(points: &[LrPoint]) -> f64 {
    let skip = points.len() / 10;
    let mut best = (f64::INFINITY, points.first().map_or(0.0, |p| p.lr));
    for w in points[skip..].windows(2) {
        let slope = (w[1].smoothed - w[0].smoothed) / (w[1].lr.ln() - w[0].lr.ln());
        if slope < best.0 {
            best = (slope, w[0].lr);
        }
    }
    best.1
}

/// Where and how a range test runs.
pub struct LrFindRun<'a> {
    /// The sweep's range and length.
    pub spec: &'a LrFindSpec,
    /// Batch size, precision, clipping and AdamW settings.
    pub train: &'a TrainSpec,
    /// Data order.
    pub seed: u64,
    /// The training (autodiff) device the model is on.
    pub device: &'a Device,
    /// Where the curve and its data are written.
    pub run_dir: &'a Path,
}

/// Run the range test on `model` (on `run.device`) over the `train` split; writes `lr-find.csv`
/// and `lr-find.json` (and TensorBoard scalars) to `run.run_dir`.
pub fn lr_find<C, E>(run: &LrFindRun, mut model: C, train: &E) -> Result<LrFindResult, TrainError>
where
    C: Classifier<Batch: Labeled>,
    E: Examples<Batch = C::Batch>,
{
    let (spec, t, ad, run_dir) = (run.spec, run.train, run.device, run.run_dir);
    let mut optim = crate::trainer::adamw(t);
    let ce = CrossEntropyLossConfig::new().init(ad);
    let mut logger = RunLogger::create(run_dir)?;
    let mut points: Vec<LrPoint> = Vec::new();
    let (mut avg, mut min_smoothed) = (0.0f64, f64::INFINITY);
    let mut order: Vec<usize> = Vec::new();
    let mut epoch = 0;
    let mut progress = Progress::new("lr-find", spec.steps);
    let mut stopped_early = false;
    let compute = amp::compute_dtype(t.precision);
    let mut scaler = t.loss_scale.as_ref().map(LossScaler::new);
    for i in 0..spec.steps {
        if order.len() < t.batch_size {
            order = epoch_order(train.len(), run.seed, epoch);
            epoch += 1;
        }
        let chunk: Vec<usize> = order.drain(..t.batch_size.min(order.len())).collect();
        let b = train.batch(&chunk, ad);
        // The recipe's precision, as in training (matrix products under autocast).
        let logits = autocast::scope(compute, || model.logits(&b));
        let loss = ce.forward(logits, b.labels());
        let value: f32 = loss.clone().into_scalar();
        let lr = sweep_lr(spec.start_lr, spec.end_lr, i, spec.steps);
        avg = 0.98 * avg + 0.02 * value as f64;
        let smoothed = avg / (1.0 - 0.98f64.powi(i as i32 + 1));
        points.push(LrPoint {
            step: i,
            lr,
            loss: value as f64,
            smoothed,
        });
        logger.log(
            "lr_find",
            i,
            &[("loss", value as f64), ("smoothed", smoothed), ("lr", lr)],
            serde_json::json!({}),
        );
        progress.update(i + 1, &format!("lr {lr:.2e} loss {smoothed:.4}"));
        if !value.is_finite() || (i > spec.steps / 10 && smoothed > 4.0 * min_smoothed) {
            stopped_early = true;
            break;
        }
        min_smoothed = min_smoothed.min(smoothed);
        let scaled = match &scaler {
            Some(s) => loss.mul_scalar(s.scale()),
            None => loss,
        };
        let mut grads = GradientsParams::from_grads(scaled.backward(), &model);
        let inv = scaler.as_ref().map_or(1.0, LossScaler::inv_scale);
        let finite = unscale_and_clip(&model, &mut grads, inv, t.grad_clip_norm).is_some();
        if let Some(s) = &mut scaler {
            // fp16: an overflowing step is skipped (and the scale backs off), as in training.
            s.update(finite).map_err(TrainError::Failed)?;
        }
        if finite {
            model = optim.step(lr, model, grads);
        }
    }
    progress.finish("sweep done");
    logger.flush();
    let result = LrFindResult {
        suggested_lr: suggest(&points),
        points,
        stopped_early,
    };
    write_results(&result, run_dir)?;
    Ok(result)
}

/// `lr-find.csv` (one line a step) and `lr-find.json` in `run_dir`.
fn write_results(result: &LrFindResult, run_dir: &Path) -> Result<(), TrainError> {
    let mut csv = String::from("step,lr,loss,smoothed\n");
    for p in &result.points {
        csv.push_str(&format!(
            "{},{:e},{},{}\n",
            p.step, p.lr, p.loss, p.smoothed
        ));
    }
    let csv_path = run_dir.join("lr-find.csv");
    std::fs::write(&csv_path, csv).map_err(|e| TrainError::io(&csv_path, e))?;
    let json_path = run_dir.join("lr-find.json");
    std::fs::write(
        &json_path,
        serde_json::to_string_pretty(result).expect("json"),
    )
    .map_err(|e| TrainError::io(&json_path, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_is_exponential_and_suggestion_is_steepest() {
        assert!((sweep_lr(1e-6, 1e-2, 0, 5) - 1e-6).abs() < 1e-18);
        assert!((sweep_lr(1e-6, 1e-2, 4, 5) - 1e-2).abs() < 1e-12);
        assert!((sweep_lr(1e-6, 1e-2, 2, 5) - 1e-4).abs() < 1e-12);
        // Loss flat, then falling fastest between points 12 and 13, then rising.
        let smoothed = [
            1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.98, 0.9, 0.8, 0.3, 0.25, 0.4, 1.5,
            3.0, 3.0, 3.0,
        ];
        let pts: Vec<LrPoint> = smoothed
            .iter()
            .enumerate()
            .map(|(i, &s)| LrPoint {
                step: i,
                lr: sweep_lr(1e-6, 1.0, i, 20),
                loss: s,
                smoothed: s,
            })
            .collect();
        assert_eq!(suggest(&pts), pts[12].lr);
    }
}
