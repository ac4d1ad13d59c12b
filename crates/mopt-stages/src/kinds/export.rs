//! `kind = "export"`: write the input model as ONNX (opset 17) with its tokenizer, labels and
//! model card, check parity in ONNX Runtime on the golden validation examples, and benchmark it
//! in ONNX Runtime (with the baseline beside it). The model passed on is the input, unchanged.

use std::path::Path;

use burn::prelude::*;
use mopt_core::{Examples, Labeled, ModelConfig};
use mopt_export::export::{ExportOptions, ModelCard, FLOAT_TOLERANCE};
use mopt_export::Exportable;
use mopt_recipe::{RecipeError, StageEntry};
use mopt_train::trainer::evaluate_keeping;

use serde::Deserialize;
use serde_json::json;

use crate::convert::CanConvert;
use crate::data::{RunData, Split};
use crate::error::StageError;
use crate::family::FamilyEntry;
use crate::shape::Shape;
use crate::stage::{PlanContext, Stage, StageContext, StageKind, StageOutput, StagePlan};

/// The kind.
pub struct Export;

/// What a family without the capability lacks.
const NEEDS: (&str, &str) = ("an ONNX exporter", "declares none");

/// A family's `export` capability (also `mopt-train export`'s): ONNX out with parity, the
/// inputs ONNX Runtime latency is timed on, and what a deployment must know.
pub trait CanExport: Send + Sync {
    /// How a deployment feeds the exported graph (padding, truncation at `size` tokens; an
    /// image's normalisation), for the model card.
    fn input_notes(&self, size: usize) -> String;
    /// Export the checkpoint at `ckpt` to the folder `out`, parity checked on the first
    /// `samples` examples of the split `which` of `data`.
    fn export(
        &self,
        ckpt: &Path,
        out: &Path,
        data: &RunData,
        samples: (Split, usize),
        opts: &ExportOptions,
    ) -> Result<ModelCard, StageError>;
    /// The synthetic inputs (`size` tokens, or ignored) ONNX Runtime latency is timed on for a
    /// model of `shape`, one per batch size; `None` when the model declares none.
    fn bench_feeds(
        &self,
        shape: &Shape,
        size: usize,
    ) -> Result<Option<serde_json::Value>, StageError>;
    /// Accuracy of the checkpoint at `ckpt` on the split `which` of `data` (the model card's).
    fn accuracy(&self, ckpt: &Path, data: &RunData, which: Split) -> Result<f64, StageError>;
}

/// The `export` capability of the model type `M` ([`Exportable`]), its deployment notes from
/// `input_notes` (given the example size).
pub fn capability<M>(input_notes: fn(usize) -> String) -> Box<dyn CanExport>
where
    M: Exportable<Batch: Labeled> + 'static,
{
    Box::new(Generic::<M> {
        input_notes,
        model: std::marker::PhantomData,
    })
}

struct Generic<M> {
    input_notes: fn(usize) -> String,
    model: std::marker::PhantomData<fn() -> M>,
}

impl<M: Exportable<Batch: Labeled> + 'static> CanExport for Generic<M> {
    fn input_notes(&self, size: usize) -> String {
        (self.input_notes)(size)
    }

    fn export(
        &self,
        ckpt: &Path,
        out: &Path,
        data: &RunData,
        (which, n): (Split, usize),
        opts: &ExportOptions,
    ) -> Result<ModelCard, StageError> {
        let examples = Head {
            examples: data.split::<M::Batch>(which)?,
            n,
        };
        Ok(mopt_export::export_checkpoint::<M, _>(
            ckpt, out, &examples, opts,
        )?)
    }

    fn bench_feeds(
        &self,
        shape: &Shape,
        size: usize,
    ) -> Result<Option<serde_json::Value>, StageError> {
        Ok(mopt_export::bench_feeds::<M>(
            shape.get::<M::Config>()?,
            size,
        ))
    }

    fn accuracy(&self, ckpt: &Path, data: &RunData, which: Split) -> Result<f64, StageError> {
        let examples = data.split::<M::Batch>(which)?;
        let device = Device::flex();
        let (model, config) = M::load(ckpt, &device)?;
        let eval = evaluate_keeping(
            &model.valid(),
            &examples,
            (64, config.num_labels()),
            0,
            &device,
        );
        Ok(eval.metrics.accuracy)
    }
}

/// ONNX Runtime latency of `models` (name, checkpoint, exported graph), interleaved, with
/// `family`'s benchmark inputs; models without inputs are left out and named in `notes`.
pub fn ort_latency(
    family: &FamilyEntry,
    models: &[(String, std::path::PathBuf, std::path::PathBuf)],
    (size, warmup_runs): (usize, (usize, usize)),
    notes: &mut Vec<String>,
) -> Result<Vec<serde_json::Value>, StageError> {
    let can = family.require::<dyn CanExport>("export", NEEDS.0, NEEDS.1)?;
    let mut bench = Vec::new();
    for (name, ckpt, onnx) in models {
        match can.bench_feeds(&family.read_shape(ckpt)?, size)? {
            Some(feeds) => bench.push(mopt_export::BenchModel {
                name: name.clone(),
                onnx: onnx.clone(),
                feeds,
            }),
            None => notes.push(format!(
                "No ONNX Runtime latency for the {name}: its family declares no benchmark input."
            )),
        }
    }
    let work = models
        .first()
        .and_then(|m| m.2.parent())
        .unwrap_or(Path::new("."));
    Ok(mopt_export::ort_latency_interleaved(
        &bench,
        warmup_runs,
        work,
    )?)
}

/// The first `n` examples of a split.
struct Head<E> {
    examples: E,
    n: usize,
}

impl<E: Examples> Examples for Head<E> {
    type Batch = E::Batch;

    fn len(&self) -> usize {
        self.n.min(self.examples.len())
    }

    fn label(&self, i: usize) -> usize {
        self.examples.label(i)
    }

    fn size(&self, i: usize) -> usize {
        self.examples.size(i)
    }

    fn batch(&self, indices: &[usize], device: &Device) -> Self::Batch {
        self.examples.batch(indices, device)
    }

    fn record(&self, i: usize) -> serde_json::Value {
        self.examples.record(i)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawExport {
    samples: Option<usize>,
    tolerance: Option<f64>,
    latency_runs: Option<usize>,
    reference: Option<OneOrMany>,
    convert: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// An export stage.
#[derive(Debug, Clone)]
pub struct ExportStage {
    /// Golden validation examples in the parity check.
    pub samples: usize,
    /// Parity tolerance (max |ONNX Runtime − mopt| logit); above it nothing is written.
    pub tolerance: f64,
    /// ONNX Runtime timed runs at the family's serving batch (4x at batch 1); `None`:
    /// `[evaluation] latency-runs`.
    pub latency_runs: Option<usize>,
    /// Also export and benchmark these models for a side-by-side ONNX Runtime latency in the
    /// same run: `baseline` and/or earlier stages' names (empty: none).
    pub reference: Vec<String>,
    /// Other formats the input is also written in, as the family's `convert` capability names
    /// them (`gguf-q8_0`, `hf`), into the stage's folder.
    pub convert: Vec<String>,
}

/// The stage's validated `tolerance` ([`FLOAT_TOLERANCE`] when unset).
fn tolerance(entry: &StageEntry, r: &RawExport) -> Result<f64, RecipeError> {
    let tolerance = r.tolerance.unwrap_or(FLOAT_TOLERANCE);
    if !(tolerance > 0.0 && tolerance.is_finite()) {
        return Err(entry.scope.err(
            "tolerance",
            format!("{tolerance} must be > 0"),
            "1e-4 suits float exports",
        ));
    }
    Ok(tolerance)
}

/// The parity tolerance of `recipe`'s last export stage, if it has one: what
/// `mopt-train export` holds the same model to (a language model's logits, ~20 in size, need
/// more than a classifier's 1e-4).
pub fn recipe_tolerance(recipe: &mopt_recipe::Recipe) -> Result<Option<f64>, RecipeError> {
    let Some(entry) = recipe.stages.iter().rev().find(|e| e.kind == "export") else {
        return Ok(None);
    };
    let r: RawExport = entry.scope.deserialize(entry.settings.clone())?;
    tolerance(entry, &r).map(Some)
}

impl StageKind for Export {
    fn name(&self) -> &'static str {
        "export"
    }

    fn about(&self) -> &'static str {
        "ONNX export with parity and ONNX Runtime latency"
    }

    fn parse(
        &self,
        entry: &StageEntry,
        family: &FamilyEntry,
    ) -> Result<Box<dyn Stage>, RecipeError> {
        family.check::<dyn CanExport>(
            entry,
            NEEDS,
            "implement `mopt_export::Exportable` for the model and register `kinds::export::capability::<M>(..)` in the family's `capabilities`",
        )?;
        let cx = &entry.scope;
        let r: RawExport = cx.deserialize(entry.settings.clone())?;
        let tolerance = tolerance(entry, &r)?;
        if entry.train_overridden {
            return Err(cx.err(
                "train",
                "an export stage does not train",
                "remove [stage.train]",
            ));
        }
        let convert = r.convert.unwrap_or_default();
        check_formats(entry, family, &convert)?;
        Ok(Box::new(ExportStage {
            convert,
            samples: cx.positive("samples", r.samples, 500)?,
            tolerance,
            latency_runs: r.latency_runs,
            reference: match r.reference {
                None => vec!["baseline".into()],
                Some(OneOrMany::One(n)) if n == "none" => Vec::new(),
                Some(OneOrMany::One(n)) => vec![n],
                Some(OneOrMany::Many(v)) => v,
            },
        }))
    }
}

impl Stage for ExportStage {
    fn kind(&self) -> &str {
        "export"
    }

    fn plan(
        &self,
        entry: &StageEntry,
        input: &Shape,
        cx: &PlanContext,
    ) -> Result<StagePlan, StageError> {
        for r in &self.reference {
            if !cx.earlier.contains(r) {
                return Err(StageError::from(entry.scope.err(
                    "reference",
                    format!("no model named `{r}` before this stage"),
                    format!(
                        "use `baseline`, `none` or an earlier stage's name: {}",
                        cx.earlier.join(", ")
                    ),
                )));
            }
        }
        let mut settings = vec![format!(
            "samples = {}, tolerance = {:e}, latency-runs = {}, reference = {:?} (ONNX opset 17; needs python3 with onnx and onnxruntime)",
            self.samples,
            self.tolerance,
            self.latency_runs.map_or("[evaluation]".to_string(), |r| r.to_string()),
            self.reference
        )];
        if !self.convert.is_empty() {
            settings.push(format!(
                "convert = {:?}: also written in those formats",
                self.convert
            ));
        }
        Ok(StagePlan {
            output: input.clone(),
            settings,
            memory: None,
            extra_memory: Vec::new(),
        })
    }

    fn run(&self, input: &Path, cx: &StageContext) -> Result<StageOutput, StageError> {
        let can = cx
            .family
            .require::<dyn CanExport>("export", NEEDS.0, NEEDS.1)?;
        let samples = (Split::Golden, self.samples.min(cx.golden_len()));
        let opts = ExportOptions {
            tolerance: self.tolerance,
            input_notes: can.input_notes(cx.size),
            labels: cx.data.labels().labels.clone(),
            accuracy: None,
            force: true,
        };
        let out = cx.dir.join("onnx");
        eprintln!("export: {} -> {}", input.display(), out.display());
        let card = can.export(input, &out, cx.data, samples, &opts)?;
        let mut notes = vec![self.card_note(&card, &out.join("model.onnx"))];
        let mut models = vec![Exported {
            name: "model".into(),
            checkpoint: input.to_path_buf(),
            onnx: out.join("model.onnx"),
        }];
        models.extend(self.export_references(input, cx, samples, &opts, &mut notes)?);
        notes.push(format!(
            "ONNX files on disk: {}.",
            models
                .iter()
                .map(|m| format!(
                    "{} {:.1} MiB",
                    m.name,
                    std::fs::metadata(&m.onnx).map_or(0, |f| f.len()) as f64 / (1 << 20) as f64
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        if let Some(extra) = &card.extra {
            notes.push(format!("Beside model.onnx: {extra}."));
        }
        let mut artifacts = Vec::new();
        for format in &self.convert {
            let can = cx
                .family
                .require::<dyn CanConvert>("export", CONVERTS.0, CONVERTS.1)?;
            let file = cx.dir.join(can.file_name(format));
            eprintln!(
                "export: {} -> {} ({format})",
                input.display(),
                file.display()
            );
            notes.push(format!(
                "Also as {format}: {}.",
                can.convert(input, format, &file)?
            ));
            artifacts.push(file);
        }
        let runs = self.latency_runs.unwrap_or(cx.evaluation.latency_runs);
        let latency = if runs > 0 {
            latency(&models, cx, runs, &mut notes)?
        } else {
            Vec::new()
        };
        Ok(StageOutput {
            checkpoint: input.to_path_buf(),
            steps: 0,
            facts: json!({
                "onnx": out.join("model.onnx").display().to_string(),
                "model_card": card,
                "ort_latency": latency,
            }),
            notes,
            references: Vec::new(),
            logit_error_vs_input: Some(card.parity.max_abs_err),
            artifacts: models
                .into_iter()
                .map(|m| m.onnx)
                .chain(artifacts)
                .collect(),
        })
    }

    fn reuse_key(&self) -> Option<String> {
        Some(format!("{self:?} latency: {}", mopt_export::LATENCY_METHOD))
    }
}

/// The layout a latency row was measured in (its model's fastest) and the p50 of the others,
/// as ` (LAYOUT; OTHER: p50 X ms)`; empty for a row without layouts.
pub(crate) fn layout_note(row: &serde_json::Value) -> String {
    let Some(best) = row["layout"].as_str() else {
        return String::new();
    };
    let others: Vec<String> = row["layouts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|l| l["layout"].as_str() != Some(best))
        .map(|l| {
            format!(
                "{}: p50 {:.2} ms",
                l["layout"].as_str().unwrap_or("?"),
                l["p50_ms"].as_f64().unwrap_or(f64::NAN)
            )
        })
        .collect();
    if others.is_empty() {
        format!(" ({best})")
    } else {
        format!(" ({best}, its fastest; {})", others.join("; "))
    }
}

/// What a family without the `convert` capability lacks.
const CONVERTS: (&str, &str) = ("a converter to other formats", "declares none");

/// At parse time: that the family writes every format of `convert`.
fn check_formats(
    entry: &StageEntry,
    family: &FamilyEntry,
    convert: &[String],
) -> Result<(), RecipeError> {
    if convert.is_empty() {
        return Ok(());
    }
    let Some(can) = family.capability::<dyn CanConvert>() else {
        return Err(entry.scope.err(
            "convert",
            family.lacks("export", CONVERTS.0, CONVERTS.1),
            "remove `convert` (the ONNX export needs none)",
        ));
    };
    let known: Vec<&str> = can.formats().iter().map(|f| f.0).collect();
    match convert.iter().find(|f| !known.contains(&f.as_str())) {
        Some(f) => Err(entry.scope.err(
            "convert",
            format!("the family does not write `{f}`"),
            format!("use one of: {}", known.join(", ")),
        )),
        None => Ok(()),
    }
}

/// A model the stage exported: its name in the report, its checkpoint and its graph.
struct Exported {
    name: String,
    checkpoint: std::path::PathBuf,
    onnx: std::path::PathBuf,
}

/// Integer-kernel ops of ONNX Runtime's optimised graph (`MatMulIntegerToFloat`, `QLinear*`,
/// `ConvInteger`…), from its op-type counts.
fn integer_ops(ops: &serde_json::Value) -> u64 {
    ops.as_object().map_or(0, |m| {
        m.iter()
            .filter(|(k, _)| k.starts_with("QLinear") || k.contains("Integer"))
            .filter_map(|(_, v)| v.as_u64())
            .sum()
    })
}

impl ExportStage {
    /// The report line on the exported graph: parity (float) or agreement (QDQ).
    fn card_note(&self, card: &ModelCard, onnx: &Path) -> String {
        match &card.quantization {
            None => format!(
                "ONNX `{}`: parity max |ONNX Runtime - mopt| {:.2e} on {} golden validation examples (tolerance {:e}); fused op types {:?}.",
                onnx.display(),
                card.parity.max_abs_err,
                card.parity.samples,
                self.tolerance,
                card.fused_ops
            ),
            Some(q) => format!(
                "ONNX `{}` (QDQ): ONNX Runtime and mopt's fake-quantized forward agree on {:.2}% of {} golden validation rows, mean KL {:.2e} nats a row (required: {}), max logit difference {:.2e}; ONNX Runtime's optimised graph runs {} integer-kernel ops among {:?}.",
                onnx.display(),
                card.parity.agreement * 100.0,
                card.parity.samples,
                card.parity.mean_kl,
                match &q["parity_rule"] {
                    serde_json::Value::Object(r) => r
                        .iter()
                        .map(|(k, v)| format!("{k} {v}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    _ => "-".into(),
                },
                card.parity.max_abs_err,
                integer_ops(&q["onnxruntime_optimized_ops"]),
                card.fused_ops
            ),
        }
    }

    /// The reference models (`baseline`, earlier stages) exported beside the input, for the
    /// side-by-side latency.
    fn export_references(
        &self,
        input: &Path,
        cx: &StageContext,
        samples: (Split, usize),
        opts: &ExportOptions,
        notes: &mut Vec<String>,
    ) -> Result<Vec<Exported>, StageError> {
        let mut out = Vec::new();
        let references = self
            .reference
            .iter()
            .filter_map(|n| cx.earlier.iter().find(|(name, _)| name == n))
            .filter(|(_, dir)| dir.as_path() != input);
        for (name, dir) in references {
            let b = cx.dir.join(format!("{name}-onnx"));
            eprintln!(
                "export: the {name} model {} -> {}",
                dir.display(),
                b.display()
            );
            let card = cx
                .family
                .require::<dyn CanExport>("export", NEEDS.0, NEEDS.1)?
                .export(dir, &b, cx.data, samples, opts)?;
            if let Some(extra) = &card.extra {
                notes.push(format!("Beside the {name}'s model.onnx: {extra}."));
            }
            out.push(Exported {
                name: name.clone(),
                checkpoint: dir.clone(),
                onnx: b.join("model.onnx"),
            });
        }
        Ok(out)
    }
}

/// ONNX Runtime latency of every exported model (`runs` timed runs, interleaved, float
/// models on their fused graphs), a note per row and the speed-up of the first model over each
/// other one in `notes`.
fn latency(
    models: &[Exported],
    cx: &StageContext,
    runs: usize,
    notes: &mut Vec<String>,
) -> Result<Vec<serde_json::Value>, StageError> {
    let e = cx.evaluation;
    eprintln!(
        "export: ONNX Runtime latency of {}, interleaved",
        models
            .iter()
            .map(|m| m.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let list: Vec<_> = models
        .iter()
        .map(|m| (m.name.clone(), m.checkpoint.clone(), m.onnx.clone()))
        .collect();
    let settings = (e.seq_len(cx.size), (e.latency_warmup, runs));
    let rows = ort_latency(cx.family, &list, settings, notes)?;
    for r in &rows {
        let name = r["model"].as_str().unwrap_or("");
        notes.push(format!(
            "ONNX Runtime graph of the {name}: {}.",
            r["graph"].as_str().unwrap_or("")
        ));
        for row in r["latency"].as_array().into_iter().flatten() {
            let size = match row["seq_len"].as_u64() {
                Some(n) if n > 0 => format!(" x {n}"),
                _ => String::new(),
            };
            notes.push(format!(
                "ONNX Runtime CPU latency, {name}, batch {}{size}: p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms{}.",
                row["batch"],
                row["p50_ms"].as_f64().unwrap_or(f64::NAN),
                row["p90_ms"].as_f64().unwrap_or(f64::NAN),
                row["p99_ms"].as_f64().unwrap_or(f64::NAN),
                layout_note(row)
            ));
        }
    }
    let p50 = |name: &str, batch: u64| {
        rows.iter().find(|r| r["model"] == name)?["latency"]
            .as_array()?
            .iter()
            .find(|r| r["batch"].as_u64() == Some(batch))?["p50_ms"]
            .as_f64()
    };
    // The batches measured, largest first (32 then 1 for text, 64 then 1 for images).
    let mut batches: Vec<u64> = rows
        .first()
        .and_then(|r| r["latency"].as_array())
        .into_iter()
        .flatten()
        .filter_map(|r| r["batch"].as_u64())
        .collect();
    batches.sort_unstable_by(|a, b| b.cmp(a));
    for m in models.iter().skip(1) {
        let parts: Vec<String> = batches
            .iter()
            .filter_map(|&b| {
                let r = p50(&m.name, b)? / p50(&models[0].name, b)?;
                Some(format!("{r:.2}x at batch {b}"))
            })
            .collect();
        if !parts.is_empty() {
            notes.push(format!(
                "ONNX Runtime p50 speed-up of this model over the {}, interleaved in the same run: {}.",
                m.name,
                parts.join(", ")
            ));
        }
    }
    Ok(rows)
}
