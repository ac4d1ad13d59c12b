//! The pieces a distillation is assembled from: the student's shape checked against the teacher,
//! its initialisation, and the teacher's outputs (disk cache, computed now, or live). The
//! `distill` stage kind (`mopt_stages`) and Rust programs put them together.

use std::path::Path;

use burn::prelude::*;
use mopt_core::ModelFault;
use mopt_data::{Batcher, Encoded};
use mopt_models::bert::setup::build_model;
use mopt_models::bert::{weights, BertConfig, BertForSequenceClassification};
use mopt_recipe::{DataSpec, ModelSpec, Scope};
use mopt_train::setup::cache_dir;
use mopt_train::TrainError;
use serde::Serialize;

use crate::cache::{cache_key, compute, TeacherCache};
use crate::matching::{resolve, MatchPlan};
use crate::spec::{DistillSpec, Feature};
use crate::student::{check_layer_init, from_teacher_layers};
use crate::task::{DistillTask, TeacherSource};

/// Teacher-cache facts of a run.
#[derive(Debug, Clone, Serialize, serde::Deserialize, Default)]
pub struct CacheSummary {
    pub enabled: bool,
    pub hit: bool,
    pub teacher_forwards: usize,
    /// Seconds of teacher forward passes over the training split: paid once with the cache,
    /// every epoch without it.
    pub teacher_pass_s: f64,
    pub file: Option<String>,
}

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
    if tokenizer_vocab > teacher.vocab_size {
        return Err(TrainError::Recipe(scx.err(
            "config",
            "the [tokenizer] is larger than the teacher's vocabulary",
            "use the teacher's tokenizer",
        )));
    }
    let matches: &[crate::spec::MatchSpec] = if spec.enabled { &spec.matches } else { &[] };
    let plan = resolve(cx, matches, student, teacher)?;
    if let Some(layers) = &student_spec.init_from_teacher_layers {
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

/// A fresh student on the autodiff device `ad`: teacher layers (of the checkpoint at
/// `teacher_dir`), the student table's weights, or random.
pub fn init_student(
    student_spec: &ModelSpec,
    seed: u64,
    config: &BertConfig,
    teacher_dir: &Path,
    ad: &Device,
) -> Result<BertForSequenceClassification, TrainError> {
    match &student_spec.init_from_teacher_layers {
        Some(layers) => {
            let (teacher_ad, _) =
                weights::load_checkpoint(teacher_dir, ad).map_err(ModelFault::from)?;
            Ok(from_teacher_layers(&teacher_ad, layers))
        }
        None => Ok(build_model(student_spec, seed, config, ad)
            .map_err(ModelFault::from)?
            .0),
    }
}

/// Hand the teacher's word-embedding table to the task when a match compares tables.
pub fn with_word_table(
    task: DistillTask,
    plan: &MatchPlan,
    teacher: &BertForSequenceClassification,
    ad: &Device,
) -> DistillTask {
    if !plan
        .matches
        .iter()
        .any(|m| m.feature == Feature::WordEmbeddings)
    {
        return task;
    }
    let table = teacher.bert.embeddings.word_embeddings.weight.val();
    task.with_teacher_word_embeddings(Tensor::from_data(table.into_data(), ad))
}

/// Where the teacher's outputs for the training split come from.
pub struct TeacherOutputs<'a> {
    /// The teacher checkpoint (its bytes key the cache).
    pub teacher_dir: &'a Path,
    pub teacher: &'a BertForSequenceClassification,
    /// The data section (the cache lives in `.mopt-cache/` beside it).
    pub data: &'a DataSpec,
    pub train: &'a [Encoded],
    pub pad_id: u32,
    pub batch_size: usize,
}

/// Teacher outputs for the training split: from the disk cache, computed now, or live.
pub fn teacher_source(
    t: &TeacherOutputs,
    spec: &DistillSpec,
    plan: &MatchPlan,
    device: &Device,
) -> Result<(TeacherSource, CacheSummary), TrainError> {
    if !spec.enabled {
        return Ok((TeacherSource::None, CacheSummary::default()));
    }
    if !spec.teacher_cache {
        let source = TeacherSource::Live {
            teacher: Box::new(t.teacher.clone()),
            examples: t.train.to_vec(),
            batcher: Batcher::new(t.pad_id),
            device: device.clone(),
        };
        return Ok((source, CacheSummary::default()));
    }
    let key = cache_key(t.teacher_dir, t.train, &plan.needs)
        .map_err(|e| TrainError::Failed(format!("teacher cache key: {e}")))?;
    let file = cache_dir(t.data).map(|d| d.join(format!("teacher-{key}.bin")));
    let cached = file
        .as_ref()
        .and_then(|f| TeacherCache::load(f, &plan.needs).ok())
        .filter(|c| c.len() == t.train.len());
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
                t.train.len()
            );
            let mut c = compute(
                t.teacher,
                t.train,
                &plan.needs,
                &Batcher::new(t.pad_id),
                t.batch_size,
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
