//! Turning a validated recipe into data, a model config and a model.

use std::path::{Path, PathBuf};

use burn::prelude::*;
use mopt_data::{encode_splits, load_splits, EncodedSplits, LabelMap, TextTokenizer};
use mopt_models::bert::{weights, BertConfig, BertForSequenceClassification};
use mopt_recipe::{DataSpec, ModelSpec, Scope, TokenizerSpec};

use crate::error::TrainError;

/// Tokenizer and tokenized splits.
pub struct PreparedData {
    pub tokenizer: TextTokenizer,
    pub data: EncodedSplits,
}

/// Load, split and tokenize the recipe's data (token ids cached in `.mopt-cache/` beside it).
/// The label map is `labels` (e.g. a teacher's), else the recipe's, else the training split's.
pub fn prepare_data(
    tok: &TokenizerSpec,
    data: &DataSpec,
    labels: Option<LabelMap>,
) -> Result<PreparedData, TrainError> {
    let tokenizer = TextTokenizer::from_file(&tok.path, tok.max_len, tok.lowercase)?;
    let splits = load_splits(data)?;
    let cache_dir = cache_dir(data);
    let labels = labels.or_else(|| data.labels.clone().map(LabelMap::new));
    let data = encode_splits(
        &tokenizer,
        &splits,
        labels,
        cache_dir.as_deref(),
        data.anchor(),
    )?;
    Ok(PreparedData { tokenizer, data })
}

/// Folder for caches derived from the recipe's data (token ids, teacher outputs).
pub fn cache_dir(data: &DataSpec) -> Option<PathBuf> {
    data.anchor().parent().map(|p| p.join(".mopt-cache"))
}

/// The model config: the model table's `config.json`, its overrides, its dropout, the label
/// count. Errors name keys of the model table `cx` (`model.` or `stage[2].student.`).
pub fn model_config(
    m: &ModelSpec,
    tok: &TokenizerSpec,
    cx: &Scope,
    labels: &LabelMap,
    vocab_size: usize,
) -> Result<BertConfig, TrainError> {
    let mut c = BertConfig::from_file(&m.config)?;
    let o = &m.overrides;
    if let Some(v) = o.num_hidden_layers {
        c.num_hidden_layers = v;
    }
    if let Some(v) = o.hidden_size {
        c.hidden_size = v;
    }
    if let Some(v) = o.num_attention_heads {
        c.num_attention_heads = v;
        c.attention_head_size = None;
    }
    if let Some(v) = o.intermediate_size {
        c.intermediate_size = v;
    }
    if let Some(v) = &o.layer_heads {
        c.mopt_layer_heads = Some(v.clone());
    }
    if let Some(v) = &o.layer_intermediate_sizes {
        c.mopt_layer_intermediate_sizes = Some(v.clone());
    }
    if let Some(p) = m.dropout {
        c.hidden_dropout_prob = p;
        c.attention_probs_dropout_prob = p;
    }
    c.num_labels = labels.len();
    c.mopt_labels = Some(labels.labels.clone());
    let bad =
        |key: &str, message: String, hint: &str| TrainError::Recipe(cx.err(key, message, hint));
    c.check().map_err(|msg| {
        bad(
            "overrides",
            msg,
            "make the overrides consistent with each other and with config.json",
        )
    })?;
    if vocab_size > c.vocab_size {
        return Err(bad(
            "config",
            format!(
                "the tokenizer has {vocab_size} tokens but the model's vocab_size is {}",
                c.vocab_size
            ),
            "use the tokenizer that belongs to the model's checkpoint ([tokenizer] path), or a config with its vocabulary",
        ));
    }
    if tok.max_len > c.max_position_embeddings {
        return Err(bad(
            "config",
            format!(
                "[tokenizer] max-len {} exceeds the model's {} positions",
                tok.max_len, c.max_position_embeddings
            ),
            "lower [tokenizer] max-len",
        ));
    }
    Ok(c)
}

/// Build the model on `device` and load the recipe's weights, if any.
pub fn build_model(
    m: &ModelSpec,
    seed: u64,
    config: &BertConfig,
    device: &Device,
) -> Result<(BertForSequenceClassification, Option<weights::LoadReport>), TrainError> {
    device.seed(seed);
    let mut model = BertForSequenceClassification::new(config, device);
    let report = match &m.weights {
        None => None,
        Some(w) if is_burnpack(w) => {
            weights::load_burnpack(&mut model, w)?;
            None
        }
        Some(w) => Some(weights::load_hf_safetensors(
            &mut model,
            w,
            m.allow_fresh_head,
        )?),
    };
    Ok((model, report))
}

fn is_burnpack(p: &Path) -> bool {
    p.extension().is_some_and(|e| e == "bpk")
}
