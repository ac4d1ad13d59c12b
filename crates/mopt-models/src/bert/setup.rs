//! BERT from a recipe's model table: its config (the table's `config.json` with overrides,
//! dropout and the label count, checked against the tokenizer) and the model with its weights.

use std::path::Path;

use burn::prelude::*;
use mopt_recipe::{ModelSpec, Scope, TokenizerSpec};

use super::{weights, BertConfig, BertForSequenceClassification};
use crate::error::ModelError;

/// The model config: the model table's `config.json`, its overrides, its dropout, the label
/// count. Errors name keys of the model table `cx` (`model.` or `stage[2].student.`).
pub fn model_config(
    m: &ModelSpec,
    tok: &TokenizerSpec,
    cx: &Scope,
    labels: &[String],
    vocab_size: usize,
) -> Result<BertConfig, ModelError> {
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
    if let Some(a) = o.hidden_act {
        c.hidden_act = a.hf_name().into();
    }
    if let Some(p) = m.dropout {
        c.hidden_dropout_prob = p;
        c.attention_probs_dropout_prob = p;
    }
    c.num_labels = labels.len();
    c.mopt_labels = Some(labels.to_vec());
    let bad =
        |key: &str, message: String, hint: &str| ModelError::Recipe(cx.err(key, message, hint));
    c.check().map_err(|msg| {
        bad(
            "overrides",
            msg,
            "make the overrides consistent with each other and with config.json",
        )
    })?;
    if vocab_size > c.input_vocab() {
        return Err(bad(
            "config",
            format!(
                "the tokenizer has {vocab_size} tokens but the model reads {} token ids",
                c.input_vocab()
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
) -> Result<(BertForSequenceClassification, Option<weights::LoadReport>), ModelError> {
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
