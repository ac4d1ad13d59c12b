//! Exporting a mopt checkpoint: `model.onnx`, tokenizer files, label map and `model-card.json`,
//! after an ONNX checker pass and a parity check against mopt's own forward pass. Files are
//! written to a temporary folder and moved into place only when every check passes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::prelude::*;
use mopt_models::bert::{weights, BertConfig, BertForSequenceClassification};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::bert::{export_bert, INPUTS, IR_VERSION, OPSET, OUTPUT};
use crate::contract::argmax;
use crate::error::ExportError;
use crate::python;

/// Parity tolerance for float exports (max absolute logit difference).
pub const FLOAT_TOLERANCE: f64 = 1e-4;

/// Prediction agreement a quantized (QDQ) export must reach with mopt's fake-quantized forward.
/// Logits are not held to [`FLOAT_TOLERANCE`]: ONNX Runtime accumulates in int32 and mopt in
/// f32, and where the two land on different sides of a rounding boundary one activation moves
/// by a quantization step.
pub const QDQ_MIN_AGREEMENT: f64 = 0.995;

#[derive(Debug, Clone, Serialize)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Parity {
    pub samples: usize,
    pub max_abs_err: f64,
    pub tolerance: f64,
    /// Share of samples where ONNX Runtime and mopt predict the same class.
    pub agreement: f64,
}

/// `model-card.json`: what a deployment needs to know about the exported model.
#[derive(Debug, Clone, Serialize)]
pub struct ModelCard {
    pub mopt_version: &'static str,
    pub burn_version: &'static str,
    pub onnxruntime_checked_with: String,
    pub opset: i64,
    pub ir_version: i64,
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
    pub padding: String,
    pub labels: Vec<String>,
    pub layers: usize,
    pub heads_per_layer: Vec<usize>,
    pub ffn_per_layer: Vec<usize>,
    pub params: usize,
    pub accuracy_at_export: Option<f64>,
    pub parity: Parity,
    /// Quantized exports: the schemes and layers (`mopt_quant` of the config) and the op types
    /// of ONNX Runtime's optimised graph (integer kernels such as `MatMulIntegerToFloat`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quantization: Option<serde_json::Value>,
    /// Op types after ONNX Runtime's BERT optimizer (Attention, SkipLayerNormalization, BiasGelu…).
    pub fused_ops: BTreeMap<String, u64>,
    pub sha256: BTreeMap<String, String>,
}

/// Options of [`export_checkpoint`].
#[derive(Debug, Clone)]
pub struct ExportOptions {
    pub tolerance: f64,
    /// Tokenizer truncation length, recorded in the card.
    pub max_len: usize,
    pub accuracy: Option<f64>,
    /// Replace an existing output folder.
    pub force: bool,
}

fn sha256_file(p: &Path) -> Result<String, ExportError> {
    let bytes = std::fs::read(p).map_err(|e| ExportError::Io(p.display().to_string(), e))?;
    Ok(format!("{:x}", Sha256::digest(&bytes)))
}

/// Rows of int64 values.
type Rows = Vec<Vec<i64>>;

/// Right-padded batches of token ids (ids, attention mask).
fn batches(samples: &[Vec<u32>], batch: usize) -> Vec<(Rows, Rows)> {
    samples
        .chunks(batch)
        .map(|chunk| {
            let seq = chunk.iter().map(Vec::len).max().unwrap_or(1);
            let ids = chunk
                .iter()
                .map(|s| {
                    (0..seq)
                        .map(|i| s.get(i).map_or(0, |&t| t as i64))
                        .collect()
                })
                .collect();
            let mask = chunk
                .iter()
                .map(|s| (0..seq).map(|i| i64::from(i < s.len())).collect())
                .collect();
            (ids, mask)
        })
        .collect()
}

/// mopt's logits for one padded batch.
pub fn mopt_logits(
    model: &BertForSequenceClassification,
    ids: &[Vec<i64>],
    mask: &[Vec<i64>],
    device: &Device,
) -> Vec<Vec<f32>> {
    let (b, s) = (ids.len(), ids[0].len());
    let flat: Vec<i64> = ids.iter().flatten().copied().collect();
    let m: Vec<f32> = mask.iter().flatten().map(|&v| v as f32).collect();
    let out = model.forward(
        Tensor::from_data(TensorData::new(flat, [b, s]), device),
        Tensor::from_data(TensorData::new(m, [b, s]), device),
        Tensor::zeros([b, s], device),
    );
    let c = out.dims()[1];
    let v: Vec<f32> = out.into_data().try_to_vec().expect("f32");
    v.chunks(c).map(<[f32]>::to_vec).collect()
}

/// Max |ONNX Runtime − mopt| over `samples` and the share of equal predictions, run in batches
/// of 32.
pub fn parity(
    model: &BertForSequenceClassification,
    onnx: &Path,
    samples: &[Vec<u32>],
    work: &Path,
) -> Result<(f64, f64), ExportError> {
    let device = Device::flex();
    let bs = batches(samples, 32);
    let feeds: Vec<serde_json::Value> = bs
        .iter()
        .map(|(ids, mask)| {
            let zeros: Vec<Vec<i64>> = ids.iter().map(|r| vec![0; r.len()]).collect();
            serde_json::json!({ "input_ids": ids, "attention_mask": mask, "token_type_ids": zeros })
        })
        .collect();
    let outs = python::run(onnx, &serde_json::Value::Array(feeds), work)?;
    let mut max = 0f64;
    let (mut same, mut n) = (0usize, 0usize);
    for ((ids, mask), out) in bs.iter().zip(outs) {
        let ours = mopt_logits(model, ids, mask, &device);
        let theirs: Vec<Vec<f64>> =
            serde_json::from_value(out).map_err(|e| ExportError::Python(e.to_string()))?;
        for (a, b) in ours.iter().zip(&theirs) {
            for (x, y) in a.iter().zip(b) {
                max = max.max((*x as f64 - y).abs());
            }
            n += 1;
            same += usize::from(argmax(a.iter().map(|&x| x as f64)) == argmax(b.iter().copied()));
        }
    }
    Ok((max, same as f64 / n.max(1) as f64))
}

/// Why a quantized model cannot be exported as QDQ, if it cannot.
fn qdq_unsupported(config: &BertConfig) -> Option<String> {
    let q = config.mopt_quant.as_ref()?;
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

/// Export the checkpoint folder `ckpt` into `out`.
pub fn export_checkpoint(
    ckpt: &Path,
    out: &Path,
    samples: &[Vec<u32>],
    opts: &ExportOptions,
) -> Result<ModelCard, ExportError> {
    if out.exists() && !opts.force {
        return Err(ExportError::Invalid(format!(
            "{} already exists; pass --force to replace it",
            out.display()
        )));
    }
    if samples.is_empty() {
        return Err(ExportError::Invalid(
            "parity needs at least one sample".into(),
        ));
    }
    let device = Device::flex();
    let (model, config): (BertForSequenceClassification, BertConfig) =
        weights::load_checkpoint(ckpt, &device)?;
    if let Some(why) = qdq_unsupported(&config) {
        return Err(ExportError::Invalid(format!("{}: {why}", ckpt.display())));
    }
    let model = model.valid();
    let tmp = PathBuf::from(format!("{}.tmp", out.display()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| ExportError::Io(tmp.display().to_string(), e))?;
    }
    std::fs::create_dir_all(&tmp).map_err(|e| ExportError::Io(tmp.display().to_string(), e))?;
    let result = write_export(&model, &config, ckpt, &tmp, samples, opts);
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

fn write_export(
    model: &BertForSequenceClassification,
    config: &BertConfig,
    ckpt: &Path,
    dir: &Path,
    samples: &[Vec<u32>],
    opts: &ExportOptions,
) -> Result<ModelCard, ExportError> {
    let onnx_path = dir.join("model.onnx");
    let proto = export_bert(
        model,
        config,
        &[("mopt_version", env!("CARGO_PKG_VERSION").to_string())],
    );
    std::fs::write(&onnx_path, proto.to_bytes())
        .map_err(|e| ExportError::Io(onnx_path.display().to_string(), e))?;
    python::tool(&["check", &onnx_path.display().to_string()])?;
    let (max_abs_err, agreement) = parity(model, &onnx_path, samples, dir)?;
    let quantized = config.mopt_quant.is_some();
    if quantized {
        if agreement < QDQ_MIN_AGREEMENT || max_abs_err.is_nan() {
            return Err(ExportError::Agreement {
                agreement,
                min: QDQ_MIN_AGREEMENT,
                max_abs_err,
                samples: samples.len(),
            });
        }
    } else if max_abs_err > opts.tolerance || max_abs_err.is_nan() {
        return Err(ExportError::Parity {
            max_abs_err,
            tolerance: opts.tolerance,
            samples: samples.len(),
        });
    }
    let fused_path = dir.join("fused.onnx.tmp");
    // Float models: ORT's BERT optimizer (fused attention, SkipLayerNorm...). Quantized ones:
    // ORT's own graph optimisation, which is what turns QDQ into integer kernels.
    let fused = if quantized {
        python::tool(&[
            "optimized-ops",
            &onnx_path.display().to_string(),
            &fused_path.display().to_string(),
        ])?
    } else {
        python::tool(&[
            "fuse",
            &onnx_path.display().to_string(),
            &config.num_attention_heads.to_string(),
            &config.hidden_size.to_string(),
            &fused_path.display().to_string(),
        ])?
    };
    let _ = std::fs::remove_file(&fused_path);
    let ort_version = python::tool(&["version"])
        .ok()
        .and_then(|v| v["onnxruntime"].as_str().map(String::from))
        .unwrap_or_default();
    let mut files = vec!["model.onnx".to_string()];
    for f in ["tokenizer.json", "vocab.txt", "labels.json"] {
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
    let dynamic = || vec!["batch".to_string(), "sequence".to_string()];
    let card = ModelCard {
        mopt_version: env!("CARGO_PKG_VERSION"),
        burn_version: "0.22.1",
        onnxruntime_checked_with: ort_version,
        opset: OPSET,
        ir_version: IR_VERSION,
        inputs: INPUTS.iter().map(|n| TensorSpec { name: n.to_string(), dtype: "int64".into(), shape: dynamic() }).collect(),
        outputs: vec![TensorSpec { name: OUTPUT.into(), dtype: "float32".into(), shape: vec!["batch".into(), config.num_labels.to_string()] }],
        padding: format!(
            "right padding with id 0 ([PAD]); attention_mask 1 for tokens and 0 for padding; token_type_ids all 0; [CLS] … [SEP], truncated at {} tokens",
            opts.max_len
        ),
        labels: config.mopt_labels.clone().unwrap_or_default(),
        layers: config.num_hidden_layers,
        heads_per_layer: (0..config.num_hidden_layers).map(|i| config.heads(i)).collect(),
        ffn_per_layer: (0..config.num_hidden_layers).map(|i| config.ffn(i)).collect(),
        params: config.num_params(),
        accuracy_at_export: opts.accuracy,
        parity: Parity { samples: samples.len(), max_abs_err, tolerance: opts.tolerance, agreement },
        quantization: config.mopt_quant.as_ref().map(|q| {
            serde_json::json!({
                "config": q,
                "format": "QDQ: QuantizeLinear/DequantizeLinear on inputs, int8 weights with per-channel DequantizeLinear",
                "min_agreement": QDQ_MIN_AGREEMENT,
                "onnxruntime_optimized_ops": python::ops(&fused),
            })
        }),
        fused_ops: python::ops(&fused),
        sha256,
    };
    let card_path = dir.join("model-card.json");
    std::fs::write(
        &card_path,
        serde_json::to_string_pretty(&card).expect("json"),
    )
    .map_err(|e| ExportError::Io(card_path.display().to_string(), e))?;
    Ok(card)
}
