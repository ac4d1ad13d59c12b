//! `[train]` and a stage's `[stage.train]` overrides.

use crate::error::RecipeError;
use crate::raw::RawTrain;
use crate::scope::Scope;

/// Metric that picks the best checkpoint (any [`Metric`], by its direction).
pub type BestMetric = crate::Metric;

/// Compute precision of training (`precision` in `[train]` or a stage's train table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// Everything in f32.
    #[default]
    Fp32,
    /// Matrix products in bfloat16 (f32's range, 8 bits of mantissa): no loss scaling needed.
    Bf16,
    /// Matrix products in IEEE half (10 bits of mantissa, max 65504), with dynamic loss scaling.
    Fp16,
}

impl Precision {
    /// The precision's recipe name.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
        }
    }

    /// The precision named `s` (`fp32`, `bf16`, `fp16`).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "fp32" | "f32" => Some(Precision::Fp32),
            "bf16" => Some(Precision::Bf16),
            "fp16" | "f16" => Some(Precision::Fp16),
            _ => None,
        }
    }
}

/// Dynamic loss scaling (fp16): the loss is multiplied by `init` before the backward pass; a step
/// whose gradients hold an inf or NaN is skipped and halves the scale (`backoff`), and after
/// `growth_interval` clean steps in a row the scale grows by `growth_factor`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossScaleSpec {
    /// Initial loss scale.
    pub init: f64,
    /// Clean steps before the scale grows.
    pub growth_interval: usize,
    /// Factor the scale grows by.
    pub growth_factor: f64,
    /// Factor it shrinks by on an overflow.
    pub backoff: f64,
}

impl Default for LossScaleSpec {
    /// PyTorch's `GradScaler` defaults.
    fn default() -> Self {
        Self {
            init: 65536.0,
            growth_interval: 2000,
            growth_factor: 2.0,
            backoff: 0.5,
        }
    }
}

/// `[train] max-nonfinite-steps` when the recipe leaves it out.
pub const DEFAULT_MAX_NONFINITE_STEPS: usize = 10;

/// `[train] state-every` when the recipe leaves it out.
pub const DEFAULT_STATE_EVERY: usize = 200;

/// `[train]`: optimisation.
#[derive(Debug, Clone)]
pub struct TrainSpec {
    /// Epochs.
    pub epochs: usize,
    /// Examples a micro-batch (per device).
    pub batch_size: usize,
    /// Examples an evaluation batch.
    pub eval_batch_size: usize,
    /// Micro-batches an optimizer step accumulates.
    pub grad_accum_steps: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// AdamW's decoupled weight decay.
    pub weight_decay: f64,
    /// AdamW's β₁.
    pub adam_beta1: f32,
    /// AdamW's β₂.
    pub adam_beta2: f32,
    /// AdamW's ε.
    pub adam_epsilon: f32,
    /// Share of the steps of linear warmup.
    pub warmup_fraction: f64,
    /// The cosine decay's final share of the peak.
    pub final_lr_ratio: f64,
    /// Global-norm clipping; `None` disables it.
    pub grad_clip_norm: Option<f32>,
    /// The validation metric the best epoch is chosen by.
    pub best_metric: BestMetric,
    /// Log a training line / TensorBoard point every this many optimizer steps.
    pub log_every: usize,
    /// Recompute cheap activations in the backward pass instead of keeping them (Burn's
    /// balanced gradient checkpointing): less activation memory for more compute.
    pub gradient_checkpointing: bool,
    /// Precision of the forward and backward matrix products; weights, optimizer state, softmax,
    /// LayerNorm and the losses stay f32.
    pub precision: Precision,
    /// Loss scaling: `Some` exactly when `precision` is fp16.
    pub loss_scale: Option<LossScaleSpec>,
    /// Optimizer steps in a row with a non-finite loss or gradient (each skipped) before the
    /// run stops (fp32/bf16; fp16 backs its loss scale off instead).
    pub max_nonfinite_steps: usize,
    /// Optimizer steps between saves of the resumable training state (weights, optimizer
    /// moments, data position, logs' lengths); it is also saved at every epoch's end.
    pub state_every: usize,
}

impl Default for TrainSpec {
    /// What an empty `[train]` table gives (the recipe's defaults), for training set up in Rust:
    /// 3 epochs, batch 32, AdamW at 5e-5 with weight decay 0.01, 10% warmup, cosine to a tenth,
    /// global-norm clipping at 1.0, best epoch by validation accuracy, fp32.
    fn default() -> Self {
        Self {
            epochs: 3,
            batch_size: 32,
            eval_batch_size: 64,
            grad_accum_steps: 1,
            lr: 5e-5,
            weight_decay: 0.01,
            adam_beta1: 0.9,
            adam_beta2: 0.999,
            adam_epsilon: 1e-8,
            warmup_fraction: 0.1,
            final_lr_ratio: 0.1,
            grad_clip_norm: Some(1.0),
            best_metric: BestMetric::Accuracy,
            log_every: 20,
            gradient_checkpointing: false,
            precision: Precision::Fp32,
            loss_scale: None,
            max_nonfinite_steps: DEFAULT_MAX_NONFINITE_STEPS,
            state_every: DEFAULT_STATE_EVERY,
        }
    }
}

/// `[lr-find]`: the LR range test.
#[derive(Debug, Clone)]
pub struct LrFindSpec {
    /// First learning rate of the sweep.
    pub start_lr: f64,
    /// Last learning rate.
    pub end_lr: f64,
    /// Steps of the sweep.
    pub steps: usize,
}

/// Validate a train table; `cx` is the scope of the table (`train.` or `stage[2].train.`).
pub fn train_spec(cx: &Scope, t: RawTrain) -> Result<TrainSpec, RecipeError> {
    let lr = peak_lr(cx, t.lr)?;
    let weight_decay = weight_decay(cx, t.weight_decay)?;
    let final_lr_ratio = final_lr_ratio(cx, t.final_lr_ratio)?;
    let grad_clip_norm = grad_clip_norm(cx, t.grad_clip_norm)?;
    let best_metric = best_metric(cx, t.best_metric.as_deref())?;
    let (beta1, beta2) = adam_betas(cx, t.adam_beta1, t.adam_beta2)?;
    let batch_size = cx.positive("batch-size", t.batch_size, 32)?;
    let (precision, loss_scale) = precision(cx, &t)?;
    Ok(TrainSpec {
        epochs: cx.positive("epochs", t.epochs, 3)?,
        batch_size,
        eval_batch_size: cx.positive("eval-batch-size", t.eval_batch_size, batch_size * 2)?,
        grad_accum_steps: cx.positive("grad-accum-steps", t.grad_accum_steps, 1)?,
        lr,
        weight_decay,
        adam_beta1: beta1,
        adam_beta2: beta2,
        adam_epsilon: t.adam_epsilon.unwrap_or(1e-8),
        warmup_fraction: cx.fraction(
            "warmup-fraction",
            t.warmup_fraction,
            0.1,
            "0.05 to 0.1 of the steps",
        )?,
        final_lr_ratio,
        grad_clip_norm,
        best_metric,
        log_every: cx.positive("log-every", t.log_every, 20)?,
        gradient_checkpointing: t.gradient_checkpointing.unwrap_or(false),
        precision,
        loss_scale,
        max_nonfinite_steps: cx.positive(
            "max-nonfinite-steps",
            t.max_nonfinite_steps,
            DEFAULT_MAX_NONFINITE_STEPS,
        )?,
        state_every: cx.positive("state-every", t.state_every, DEFAULT_STATE_EVERY)?,
    })
}

/// `lr`, the peak learning rate (default 5e-5), which must lie in (0, 1].
fn peak_lr(cx: &Scope, value: Option<f64>) -> Result<f64, RecipeError> {
    let lr = value.unwrap_or(5e-5);
    if !(lr > 0.0 && lr <= 1.0) {
        return Err(cx.err(
            "lr",
            format!("{lr} is not in (0, 1]"),
            "fine-tuning a pretrained model uses 1e-5 to 1e-4; training from scratch up to 1e-2",
        ));
    }
    Ok(lr)
}

/// `weight-decay` (default 0.01), which must lie in [0, 1).
fn weight_decay(cx: &Scope, value: Option<f64>) -> Result<f64, RecipeError> {
    let weight_decay = value.unwrap_or(0.01);
    if !(0.0..1.0).contains(&weight_decay) {
        return Err(cx.err(
            "weight-decay",
            format!("{weight_decay} is outside [0, 1)"),
            "0.01 is the usual AdamW value",
        ));
    }
    Ok(weight_decay)
}

/// `final-lr-ratio` (default 0.1), which must lie in [0, 1].
fn final_lr_ratio(cx: &Scope, value: Option<f64>) -> Result<f64, RecipeError> {
    let final_lr_ratio = value.unwrap_or(0.1);
    if !(0.0..=1.0).contains(&final_lr_ratio) {
        return Err(cx.err(
            "final-lr-ratio",
            format!("{final_lr_ratio} is outside [0, 1]"),
            "0.1 decays to a tenth of the peak",
        ));
    }
    Ok(final_lr_ratio)
}

/// `grad-clip-norm` (default 1.0); 0 turns clipping off (`None`).
fn grad_clip_norm(cx: &Scope, value: Option<f32>) -> Result<Option<f32>, RecipeError> {
    match value {
        Some(n) if n < 0.0 || !n.is_finite() => Err(cx.err(
            "grad-clip-norm",
            format!("{n} must be positive (0 turns clipping off)"),
            "1.0 is a good start",
        )),
        Some(0.0) => Ok(None),
        Some(n) => Ok(Some(n)),
        None => Ok(Some(1.0)),
    }
}

/// `best-metric` (default `accuracy`).
fn best_metric(cx: &Scope, value: Option<&str>) -> Result<BestMetric, RecipeError> {
    let name = value.unwrap_or("accuracy");
    crate::Metric::from_name(name).ok_or_else(|| {
        cx.err(
            "best-metric",
            format!("unknown metric `{name}`"),
            format!("use {}", crate::Metric::listed()),
        )
    })
}

/// `adam-beta1` and `adam-beta2` (default 0.9 and 0.999), each in [0, 1).
fn adam_betas(
    cx: &Scope,
    beta1: Option<f32>,
    beta2: Option<f32>,
) -> Result<(f32, f32), RecipeError> {
    let beta1 = beta1.unwrap_or(0.9);
    let beta2 = beta2.unwrap_or(0.999);
    for (k, b) in [("adam-beta1", beta1), ("adam-beta2", beta2)] {
        if !(0.0..1.0).contains(&b) {
            return Err(cx.err(k, format!("{b} is outside [0, 1)"), "use 0.9 / 0.999"));
        }
    }
    Ok((beta1, beta2))
}

/// `precision` and, for fp16, the `loss-scale-*` keys.
fn precision(cx: &Scope, t: &RawTrain) -> Result<(Precision, Option<LossScaleSpec>), RecipeError> {
    let name = t.precision.as_deref().unwrap_or("fp32");
    let p = Precision::parse(name).ok_or_else(|| {
        cx.err(
            "precision",
            format!("unknown precision `{name}`"),
            "use `fp32`, `bf16` (GPUs with bfloat16) or `fp16` (with dynamic loss scaling)",
        )
    })?;
    let keys = [
        ("loss-scale-init", t.loss_scale_init.is_some()),
        (
            "loss-scale-growth-interval",
            t.loss_scale_growth_interval.is_some(),
        ),
        (
            "loss-scale-growth-factor",
            t.loss_scale_growth_factor.is_some(),
        ),
        ("loss-scale-backoff", t.loss_scale_backoff.is_some()),
    ];
    if p != Precision::Fp16 {
        if let Some((key, _)) = keys.iter().find(|(_, set)| *set) {
            return Err(cx.err(
                key,
                format!("loss scaling is for fp16, and precision is `{}`", p.name()),
                "remove the loss-scale keys, or set precision = \"fp16\"",
            ));
        }
        return Ok((p, None));
    }
    let d = LossScaleSpec::default();
    let init = t.loss_scale_init.unwrap_or(d.init);
    if !(1.0..=1e30).contains(&init) {
        return Err(cx.err(
            "loss-scale-init",
            format!("{init} is outside [1, 1e30]"),
            "65536 (2^16) is the usual start",
        ));
    }
    let growth_factor = t.loss_scale_growth_factor.unwrap_or(d.growth_factor);
    if !(growth_factor > 1.0 && growth_factor <= 1e3) {
        return Err(cx.err(
            "loss-scale-growth-factor",
            format!("{growth_factor} must be above 1"),
            "2.0 doubles the scale after a run of clean steps",
        ));
    }
    let backoff = t.loss_scale_backoff.unwrap_or(d.backoff);
    if !(backoff > 0.0 && backoff < 1.0) {
        return Err(cx.err(
            "loss-scale-backoff",
            format!("{backoff} is outside (0, 1)"),
            "0.5 halves the scale on an overflow",
        ));
    }
    let spec = LossScaleSpec {
        init,
        growth_interval: cx.positive(
            "loss-scale-growth-interval",
            t.loss_scale_growth_interval,
            d.growth_interval,
        )?,
        growth_factor,
        backoff,
    };
    Ok((p, Some(spec)))
}

/// `base` with the keys of `overrides` replaced (a stage's `[stage.train]` over `[train]`).
pub fn merge_tables(base: &toml::Table, overrides: &toml::Table) -> toml::Table {
    let mut t = base.clone();
    for (k, v) in overrides {
        t.insert(k.clone(), v.clone());
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_an_empty_train_table() {
        let raw: RawTrain = toml::from_str("").unwrap();
        let cx = Scope::root(std::path::Path::new("r.toml"), "");
        let from_recipe = train_spec(&cx.nested("train"), raw).unwrap();
        assert_eq!(
            format!("{:?}", TrainSpec::default()),
            format!("{from_recipe:?}")
        );
    }
}
