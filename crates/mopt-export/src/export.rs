//! Exporting a mopt checkpoint of any [`Exportable`] model: `model.onnx`, the checkpoint's
//! side files (tokenizer, label map), and `model-card.json`, after an ONNX checker pass and a
//! parity check against mopt's own forward pass. Files are written to a temporary folder and
//! moved into place only when every check passes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::prelude::*;
use mopt_core::{Examples, ModelConfig};
use mopt_quant::node::QuantConfig;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::contract::{parity, Exportable, InputType, Parity, QdqParity};
use crate::error::ExportError;
use crate::onnx::{Dim, IR_VERSION, OPSET};
use crate::python;

/// The graph output every exporter writes: the logits `[batch, num_labels]`.
pub const OUTPUT: &str = "logits";

/// Examples per ONNX Runtime call in the parity check.
const PARITY_BATCH: usize = 32;

/// Files of a checkpoint folder a deployment needs besides the graph, copied when present.
const SIDE_FILES: [&str; 4] = [
    "tokenizer.json",
    "tokenizer.gguf",
    "vocab.txt",
    "labels.json",
];

/// Parity tolerance for float exports (max absolute logit difference).
pub const FLOAT_TOLERANCE: f64 = 1e-4;

/// Prediction agreement a quantized (QDQ) classifier's export must reach with mopt's
/// fake-quantized forward ([`QdqParity::MinAgreement`]).
pub const QDQ_MIN_AGREEMENT: f64 = 0.995;

/// Mean KL divergence (nats a position) a quantized language model's export may be from mopt's
/// fake-quantized forward ([`QdqParity::MaxMeanKl`]). Measured on SmolLM2 pruned to 22 layers
/// with int8 projections (per-tensor uint8 inputs): mopt's own integer form of the model is
/// 0.040 nats from its fake-quantized forward (88.7% of next tokens the same, perplexity 45.78
/// against 45.96 on 512 positions of Hamlet); a graph with a wrong scale or op is nats away.
pub const QDQ_MAX_MEAN_KL: f64 = 0.1;

#[derive(Debug, Clone, Serialize)]
/// A graph input or output as the model card lists it.
pub struct TensorSpec {
    /// Its name.
    pub name: String,
    /// Its element type (`float32`, `int64`).
    pub dtype: String,
    /// Its dimensions (`batch`, sizes).
    pub shape: Vec<String>,
}

/// `model-card.json`: what a deployment needs to know about the exported model.
#[derive(Debug, Clone, Serialize)]
pub struct ModelCard {
    /// mopt's version.
    pub mopt_version: &'static str,
    /// Burn's version.
    pub burn_version: &'static str,
    /// The ONNX Runtime version parity was checked with.
    pub onnxruntime_checked_with: String,
    /// ONNX opset.
    pub opset: i64,
    /// ONNX IR version.
    pub ir_version: i64,
    /// The graph's inputs.
    pub inputs: Vec<TensorSpec>,
    /// The graph's outputs.
    pub outputs: Vec<TensorSpec>,
    /// How a deployment prepares the inputs (BERT: padding, token types, truncation).
    pub padding: String,
    /// Class names in logit order.
    pub labels: Vec<String>,
    /// The model's own facts ([`Exportable::card_facts`]; BERT: `layers`, `heads_per_layer`,
    /// `ffn_per_layer`).
    #[serde(flatten)]
    pub architecture: serde_json::Map<String, serde_json::Value>,
    /// Parameters.
    pub params: usize,
    /// Validation accuracy of the exported checkpoint, when known.
    pub accuracy_at_export: Option<f64>,
    /// How ONNX Runtime compared with mopt.
    pub parity: Parity,
    /// Quantized exports: the schemes and layers (`mopt_quant` of the config) and the op types
    /// of ONNX Runtime's optimised graph (integer kernels such as `MatMulIntegerToFloat`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quantization: Option<serde_json::Value>,
    /// Op types of the graph ONNX Runtime runs: the [`FUSED`] graph's where one was written
    /// (Attention, SkipLayerNormalization, BiasGelu…; for QDQ, MatMulIntegerToFloat…).
    pub fused_ops: BTreeMap<String, u64>,
    /// The [`FUSED`] graph's parity with mopt (`file`, `agreement`, `max_abs_err`), when written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fused_graph: Option<serde_json::Value>,
    /// Further graphs and their checks ([`Exportable::write_extra`]: a decoder's step with past
    /// keys and values), when the model writes any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extra: Option<serde_json::Value>,
    /// sha256 of every file of the export folder.
    pub sha256: BTreeMap<String, String>,
}

/// Options of [`export_checkpoint`].
#[derive(Debug, Clone)]
pub struct ExportOptions {
    /// Float parity tolerance (max |ONNX Runtime − mopt| logit).
    pub tolerance: f64,
    /// How a deployment prepares the inputs, recorded in the card (see [`ModelCard::padding`]).
    pub input_notes: String,
    /// The class names, in logit order, recorded in the card.
    pub labels: Vec<String>,
    /// Validation accuracy to record, when known.
    pub accuracy: Option<f64>,
    /// Replace an existing output folder.
    pub force: bool,
}

fn sha256_file(p: &Path) -> Result<String, ExportError> {
    let bytes = std::fs::read(p).map_err(|e| ExportError::Io(p.display().to_string(), e))?;
    Ok(format!("{:x}", Sha256::digest(&bytes)))
}

/// Why a quantized model cannot be exported as QDQ, if it cannot.
fn qdq_unsupported(q: Option<&QuantConfig>) -> Option<String> {
    let q = q?;
    if q.weight.format.bits > 8 || q.weight.format.bits < 5 || !q.weight.format.signed {
        return Some(format!(
            "weights are quantized to {}-bit {}: the QDQ export writes int8 weights (8 bits, or the 7-bit range); INT4 needs ONNX opset 21. Use weight bits = 8 (or 7) for an ONNX deployment",
            q.weight.format.bits,
            if q.weight.format.signed { "signed" } else { "unsigned" }
        ));
    }
    if q.activation.format.bits != 8 {
        return Some(format!(
            "activations are quantized to {} bits: QDQ export needs 8-bit activations",
            q.activation.format.bits
        ));
    }
    None
}

/// Export the checkpoint folder `ckpt` of an `M` into `out`, checking parity on `examples`.
pub fn export_checkpoint<M, E>(
    ckpt: &Path,
    out: &Path,
    examples: &E,
    opts: &ExportOptions,
) -> Result<ModelCard, ExportError>
where
    M: Exportable,
    E: Examples<Batch = M::Batch>,
{
    if out.exists() && !opts.force {
        return Err(ExportError::Invalid(format!(
            "{} already exists; pass --force to replace it",
            out.display()
        )));
    }
    if examples.is_empty() {
        return Err(ExportError::Invalid(
            "parity needs at least one sample".into(),
        ));
    }
    let device = Device::flex();
    let (model, config) = M::load(ckpt, &device).map_err(ExportError::Model)?;
    if let Some(why) = qdq_unsupported(M::quantization(&config).as_ref()) {
        return Err(ExportError::Invalid(format!("{}: {why}", ckpt.display())));
    }
    let model = model.valid();
    let tmp = PathBuf::from(format!("{}.tmp", out.display()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| ExportError::Io(tmp.display().to_string(), e))?;
    }
    std::fs::create_dir_all(&tmp).map_err(|e| ExportError::Io(tmp.display().to_string(), e))?;
    let target = Target {
        ckpt,
        dir: &tmp,
        device: &device,
    };
    let result = write_export(&model, &config, &target, examples, opts);
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
        return result;
    }
    if out.exists() {
        std::fs::remove_dir_all(out).map_err(|e| ExportError::Io(out.display().to_string(), e))?;
    }
    std::fs::rename(&tmp, out).map_err(|e| ExportError::Io(out.display().to_string(), e))?;
    result
}

/// Where an export reads from and writes to.
struct Target<'a> {
    ckpt: &'a Path,
    dir: &'a Path,
    device: &'a Device,
}

fn write_export<M, E>(
    model: &M,
    config: &M::Config,
    at: &Target,
    examples: &E,
    opts: &ExportOptions,
) -> Result<ModelCard, ExportError>
where
    M: Exportable,
    E: Examples<Batch = M::Batch>,
{
    let onnx_path = at.dir.join("model.onnx");
    crate::contract::write_checked(&model.onnx(config)?, &onnx_path)?;
    let p = parity(
        model,
        &onnx_path,
        examples,
        PARITY_BATCH,
        opts.tolerance,
        at.device,
        at.dir,
    )?;
    let quantization = M::quantization(config);
    let rule = quantization.as_ref().map(|_| M::qdq_parity());
    check_parity(&p, rule)?;
    let fused = python::ops(&fused_ops(
        &onnx_path,
        M::ort_fusion(config),
        quantization.is_some(),
        at.dir,
    )?);
    let fused_parity = fused_graph_parity(model, examples, at, opts.tolerance, rule)?;
    let first: Vec<usize> = (0..examples.len().min(PARITY_BATCH)).collect();
    let extra = model.write_extra(config, at.dir, &examples.batch(&first, at.device))?;
    let extra_files = extra_graphs(at.dir, extra.as_ref());
    let sha256 = copy_side_files(at.ckpt, at.dir, &extra_files)?;
    let card = ModelCard {
        mopt_version: env!("CARGO_PKG_VERSION"),
        burn_version: "0.22.1",
        onnxruntime_checked_with: ort_version(),
        opset: OPSET,
        ir_version: IR_VERSION,
        inputs: input_specs::<M>(config),
        outputs: vec![TensorSpec {
            name: OUTPUT.into(),
            dtype: "float32".into(),
            shape: M::outputs(config).iter().map(dim_name).collect(),
        }],
        padding: opts.input_notes.clone(),
        labels: opts.labels.clone(),
        architecture: M::card_facts(config),
        params: config.num_params(),
        accuracy_at_export: opts.accuracy,
        parity: p,
        quantization: quantization.as_ref().map(|q| {
            serde_json::json!({
                "config": q,
                "format": qdq_format(q),
                "parity_rule": rule,
                "onnxruntime_optimized_ops": fused,
            })
        }),
        fused_ops: fused,
        fused_graph: fused_parity,
        extra,
        sha256,
    };
    write_card(&card, at.dir)?;
    Ok(card)
}

/// The [`FUSED`] graph's checked parity for the card (`file`, `agreement`, `max_abs_err`), when
/// the export wrote one.
fn fused_graph_parity<M, E>(
    model: &M,
    examples: &E,
    at: &Target,
    tolerance: f64,
    rule: Option<QdqParity>,
) -> Result<Option<serde_json::Value>, ExportError>
where
    M: Exportable,
    E: Examples<Batch = M::Batch>,
{
    // The fused graph is the one timed and deployed: checked like `model.onnx`.
    let fused_path = at.dir.join(FUSED);
    if fused_path.is_file() {
        let p = parity(
            model,
            &fused_path,
            examples,
            PARITY_BATCH,
            tolerance,
            at.device,
            at.dir,
        )?;
        check_parity(&p, rule)?;
        Ok(Some(serde_json::json!({
            "file": FUSED,
            "agreement": p.agreement,
            "mean_kl": p.mean_kl,
            "max_abs_err": p.max_abs_err,
        })))
    } else {
        Ok(None)
    }
}

/// The card's description of the graph inputs of an `M` of `config`.
fn input_specs<M: Exportable>(config: &M::Config) -> Vec<TensorSpec> {
    M::inputs(config)
        .iter()
        .map(|i| TensorSpec {
            name: i.name.clone(),
            dtype: match i.dtype {
                InputType::Float => "float32",
                InputType::Int64 => "int64",
            }
            .into(),
            shape: i.dims.iter().map(dim_name).collect(),
        })
        .collect()
}

/// Write `card` to `model-card.json` in `dir`.
fn write_card(card: &ModelCard, dir: &Path) -> Result<(), ExportError> {
    let card_path = dir.join("model-card.json");
    std::fs::write(
        &card_path,
        serde_json::to_string_pretty(card).expect("json"),
    )
    .map_err(|e| ExportError::Io(card_path.display().to_string(), e))
}

/// The card's description of a QDQ graph's formats: which kernels its weights suit.
fn qdq_format(q: &QuantConfig) -> String {
    let weights = match q.weight.format.bits {
        8 => "full-range 8-bit weights (ONNX Runtime's u8·s8 kernels: for CPUs with VNNI)",
        7 => {
            "7-bit weights in int8 (ONNX Runtime's u8·s8 kernels without VNNI: no int16 saturation)"
        }
        _ => "int8 weights",
    };
    let mut s = format!(
        "QDQ: QuantizeLinear/DequantizeLinear on inputs, {weights} with per-channel DequantizeLinear"
    );
    if !q.embeddings.is_empty() {
        s += &format!(
            "; embedding tables int8 with one float scale per row, gathered as Cast(Gather(int8)) * Gather(scale): {}",
            q.embeddings.join(", ")
        );
    }
    s
}

/// A quantized graph (`rule`: its family's [`QdqParity`]) must agree with mopt's
/// fake-quantized forward as the rule says, a float one match its logits within its
/// `tolerance`.
fn check_parity(p: &Parity, rule: Option<QdqParity>) -> Result<(), ExportError> {
    let (max_abs_err, tolerance, samples) = (p.max_abs_err, p.tolerance, p.samples);
    match rule {
        Some(QdqParity::MinAgreement(min)) if p.agreement < min || max_abs_err.is_nan() => {
            return Err(ExportError::Agreement {
                agreement: p.agreement,
                min,
                max_abs_err,
                samples,
            });
        }
        Some(QdqParity::MaxMeanKl(max)) if p.mean_kl > max || p.mean_kl.is_nan() => {
            return Err(ExportError::Divergence {
                mean_kl: p.mean_kl,
                max,
                agreement: p.agreement,
                samples,
            });
        }
        _ => {}
    }
    if rule.is_none() && (max_abs_err > tolerance || max_abs_err.is_nan()) {
        return Err(ExportError::Parity {
            max_abs_err,
            tolerance,
            samples,
        });
    }
    Ok(())
}

fn dim_name(d: &Dim) -> String {
    match d {
        Dim::Fixed(v) => v.to_string(),
        Dim::Named(n) => (*n).to_string(),
    }
}

/// The graph a deployment on ONNX Runtime's CPU runs, written beside `model.onnx` where the
/// family declares a transformer fusion: for a float model, ORT's transformer optimizer applied
/// (fused Attention, SkipLayerNormalization, BiasGelu…); for a QDQ model, mopt's rewrite into
/// ORT's contrib ops (`MatMulIntegerToFloat` with its bias, `SkipLayerNormalization`,
/// `MultiHeadAttention`; the same integer arithmetic, checked for parity like `model.onnx`).
/// Latency is timed on it.
pub const FUSED: &str = "model.fused.onnx";

/// The op types of ONNX Runtime's optimised graph: with `fusion`, the [`FUSED`] graph's (kept),
/// otherwise ORT's own graph optimisation of `model.onnx` (which turns QDQ into integer kernels).
fn fused_ops(
    onnx: &Path,
    fusion: Option<crate::contract::OrtFusion>,
    quantized: bool,
    dir: &Path,
) -> Result<serde_json::Value, ExportError> {
    let kept = dir.join(FUSED);
    if kept.exists() {
        std::fs::remove_file(&kept).map_err(|e| ExportError::Io(kept.display().to_string(), e))?;
    }
    // Without a fusion the optimised graph is only read for its op types, then removed.
    let temporary = fusion.is_none();
    let fused_path = if temporary {
        dir.join("fused.onnx.tmp")
    } else {
        kept
    };
    let (onnx, fused) = (onnx.display().to_string(), fused_path.display().to_string());
    let ops = match fusion {
        Some(_) if quantized => python::tool(&["fuse-qdq", &onnx, &fused])?,
        Some(f) => python::tool(&[
            "fuse",
            &onnx,
            f.model_type,
            &f.heads.to_string(),
            &f.hidden.to_string(),
            &fused,
        ])?,
        None => python::tool(&["optimized-ops", &onnx, &fused])?,
    };
    if temporary {
        let _ = std::fs::remove_file(&fused_path);
    }
    Ok(ops)
}

fn ort_version() -> String {
    python::tool(&["version"])
        .ok()
        .and_then(|v| v["onnxruntime"].as_str().map(String::from))
        .unwrap_or_default()
}

/// The `.onnx` files of `dir` that `extra` (a [`ModelCard::extra`]) names as string values.
fn extra_graphs(dir: &Path, extra: Option<&serde_json::Value>) -> Vec<String> {
    let Some(serde_json::Value::Object(m)) = extra else {
        return Vec::new();
    };
    m.values()
        .filter_map(|v| v.as_str())
        .filter(|f| f.ends_with(".onnx") && dir.join(f).is_file())
        .map(String::from)
        .collect()
}

/// Copy [`SIDE_FILES`] present in `ckpt` to `dir`; sha256 of those and of `model.onnx` and
/// the graphs `extra` names (the family's [`Exportable::write_extra`]).
fn copy_side_files(
    ckpt: &Path,
    dir: &Path,
    extra: &[String],
) -> Result<BTreeMap<String, String>, ExportError> {
    let mut files = vec!["model.onnx".to_string()];
    files.extend(extra.iter().cloned());
    for f in SIDE_FILES {
        let src = ckpt.join(f);
        if src.is_file() {
            std::fs::copy(&src, dir.join(f))
                .map_err(|e| ExportError::Io(src.display().to_string(), e))?;
            files.push(f.to_string());
        }
    }
    let mut sha256 = BTreeMap::new();
    for f in &files {
        sha256.insert(f.clone(), sha256_file(&dir.join(f))?);
    }
    Ok(sha256)
}

/// The benchmark inputs of a model of `config` at `size` (tokens, or ignored), one per batch
/// of [`Exportable::bench_batches`]; `None` when the model declares none.
pub fn bench_feeds<M: Exportable>(config: &M::Config, size: usize) -> Option<serde_json::Value> {
    let mut feeds = Vec::new();
    for batch in M::bench_batches() {
        let feed = M::bench_feed(config, batch, size)?;
        feeds.push(serde_json::json!({ "batch": batch, "seq_len": size, "feed": feed }));
    }
    Some(serde_json::Value::Array(feeds))
}

/// A graph to time: its name in the report, the exported `model.onnx` and its inputs
/// ([`bench_feeds`]).
#[derive(Debug, Clone)]
pub struct BenchModel {
    /// Its name in the report.
    pub name: String,
    /// The exported `model.onnx` ([`FUSED`] beside it is timed instead when present).
    pub onnx: std::path::PathBuf,
    /// Its inputs, one per batch size.
    pub feeds: serde_json::Value,
}

/// Whether the export at `onnx` is quantized (its model card says so).
fn is_quantized_export(onnx: &Path) -> bool {
    std::fs::read(onnx.with_file_name("model-card.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .is_some_and(|c| c.get("quantization").is_some_and(|q| !q.is_null()))
}

/// How [`ort_latency_interleaved`] times: part of the export stage's reuse key, so that a stage
/// timed by another method is not reused as if this build had timed it.
pub const LATENCY_METHOD: &str = "rounds of back-to-back blocks; every layout (intra-op; data-parallel single-thread sessions, one at batch 1); each model's fastest layout";

/// ONNX Runtime latency of `models`, interleaved in rounds: each round times a block of
/// back-to-back runs of every model in turn (after two untimed runs), so that every model is
/// timed hot, as a deployment serving requests runs it, and meets the same drift of a shared
/// machine (`ort_tool.py`'s `bench_many`). Each model runs its fused graph ([`FUSED`]) when
/// the export wrote one (float and QDQ transformers), as a deployment would; every session has
/// ORT's full graph optimisation, in every layout the batch allows (one session with ORT's
/// intra-op threads; the batch split over one single-thread session per core), and its row is
/// its fastest layout's, named (`"layout"`, every layout in `"layouts"`). One row per model: `{"model", "graph",
/// "file", "latency": [{"batch", "seq_len", "runs", "p50_ms", "p90_ms", "p99_ms", "mean_ms"}]}`.
pub fn ort_latency_interleaved(
    models: &[BenchModel],
    (warmup, runs): (usize, usize),
    work: &Path,
) -> Result<Vec<serde_json::Value>, ExportError> {
    if models.is_empty() {
        return Ok(Vec::new());
    }
    let graph = |m: &BenchModel| {
        let fused = m.onnx.with_file_name(FUSED);
        if fused.is_file() && is_quantized_export(&m.onnx) {
            (fused, "mopt's QDQ fusion for ORT (MatMulIntegerToFloat with bias, SkipLayerNormalization, MultiHeadAttention, FastGelu for a tanh GELU) + ORT_ENABLE_ALL")
        } else if fused.is_file() {
            (fused, "ORT transformer optimizer (fused Attention, SkipLayerNormalization, BiasGelu) + ORT_ENABLE_ALL")
        } else {
            (
                m.onnx.clone(),
                "ORT_ENABLE_ALL (QDQ runs as integer kernels)",
            )
        }
    };
    let spec: Vec<serde_json::Value> = models
        .iter()
        .map(|m| serde_json::json!({ "name": m.name, "model": graph(m).0, "feeds": m.feeds }))
        .collect();
    let path = work.join("ort-bench-spec.json");
    std::fs::write(&path, serde_json::to_vec(&spec).expect("json"))
        .map_err(|e| ExportError::Io(path.display().to_string(), e))?;
    let v = python::tool(&[
        "bench-many",
        &path.display().to_string(),
        &warmup.to_string(),
        &runs.to_string(),
    ]);
    let _ = std::fs::remove_file(&path);
    let v = v?;
    let rows = v["latency"].as_array().cloned().unwrap_or_default();
    Ok(models
        .iter()
        .zip(rows)
        .map(|(m, r)| {
            let (file, graph) = graph(m);
            serde_json::json!({
                "model": m.name,
                "graph": graph,
                "file": file.display().to_string(),
                "latency": r["latency"],
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parity(agreement: f64, mean_kl: f64, max_abs_err: f64) -> Parity {
        Parity {
            samples: 128,
            max_abs_err,
            tolerance: FLOAT_TOLERANCE,
            agreement,
            mean_kl,
        }
    }

    #[test]
    fn each_kind_of_graph_is_held_to_its_own_rule() {
        // Float: the logit tolerance, whatever the agreement.
        assert!(check_parity(&parity(0.5, 1.0, 5e-5), None).is_ok());
        assert!(matches!(
            check_parity(&parity(1.0, 0.0, 2e-4), None),
            Err(ExportError::Parity { .. })
        ));
        // A classifier's QDQ graph: agreement; its logits may move.
        let agree = Some(QdqParity::MinAgreement(QDQ_MIN_AGREEMENT));
        assert!(check_parity(&parity(0.996, 1.0, 3.0), agree).is_ok());
        assert!(matches!(
            check_parity(&parity(0.99, 0.0, 0.1), agree),
            Err(ExportError::Agreement { .. })
        ));
        // A language model's: the mean KL, however many near ties flip (SmolLM2's 86%).
        let kl = Some(QdqParity::MaxMeanKl(QDQ_MAX_MEAN_KL));
        assert!(check_parity(&parity(0.86, 0.04, 6.0), kl).is_ok());
        assert!(matches!(
            check_parity(&parity(1.0, 0.2, 0.1), kl),
            Err(ExportError::Divergence { .. })
        ));
        assert!(check_parity(&parity(1.0, f64::NAN, 0.1), kl).is_err());
    }
}
