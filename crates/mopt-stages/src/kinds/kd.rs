//! The training objective of stages that fine-tune a compressed model (prune rounds, QAT), for
//! any model family: KD against the baseline teacher's cached logits, or hard labels.

use burn::prelude::*;
use mopt_core::Checkpoint;
use mopt_distill::kd::{KdSettings, KdTask, LogitCache};
use mopt_distill::spec::{Schedule, SoftLoss};

use crate::error::StageError;
use crate::stage::StageContext;

/// The KD fine-tuning keys of a compressing stage, validated: `alpha` (the hard-label weight,
/// default 0.5) and `temperature` (default 4).
pub fn kd_settings(
    cx: &mopt_recipe::Scope,
    alpha: Option<f64>,
    temperature: Option<f64>,
) -> Result<(f64, f64), mopt_recipe::RecipeError> {
    let alpha = alpha.unwrap_or(0.5);
    if !(0.0..=1.0).contains(&alpha) {
        return Err(cx.err(
            "alpha",
            format!("{alpha} is outside [0, 1]"),
            "the hard-label weight of the KD fine-tuning, e.g. 0.5",
        ));
    }
    let temperature = temperature.unwrap_or(4.0);
    if temperature.is_nan() || temperature <= 0.0 {
        return Err(cx.err(
            "temperature",
            format!("{temperature} must be > 0"),
            "e.g. 4.0",
        ));
    }
    Ok((alpha, temperature))
}

/// The objective of a compressing stage for any model family: `kd = Some((alpha,
/// temperature))`: KD on logits against the run's baseline (loaded as an `M`), its logits on
/// the training split computed once (size-sorted batches of the stage's eval batch size);
/// `None`: hard labels only. `ad` is the training device.
pub fn kd_objective<M>(
    kd: Option<(f64, f64)>,
    cx: &StageContext,
    ad: &Device,
) -> Result<KdTask<M>, StageError>
where
    M: Checkpoint<Batch: mopt_core::Labeled>,
{
    let Some((alpha, temperature)) = kd else {
        return Ok(KdTask::hard_labels(ad));
    };
    let device = cx.device.device();
    let (teacher, _) = M::load(cx.baseline, &device)?;
    let train = cx.splits::<M::Batch>()?.train;
    eprintln!(
        "teacher pass: the baseline's logits on {} training examples",
        train.len()
    );
    let cache = LogitCache::compute(&teacher, &train, cx.entry.train.eval_batch_size, &device);
    let settings = KdSettings {
        alpha: Schedule::Constant(alpha),
        temperature: Schedule::Constant(temperature),
        soft_loss: SoftLoss::Kl,
    };
    Ok(KdTask::new(settings, cache, ad))
}
