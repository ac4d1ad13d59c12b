//! The pieces a distillation is assembled from: the teacher's outputs (disk cache, computed
//! now, or live) and its word-embedding table. The `distill` stage (its family's implementation
//! in `mopt_stages`) and Rust programs put them together with the family's student.

use std::path::Path;

use burn::prelude::*;
use mopt_core::Tapped;
use mopt_data::{Batcher, Encoded, TextBatch};
use mopt_recipe::DataSpec;
use mopt_train::setup::cache_dir;
use mopt_train::TrainError;
use serde::Serialize;

use crate::cache::{cache_key, compute, TeacherCache};
use crate::matching::MatchPlan;
use crate::spec::{DistillSpec, Feature};
use crate::task::{DistillTask, TeacherSource};

/// Teacher-cache facts of a run.
#[derive(Debug, Clone, Serialize, serde::Deserialize, Default)]
pub struct CacheSummary {
    /// Whether the teacher's outputs were cached.
    pub enabled: bool,
    /// Whether they were read from disk.
    pub hit: bool,
    /// Examples the teacher ran on in this process.
    pub teacher_forwards: usize,
    /// Seconds of teacher forward passes over the training split: paid once with the cache,
    /// every epoch without it.
    pub teacher_pass_s: f64,
    /// The cache file, if any.
    pub file: Option<String>,
}

/// Hand the teacher's word-embedding table to the task when a match compares tables.
pub fn with_word_table<M: Tapped<Batch = TextBatch>>(
    task: DistillTask<M>,
    plan: &MatchPlan,
    teacher: &M,
    ad: &Device,
) -> DistillTask<M> {
    if !plan
        .matches
        .iter()
        .any(|m| m.feature == Feature::WordEmbeddings)
    {
        return task;
    }
    let table = teacher
        .word_embeddings()
        .expect("a word-embedding match was resolved, so the teacher has a table");
    task.with_teacher_word_embeddings(Tensor::from_data(table.into_data(), ad))
}

/// Where the teacher's outputs for the training split come from.
pub struct TeacherOutputs<'a, M> {
    /// The teacher checkpoint (its bytes key the cache).
    pub teacher_dir: &'a Path,
    /// The teacher (inference device).
    pub teacher: &'a M,
    /// The data section (the cache lives in `.mopt-cache/` beside it).
    pub data: &'a DataSpec,
    /// The training split, encoded.
    pub train: &'a [Encoded],
    /// Token id of padding.
    pub pad_id: u32,
    /// Examples a teacher batch.
    pub batch_size: usize,
}

/// Teacher outputs for the training split: from the disk cache, computed now, or live.
pub fn teacher_source<M: Tapped<Batch = TextBatch>>(
    t: &TeacherOutputs<M>,
    spec: &DistillSpec,
    plan: &MatchPlan,
    device: &Device,
) -> Result<(TeacherSource<M>, CacheSummary), TrainError> {
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
    let file = cache_dir(t.data).map(|d| d.join(format!("teacher-{key}.safetensors")));
    let cached = file
        .as_ref()
        .filter(|f| f.exists())
        .and_then(|f| match TeacherCache::load(f, &plan.needs) {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!(
                    "teacher cache {} is unusable ({e}): running the teacher again",
                    f.display()
                );
                None
            }
        })
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
                // Saved, the outputs are read back from the file batch by batch: training
                // does not hold them in memory.
                match c.save(f) {
                    Ok(()) => match c.clone().reopened(f) {
                        Ok(r) => c = r,
                        Err(e) => eprintln!(
                            "warning: teacher cache {} unreadable after saving: {e}",
                            f.display()
                        ),
                    },
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
