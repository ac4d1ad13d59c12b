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

use crate::matching::MatchPlan;
use crate::spec::{DistillSpec, Feature};
use crate::text::cache::{cache_key, compute, compute_to_file, TeacherCache};
use crate::text::task::{DistillTask, TeacherSource};

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
    let cache = match file.as_deref().and_then(|f| cached(f, plan, t.train.len())) {
        Some(c) => c,
        None => build(t, plan, device, file.as_deref()),
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

/// The cache at `file` when it exists, verifies, holds the features the matches read and `n`
/// examples.
fn cached(file: &Path, plan: &MatchPlan, n: usize) -> Option<TeacherCache> {
    if !file.exists() {
        return None;
    }
    match TeacherCache::load(file, &plan.needs) {
        Ok(c) if c.len() == n => {
            eprintln!("teacher cache: reusing {}", file.display());
            Some(c)
        }
        Ok(_) => None,
        Err(e) => {
            eprintln!(
                "teacher cache {} is unusable ({e}): running the teacher again",
                file.display()
            );
            None
        }
    }
}

/// Run the teacher over the training split: into `file`, written as the pass goes and then
/// read back batch by batch (neither the build nor training holds the outputs in memory), or
/// in memory when there is no file or it cannot be written.
fn build<M: Tapped<Batch = TextBatch>>(
    t: &TeacherOutputs<M>,
    plan: &MatchPlan,
    device: &Device,
    file: Option<&Path>,
) -> TeacherCache {
    eprintln!(
        "teacher cache: running the teacher over {} training examples",
        t.train.len()
    );
    let batcher = Batcher::new(t.pad_id);
    let in_memory = || {
        compute(
            t.teacher,
            t.train,
            &plan.needs,
            &batcher,
            t.batch_size,
            device,
        )
    };
    let c = match file {
        Some(f) => {
            let batches = (&batcher, t.batch_size);
            compute_to_file(t.teacher, t.train, &plan.needs, batches, device, f)
                .unwrap_or_else(|e| {
                    eprintln!(
                        "warning: teacher cache not written ({}): {e}; keeping the outputs in memory",
                        f.display()
                    );
                    in_memory()
                })
        }
        None => in_memory(),
    };
    eprintln!("teacher cache: {:.1}s of teacher forwards", c.build_s);
    c
}
