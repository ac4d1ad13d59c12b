//! `mopt-train export RECIPE` (the recipe's model family does the work): export a run's best checkpoint (and its teacher, for distillation
//! runs) with parity on real test sentences, then benchmark both in ONNX Runtime side by side.

use std::path::{Path, PathBuf};

use mopt_data::LabelMap;
use mopt_export::export::{ExportOptions, ModelCard, FLOAT_TOLERANCE};
use mopt_export::ExportError;
use mopt_recipe::Recipe;
use serde::Serialize;

use crate::data::Split;
use crate::error::StageError;
use crate::kinds::export::{ort_latency, recipe_tolerance, CanExport};
use crate::Registry;

/// ONNX Runtime latency of one exported model.
#[derive(Debug, Clone, Serialize)]
pub struct OrtLatency {
    /// Which model (`student`, `teacher`).
    pub model: String,
    /// The graph timed and ONNX Runtime's optimisations of it.
    pub graph: String,
    /// Its latency rows.
    pub latency: serde_json::Value,
}

/// What `mopt-train export` produced.
#[derive(Debug, Clone, Serialize)]
pub struct ExportSummary {
    /// The export folder.
    pub out: PathBuf,
    /// The exported model's card.
    pub student: ModelCard,
    /// The teacher's card, when exported beside it.
    pub teacher: Option<ModelCard>,
    /// ONNX Runtime latency of each.
    pub latency: Vec<OrtLatency>,
}

/// Options of [`export_recipe`].
#[derive(Debug, Clone)]
pub struct RecipeExport {
    /// The checkpoint to export (default `<run>/best`).
    pub checkpoint: Option<PathBuf>,
    /// The output folder (default `<run>/export`).
    pub out: Option<PathBuf>,
    /// Examples in the parity check.
    pub samples: usize,
    /// Replace an existing output folder.
    pub force: bool,
    /// ONNX Runtime latency runs at batch 32 (4× at batch 1); 0 skips the benchmark.
    pub latency_runs: usize,
    /// Float parity tolerance; `None`: the recipe's export stage's `tolerance`
    /// ([`crate::kinds::export::recipe_tolerance`]), else [`FLOAT_TOLERANCE`].
    pub tolerance: Option<f64>,
}

fn export_one(
    (registry, fam): (&Registry, &crate::family::FamilyEntry),
    recipe: &Recipe,
    ckpt: &Path,
    out: &Path,
    opts: &RecipeExport,
) -> Result<ModelCard, StageError> {
    if !ckpt.join("model.bpk").is_file() {
        return Err(ExportError::Invalid(format!(
            "no checkpoint at {} (model.bpk); run the recipe first or pass --checkpoint",
            ckpt.display()
        ))
        .into());
    }
    let labels = LabelMap::load(&ckpt.join("labels.json")).map_err(mopt_train::TrainError::from)?;
    let data = fam
        .data()
        .load(recipe, registry.data_format(recipe)?, Some(labels), 0)?;
    let can = fam.require::<dyn CanExport>("export", "an ONNX exporter", "declares none")?;
    let accuracy = can.accuracy(ckpt, &data, Split::Test)?;
    let n = opts.samples.min(data.len(Split::Test));
    let tolerance = match opts.tolerance {
        Some(t) if t > 0.0 && t.is_finite() => t,
        Some(t) => {
            return Err(ExportError::Invalid(format!(
                "--tolerance {t} must be a positive number (1e-4 suits classifiers' logits)"
            ))
            .into())
        }
        None => recipe_tolerance(recipe)?.unwrap_or(FLOAT_TOLERANCE),
    };
    let eo = ExportOptions {
        tolerance,
        input_notes: can.input_notes(registry.example_size(recipe)?),
        labels: data.labels().labels.clone(),
        accuracy: Some(accuracy),
        force: opts.force,
    };
    can.export(ckpt, out, &data, (Split::Test, n), &eo)
}

/// Export the recipe's best checkpoint (default `<run>/best` → `<run>/export`), plus the teacher of
/// a distillation recipe (→ `<out>/teacher`), and benchmark them in ONNX Runtime. The recipe's
/// family is looked up in `registry`.
pub fn export_recipe(
    registry: &Registry,
    recipe: &Recipe,
    opts: &RecipeExport,
) -> Result<ExportSummary, StageError> {
    let fam = registry.recipe_family(recipe)?;
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
        ))
        .into());
    }
    eprintln!("exporting {} -> {}", ckpt.display(), out.display());
    // The final model's family: a cross-family distillation's student is not the recipe's.
    let student = export_one(
        (registry, registry.source_family(&ckpt).unwrap_or(fam)),
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
                (registry, fam),
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
        let mut models = vec![("student".to_string(), ckpt.clone(), out.join("model.onnx"))];
        if let Some(t) = &recipe.teacher {
            models.push((
                "teacher".into(),
                t.checkpoint.clone(),
                out.join("teacher/model.onnx"),
            ));
        }
        eprintln!("benchmarking in ONNX Runtime, interleaved");
        let e = &recipe.evaluation;
        let size = e.seq_len(registry.example_size(recipe)?);
        let settings = (size, (e.latency_warmup, opts.latency_runs));
        let mut notes = Vec::new();
        for r in ort_latency(fam, &models, settings, &mut notes)? {
            latency.push(OrtLatency {
                model: r["model"].as_str().unwrap_or("").to_string(),
                graph: r["graph"].as_str().unwrap_or("").to_string(),
                latency: r["latency"].clone(),
            });
        }
        for n in notes {
            eprintln!("{n}");
        }
    }
    if !latency.is_empty() {
        let md = latency_markdown(&latency);
        let path = out.join("latency.md");
        std::fs::write(&path, &md).map_err(|e| StageError::io(&path, e))?;
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
        .map_err(|e| StageError::io(&path, e))?;
    Ok(summary)
}

/// The latency rows as a markdown table.
fn latency_markdown(latency: &[OrtLatency]) -> String {
    let mut md = String::from(
        "| ONNX Runtime CPU latency (ms) | batch | p50 | p90 | p99 | layout (the model's fastest) |\n|---|---|---|---|---|---|\n",
    );
    for l in latency {
        for row in l.latency.as_array().into_iter().flatten() {
            md += &format!(
                "| {} | {} x {} | {:.2} | {:.2} | {:.2} | {} |\n",
                l.model,
                row["batch"],
                row["seq_len"],
                row["p50_ms"].as_f64().unwrap_or(f64::NAN),
                row["p90_ms"].as_f64().unwrap_or(f64::NAN),
                row["p99_ms"].as_f64().unwrap_or(f64::NAN),
                row["layout"].as_str().unwrap_or("")
            );
        }
    }
    md += "\nModels timed interleaved in rounds (a block of back-to-back runs of each in turn), each on its deployment graph:\n";
    for l in latency {
        md += &format!("- {}: {}\n", l.model, l.graph);
    }
    md
}
