//! `[model]` (and a stage's student): what to build and which weights to load.

use std::path::PathBuf;

use crate::error::RecipeError;
use crate::raw::RawModel;
use crate::scope::Scope;

/// `[model]`: what to build and which weights to load.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    /// `arch` as the recipe writes it; the stage runner resolves it against its registered
    /// model families (an unknown name is an error there). `None`: the run's family (a
    /// student's, its teacher's; a recipe's, its teacher checkpoint's or the registry's default).
    pub arch: Option<String>,
    /// HF `config.json` (or a mopt checkpoint's `config.json`).
    pub config: PathBuf,
    /// HF safetensors or a mopt checkpoint (`.bpk`); `None` = random init.
    pub weights: Option<PathBuf>,
    /// Accept a checkpoint without a classifier head (it is initialised fresh).
    pub allow_fresh_head: bool,
    /// Overrides the config's hidden/attention dropout.
    pub dropout: Option<f64>,
    /// Initialise the student from these teacher layers (0-based), embeddings, pooler and head copied.
    pub init_from_teacher_layers: Option<Vec<usize>>,
    /// With `weights`: the model's layers are these layers of the weights file (0-based; the
    /// file is as deep as `config` says), embeddings, pooler and head with them (DistilBERT's
    /// initialisation, from a pretrained model rather than the fine-tuned teacher).
    pub weights_layers: Option<Vec<usize>>,
    /// Shape changes over the config file.
    pub overrides: ModelOverrides,
}

/// Size overrides applied to the config (tiny test models; pruned shapes).
#[derive(Debug, Clone, Default)]
pub struct ModelOverrides {
    /// Encoder layers.
    pub num_hidden_layers: Option<usize>,
    /// Residual width.
    pub hidden_size: Option<usize>,
    /// Attention heads a layer.
    pub num_attention_heads: Option<usize>,
    /// FFN width.
    pub intermediate_size: Option<usize>,
    /// Heads of each layer.
    pub layer_heads: Option<Vec<usize>>,
    /// FFN width of each layer.
    pub layer_intermediate_sizes: Option<Vec<usize>>,
    /// The FFN activation.
    pub hidden_act: Option<Activation>,
}

/// `overrides.hidden-act`: the FFN's activation (a student trained with the function its
/// deployment computes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `gelu`: the exact GELU (through `erf`), BERT's.
    Gelu,
    /// `gelu-tanh`: GELU's tanh approximation (HF `gelu_new`, ONNX Runtime's `FastGelu`).
    GeluTanh,
}

impl Activation {
    /// The activation's recipe name.
    pub fn name(self) -> &'static str {
        match self {
            Activation::Gelu => "gelu",
            Activation::GeluTanh => "gelu-tanh",
        }
    }

    /// The activation named `s` in a recipe (`gelu`, `gelu-tanh`).
    pub fn parse(s: &str) -> Option<Self> {
        [Activation::Gelu, Activation::GeluTanh]
            .into_iter()
            .find(|a| a.name() == s)
    }

    /// The name a Hugging Face `config.json` gives it (`hidden_act`).
    pub fn hf_name(self) -> &'static str {
        match self {
            Activation::Gelu => "gelu",
            Activation::GeluTanh => "gelu_new",
        }
    }
}

/// Validate a model table; `cx` is the scope of the table itself (`model.` or `stage[2].student.`).
pub fn model_spec(cx: &Scope, raw: RawModel) -> Result<ModelSpec, RecipeError> {
    let arch = raw.arch.clone();
    let config = cx.input_file("config", &raw.config)?;
    let weights = match &raw.weights {
        Some(w) => Some(cx.input_file("weights", w)?),
        None => None,
    };
    if raw.weights_layers.is_some() && weights.is_none() {
        return Err(cx.err(
            "weights-layers",
            "picks layers of the `weights` file, and there is none",
            "add `weights` (e.g. the pretrained model's model.safetensors, with its config.json as `config`)",
        ));
    }
    if let Some(p) = raw.dropout {
        if !(0.0..1.0).contains(&p) {
            return Err(cx.err("dropout", format!("{p} is outside [0, 1)"), "use e.g. 0.1"));
        }
    }
    let o = raw.overrides;
    for (k, v) in [
        ("overrides.num-hidden-layers", o.num_hidden_layers),
        ("overrides.hidden-size", o.hidden_size),
        ("overrides.num-attention-heads", o.num_attention_heads),
        ("overrides.intermediate-size", o.intermediate_size),
    ] {
        if v == Some(0) {
            return Err(cx.err(
                k,
                "must be at least 1",
                "set a positive integer or remove the key",
            ));
        }
    }
    let hidden_act = match o.hidden_act.as_deref() {
        None => None,
        Some(name) => Some(Activation::parse(name).ok_or_else(|| {
            cx.err(
                "overrides.hidden-act",
                format!("`{name}` is not an activation mopt knows"),
                "use \"gelu\" (exact) or \"gelu-tanh\" (tanh approximation)",
            )
        })?),
    };
    Ok(ModelSpec {
        arch,
        config,
        weights,
        allow_fresh_head: raw.allow_fresh_head.unwrap_or(false),
        dropout: raw.dropout,
        init_from_teacher_layers: raw.init_from_teacher_layers.clone(),
        weights_layers: raw.weights_layers.clone(),
        overrides: ModelOverrides {
            num_hidden_layers: o.num_hidden_layers,
            hidden_size: o.hidden_size,
            num_attention_heads: o.num_attention_heads,
            intermediate_size: o.intermediate_size,
            layer_heads: o.layer_heads,
            layer_intermediate_sizes: o.layer_intermediate_sizes,
            hidden_act,
        },
    })
}
