//! Loading and saving BERT weights.
//!
//! - Hugging Face safetensors (`model.safetensors` of `BertModel` or `BertForSequenceClassification`,
//!   with or without the `bert.` prefix): Linear weights are transposed from PyTorch's `[out, in]`,
//!   LayerNorm `weight/bias` become `gamma/beta`, `.self.` and `.LayerNorm.` are renamed to fields,
//!   `position_ids` buffers are skipped. Missing or unknown keys are errors, except a missing
//!   classifier when a fresh head is allowed.
//! - Burn's own format (burnpack, `.bpk`) for mopt checkpoints, always with the `config.json`
//!   that describes the (possibly pruned) shape.
//! - HF-style safetensors + `config.json` for use outside mopt.

use std::path::{Path, PathBuf};

use burn::store::{
    BurnToPyTorchAdapter, KeyRemapper, ModuleSnapshot, PyTorchToBurnAdapter, SafetensorsStore,
};

use super::{BertConfig, BertForSequenceClassification};
use crate::error::ModelError;
use burn::prelude::*;
use mopt_core::Quantizable;

/// HF checkpoint key patterns → mopt module paths.
const HF_TO_MOPT: [(&str, &str); 3] = [
    (r"^(embeddings|encoder|pooler)\.", "bert.$1."),
    (r"\.self\.", ".self_attn."),
    (r"\.LayerNorm\.", ".layer_norm."),
];

/// mopt module paths → HF `BertForSequenceClassification` keys.
const MOPT_TO_HF: [(&str, &str); 2] = [
    (r"\.self_attn\.", ".self."),
    (r"\.layer_norm\.", ".LayerNorm."),
];

/// What a checkpoint load did.
#[derive(Debug, Clone, Default)]
pub struct LoadReport {
    /// Tensors copied into the model.
    pub applied: usize,
    /// Model tensors the checkpoint did not have (left at their fresh initialisation).
    pub fresh: Vec<String>,
    /// Checkpoint tensors that were deliberately skipped (buffers such as `position_ids`).
    pub skipped: Vec<String>,
}

fn remapper(patterns: &[(&str, &str)]) -> KeyRemapper {
    KeyRemapper::from_patterns(patterns.to_vec()).expect("static patterns are valid regexes")
}

fn is_head(key: &str) -> bool {
    key.starts_with("classifier.")
}

/// Load a Hugging Face BERT safetensors checkpoint into `model`.
pub fn load_hf_safetensors(
    model: &mut BertForSequenceClassification,
    path: &Path,
    allow_fresh_head: bool,
) -> Result<LoadReport, ModelError> {
    let fail = |message: String, hint: &str| ModelError::Load {
        path: path.to_path_buf(),
        message,
        hint: hint.to_string(),
    };
    let mut store = SafetensorsStore::from_file(path)
        .with_from_adapter(PyTorchToBurnAdapter)
        .allow_partial(true)
        .validate(false)
        .remap(remapper(&HF_TO_MOPT));
    let result = model.load_from(&mut store).map_err(|e| {
        fail(
            e.to_string(),
            "check that the file is a safetensors BERT checkpoint",
        )
    })?;
    if !result.errors.is_empty() {
        let list: Vec<String> = result
            .errors
            .iter()
            .take(4)
            .map(|e| e.to_string())
            .collect();
        return Err(fail(
            format!(
                "{} tensors do not fit the model, e.g. {}",
                result.errors.len(),
                list.join("; ")
            ),
            "the checkpoint's config.json must describe the same shape (layers, hidden size, heads, FFN width, vocabulary)",
        ));
    }
    let (skipped, unknown): (Vec<String>, Vec<String>) = result
        .unused
        .iter()
        .cloned()
        .partition(|k| k.ends_with("position_ids"));
    if !unknown.is_empty() {
        return Err(fail(
            format!("unknown keys in checkpoint: {}", unknown.join(", ")),
            "use a BERT checkpoint (BertModel or BertForSequenceClassification)",
        ));
    }
    let missing: Vec<String> = result.missing.iter().map(|(k, _)| k.clone()).collect();
    let (head, body): (Vec<String>, Vec<String>) = missing.into_iter().partition(|k| is_head(k));
    if !body.is_empty() {
        return Err(fail(
            format!(
                "checkpoint lacks {} model tensors: {}",
                body.len(),
                body.join(", ")
            ),
            "use a complete BERT checkpoint matching the config",
        ));
    }
    if !head.is_empty() && !allow_fresh_head {
        return Err(fail(
            format!(
                "checkpoint has no classification head ({})",
                head.join(", ")
            ),
            "set `allow-fresh-head = true` under [model] to start the classifier from scratch",
        ));
    }
    Ok(LoadReport {
        applied: result.applied.len(),
        fresh: head,
        skipped,
    })
}

/// Files of a mopt checkpoint folder.
pub struct CheckpointFiles {
    /// The checkpoint folder.
    pub dir: PathBuf,
}

impl CheckpointFiles {
    /// The files of the checkpoint folder `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }
    /// Burn weights.
    pub fn weights(&self) -> PathBuf {
        self.dir.join("model.bpk")
    }
    /// The shape (HF `config.json` plus mopt's per-layer fields).
    pub fn config(&self) -> PathBuf {
        self.dir.join("config.json")
    }
}

/// Save `model` and its config as a mopt checkpoint into `dir` (created; files replaced).
pub fn save_checkpoint(
    model: &BertForSequenceClassification,
    config: &BertConfig,
    dir: &Path,
) -> Result<(), ModelError> {
    let files = CheckpointFiles::new(dir);
    std::fs::create_dir_all(dir).map_err(|source| ModelError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    crate::burnpack::save_burnpack(model, &files.weights())?;
    write_config(config, &files.config())
}

/// Write `config` as pretty JSON.
pub fn write_config(config: &BertConfig, path: &Path) -> Result<(), ModelError> {
    let mut value = serde_json::to_value(config).expect("config serialises");
    value["model_type"] = "bert".into();
    value["architectures"] = serde_json::json!(["BertForSequenceClassification"]);
    if let Some(labels) = &config.mopt_labels {
        let id2label: serde_json::Map<String, serde_json::Value> = labels
            .iter()
            .enumerate()
            .map(|(i, l)| (i.to_string(), l.clone().into()))
            .collect();
        let label2id: serde_json::Map<String, serde_json::Value> = labels
            .iter()
            .enumerate()
            .map(|(i, l)| (l.clone(), i.into()))
            .collect();
        value["id2label"] = id2label.into();
        value["label2id"] = label2id.into();
    }
    std::fs::write(path, serde_json::to_string_pretty(&value).expect("json")).map_err(|source| {
        ModelError::Io {
            path: path.to_path_buf(),
            source,
        }
    })
}

/// Load a mopt checkpoint folder (`config.json` + `model.bpk`) onto `device`.
pub fn load_checkpoint(
    dir: &Path,
    device: &Device,
) -> Result<(BertForSequenceClassification, BertConfig), ModelError> {
    let files = CheckpointFiles::new(dir);
    let config = BertConfig::from_file(&files.config())?;
    let mut model = BertForSequenceClassification::new(&config, device);
    load_burnpack(&mut model, &files.weights())?;
    Ok((model, config))
}

pub use crate::burnpack::load_burnpack;

/// Write HF-style `model.safetensors` (BertForSequenceClassification keys, PyTorch layouts) and
/// `config.json` into `dir`.
pub fn save_hf(
    model: &BertForSequenceClassification,
    config: &BertConfig,
    dir: &Path,
) -> Result<(), ModelError> {
    if config.mopt_quant.is_some() || model.is_quantized() {
        return Err(ModelError::Config {
            path: dir.to_path_buf(),
            message: "this model is quantized (its config has mopt_quant): transformers has no place for its scales and zero points, and float weights alone would not be the model that was evaluated; nothing was written. Export it to ONNX (QDQ, integer kernels in ONNX Runtime): `mopt-train export RECIPE --checkpoint DIR` or an `export` stage".into(),
        });
    }
    if config.mopt_vocab_map.is_some() {
        return Err(ModelError::Config {
            path: dir.to_path_buf(),
            message: "this model's vocabulary was pruned (its config has mopt_vocab_map): transformers would read the tokenizer's ids as rows of the smaller table; nothing was written. Export it to ONNX, which maps the ids".into(),
        });
    }
    // transformers builds every layer from `num_attention_heads` x (hidden / heads) and
    // `intermediate_size`: a pruned shape (per-layer heads or FFN widths, or heads x head size
    // != hidden) cannot be expressed, and it ignores `pruned_heads` on load.
    let h = config.hidden_size;
    let uniform = (0..config.num_hidden_layers).all(|l| {
        config.heads(l) == config.num_attention_heads
            && config.ffn(l) == config.intermediate_size
            && config.heads(l) * config.head_size() == h
    });
    if !uniform {
        return Err(ModelError::Config {
            path: dir.to_path_buf(),
            message: format!(
                "transformers cannot load this shape (heads per layer {:?}, FFN widths {:?}, head size {}, hidden {h}): it builds every layer from num_attention_heads x hidden/heads and one intermediate_size, and ignores pruned_heads; nothing was written. Export pruned models to ONNX instead: `mopt-train export RECIPE --checkpoint DIR` (or an `export` stage)",
                (0..config.num_hidden_layers).map(|l| config.heads(l)).collect::<Vec<_>>(),
                (0..config.num_hidden_layers).map(|l| config.ffn(l)).collect::<Vec<_>>(),
                config.head_size()
            ),
        });
    }
    std::fs::create_dir_all(dir).map_err(|source| ModelError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let path = dir.join("model.safetensors");
    let mut store = SafetensorsStore::from_file(&path)
        .with_to_adapter(BurnToPyTorchAdapter)
        .remap(remapper(&MOPT_TO_HF))
        .metadata("format", "pt")
        .overwrite(true);
    model.save_into(&mut store).map_err(|e| ModelError::Save {
        path: path.clone(),
        message: e.to_string(),
    })?;
    write_config(config, &dir.join("config.json"))
}
