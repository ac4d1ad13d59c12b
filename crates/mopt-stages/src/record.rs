//! What the runner measures on every model (validation and test metrics, golden logits, size,
//! FLOPs, CPU latency) and the per-stage record written to `stage.json`.

use std::path::{Path, PathBuf};

use burn::prelude::*;
use mopt_core::{Checkpoint, Labeled, ModelConfig};
use mopt_distill::latency::{measure as measure_latency, LatencyStats};
use mopt_recipe::{normalize, EvaluationSpec};
use mopt_train::metrics::EvalMetrics;
use mopt_train::trainer::evaluate_keeping;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::data::{RunData, Split};
use crate::error::StageError;
use crate::gate::Decision;

/// A file and its sha256.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileHash {
    /// The file.
    pub path: String,
    /// Its sha256.
    pub sha256: String,
}

/// sha256 of a file's bytes.
pub fn sha256_file(p: &Path) -> Result<String, StageError> {
    let bytes = std::fs::read(p).map_err(|e| StageError::io(p, e))?;
    Ok(format!("{:x}", Sha256::digest(&bytes)))
}

/// sha256 of a checkpoint folder's weights and config (`model.bpk`, `config.json`).
pub fn checkpoint_sha256(dir: &Path) -> Result<String, StageError> {
    let mut h = Sha256::new();
    for f in ["model.bpk", "config.json"] {
        let p = dir.join(f);
        h.update(std::fs::read(&p).map_err(|e| StageError::io(&p, e))?);
    }
    Ok(format!("{:x}", h.finalize()))
}

/// The first 12 hex digits of a sha256, as reports print it.
pub fn short_sha(sha: &str) -> &str {
    &sha[..12.min(sha.len())]
}

/// A path as reports print it.
pub fn shown(p: &Path) -> String {
    normalize(p).display().to_string()
}

/// Measured facts of one model.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelFacts {
    /// The checkpoint folder.
    pub checkpoint: String,
    /// [`checkpoint_sha256`] of the folder.
    pub sha256: String,
    /// Validation metrics.
    pub valid: EvalMetrics,
    /// Test metrics.
    pub test: EvalMetrics,
    /// Parameters.
    pub params: usize,
    /// Forward FLOPs for one example of `[evaluation] latency-seq-len` tokens.
    pub flops_per_example: u64,
    /// Bytes of the checkpoint folder.
    pub checkpoint_bytes: u64,
    /// The shape in words ([`ModelConfig::describe`]).
    #[serde(default)]
    pub describe: String,
    /// The shape as the family records it ([`ModelConfig::facts`]: BERT's `layers`, `hidden`,
    /// `heads`, `ffn`).
    #[serde(flatten)]
    pub shape: serde_json::Map<String, serde_json::Value>,
    /// mopt CPU latency at batch 1 and 32 (empty when `latency-runs = 0`).
    pub latency: Vec<LatencyStats>,
}

impl ModelFacts {
    /// p50 and p90 at `batch`, if measured.
    pub fn latency_at(&self, batch: usize) -> Option<&LatencyStats> {
        self.latency.iter().find(|l| l.batch == batch)
    }
}

/// How the runner evaluates models.
pub struct EvalSettings<'a> {
    /// Examples an evaluation batch.
    pub eval_batch_size: usize,
    /// `[evaluation]`.
    pub evaluation: &'a EvaluationSpec,
    /// The size of one example of the data (a tokenizer's `max-len`; 0 for images).
    pub size: usize,
    /// The inference device.
    pub device: Device,
}

/// Measure the `M` checkpoint at `dir` on `data` (after `prepare`: a quantized model's weights
/// fake-quantized once, say); returns its facts and its logits on the golden set.
pub fn measure_checkpoint<M>(
    dir: &Path,
    data: &RunData,
    ev: &EvalSettings,
    prepare: impl FnOnce(M) -> M,
) -> Result<(ModelFacts, Vec<Vec<f32>>), StageError>
where
    M: Checkpoint<Batch: Labeled>,
{
    let (model, config) = M::load(dir, &ev.device)?;
    let model = prepare(model.valid());
    let n = config.num_labels();
    let bs = ev.eval_batch_size;
    let valid = data.split::<M::Batch>(Split::Valid)?;
    let test = data.split::<M::Batch>(Split::Test)?;
    // Only the golden examples' logits are kept (a language model's rows over a whole split
    // would not fit).
    let golden_n = data.len(Split::Golden);
    let valid = evaluate_keeping(&model, &valid, (bs, n), golden_n, &ev.device);
    let test = evaluate_keeping(&model, &test, (bs, n), 0, &ev.device).metrics;
    let golden = valid.logits;
    let e = ev.evaluation;
    let latency = if e.latency_runs == 0 {
        Vec::new()
    } else {
        [1usize, 32]
            .iter()
            .filter_map(|&b| {
                let runs = if b == 1 {
                    e.latency_runs * 4
                } else {
                    e.latency_runs
                };
                measure_latency(
                    &model,
                    &config,
                    (b, e.seq_len(ev.size)),
                    (e.latency_warmup, runs),
                    &ev.device,
                )
            })
            .collect()
    };
    let facts = ModelFacts {
        checkpoint: shown(dir),
        sha256: checkpoint_sha256(dir)?,
        valid: valid.metrics,
        test,
        params: config.num_params(),
        flops_per_example: config.flops(e.seq_len(ev.size)) as u64,
        checkpoint_bytes: std::fs::metadata(dir.join("model.bpk"))
            .map(|m| m.len())
            .unwrap_or(0),
        describe: config.describe(),
        shape: config.facts(),
        latency,
    };
    Ok((facts, golden))
}

/// Max |a − b| over two sets of logits (∞ when their shapes differ).
pub fn max_abs_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    let mut m = 0.0f64;
    for (x, y) in a.iter().zip(b) {
        if x.len() != y.len() {
            return f64::INFINITY;
        }
        for (p, q) in x.iter().zip(y) {
            m = m.max((p - q).abs() as f64);
        }
    }
    m
}

/// A model reported beside the chain, measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReferenceRecord {
    /// The reference's name.
    pub name: String,
    /// What it is.
    pub about: String,
    /// Its measurements.
    pub model: ModelFacts,
    /// The stage's hard-label twin ([`crate::stage::ReferenceModel::twin`]).
    #[serde(default)]
    pub twin: bool,
}

/// `stage.json`: everything the report says about one stage; written last, atomically, so a
/// stage with a record is finished.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StageRecord {
    /// 0 for the baseline.
    pub index: usize,
    /// The stage's name.
    pub name: String,
    /// Its kind.
    pub kind: String,
    /// The settings as `--check` prints them.
    pub settings: Vec<String>,
    /// The input checkpoint (`None` for the baseline).
    pub input: Option<FileHash>,
    /// Its output's measurements.
    pub model: ModelFacts,
    /// The gate's decision.
    pub decision: Decision,
    /// The headline metric on validation minus the baseline's (accuracy: a fraction; the
    /// report shows points).
    pub delta_valid_vs_baseline: f64,
    /// The same on test.
    pub delta_test_vs_baseline: f64,
    /// Largest logit change against the input on the golden set.
    pub max_logit_error_vs_input: f64,
    /// Largest logit change against the baseline.
    pub max_logit_error_vs_baseline: f64,
    /// Optimizer steps.
    pub steps: usize,
    /// Wall time.
    pub wall_time_s: f64,
    /// The process's peak RSS when the stage ended.
    pub peak_rss_bytes: Option<u64>,
    /// `--max-steps` of a smoke run (such stages are never reused by another run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<usize>,
    /// Further outputs, checked before reuse.
    pub artifacts: Vec<FileHash>,
    /// What another run must match to reuse this stage ([`crate::donor::reuse_key`]); absent:
    /// never reused (stages without a key, and records written before keys existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reuse_key: Option<String>,
    /// The kind's facts (rounds, sensitivity, cache…).
    pub facts: serde_json::Value,
    /// The kind's notes for the report.
    pub notes: Vec<String>,
    /// Models reported beside the chain (the twin, compared criteria).
    pub references: Vec<ReferenceRecord>,
}

/// Write `value` as JSON to `path` atomically (a temporary file renamed over it), streamed to
/// the file (no copy of the text in memory).
pub fn write_json_atomic<T: Serialize>(path: &Path, value: &T) -> Result<(), StageError> {
    use std::io::Write;
    let tmp = PathBuf::from(format!("{}.tmp", path.display()));
    let io = |e: std::io::Error| StageError::io(&tmp, e);
    let mut w = std::io::BufWriter::new(std::fs::File::create(&tmp).map_err(io)?);
    serde_json::to_writer_pretty(&mut w, value).map_err(|e| io(e.into()))?;
    w.flush().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(|e| StageError::io(path, e))
}

/// Read a JSON file written by [`write_json_atomic`].
pub fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Option<T> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// How the report, the seeds summary and the chart show a run's headline metric (its family's
/// [`crate::family::Family::metric`]): accuracy and macro-F1 in points, loss and perplexity as
/// they are.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Headline(pub mopt_recipe::Metric);

impl Headline {
    /// The metric a report names (`accuracy` when it names none it knows).
    pub fn named(name: &str) -> Self {
        Self(mopt_recipe::Metric::from_name(name).unwrap_or(mopt_recipe::Metric::Accuracy))
    }

    /// Its value in `m`.
    pub fn of(self, m: &EvalMetrics) -> f64 {
        m.value(self.0)
    }

    /// A table column's short name (`acc`, `perplexity`).
    pub fn column(self) -> &'static str {
        match self.0 {
            mopt_recipe::Metric::Accuracy => "acc",
            m => m.name(),
        }
    }

    /// A value as the metric is read (`0.9120` accuracy, `49.920` perplexity).
    pub fn value(self, v: f64) -> String {
        if self.0.in_points() {
            format!("{v:.4}")
        } else {
            format!("{v:.3}")
        }
    }

    /// A difference (`+1.20 pts` of accuracy, `+0.532` of perplexity).
    pub fn delta(self, d: f64) -> String {
        if self.0.in_points() {
            format!("{:+.2} pts", d * 100.0)
        } else {
            format!("{d:+.3}")
        }
    }

    /// A mean ± spread (`91.20 ± 0.35%`, `23.412 ± 0.210`).
    pub fn spread(self, mean: f64, std: f64) -> String {
        if self.0.in_points() {
            format!("{:.2} ± {:.2}%", 100.0 * mean, 100.0 * std)
        } else {
            format!("{mean:.3} ± {std:.3}")
        }
    }

    /// A difference's mean ± spread with its unit (`+0.60 ± 0.40 pt`, `-1.250 ± 0.300`).
    pub fn spread_delta(self, mean: f64, std: f64) -> String {
        if self.0.in_points() {
            format!("{:+.2} ± {:.2} pt", 100.0 * mean, 100.0 * std)
        } else {
            format!("{mean:+.3} ± {std:.3}")
        }
    }

    /// An interval of differences (`[-0.20, +1.40] pt`).
    pub fn interval(self, lo: f64, hi: f64) -> String {
        if self.0.in_points() {
            format!("[{:+.2}, {:+.2}] pt", 100.0 * lo, 100.0 * hi)
        } else {
            format!("[{lo:+.3}, {hi:+.3}]")
        }
    }

    /// The chart's value (accuracy in %) and its axis label.
    pub fn chart(self, v: f64) -> f64 {
        if self.0.in_points() {
            100.0 * v
        } else {
            v
        }
    }

    /// The chart's axis label (`test accuracy (%)`, `test perplexity`).
    pub fn chart_label(self) -> String {
        if self.0.in_points() {
            format!("test {} (%)", self.0.name())
        } else {
            format!("test {}", self.0.name())
        }
    }
}
