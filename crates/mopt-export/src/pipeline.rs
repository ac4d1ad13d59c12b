//! `mopt-train export RECIPE`: export a run's best checkpoint (and its teacher, for distillation
//! runs) with parity on real test sentences, then benchmark both in ONNX Runtime side by side.

use std::path::{Path, PathBuf};

use burn::prelude::*;
use mopt_data::{LabelMap, TextExamples};
use mopt_models::bert::weights;
use mopt_recipe::Recipe;
use mopt_train::setup::prepare_data;
use mopt_train::trainer::evaluate;
use serde::Serialize;

use crate::error::ExportError;
use crate::export::{export_checkpoint, ExportOptions, ModelCard, FLOAT_TOLERANCE};
use crate::python;

/// ONNX Runtime latency of one exported model.
#[derive(Debug, Clone, Serialize)]
pub struct OrtLatency {
    pub model: String,
    pub latency: serde_json::Value,
}

/// What `mopt-train export` produced.
#[derive(Debug, Clone, Serialize)]
pub struct ExportSummary {
    pub out: PathBuf,
    pub student: ModelCard,
    pub teacher: Option<ModelCard>,
    pub latency: Vec<OrtLatency>,
}

/// Options of [`export_recipe`].
#[derive(Debug, Clone)]
pub struct RecipeExport {
    pub checkpoint: Option<PathBuf>,
    pub out: Option<PathBuf>,
    pub samples: usize,
    pub force: bool,
    /// ONNX Runtime latency runs at batch 32 (4× at batch 1); 0 skips the benchmark.
    pub latency_runs: usize,
}

fn export_one(
    recipe: &Recipe,
    ckpt: &Path,
    out: &Path,
    opts: &RecipeExport,
) -> Result<ModelCard, ExportError> {
    if !ckpt.join("model.bpk").is_file() {
        return Err(ExportError::Invalid(format!(
            "no checkpoint at {} (model.bpk); run the recipe first or pass --checkpoint",
            ckpt.display()
        )));
    }
    let labels = LabelMap::load(&ckpt.join("labels.json")).map_err(mopt_train::TrainError::from)?;
    let prepared = prepare_data(&recipe.tokenizer, &recipe.data, Some(labels))?;
    let test = &prepared.data.test;
    let device = Device::flex();
    let (model, config) = weights::load_checkpoint(ckpt, &device)?;
    let test_split = TextExamples::new(test, prepared.tokenizer.pad_id);
    let accuracy = evaluate(&model.valid(), &test_split, 64, config.num_labels, &device)
        .metrics
        .accuracy;
    let samples: Vec<Vec<u32>> = test
        .iter()
        .take(opts.samples)
        .map(|e| e.ids.clone())
        .collect();
    let eo = ExportOptions {
        tolerance: FLOAT_TOLERANCE,
        max_len: recipe.tokenizer.max_len,
        accuracy: Some(accuracy),
        force: opts.force,
    };
    export_checkpoint(ckpt, out, &samples, &eo)
}

/// ONNX Runtime latency (p50/p90/p99 at batch 1 and 32) of the model at `onnx`, on token ids
/// drawn below `vocab`.
pub fn ort_latency(
    onnx: &Path,
    vocab: usize,
    seq_len: usize,
    warmup: usize,
    runs: usize,
) -> Result<serde_json::Value, ExportError> {
    let v = python::tool(&[
        "bench",
        &onnx.display().to_string(),
        &seq_len.to_string(),
        &warmup.to_string(),
        &runs.to_string(),
        &vocab.to_string(),
    ])?;
    Ok(v["latency"].clone())
}

/// Export the recipe's best checkpoint (default `<run>/best` → `<run>/export`), plus the teacher of
/// a distillation recipe (→ `<out>/teacher`), and benchmark them in ONNX Runtime.
pub fn export_recipe(recipe: &Recipe, opts: &RecipeExport) -> Result<ExportSummary, ExportError> {
    let run_dir = recipe.run.run_dir();
    let ckpt = opts
        .checkpoint
        .clone()
        .unwrap_or_else(|| run_dir.join("best"));
    let out = opts.out.clone().unwrap_or_else(|| run_dir.join("export"));
    if out.exists() && !opts.force {
        return Err(ExportError::Invalid(format!(
            "{} already exists; pass --force to replace it",
            out.display()
        )));
    }
    eprintln!("exporting {} -> {}", ckpt.display(), out.display());
    let student = export_one(
        recipe,
        &ckpt,
        &out,
        &RecipeExport {
            force: true,
            ..opts.clone()
        },
    )?;
    let teacher = match &recipe.teacher {
        Some(t) => {
            eprintln!("exporting the teacher {}", t.checkpoint.display());
            Some(export_one(
                recipe,
                &t.checkpoint,
                &out.join("teacher"),
                &RecipeExport {
                    force: true,
                    ..opts.clone()
                },
            )?)
        }
        None => None,
    };
    let mut latency = Vec::new();
    if opts.latency_runs > 0 {
        let vocab = mopt_models::bert::BertConfig::from_file(&ckpt.join("config.json"))?.vocab_size;
        let mut models = vec![("student".to_string(), out.join("model.onnx"))];
        if teacher.is_some() {
            models.push(("teacher".to_string(), out.join("teacher/model.onnx")));
        }
        for (name, path) in models {
            eprintln!("benchmarking {name} in ONNX Runtime");
            let e = &recipe.evaluation;
            latency.push(OrtLatency {
                model: name,
                latency: ort_latency(
                    &path,
                    vocab,
                    e.latency_seq_len,
                    e.latency_warmup,
                    opts.latency_runs,
                )?,
            });
        }
    }
    if !latency.is_empty() {
        let mut md = String::from(
            "| ONNX Runtime CPU latency (ms) | batch | p50 | p90 | p99 |\n|---|---|---|---|---|\n",
        );
        for l in &latency {
            for row in l.latency.as_array().into_iter().flatten() {
                md += &format!(
                    "| {} | {} x {} | {:.2} | {:.2} | {:.2} |\n",
                    l.model,
                    row["batch"],
                    row["seq_len"],
                    row["p50_ms"].as_f64().unwrap_or(f64::NAN),
                    row["p90_ms"].as_f64().unwrap_or(f64::NAN),
                    row["p99_ms"].as_f64().unwrap_or(f64::NAN)
                );
            }
        }
        let path = out.join("latency.md");
        std::fs::write(&path, &md).map_err(|e| ExportError::Io(path.display().to_string(), e))?;
        eprint!("{md}");
    }
    let summary = ExportSummary {
        out: out.clone(),
        student,
        teacher,
        latency,
    };
    let path = out.join("export-report.json");
    std::fs::write(&path, serde_json::to_string_pretty(&summary).expect("json"))
        .map_err(|e| ExportError::Io(path.display().to_string(), e))?;
    Ok(summary)
}
