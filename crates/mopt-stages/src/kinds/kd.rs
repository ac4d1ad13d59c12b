//! The training objective of stages that fine-tune a compressed model (prune rounds, QAT), for
//! any model family: KD against the baseline teacher's cached logits, or hard labels.

use std::path::Path;

use burn::prelude::*;
use mopt_core::Checkpoint;
use mopt_distill::kd::{KdSettings, KdTask, LogitCache};
use mopt_distill::spec::{Schedule, SoftLoss};

use crate::error::StageError;
use crate::family::FamilyEntry;
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

/// Refuse the first of `keys` (`(key, written)`) that a stage writes although it trains without
/// its teacher (`off`: what turns the teacher off, `distill = false`): nothing would read it.
pub fn refuse_without_kd<const N: usize>(
    cx: &mopt_recipe::Scope,
    keys: [(&str, bool); N],
    off: &str,
) -> Result<(), mopt_recipe::RecipeError> {
    match keys.iter().find(|(_, written)| *written) {
        Some((key, _)) => Err(cx.err(
            key,
            format!("`{key}` shapes the teacher's term, which `{off}` leaves out"),
            format!("remove `{key}`, or `{off}`"),
        )),
        None => Ok(()),
    }
}

/// A compressing stage's `teacher-top-k`, validated: `None` keeps every teacher logit, `Some(k)`
/// the `k` largest of each row and the remaining mass (`mopt_distill::topk`).
pub fn teacher_top_k(
    cx: &mopt_recipe::Scope,
    k: Option<usize>,
) -> Result<Option<usize>, mopt_recipe::RecipeError> {
    if k == Some(0) {
        return Err(cx.err(
            "teacher-top-k",
            "0 keeps no logit",
            "keep the k largest logits of each row, e.g. 64, or leave the key out (every logit)",
        ));
    }
    Ok(k)
}

/// `, teacher-top-k = k` for a plan line when the stage keeps the top-k teacher logits only.
pub fn top_k_note(top_k: Option<usize>) -> String {
    top_k.map_or(String::new(), |k| format!(", teacher-top-k = {k}"))
}

/// A compressing stage's KD (between prune rounds, in QAT) reads the baseline's logits cached
/// once over the unaugmented training images; with `[data.augment]` the student's batches are
/// cropped and flipped and would not match them: refused at plan time, naming the fix.
pub fn check_kd_augment(
    entry: &mopt_recipe::StageEntry,
    distill: bool,
    data: &mopt_recipe::DataSpec,
) -> Result<(), StageError> {
    if distill && crate::data::image::augment(data)?.is_on() {
        return Err(entry
            .scope
            .err(
                "distill",
                "this stage's KD reads the teacher's cached logits of unaugmented images, which the `[data.augment]` batches would not match",
                "set `distill = false` on this stage (hard labels), or give `[data.augment]` only to the recipes that train the teacher and distill (the `distill` stage runs its teacher live on the augmented batches)",
            )
            .into());
    }
    Ok(())
}

/// The objective of a compressing stage for any model family: `kd = Some((alpha,
/// temperature))`: KD on logits against the run's baseline (loaded as an `M`), its logits on
/// the training split computed once (size-sorted batches of the stage's eval batch size),
/// each row's `top_k` largest only when given; `None`: hard labels only. `ad` is the training
/// device.
pub fn kd_objective<M>(
    (kd, top_k): (Option<(f64, f64)>, Option<usize>),
    cx: &StageContext,
    ad: &Device,
) -> Result<KdTask<M>, StageError>
where
    M: Checkpoint<Batch: mopt_core::Labeled>,
{
    let Some((alpha, temperature)) = kd else {
        return Ok(KdTask::hard_labels(ad));
    };
    // The baseline teaches as a model of its own family: after a cross-family distill stage
    // the current model (an `M`) is of another family than the teacher.
    let teacher_family = cx.registry.source_family(cx.baseline).unwrap_or(cx.family);
    let teacher = (cx.baseline, teacher_family);
    let cache = taught::<M>(teacher, cx.family.arch(), cx, (true, top_k))?;
    let settings = KdSettings {
        alpha: Schedule::Constant(alpha),
        temperature: Schedule::Constant(temperature),
        soft_loss: SoftLoss::Kl,
    };
    Ok(KdTask::new(settings, cache, ad))
}

/// The logits of the teacher at `teacher_dir` (loaded as `teacher`) on the training split
/// `train`, every logit or each row's `top_k` largest: from the disk cache beside the data
/// (`.mopt-cache/`) when `disk` and an earlier stage or run computed them for the same teacher,
/// examples and `top_k`, otherwise computed now (and saved there when `disk`). Says which on
/// stderr, with the bytes a row takes.
pub fn teacher_logits<M, E>(
    (teacher_dir, teacher): (&Path, &M),
    train: &E,
    cx: &StageContext,
    (disk, top_k): (bool, Option<usize>),
) -> LogitCache
where
    M: Checkpoint,
    E: mopt_core::Examples<Batch = M::Batch>,
{
    let t0 = std::time::Instant::now();
    let dir = disk
        .then(|| mopt_train::setup::cache_dir(cx.data_spec))
        .flatten();
    let (cache, read) = LogitCache::load_or_compute(
        (teacher_dir, teacher),
        train,
        (cx.entry.train.eval_batch_size, top_k),
        &cx.device.device(),
        dir.as_deref(),
    );
    let rows = match cache.top_k() {
        Some(k) => format!("top {k} logits a row, {} bytes", cache.bytes_per_row()),
        None => format!("every logit, {} bytes a row", cache.bytes_per_row()),
    };
    match read {
        Some(f) => eprintln!(
            "teacher logits: reusing {} ({} training examples; {rows})",
            crate::record::shown(&f),
            train.len()
        ),
        None => eprintln!(
            "teacher pass: the teacher's logits on {} training examples in {:.1}s ({rows})",
            train.len(),
            t0.elapsed().as_secs_f64()
        ),
    }
    cache
}

/// The teacher logit cache a KD stage holds while it trains, as the plan's extra memory: a row
/// of every logit (f32) for every training row, or each row's `top_k` largest (their values and
/// ids and the rest's mass: 8k + 4 bytes). `config` is the student's (or the pruned input's)
/// shape, which has the teacher's labels and rows.
pub fn cache_memory(
    config: &impl mopt_core::ModelConfig,
    top_k: Option<usize>,
    cx: &crate::stage::PlanContext,
) -> (String, u64) {
    let rows = (cx.train_examples * config.logit_rows(cx.size())) as u64;
    let row = match top_k {
        Some(k) => 8 * k as u64 + 4,
        None => 4 * config.num_labels() as u64,
    };
    ("teacher logit cache".to_string(), rows * row)
}

/// A family's models as teachers of another family's student (cross-family logit KD): their
/// logits on the run's training split, in its example order, which the student's batches
/// index. Every example of the split is a row (a classifier's) or a row a position (a language
/// model's), over the labels both families score.
pub trait CanTeach: Send + Sync {
    /// The logits of the checkpoint at `teacher` on the training split of `cx`'s run, from
    /// the disk cache when `disk` ([`teacher_logits`]), each row's `top_k` largest when given.
    fn logits(
        &self,
        teacher: &Path,
        cx: &StageContext,
        cache: (bool, Option<usize>),
    ) -> Result<LogitCache, StageError>;
}

/// The logits of the teacher checkpoint at `dir` (of the family `family`) for a student of type
/// `M` (of the family `student`): through the teacher family's [`CanTeach`], or, for a family
/// that registers none, loaded as an `M` when it is the student's family.
pub fn taught<M>(
    (dir, family): (&Path, &FamilyEntry),
    student: &str,
    cx: &StageContext,
    cache: (bool, Option<usize>),
) -> Result<LogitCache, StageError>
where
    M: Checkpoint<Batch: mopt_core::Labeled> + 'static,
{
    match family.capability::<dyn CanTeach>() {
        Some(t) => t.logits(dir, cx, cache),
        None if family.arch() == student => {
            Teach::<M>(std::marker::PhantomData).logits(dir, cx, cache)
        }
        None => Err(StageError::Unsupported(family.lacks(
            &cx.entry.kind,
            "a teacher of another family's student",
            "lists no teach capability",
        ))),
    }
}

/// The teacher capability of the model type `M`: `M::load` and its logits over the split of
/// `M::Batch` (a student of another family reads the same batches).
pub fn teach_capability<M>() -> Box<dyn CanTeach>
where
    M: Checkpoint<Batch: mopt_core::Labeled> + 'static,
{
    Box::new(Teach::<M>(std::marker::PhantomData))
}

struct Teach<M>(std::marker::PhantomData<fn() -> M>);

impl<M> CanTeach for Teach<M>
where
    M: Checkpoint<Batch: mopt_core::Labeled> + 'static,
{
    fn logits(
        &self,
        teacher: &Path,
        cx: &StageContext,
        cache: (bool, Option<usize>),
    ) -> Result<LogitCache, StageError> {
        let (model, _) = M::load(teacher, &cx.device.device())?;
        let train = cx.splits::<M::Batch>()?.train;
        Ok(teacher_logits((teacher, &model), &train, cx, cache))
    }
}
