//! A `distill` stage for any classifier: a fresh student of a given shape trained on the
//! teacher's logits (KD, `L = α·CE + (1−α)·soft(T)`), the teacher's logits on the training
//! split computed once, and with `baseline = true` its hard-label twin (same init, same budget)
//! reported beside it. What a family without intermediate matches calls from its
//! [`Family::distill`](crate::family::Family::distill); BERT's stage adds matches.

use std::path::Path;

use mopt_core::{Checkpoint, FeatureMaps, Labeled, ModelConfig};
use mopt_distill::features::{MapKdTask, MapMatch, MapStudent, MapWidths};
use mopt_distill::kd::{KdSettings, KdTask};
use mopt_recipe::Metric;
use mopt_train::trainer::{fit, RunContext, TrainReport};
use serde_json::json;

use crate::error::StageError;
use crate::kinds::distill::DistillStage;
use crate::kinds::kd::taught;
use crate::plan::train_settings;
use crate::shape::Shape;
use crate::stage::{PlanContext, ReferenceModel, StageContext, StageOutput, StagePlan};

/// The plan of a logits-only distill stage whose student is `student` (teacher `teacher`).
pub fn plan<C: ModelConfig>(
    stage: &DistillStage,
    entry: &mopt_recipe::StageEntry,
    (teacher, student): (&Shape, C),
    cx: &PlanContext,
) -> Result<StagePlan, StageError> {
    stage.refuse_augment("this family's distillation trains on its inputs as they are")?;
    let (s, size) = (&stage.spec, cx.size());
    check_label_space(stage, teacher, &student, size)?;
    let settings = vec![
        format!(
            "student: {}, {:.2}M params, random init",
            student.describe(),
            student.num_params() as f64 / 1e6
        ),
        format!(
            "{}, {}; KD on logits{}",
            s.objective_line(),
            baseline_setting(s.baseline),
            match s.teacher_top_k {
                Some(k) => format!(", the teacher's top {k} logits a row and the rest's mass"),
                None => String::new(),
            }
        ),
    ];
    let cache = s
        .enabled
        .then(|| crate::kinds::kd::cache_memory(&student, s.teacher_top_k, cx));
    Ok(StagePlan {
        memory: Some(student.training_memory(entry.train.batch_size, size)),
        output: Shape::new(student),
        settings: settings
            .into_iter()
            .chain(train_settings(&entry.train, entry.train_overridden))
            .collect(),
        extra_memory: [(
            "teacher weights (inference)".to_string(),
            4 * teacher.num_params() as u64,
        )]
        .into_iter()
        .chain(cache)
        .collect(),
    })
}

/// Refuse a student whose logits do not line up with the teacher's: another label space (its
/// classes, a language model's vocabulary) or another number of rows an example.
fn check_label_space<C: ModelConfig>(
    stage: &DistillStage,
    teacher: &Shape,
    student: &C,
    size: usize,
) -> Result<(), StageError> {
    let (t, s) = (
        (teacher.num_labels(), teacher.logit_rows(size)),
        (student.num_labels(), student.logit_rows(size)),
    );
    if t == s {
        return Ok(());
    }
    let what = format!(
        "the student (`{}`) scores {} labels in {} rows an example, the teacher (`{}`) {} in {}: logit KD needs one label space",
        student.arch(),
        s.0,
        s.1,
        teacher.arch(),
        t.0,
        t.1
    );
    let fix = "distil into a student of the teacher's task (its classes, or its vocabulary for a language model)";
    Err(stage.scope.nested("student").err("arch", what, fix).into())
}

/// Train a fresh `M` shaped `config` on the logits of the teacher at `input` (and its
/// hard-label twin when the stage asks for it): a teacher of `M`'s family loaded as one,
/// another family's through its [`CanTeach`](crate::kinds::kd::CanTeach).
pub fn run<M>(
    stage: &DistillStage,
    input: &Path,
    cx: &StageContext,
    config: &M::Config,
) -> Result<StageOutput, StageError>
where
    M: Checkpoint<Batch: Labeled>,
{
    let (entry, spec) = (cx.entry, &stage.spec);
    let ad = cx.device.train_device(&entry.train);
    let run = cx.run_context::<M::Batch, _>(config)?;
    let task = if spec.enabled {
        // A teacher of another family teaches through its own capability, over the same
        // training split.
        let teacher = (input, cx.family);
        let cache_keys = (spec.teacher_cache, spec.teacher_top_k);
        let cache = taught::<M>(teacher, config.arch(), cx, cache_keys)?;
        let settings = KdSettings {
            alpha: spec.alpha,
            temperature: spec.temperature,
            soft_loss: spec.soft_loss,
        };
        KdTask::<M>::new(settings, cache, &ad).with_extra(stage.extra.clone())
    } else {
        KdTask::hard_labels(&ad)
    };
    let student = || {
        ad.seed(cx.seed);
        M::init(config, &ad)
    };
    let training = fit(&run, task, student())?;
    let what = "the teacher's logits";
    finish::<M>(stage, cx, &run, (&training, what), student)
}

/// Train a fresh `M` shaped `config` on the logits and the feature maps (`matches`) of the
/// teacher at `input`, which runs live beside it (and its hard-label twin when the stage asks
/// for it).
pub fn run_maps<M>(
    stage: &DistillStage,
    input: &Path,
    cx: &StageContext,
    config: &M::Config,
    matches: Vec<MapMatch>,
) -> Result<StageOutput, StageError>
where
    M: FeatureMaps<Batch: Labeled>,
{
    let spec = &stage.spec;
    let ad = cx.device.train_device(&cx.entry.train);
    let device = cx.device.device();
    let run = cx.run_context::<M::Batch, _>(config)?;
    let (teacher, teacher_config) = M::load(input, &device)?;
    let widths: Vec<MapWidths> = {
        let (s, t) = (
            M::feature_shapes(config),
            M::feature_shapes(&teacher_config),
        );
        matches
            .iter()
            .map(|m| (s[m.student][0], t[m.teacher][0], m.loss, m.projection))
            .collect()
    };
    let settings = KdSettings {
        alpha: spec.alpha,
        temperature: spec.temperature,
        soft_loss: spec.soft_loss,
    };
    eprintln!(
        "distill: {} feature-map matches, the teacher running live",
        matches.len()
    );
    let task = MapKdTask::new(
        settings,
        matches,
        (teacher.valid(), device),
        run.data.train,
        &ad,
    )
    .with_extra(stage.extra.clone());
    let student = || {
        ad.seed(cx.seed);
        M::init(config, &ad)
    };
    let model = MapStudent::new(student(), &widths, &ad);
    let training = fit(&run, task, model)?;
    let what = "the teacher's logits and feature maps";
    finish::<M>(stage, cx, &run, (&training, what), student)
}

/// The stage's output after the student's training (on `what`): its twin when the stage asks
/// for one, the notes and facts.
fn finish<M>(
    stage: &DistillStage,
    cx: &StageContext,
    run: &RunContext<'_, &dyn mopt_core::Examples<Batch = M::Batch>, M::Config>,
    (training, what): (&TrainReport, &str),
    student: impl Fn() -> M,
) -> Result<StageOutput, StageError>
where
    M: Checkpoint<Batch: Labeled>,
{
    let (entry, spec) = (cx.entry, &stage.spec);
    let mut notes = vec![format!(
        "Student trained on {what} (alpha {}, T {}): {} optimizer steps, best epoch {}, {:.1} train samples/s.",
        spec.alpha.to_toml(),
        spec.temperature.to_toml(),
        training.steps,
        training.best_epoch,
        training.train_samples_per_s
    )];
    let mut references = Vec::new();
    if spec.enabled && spec.baseline {
        let twin = twin::<M>(run, cx, student())?;
        let (reference, note) = twin_report(&entry.name, (&twin, training), cx.family.metric());
        references.push(reference);
        notes.push(note);
    }
    Ok(StageOutput {
        checkpoint: training.checkpoint.clone(),
        steps: training.steps,
        facts: json!({
            "best_epoch": training.best_epoch,
            "epoch_time_s": training.epochs.iter().map(|e| e.epoch_time_s).collect::<Vec<_>>(),
            "train_samples_per_s": training.train_samples_per_s,
        }),
        notes,
        references,
        logit_error_vs_input: None,
        artifacts: Vec::new(),
    })
}

/// `baseline = …` as `--check` says it: with a twin, the better of the two on validation is
/// what the stage hands on (the runner decides, [`crate::stage::ReferenceModel::twin`]).
pub fn baseline_setting(baseline: bool) -> String {
    match baseline {
        true => {
            "baseline = true (a hard-label twin; the better of the two on validation is handed on)"
                .into()
        }
        false => "baseline = false".into(),
    }
}

/// The twin as a reference model of the stage `stage`, and the report's line comparing it with
/// the distilled student on the family's `metric` (BERT's distill stage reports its twin the
/// same way).
pub fn twin_report(
    stage: &str,
    (twin, student): (&TrainReport, &TrainReport),
    metric: Metric,
) -> (ReferenceModel, String) {
    let (t, s) = (twin.test.value(metric), student.test.value(metric));
    let name = metric.name();
    let line = if metric.in_points() {
        format!(
            "test {name} {t:.4} vs the distilled student's {s:.4} ({:+.2} points for distillation)",
            (s - t) * 100.0
        )
    } else {
        let better = if metric.higher_is_better() {
            "higher"
        } else {
            "lower"
        };
        format!("test {name} {t:.3} vs the distilled student's {s:.3} (student - twin {:+.3}; {better} is better)", s - t)
    };
    (
        ReferenceModel {
            name: format!("{stage} (hard-label twin)"),
            about: "the same student, init and budget, trained on hard labels only".into(),
            checkpoint: twin.checkpoint.clone(),
            twin: true,
        },
        format!("Hard-label twin (same init and budget, no teacher): {line}."),
    )
}

/// The hard-label twin, in `<stage>/twin`.
fn twin<M>(
    run: &RunContext<'_, &dyn mopt_core::Examples<Batch = M::Batch>, M::Config>,
    cx: &StageContext,
    student: M,
) -> Result<TrainReport, StageError>
where
    M: Checkpoint<Batch: Labeled>,
{
    eprintln!("twin: the same student trained on hard labels only");
    let dir = cx.dir.join("twin");
    std::fs::create_dir_all(&dir).map_err(|e| StageError::io(&dir, e))?;
    let ad = cx.device.train_device(&cx.entry.train);
    Ok(fit(
        &RunContext {
            run_dir: &dir,
            ..*run
        },
        KdTask::<M>::hard_labels(&ad),
        student,
    )?)
}
