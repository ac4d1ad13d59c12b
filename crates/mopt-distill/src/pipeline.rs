//! `mopt-train recipes/distill_bert.toml`: obtain the teacher (fine-tuning it first when its
//! checkpoint does not exist), distill the student, train its hard-label twin for the same budget
//! when asked, measure both against the teacher and write `report.json` + `report.md`.

use std::path::Path;

use burn::prelude::*;
use mopt_data::{Batcher, LabelMap, TextTokenizer};
use mopt_models::bert::{weights, BertConfig, BertForSequenceClassification};
use mopt_recipe::{DistillSpec, Feature, Recipe};
use mopt_train::memory::peak_rss_bytes;
use mopt_train::metrics::EvalMetrics;
use mopt_train::setup::{build_model, cache_dir, model_config, prepare_data, PreparedData};
use mopt_train::trainer::{evaluate, fit, RunContext, TrainOptions, TrainReport};
use mopt_train::{rundir, trainer, DeviceSpec, TrainError};
use serde::Serialize;

use crate::cache::{cache_key, compute, TeacherCache};
use crate::latency::{measure, LatencyStats};
use crate::matching::{resolve, MatchPlan};
use crate::student::{check_layer_init, from_teacher_layers, DistillModel};
use crate::task::{DistillTask, TeacherSource};

/// Model-level numbers of the report.
#[derive(Debug, Clone, Serialize)]
pub struct ModelSummary {
    pub test: EvalMetrics,
    pub params: usize,
    pub layers: usize,
    pub hidden: usize,
    pub checkpoint_bytes: u64,
    pub latency: Vec<LatencyStats>,
}

/// Teacher-cache facts of the run.
#[derive(Debug, Clone, Serialize)]
pub struct CacheSummary {
    pub enabled: bool,
    pub hit: bool,
    pub teacher_forwards: usize,
    /// Seconds of teacher forward passes over the training split: paid once with the cache,
    /// every epoch without it.
    pub teacher_pass_s: f64,
    pub file: Option<String>,
}

/// `report.json` of a distillation run.
#[derive(Debug, Clone, Serialize)]
pub struct DistillReport {
    pub run: String,
    pub recipe: String,
    pub teacher_checkpoint: String,
    pub teacher_trained_in_this_run: bool,
    pub teacher: ModelSummary,
    pub student: ModelSummary,
    /// Student test accuracy / teacher test accuracy.
    pub retention: f64,
    /// Teacher p50 / student p50 at batch 1 and at batch 32.
    pub speedup_b1: f64,
    pub speedup_b32: f64,
    /// Hard-label twin (same init, same budget, no teacher terms).
    pub baseline: Option<EvalMetrics>,
    pub student_beats_baseline: Option<bool>,
    pub teacher_cache: CacheSummary,
    pub student_epoch_time_s: Vec<f64>,
    pub training: TrainReport,
    pub wall_time_s: f64,
    pub peak_rss_bytes: Option<u64>,
}

fn recipe_error(recipe: &Recipe, key: &str, message: String, hint: &str) -> TrainError {
    TrainError::Recipe(recipe.invalid(key, message, hint))
}

/// Make sure the teacher checkpoint exists, fine-tuning it with `[teacher] recipe` when it does not.
/// Returns whether it was trained now.
pub fn ensure_teacher(recipe: &Recipe, device: &DeviceSpec) -> Result<bool, TrainError> {
    let t = recipe
        .teacher
        .as_ref()
        .expect("distillation recipes have [teacher]");
    if t.checkpoint.join("model.bpk").is_file() {
        eprintln!("teacher: reusing {}", t.checkpoint.display());
        return Ok(false);
    }
    let Some(teacher_recipe_path) = &t.recipe else {
        return Err(recipe_error(
            recipe,
            "teacher.checkpoint",
            format!("no checkpoint at {}", t.checkpoint.display()),
            "train the teacher first or set [teacher] recipe",
        ));
    };
    let teacher_recipe = mopt_recipe::load(teacher_recipe_path)?;
    eprintln!(
        "teacher: no checkpoint at {}; fine-tuning it first with {}",
        t.checkpoint.display(),
        teacher_recipe_path.display()
    );
    let dir = teacher_recipe.run.run_dir();
    if dir.exists() {
        return Err(TrainError::Input(format!(
            "the teacher's run folder {} exists but holds no finished checkpoint at {}; delete it (an interrupted run) or point [teacher] checkpoint at the right folder",
            dir.display(),
            t.checkpoint.display()
        )));
    }
    rundir::create_run_dir(&teacher_recipe, &dir, false)?;
    let report = trainer::train(&teacher_recipe, device, &dir, &TrainOptions::default())?;
    eprintln!("teacher: test accuracy {:.4}", report.test.accuracy);
    if !t.checkpoint.join("model.bpk").is_file() {
        return Err(recipe_error(
            recipe,
            "teacher.checkpoint",
            format!(
                "the teacher recipe wrote {} but [teacher] checkpoint is {}",
                report.checkpoint.display(),
                t.checkpoint.display()
            ),
            "point [teacher] checkpoint at `<teacher run folder>/best`",
        ));
    }
    Ok(true)
}

/// Everything a distillation needs before training.
pub struct DistillSetup {
    pub prepared: PreparedData,
    pub teacher: BertForSequenceClassification,
    pub teacher_config: BertConfig,
    pub student_config: BertConfig,
    pub plan: MatchPlan,
    pub spec: DistillSpec,
}

/// Check the student against the teacher: vocabulary, layer maps, widths, heads, layer init.
/// Returns the resolved matches.
pub fn check_compat(
    recipe: &Recipe,
    spec: &DistillSpec,
    student: &BertConfig,
    teacher: &BertConfig,
    tokenizer_vocab: usize,
) -> Result<MatchPlan, TrainError> {
    if student.vocab_size != teacher.vocab_size {
        return Err(recipe_error(
            recipe,
            "model.config",
            format!(
                "the student's vocabulary ({} tokens) differs from the teacher's ({}); logits and inputs would not line up",
                student.vocab_size, teacher.vocab_size
            ),
            "give the student the teacher's vocabulary (its config.json's vocab_size and its tokenizer)",
        ));
    }
    if tokenizer_vocab > teacher.vocab_size {
        return Err(recipe_error(
            recipe,
            "tokenizer.path",
            "the tokenizer is larger than the teacher's vocabulary".into(),
            "use the teacher's tokenizer",
        ));
    }
    let matches: &[mopt_recipe::MatchSpec] = if spec.enabled { &spec.matches } else { &[] };
    let plan = resolve(recipe, matches, student, teacher)?;
    if let Some(layers) = &recipe.model.init_from_teacher_layers {
        check_layer_init(student, teacher, layers).map_err(|m| {
            recipe_error(
                recipe,
                "model.init-from-teacher-layers",
                m,
                "list one distinct teacher layer (0-based) per student layer, with equal shapes",
            )
        })?;
    }
    Ok(plan)
}

/// Validate a distillation recipe before anything is written or trained. When the teacher does not
/// exist yet, its shape comes from its recipe.
pub fn precheck(recipe: &Recipe) -> Result<(), TrainError> {
    let t = recipe.teacher.as_ref().expect("[teacher]");
    let spec = recipe.distill.as_ref().expect("[distill]");
    let two = LabelMap::new(vec!["0".into(), "1".into()]);
    let teacher_config = if t.checkpoint.join("config.json").is_file() {
        BertConfig::from_file(&t.checkpoint.join("config.json"))?
    } else {
        let path = t.recipe.as_ref().expect("validated: recipe or checkpoint");
        let tr = mopt_recipe::load(path)?;
        let tok = TextTokenizer::from_file(
            &tr.tokenizer.path,
            tr.tokenizer.max_len,
            tr.tokenizer.lowercase,
        )?;
        model_config(&tr, &two, tok.vocab_size())?
    };
    let tok = TextTokenizer::from_file(
        &recipe.tokenizer.path,
        recipe.tokenizer.max_len,
        recipe.tokenizer.lowercase,
    )?;
    let mut student = model_config(recipe, &two, tok.vocab_size())?;
    student.num_labels = teacher_config.num_labels;
    check_compat(recipe, spec, &student, &teacher_config, tok.vocab_size()).map(|_| ())
}

/// Load the teacher, the data (with the teacher's labels) and check the student against it.
pub fn setup(recipe: &Recipe, device: &Device) -> Result<DistillSetup, TrainError> {
    let t = recipe.teacher.as_ref().expect("[teacher]");
    let spec = recipe.distill.clone().expect("[distill]");
    let (teacher, teacher_config) = weights::load_checkpoint(&t.checkpoint, device)?;
    let labels = LabelMap::load(&t.checkpoint.join("labels.json"))?;
    let prepared = prepare_data(recipe, Some(labels.clone()))?;
    let student_config = model_config(recipe, &labels, prepared.tokenizer.vocab_size())?;
    let plan = check_compat(
        recipe,
        &spec,
        &student_config,
        &teacher_config,
        prepared.tokenizer.vocab_size(),
    )?;
    Ok(DistillSetup {
        prepared,
        teacher: teacher.valid(),
        teacher_config,
        student_config,
        plan,
        spec,
    })
}

/// A fresh student on the autodiff device: teacher layers, a checkpoint, or random.
pub fn init_student(
    recipe: &Recipe,
    setup: &DistillSetup,
    ad: &Device,
) -> Result<BertForSequenceClassification, TrainError> {
    match &recipe.model.init_from_teacher_layers {
        Some(layers) => {
            let t = recipe.teacher.as_ref().expect("[teacher]");
            let (teacher_ad, _) = weights::load_checkpoint(&t.checkpoint, ad)?;
            Ok(from_teacher_layers(&teacher_ad, layers))
        }
        None => Ok(build_model(recipe, &setup.student_config, ad)?.0),
    }
}

/// Hand the teacher's word-embedding table to the task when a match compares tables.
pub fn with_word_table(task: DistillTask, s: &DistillSetup, ad: &Device) -> DistillTask {
    if !s
        .plan
        .matches
        .iter()
        .any(|m| m.feature == Feature::WordEmbeddings)
    {
        return task;
    }
    let table = s.teacher.bert.embeddings.word_embeddings.weight.val();
    task.with_teacher_word_embeddings(Tensor::from_data(table.into_data(), ad))
}

/// Teacher outputs for the training split: from the disk cache, computed now, or live.
pub fn teacher_source(
    recipe: &Recipe,
    s: &DistillSetup,
    device: &Device,
) -> Result<(TeacherSource, CacheSummary), TrainError> {
    let t = recipe.teacher.as_ref().expect("[teacher]");
    let train = &s.prepared.data.train;
    if !s.spec.teacher_cache {
        let summary = CacheSummary {
            enabled: false,
            hit: false,
            teacher_forwards: 0,
            teacher_pass_s: 0.0,
            file: None,
        };
        let source = TeacherSource::Live {
            teacher: Box::new(s.teacher.clone()),
            examples: train.clone(),
            batcher: Batcher::new(s.prepared.tokenizer.pad_id),
            device: device.clone(),
        };
        return Ok((source, summary));
    }
    let key = cache_key(&t.checkpoint, train, &s.plan.needs)
        .map_err(|e| TrainError::Failed(format!("teacher cache key: {e}")))?;
    let file = cache_dir(recipe).map(|d| d.join(format!("teacher-{key}.bin")));
    let cached = file
        .as_ref()
        .and_then(|f| TeacherCache::load(f, &s.plan.needs).ok())
        .filter(|c| c.len() == train.len());
    let cache = match cached {
        Some(c) => {
            eprintln!(
                "teacher cache: reusing {}",
                c.file
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()
            );
            c
        }
        None => {
            eprintln!(
                "teacher cache: running the teacher over {} training examples",
                train.len()
            );
            let mut c = compute(
                &s.teacher,
                train,
                &s.plan.needs,
                &Batcher::new(s.prepared.tokenizer.pad_id),
                recipe.train.eval_batch_size,
                device,
            );
            if let Some(f) = &file {
                match c.save(f) {
                    Ok(()) => c.file = Some(f.clone()),
                    Err(e) => eprintln!("warning: teacher cache not saved ({}): {e}", f.display()),
                }
            }
            eprintln!("teacher cache: {:.1}s of teacher forwards", c.build_s);
            c
        }
    };
    let summary = CacheSummary {
        enabled: true,
        hit: cache.hit,
        teacher_forwards: cache.teacher_forwards,
        teacher_pass_s: cache.build_s,
        file: cache.file.as_ref().map(|p| p.display().to_string()),
    };
    Ok((TeacherSource::Cache(cache), summary))
}

fn file_size(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

fn summarize(
    model: &BertForSequenceClassification,
    config: &BertConfig,
    test: EvalMetrics,
    ckpt: &Path,
    recipe: &Recipe,
    device: &Device,
) -> ModelSummary {
    let r = &recipe.report;
    let latency = [1usize, 32]
        .iter()
        .map(|&b| {
            let runs = if b == 1 {
                r.latency_runs * 4
            } else {
                r.latency_runs
            };
            measure(
                model,
                config.vocab_size,
                b,
                r.latency_seq_len,
                r.latency_warmup,
                runs,
                device,
            )
        })
        .collect();
    ModelSummary {
        test,
        params: config.num_params(),
        layers: config.num_hidden_layers,
        hidden: config.hidden_size,
        checkpoint_bytes: file_size(&ckpt.join("model.bpk")),
        latency,
    }
}

/// Run a distillation recipe into `run_dir`.
pub fn run(
    recipe: &Recipe,
    device_spec: &DeviceSpec,
    run_dir: &Path,
    opts: &TrainOptions,
) -> Result<DistillReport, TrainError> {
    let wall = std::time::Instant::now();
    let device = device_spec.device();
    let ad = device_spec.train_device(&recipe.train);
    let teacher_trained = ensure_teacher(recipe, device_spec)?;
    let s = setup(recipe, &device)?;
    let (source, cache_summary) = if s.spec.enabled {
        teacher_source(recipe, &s, &device)?
    } else {
        (
            TeacherSource::None,
            CacheSummary {
                enabled: false,
                hit: false,
                teacher_forwards: 0,
                teacher_pass_s: 0.0,
                file: None,
            },
        )
    };
    let ctx = RunContext {
        recipe,
        device_spec,
        run_dir,
        opts,
        data: &s.prepared.data,
        tokenizer_file: &s.prepared.tokenizer.path,
        pad_id: s.prepared.tokenizer.pad_id,
        config: &s.student_config,
    };
    let student = init_student(recipe, &s, &ad)?;
    let model = DistillModel::new(student, &s.plan.projections, &ad);
    eprintln!(
        "distilling: student {} layers x {} ({:.1}M params), {} matches, {} projections, alpha {:?}, T {:?}",
        s.student_config.num_hidden_layers,
        s.student_config.hidden_size,
        s.student_config.num_params() as f64 / 1e6,
        s.plan.matches.len(),
        s.plan.projections.len(),
        s.spec.alpha,
        s.spec.temperature
    );
    let task = with_word_table(
        DistillTask::new(s.spec.clone(), s.plan.clone(), source, &ad),
        &s,
        &ad,
    );
    let training = fit(&ctx, task, model)?;

    // The hard-label twin: same student init, same budget, no teacher.
    let baseline = if s.spec.enabled && s.spec.baseline {
        eprintln!("baseline: the same student trained on hard labels only");
        let dir = run_dir.join("baseline");
        std::fs::create_dir_all(&dir).map_err(|e| TrainError::Io {
            path: dir.display().to_string(),
            source: e,
        })?;
        let mut twin_spec = s.spec.clone();
        twin_spec.enabled = false;
        let bctx = RunContext {
            run_dir: &dir,
            ..ctx
        };
        let twin = DistillModel::new(init_student(recipe, &s, &ad)?, &[], &ad);
        let empty = MatchPlan {
            matches: Vec::new(),
            projections: Vec::new(),
            needs: Default::default(),
        };
        Some(
            fit(
                &bctx,
                DistillTask::new(twin_spec, empty, TeacherSource::None, &ad),
                twin,
            )?
            .test,
        )
    } else {
        None
    };

    eprintln!("evaluating the teacher and measuring latency");
    let t = recipe.teacher.as_ref().expect("[teacher]");
    let batcher = Batcher::new(s.prepared.tokenizer.pad_id);
    let teacher_test = evaluate(
        &s.teacher,
        &s.prepared.data.test,
        &batcher,
        recipe.train.eval_batch_size,
        s.teacher_config.num_labels,
        &device,
    )
    .metrics;
    let teacher = summarize(
        &s.teacher,
        &s.teacher_config,
        teacher_test,
        &t.checkpoint,
        recipe,
        &device,
    );
    let (best_student, _) = weights::load_checkpoint(&training.checkpoint, &device)?;
    let student = summarize(
        &best_student,
        &s.student_config,
        training.test,
        &training.checkpoint,
        recipe,
        &device,
    );
    let speed = |i: usize| teacher.latency[i].p50_ms / student.latency[i].p50_ms;
    let report = DistillReport {
        run: recipe.run.name.clone(),
        recipe: recipe.path.display().to_string(),
        teacher_checkpoint: t.checkpoint.display().to_string(),
        teacher_trained_in_this_run: teacher_trained,
        retention: student.test.accuracy / teacher.test.accuracy,
        speedup_b1: speed(0),
        speedup_b32: speed(1),
        baseline,
        student_beats_baseline: baseline.map(|b| student.test.accuracy > b.accuracy),
        teacher_cache: cache_summary,
        student_epoch_time_s: training.epochs.iter().map(|e| e.epoch_time_s).collect(),
        teacher,
        student,
        training,
        wall_time_s: wall.elapsed().as_secs_f64(),
        peak_rss_bytes: peak_rss_bytes(),
    };
    let json_path = run_dir.join("report.json");
    std::fs::write(
        &json_path,
        serde_json::to_string_pretty(&report).expect("json"),
    )
    .map_err(|e| TrainError::Io {
        path: json_path.display().to_string(),
        source: e,
    })?;
    let md_path = run_dir.join("report.md");
    std::fs::write(&md_path, markdown(&report)).map_err(|e| TrainError::Io {
        path: md_path.display().to_string(),
        source: e,
    })?;
    Ok(report)
}

/// The human-readable report.
pub fn markdown(r: &DistillReport) -> String {
    let mb = |b: u64| b as f64 / 1048576.0;
    let lat = |m: &ModelSummary, i: usize| {
        let l = &m.latency[i];
        format!("{:.1} / {:.1} / {:.1}", l.p50_ms, l.p90_ms, l.p99_ms)
    };
    let mut s = format!("# Distillation report: {}\n\n", r.run);
    s += &format!(
        "Recipe `{}`; teacher `{}`{}.\n\n",
        r.recipe,
        r.teacher_checkpoint,
        if r.teacher_trained_in_this_run {
            " (fine-tuned in this run)"
        } else {
            ""
        }
    );
    s += "| | teacher | student |\n|---|---|---|\n";
    s += &format!(
        "| test accuracy | {:.4} | {:.4} |\n",
        r.teacher.test.accuracy, r.student.test.accuracy
    );
    s += &format!(
        "| test macro-F1 | {:.4} | {:.4} |\n",
        r.teacher.test.macro_f1, r.student.test.macro_f1
    );
    s += &format!(
        "| layers x hidden | {} x {} | {} x {} |\n",
        r.teacher.layers, r.teacher.hidden, r.student.layers, r.student.hidden
    );
    s += &format!(
        "| parameters | {:.2}M | {:.2}M |\n",
        r.teacher.params as f64 / 1e6,
        r.student.params as f64 / 1e6
    );
    s += &format!(
        "| checkpoint size | {:.1} MiB | {:.1} MiB |\n",
        mb(r.teacher.checkpoint_bytes),
        mb(r.student.checkpoint_bytes)
    );
    let l1 = &r.teacher.latency[0];
    s += &format!(
        "| CPU latency p50/p90/p99 ms, batch 1 x {} | {} | {} |\n",
        l1.seq_len,
        lat(&r.teacher, 0),
        lat(&r.student, 0)
    );
    s += &format!(
        "| CPU latency p50/p90/p99 ms, batch 32 x {} | {} | {} |\n\n",
        l1.seq_len,
        lat(&r.teacher, 1),
        lat(&r.student, 1)
    );
    s += &format!(
        "- Retention (student / teacher accuracy): **{:.1}%**\n",
        r.retention * 100.0
    );
    s += &format!(
        "- Speed-up at p50: {:.2}x (batch 1), {:.2}x (batch 32)\n",
        r.speedup_b1, r.speedup_b32
    );
    if let Some(b) = &r.baseline {
        s += &format!(
            "- Same student without distillation (hard labels, same init and budget): accuracy {:.4}, macro-F1 {:.4}; distillation {} ({:+.2} points)\n",
            b.accuracy,
            b.macro_f1,
            if r.student.test.accuracy > b.accuracy { "wins" } else { "does not win" },
            (r.student.test.accuracy - b.accuracy) * 100.0
        );
    }
    let c = &r.teacher_cache;
    s += &format!(
        "- Teacher cache: {}{}; teacher pass over the training split {:.1}s (paid once with the cache, every epoch without it); student epoch times {:?} s\n",
        if c.enabled { "on" } else { "off" },
        if c.hit { ", reused from disk" } else { "" },
        c.teacher_pass_s,
        r.student_epoch_time_s.iter().map(|t| (t * 10.0).round() / 10.0).collect::<Vec<_>>()
    );
    s += &format!(
        "- Wall time {:.0}s; peak memory {:.0} MiB\n",
        r.wall_time_s,
        r.peak_rss_bytes.map_or(0.0, mb)
    );
    s
}
