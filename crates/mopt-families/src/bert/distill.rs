//! Distillation for BERT: the `distill` stage kind's plan and run with BERT's matches (hidden
//! states, attention, embeddings), its teacher-feature cache and student initialisation from
//! teacher layers. Other families lack this capability until distillation reads the contracts'
//! taps (see `mopt_distill`).

use std::path::Path;

use burn::prelude::*;
use mopt_core::{ModelFault, Tapped};
use mopt_data::{LabelMap, TextBatch, TextSplit};
use mopt_distill::matching::resolve;
use mopt_distill::matching::MatchPlan;
use mopt_distill::spec::DistillSpec;
use mopt_distill::text::augment::TextAugment;
use mopt_distill::text::pipeline::{teacher_source, with_word_table, TeacherOutputs};
use mopt_distill::text::task::{DistillTask, TeacherSource};
use mopt_distill::DistillModel;
use mopt_models::bert::setup::{build_model, model_config};
use mopt_models::bert::student::{check_layer_init, from_teacher_layers};
use mopt_models::bert::{weights, BertConfig, BertForSequenceClassification as Model, BertModel};
use mopt_recipe::{ModelSpec, Scope, StageEntry};
use mopt_train::trainer::{fit, RunContext, Splits};
use mopt_train::TrainError;
use serde_json::json;

use mopt_stages::data::text::TextData;
use mopt_stages::kinds::distill::{match_line, DistillStage};
use mopt_stages::plan::train_settings;
use mopt_stages::shape::Shape;
use mopt_stages::stage::{PlanContext, StageContext, StageOutput, StagePlan};
use mopt_stages::StageError;

/// Check the student against the teacher (vocabulary, layer maps, widths, heads, layer init) and
/// resolve the matches. Errors name keys of the distill stage `cx` and its student table.
pub fn check_compat(
    cx: &Scope,
    spec: &DistillSpec,
    student_spec: &ModelSpec,
    student: &BertConfig,
    teacher: &BertConfig,
    tokenizer_vocab: usize,
) -> Result<MatchPlan, TrainError> {
    let scx = cx.nested("student");
    if student.vocab_size != teacher.vocab_size {
        return Err(TrainError::Recipe(scx.err(
            "config",
            format!(
                "the student's vocabulary ({} tokens) differs from the teacher's ({}); logits and inputs would not line up",
                student.vocab_size, teacher.vocab_size
            ),
            "give the student the teacher's vocabulary (its config.json's vocab_size and its tokenizer)",
        )));
    }
    if tokenizer_vocab > teacher.input_vocab() {
        return Err(TrainError::Recipe(scx.err(
            "config",
            "the [tokenizer] is larger than the teacher's vocabulary",
            "use the teacher's tokenizer",
        )));
    }
    let matches: &[mopt_distill::spec::MatchSpec] = if spec.enabled { &spec.matches } else { &[] };
    let plan = resolve(
        cx,
        matches,
        &Model::tap_layout(student),
        &Model::tap_layout(teacher),
    )?;
    if let Some(layers) = &BertModel::from_spec(student_spec)?.init_from_teacher_layers {
        check_layer_init(student, teacher, layers).map_err(|m| {
            TrainError::Recipe(scx.err(
                "init-from-teacher-layers",
                m,
                "list one distinct teacher layer (0-based) per student layer, with equal shapes",
            ))
        })?;
    }
    Ok(plan)
}

/// The report's word on a twin built from the teacher's own layers: KD's gain over it is small
/// by nature (measured: +0.42 +- 1.02 points over three seeds on Rotten Tomatoes, against +1.40
/// +- 0.67 over five from the pretrained layers).
pub const INHERITED_TWIN: &str = "The student and its twin both start from the teacher's own layers, so the twin inherits what the teacher learnt from these labels: KD's gain over it is small by nature, and one seed's difference is noise (run --seeds for its interval; a student from the pretrained model's layers, `weights` with `weights-layers`, leaves the task to the teacher's soft targets).";

/// A fresh student on the autodiff device `ad`: teacher layers (of the checkpoint at
/// `teacher_dir`), the student table's weights, or random.
pub fn init_student(
    student_spec: &ModelSpec,
    seed: u64,
    config: &BertConfig,
    teacher_dir: &Path,
    ad: &Device,
) -> Result<Model, TrainError> {
    match &BertModel::from_spec(student_spec)?.init_from_teacher_layers {
        Some(layers) => {
            let (teacher_ad, _) =
                weights::load_checkpoint(teacher_dir, ad).map_err(ModelFault::from)?;
            Ok(from_teacher_layers(&teacher_ad, layers, config))
        }
        None => Ok(build_model(student_spec, seed, config, ad)
            .map_err(ModelFault::from)?
            .0),
    }
}

/// The student's config for this teacher and label map, and the resolved matches.
pub fn student_config(
    stage: &DistillStage,
    teacher: &BertConfig,
    labels: &LabelMap,
    tokenizer: &mopt_data::TokenizerSpec,
    vocab: usize,
) -> Result<(BertConfig, MatchPlan), StageError> {
    use mopt_stages::family::Family;
    let bert = super::Bert;
    let named = stage.student.arch.as_deref();
    if let Some(arch) = named.filter(|a| *a != bert.arch() && !bert.aliases().contains(a)) {
        let err = stage.scope.nested("student").err(
            "arch",
            format!("the student is a `{arch}`, the teacher a BERT"),
            "distil a BERT teacher into a BERT student (leave `arch` out, or write \"bert\")",
        );
        return Err(err.into());
    }
    let config = model_config(
        &stage.student,
        tokenizer,
        &stage.scope.nested("student"),
        &labels.labels,
        vocab,
    )?;
    let plan = check_compat(
        &stage.scope,
        &stage.spec,
        &stage.student,
        &config,
        teacher,
        vocab,
    )?;
    Ok((config, plan))
}

/// Bytes of the teacher cache per training example of `t` tokens on average (`t2`: mean of
/// the squared token count, for attention maps).
fn cache_bytes_per_example(
    plan: &MatchPlan,
    teacher: &BertConfig,
    labels: usize,
    t: f64,
    t2: f64,
) -> u64 {
    let mut b = 4.0 * labels as f64;
    b += plan.needs.hidden.len() as f64 * t * teacher.hidden_size as f64 * 4.0;
    for l in plan.needs.attentions.iter().chain(&plan.needs.scores) {
        let heads = teacher.heads(l.saturating_sub(1)) as f64;
        b += heads * t2 * 4.0;
    }
    b as u64
}

/// The plan of a distill stage on a BERT teacher.
pub fn plan(
    stage: &DistillStage,
    entry: &StageEntry,
    shape: &Shape,
    cx: &PlanContext,
) -> Result<StagePlan, StageError> {
    stage.refuse_top_k(
        "BERT's distillation reads the teacher's taps and logits from its own cache",
    )?;
    let input: &BertConfig = shape.get()?;
    let labels = LabelMap::new(
        (0..input.num_labels)
            .map(|i| format!("<class {i}>"))
            .collect(),
    );
    let tokenizer = cx
        .tokenizer
        .as_ref()
        .ok_or_else(|| StageError::Unsupported("a BERT student needs a [tokenizer]".into()))?;
    let (config, plan) = student_config(stage, input, &labels, tokenizer, cx.vocab)?;
    let mut settings = plan_lines(stage, &config, &plan)?;
    settings.extend(train_settings(&entry.train, entry.train_overridden));
    let extra = plan_memory((&stage.spec, stage.augment), (input, &plan), entry, cx);
    Ok(StagePlan {
        memory: Some(mopt_core::ModelConfig::training_memory(
            &config,
            entry.train.batch_size,
            cx.size(),
        )),
        output: Shape::new(config),
        settings,
        extra_memory: extra,
    })
}

/// The student's and the objective's lines of the plan, a line a match.
fn plan_lines(
    stage: &DistillStage,
    config: &BertConfig,
    plan: &MatchPlan,
) -> Result<Vec<String>, StageError> {
    let s = &stage.spec;
    let keys = BertModel::from_spec(&stage.student)?;
    let init = match (&keys.init_from_teacher_layers, &keys.weights) {
        (Some(l), _) => format!("init-from-teacher-layers = {l:?}"),
        (None, Some(w)) => match &keys.weights_layers {
            Some(l) => format!("weights = \"{}\", its layers {l:?}", w.display()),
            None => format!("weights = \"{}\"", w.display()),
        },
        (None, None) => "random init".into(),
    };
    let mut settings = vec![
        format!(
            "student: {} layers x {} ({:.2}M params), {init}, hidden_act = \"{}\"",
            config.num_hidden_layers,
            config.hidden_size,
            config.num_params() as f64 / 1e6,
            config.hidden_act
        ),
        format!(
            "{}, teacher-cache = {}, {}",
            s.objective_line(),
            s.teacher_cache,
            mopt_stages::kinds::kd_student::baseline_setting(s.baseline)
        ),
    ];
    if let Some(a) = stage.augment {
        settings.push(format!(
            "augment-copies = {}, augment-replace = {}, augment-neighbours = {} (TinyBERT: copies labelled by the teacher; the twin trains on the originals {}x)",
            a.copies, a.replace, a.neighbours, 1 + a.copies
        ));
    }
    for (m, resolved) in s.matches.iter().zip(&plan.matches) {
        let pairs: Vec<String> = resolved
            .pairs
            .iter()
            .map(|p| format!("{}->{}", p.student, p.teacher))
            .collect();
        settings.push(format!(
            "{} (student->teacher {})",
            match_line(m),
            pairs.join(", ")
        ));
    }
    Ok(settings)
}

/// Memory beside the student's training: the teacher's weights and, with the teacher cache,
/// one batch of its build and the logits and index that grow with the data set.
fn plan_memory(
    (s, augment): (&DistillSpec, Option<TextAugment>),
    (input, plan): (&BertConfig, &MatchPlan),
    entry: &StageEntry,
    cx: &PlanContext,
) -> Vec<(String, u64)> {
    let mut extra = vec![(
        "teacher weights (inference)".to_string(),
        4 * input.num_params() as u64,
    )];
    if s.enabled && s.teacher_cache {
        let n = cx.train_examples as u64 * (1 + augment.map_or(0, |a| a.copies as u64));
        let per = cache_bytes_per_example(
            plan,
            input,
            input.num_labels,
            cx.mean_tokens,
            cx.mean_tokens_sq,
        );
        let batch = entry.train.eval_batch_size as u64;
        extra.push((
            format!(
                "teacher cache build: one batch of {batch} examples' outputs (the cache, {} on disk for {n} examples x {:.1} tokens on average, is written as it is computed and read a batch at a time)",
                mopt_train::memory::human_bytes(n * per),
                cx.mean_tokens
            ),
            batch * per,
        ));
        extra.push((
            format!("teacher logits and cache index ({n} examples; these grow with the data set)"),
            n * (4 * input.num_labels as u64 + 16),
        ));
    }
    extra
}

/// Run a distill stage on the BERT teacher at `input`.
pub fn run(
    stage: &DistillStage,
    input: &Path,
    cx: &StageContext,
) -> Result<StageOutput, StageError> {
    let entry = cx.entry;
    let device = cx.device.device();
    let ad = cx.device.train_device(&entry.train);
    let (teacher, teacher_config) = weights::load_checkpoint(input, &device)?;
    let teacher = teacher.valid();
    let text = cx.data.get::<TextData>()?;
    let (config, plan) = student_config(
        stage,
        &teacher_config,
        &text.labels,
        &text.spec,
        text.vocab(),
    )?;
    let augmented = super::augment::copies(
        stage,
        (&teacher, &teacher_config),
        &text.train.examples,
        &text.tokenizer,
        cx.seed,
    )?;
    let (source, cache) = teacher_source(
        &TeacherOutputs {
            teacher_dir: input,
            teacher: &teacher,
            data: cx.data_spec,
            train: augmented
                .as_ref()
                .map_or(&text.train.examples, |a| &a.examples),
            pad_id: text.pad_id(),
            batch_size: entry.train.eval_batch_size,
        },
        &stage.spec,
        &plan,
        &device,
    )?;
    let labelled = augmented.map(|a| super::augment::labelled(a, &source, text.pad_id()));
    let mut notes: Vec<String> = labelled.iter().map(|(_, note)| note.clone()).collect();
    let run = with_train(
        cx.run_context::<TextBatch, _>(&config)?,
        labelled.as_ref().map(|(split, _)| split),
    );
    let student = init_student(&stage.student, cx.seed, &config, input, &ad)?;
    let model = DistillModel::new(student, &plan.projections, &ad);
    eprintln!(
        "distilling: student {} layers x {} ({:.1}M params), {} matches, {} projections, alpha {}, T {}",
        config.num_hidden_layers,
        config.hidden_size,
        config.num_params() as f64 / 1e6,
        plan.matches.len(),
        plan.projections.len(),
        stage.spec.alpha.to_toml(),
        stage.spec.temperature.to_toml()
    );
    let task = with_word_table(
        DistillTask::new(stage.spec.clone(), plan.clone(), source, &ad),
        &plan,
        &teacher,
        &ad,
    )
    .with_extra(stage.extra.clone());
    let training = fit(&run, task, model)?;
    let mut references = Vec::new();
    notes.insert(0, format!(
        "Teacher cache: {}{}; teacher pass over the training split {:.1}s (paid once with the cache, every epoch without it); student epoch times {:?} s.",
        if cache.enabled { "on" } else { "off" },
        if cache.hit { ", reused from disk" } else { "" },
        cache.teacher_pass_s,
        training.epochs.iter().map(|e| (e.epoch_time_s * 10.0).round() / 10.0).collect::<Vec<_>>()
    ));
    let mut twin_steps = None;
    if stage.spec.enabled && stage.spec.baseline {
        let twin = twin(stage, input, &config, &run, (cx, &text.train))?;
        twin_steps = Some(twin.steps);
        let (reference, note) = mopt_stages::kinds::kd_student::twin_report(
            &entry.name,
            (&twin, &training),
            cx.family.metric(),
        );
        references.push(reference);
        notes.push(note);
        if BertModel::from_spec(&stage.student)?
            .init_from_teacher_layers
            .is_some()
        {
            notes.push(INHERITED_TWIN.into());
        }
    }
    Ok(StageOutput {
        checkpoint: training.checkpoint.clone(),
        steps: training.steps,
        facts: json!({
            "teacher_cache": cache,
            "best_epoch": training.best_epoch,
            "epoch_time_s": training.epochs.iter().map(|e| e.epoch_time_s).collect::<Vec<_>>(),
            "train_samples_per_s": training.train_samples_per_s,
            "twin_steps": twin_steps,
        }),
        notes,
        references,
        logit_error_vs_input: None,
        artifacts: Vec::new(),
    })
}

/// `run` training on `train` instead of its own training split, when given.
fn with_train<'b>(
    run: RunContext<'b, &'b dyn mopt_core::Examples<Batch = TextBatch>, BertConfig>,
    train: Option<&'b TextSplit>,
) -> RunContext<'b, &'b dyn mopt_core::Examples<Batch = TextBatch>, BertConfig> {
    match train {
        Some(t) => RunContext {
            data: Splits {
                train: t,
                ..run.data
            },
            ..run
        },
        None => run,
    }
}

/// The hard-label twin: the same student (same init), trained with the same budget on the
/// labels alone, in `<stage>/twin`.
fn twin(
    stage: &DistillStage,
    input: &Path,
    config: &BertConfig,
    run: &RunContext<'_, &dyn mopt_core::Examples<Batch = TextBatch>, BertConfig>,
    (cx, originals): (&StageContext, &TextSplit),
) -> Result<mopt_train::trainer::TrainReport, StageError> {
    eprintln!("twin: the same student trained on hard labels only");
    // With augmentation the twin has no labels for the copies: it trains on the originals,
    // repeated as often, so that its schedule has the student's steps.
    let repeated = stage.augment.map(|a| TextSplit {
        examples: (0..=a.copies)
            .flat_map(|_| originals.examples.iter().cloned())
            .collect(),
        pad_id: originals.pad_id,
    });
    let run = with_train(*run, repeated.as_ref());
    let ad = cx.device.train_device(&cx.entry.train);
    let dir = cx.dir.join("twin");
    std::fs::create_dir_all(&dir).map_err(|e| StageError::io(&dir, e))?;
    let mut twin_spec = stage.spec.clone();
    twin_spec.enabled = false;
    let twin = DistillModel::new(
        init_student(&stage.student, cx.seed, config, input, &ad)?,
        &[],
        &ad,
    );
    let empty = MatchPlan {
        matches: Vec::new(),
        projections: Vec::new(),
        needs: Default::default(),
    };
    let task = DistillTask::new(twin_spec, empty, TeacherSource::<Model>::None, &ad);
    Ok(fit(
        &RunContext {
            run_dir: &dir,
            ..run
        },
        task,
        twin,
    )?)
}
