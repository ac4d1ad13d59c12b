//! BERT from a recipe's model table: its config (the table's `config.json` with overrides,
//! dropout and the label count, checked against the tokenizer) and the model with its weights.

use std::path::Path;

use burn::prelude::*;
use mopt_data::TokenizerSpec;
use mopt_recipe::{ModelSpec, Scope};

use super::{weights, BertConfig, BertForSequenceClassification, BertModel};
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
    let keys = BertModel::from_spec(m)?;
    let mut c = BertConfig::from_file(&m.config)?;
    let o = &keys.overrides;
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
    if let Some(p) = keys.dropout {
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
    if let Some(layers) = &keys.weights_layers {
        super::student::check_layer_init(&c, &source_config(m, &c)?, layers).map_err(|msg| {
            bad(
                "weights-layers",
                msg.replace("teacher", "weights file"),
                "list one distinct layer of the weights file (0-based, as deep as `config` says) per model layer, with equal shapes",
            )
        })?;
    }
    if tok.max_len > c.max_position_embeddings {
        return Err(ModelError::Recipe(cx.file().err(
            "tokenizer.max-len",
            format!(
                "{} exceeds the model's {} positions ({})",
                tok.max_len,
                c.max_position_embeddings,
                m.config.display()
            ),
            "lower [tokenizer] max-len to the model's position table or less",
        )));
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
    let m_keys = BertModel::from_spec(m)?;
    device.seed(seed);
    // With `weights-layers` the weights load into a model of the file's own depth first.
    let source = match m_keys.weights_layers {
        Some(_) => source_config(m, config)?,
        None => config.clone(),
    };
    let mut model = BertForSequenceClassification::new(&source, device);
    let report = match &m_keys.weights {
        None => None,
        Some(w) if is_burnpack(w) => {
            weights::load_burnpack(&mut model, w)?;
            None
        }
        Some(w) => Some(weights::load_hf_safetensors(
            &mut model,
            w,
            m_keys.allow_fresh_head,
        )?),
    };
    if let Some(layers) = &m_keys.weights_layers {
        model = super::student::from_teacher_layers(&model, layers, config);
    }
    Ok((model, report))
}

/// The shape of the model table's weights file for a model of `config`: `config.json` as the
/// file says (its depth and widths), with the model's labels.
fn source_config(m: &ModelSpec, config: &BertConfig) -> Result<BertConfig, ModelError> {
    let mut c = BertConfig::from_file(&m.config)?;
    c.num_labels = config.num_labels;
    c.mopt_labels = config.mopt_labels.clone();
    Ok(c)
}

fn is_burnpack(p: &Path) -> bool {
    p.extension().is_some_and(|e| e == "bpk")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weight(m: &BertForSequenceClassification, layer: usize) -> Vec<f32> {
        let w = &m.bert.encoder.layer[layer].intermediate.dense.weight;
        w.val().into_data().try_to_vec().unwrap()
    }

    /// `weights-layers`: a 2-layer model built from layers 0 and 2 of a 3-layer weights file
    /// holds exactly those layers (and the file's embeddings); layers past the file's depth or
    /// of another shape are refused by key, and without the key the shorter model cannot load
    /// the deeper file.
    #[test]
    fn weights_layers_pick_layers_of_a_deeper_file() {
        let dir = tempfile::tempdir().unwrap();
        let d = Device::flex();
        let mut full = BertConfig::tiny(50, 2);
        full.num_hidden_layers = 3;
        full.mopt_labels = Some(vec!["a".into(), "b".into()]);
        let source = BertForSequenceClassification::new(&full, &d);
        weights::save_hf(&source, &full, dir.path()).unwrap();
        let text = "[model]\nconfig = \"config.json\"\nweights = \"model.safetensors\"\n";
        let recipe = dir.path().join("r.toml");
        let scope = Scope::root(&recipe, text).nested("model");
        use crate::bert::BertModelKeys;
        let spec = |layers: Option<&[usize]>| {
            let b = ModelSpec::builder(dir.path().join("config.json"))
                .weights(dir.path().join("model.safetensors"))
                .num_hidden_layers(2);
            match layers {
                Some(l) => b.weights_layers(l),
                None => b,
            }
            .build(&scope)
            .unwrap()
        };
        let tok = TokenizerSpec {
            path: dir.path().join("vocab.txt"),
            max_len: 16,
            lowercase: true,
        };
        let labels = ["a".to_string(), "b".to_string()];
        let m = spec(Some(&[0, 2]));
        let config = model_config(&m, &tok, &scope, &labels, 50).unwrap();
        assert_eq!(config.num_hidden_layers, 2);
        let (model, _) = build_model(&m, 7, &config, &d).unwrap();
        assert_eq!(model.bert.encoder.layer.len(), 2);
        assert_eq!(weight(&model, 0), weight(&source, 0));
        assert_eq!(weight(&model, 1), weight(&source, 2));
        assert_ne!(weight(&model, 1), weight(&source, 1));
        let table = |m: &BertForSequenceClassification| -> Vec<f32> {
            let w = &m.bert.embeddings.word_embeddings.weight;
            w.val().into_data().try_to_vec().unwrap()
        };
        assert_eq!(table(&model), table(&source));
        let err = model_config(&spec(Some(&[0, 3])), &tok, &scope, &labels, 50).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("weights-layers") && msg.contains("layer 3"),
            "{msg}"
        );
        // Without `weights-layers` the 2-layer model refuses the 3-layer file's extra layer.
        let m = spec(None);
        let config = model_config(&m, &tok, &scope, &labels, 50).unwrap();
        let Err(err) = build_model(&m, 7, &config, &d) else {
            panic!("a 2-layer model loaded a 3-layer file without weights-layers");
        };
        assert!(err.to_string().contains("encoder.layer.2"), "{err}");
    }
}
