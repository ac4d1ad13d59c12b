//! Zero-shot evaluation of language models, the way lm-evaluation-harness and the OLMo suite
//! score multiple-choice tasks: every choice's continuation is scored by its summed
//! log-probability after its context; `acc` picks the highest sum, `acc_norm` the highest sum
//! per character of the continuation (lm-eval's `acc_norm`, OLMo's `acc_per_char`); each with
//! its standard error. A single-choice task (LAMBADA's `bpb`) reports bits per byte of the
//! continuation. A family that can score continuations registers [`CanScore`] (the Llama
//! family does); `mopt-train eval` runs the suites `datasets/fetch.sh --lm-eval` fetched.

use std::path::{Path, PathBuf};
use std::time::Instant;

use mopt_data::{read_requests, Document};

use crate::error::StageError;

/// The tasks of the suite, each with its request file under the folder the fetch script fills
/// (`datasets/data/lm-eval/<task>.jsonl.gz`).
pub const TASKS: &[&str] = &[
    "hellaswag",
    "arc_easy",
    "arc_challenge",
    "piqa",
    "winogrande",
    "boolq",
    "csqa",
    "openbookqa",
    "sciq",
    "socialiqa",
    "lambada",
];

/// A continuation's score.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scored {
    /// Sum of the log-probabilities (natural log) of the continuation's tokens.
    pub logprob: f64,
    /// Its tokens.
    pub tokens: usize,
}

/// A loaded model that scores continuations.
pub trait Scorer {
    /// The score of each `(context, continuation)` pair, in order.
    fn score(&self, requests: &[(&str, &str)]) -> Result<Vec<Scored>, StageError>;
}

/// A family's capability to score continuations (a language model's).
pub trait CanScore: Send + Sync {
    /// Load the model at `source` (a checkpoint folder of the family, or a model file it
    /// reads, such as a GGUF) with the tokenizer that comes with it.
    fn scorer(&self, source: &Path) -> Result<Box<dyn Scorer>, StageError>;
}

/// A mean over documents and its standard error (sample deviation over √n, as lm-eval's).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Estimate {
    /// The mean.
    pub mean: f64,
    /// Its standard error.
    pub stderr: f64,
}

impl Estimate {
    /// The mean of `values` and its standard error.
    pub fn of(values: &[f64]) -> Self {
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n.max(1.0);
        let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
        Self {
            mean,
            stderr: (var / n.max(1.0)).sqrt(),
        }
    }
}

/// A task's result.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TaskResult {
    /// The task.
    pub task: String,
    /// Documents scored.
    pub documents: usize,
    /// Accuracy by summed log-probability (`None` for a single-choice task).
    pub acc: Option<Estimate>,
    /// Accuracy by log-probability per character of the continuation.
    pub acc_norm: Option<Estimate>,
    /// Bits per byte of the gold continuation.
    pub bits_per_byte: Estimate,
    /// Chance accuracy: the mean of one over the choices (`None` for a single-choice task).
    pub chance: Option<f64>,
    /// Documents a second.
    pub docs_per_sec: f64,
}

/// The first of the highest values (lm-eval's `argmax` keeps the first of ties).
fn argmax(values: impl Iterator<Item = f64>) -> usize {
    let mut best = (0, f64::NEG_INFINITY);
    for (i, v) in values.enumerate() {
        if v > best.1 {
            best = (i, v);
        }
    }
    best.0
}

/// Score `docs` of `task` with `scorer`, a document a call (its choices batched); `progress`
/// hears how many documents are done.
pub fn evaluate_task(
    scorer: &dyn Scorer,
    task: &str,
    docs: &[Document],
    mut progress: impl FnMut(usize),
) -> Result<TaskResult, StageError> {
    let start = Instant::now();
    let (mut acc, mut norm, mut bpb, mut chance) = (vec![], vec![], vec![], vec![]);
    for (k, doc) in docs.iter().enumerate() {
        let pairs: Vec<(&str, &str)> = doc
            .choices
            .iter()
            .map(|c| (c.context.as_str(), c.continuation.as_str()))
            .collect();
        let scores = scorer.score(&pairs)?;
        let gold = &doc.choices[doc.gold];
        let bytes = gold.continuation.len().max(1) as f64;
        bpb.push(-scores[doc.gold].logprob / std::f64::consts::LN_2 / bytes);
        if doc.choices.len() > 1 {
            let hit = |i: usize| if i == doc.gold { 1.0 } else { 0.0 };
            acc.push(hit(argmax(scores.iter().map(|s| s.logprob))));
            let per_char = scores
                .iter()
                .zip(&doc.choices)
                .map(|(s, c)| s.logprob / c.continuation.chars().count().max(1) as f64);
            norm.push(hit(argmax(per_char)));
            chance.push(1.0 / doc.choices.len() as f64);
        }
        progress(k + 1);
    }
    let multiple = !acc.is_empty();
    Ok(TaskResult {
        task: task.to_string(),
        documents: docs.len(),
        acc: multiple.then(|| Estimate::of(&acc)),
        acc_norm: multiple.then(|| Estimate::of(&norm)),
        bits_per_byte: Estimate::of(&bpb),
        chance: multiple.then(|| chance.iter().sum::<f64>() / chance.len() as f64),
        docs_per_sec: docs.len() as f64 / start.elapsed().as_secs_f64().max(1e-9),
    })
}

/// The request file of `task` under `dir`; an unknown task is an error listing the known ones.
pub fn task_file(dir: &Path, task: &str) -> Result<PathBuf, StageError> {
    if !TASKS.contains(&task) {
        return Err(StageError::Unsupported(format!(
            "unknown task `{task}`: the suite has {}",
            TASKS.join(", ")
        )));
    }
    let file = dir.join(format!("{task}.jsonl.gz"));
    if !file.is_file() {
        return Err(StageError::Unsupported(format!(
            "{}: no request file for `{task}`: run `datasets/fetch.sh --lm-eval` (or pass --data-dir)",
            file.display()
        )));
    }
    Ok(file)
}

/// The documents of `task` under `dir`: all, or `limit` of them drawn with `seed` (the same
/// seed, the same documents), in file order.
pub fn task_documents(
    dir: &Path,
    task: &str,
    limit: Option<usize>,
    seed: u64,
) -> Result<Vec<Document>, StageError> {
    let file = task_file(dir, task)?;
    let docs = read_requests(&file, None).map_err(mopt_train::TrainError::from)?;
    let Some(limit) = limit.filter(|&l| l < docs.len()) else {
        return Ok(docs);
    };
    let mut order: Vec<usize> = (0..docs.len()).collect();
    mopt_data::SplitMix64::new(seed).shuffle(&mut order);
    let mut keep = order[..limit].to_vec();
    keep.sort_unstable();
    Ok(keep.into_iter().map(|i| docs[i].clone()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mopt_data::Choice;

    /// Scores a continuation by its length in characters, minus a penalty for "bad".
    struct ByLength;

    impl Scorer for ByLength {
        fn score(&self, requests: &[(&str, &str)]) -> Result<Vec<Scored>, StageError> {
            Ok(requests
                .iter()
                .map(|(_, c)| Scored {
                    logprob: -(c.len() as f64) - if c.contains("bad") { 10.0 } else { 0.0 },
                    tokens: c.len(),
                })
                .collect())
        }
    }

    fn doc(id: u64, choices: &[&str], gold: usize) -> Document {
        Document {
            id,
            choices: choices
                .iter()
                .map(|c| Choice {
                    context: "Q:".into(),
                    continuation: c.to_string(),
                })
                .collect(),
            gold,
        }
    }

    #[test]
    fn accuracy_per_sum_and_per_character_and_their_errors() {
        // Sums prefer the shortest; per character, all but "bad" tie at -1 and the first wins.
        let docs = [
            doc(0, &[" aaaa", " b"], 1),       // acc hit, norm miss
            doc(1, &[" cc", " bad", " d"], 0), // acc miss, norm hit
            doc(2, &[" e", " ff"], 0),         // both hit
            doc(3, &[" g", " hh"], 1),         // both miss
        ];
        let mut seen = 0;
        let r = evaluate_task(&ByLength, "t", &docs, |k| seen = k).unwrap();
        assert_eq!((seen, r.documents), (4, 4));
        let (acc, norm) = (r.acc.unwrap(), r.acc_norm.unwrap());
        assert_eq!((acc.mean, norm.mean), (0.5, 0.5));
        // Sample deviation of [1, 0, 1, 0] is sqrt(1/3); over sqrt(4).
        assert!((acc.stderr - (1.0f64 / 3.0).sqrt() / 2.0).abs() < 1e-12);
        assert!((r.chance.unwrap() - (0.5 + 1.0 / 3.0 + 0.5 + 0.5) / 4.0).abs() < 1e-12);
        // Bits per byte of the gold continuations: -logprob / ln 2 / bytes = 1 / ln 2 each.
        assert!((r.bits_per_byte.mean - 1.0 / std::f64::consts::LN_2).abs() < 1e-12);
        // One choice: no accuracy, bits per byte only.
        let r = evaluate_task(&ByLength, "lambada", &[doc(0, &[" word"], 0)], |_| ()).unwrap();
        assert!(r.acc.is_none() && r.chance.is_none());
    }

    #[test]
    fn unknown_tasks_and_missing_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let e = task_file(dir.path(), "mmlu").unwrap_err().to_string();
        assert!(e.contains("mmlu") && e.contains("hellaswag"), "{e}");
        let e = task_file(dir.path(), "piqa").unwrap_err().to_string();
        assert!(
            e.contains("piqa.jsonl.gz") && e.contains("--lm-eval"),
            "{e}"
        );
    }
}
