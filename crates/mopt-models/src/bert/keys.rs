//! BERT's keys of a model table (`[model]`, a distill stage's `[stage.student]`): where its
//! weights come from and how its shape differs from `config.json`. The family declares them;
//! any other key of the table is refused naming the keys it takes.

use std::path::{Path, PathBuf};

use mopt_recipe::{ModelBuilder, ModelSpec, RecipeError};
use serde::Deserialize;

/// The family name BERT's keys are refused under.
const ARCH: &str = "bert";

/// BERT's keys of a model table, validated.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BertModel {
    /// `weights`: HF safetensors or a mopt checkpoint (`.bpk`); `None` = random init.
    pub weights: Option<PathBuf>,
    /// `allow-fresh-head`: accept a checkpoint without a classifier head (initialised fresh).
    pub allow_fresh_head: bool,
    /// `dropout`: overrides the config's hidden and attention dropout.
    pub dropout: Option<f64>,
    /// `init-from-teacher-layers`: a student initialised from these teacher layers (0-based),
    /// embeddings, pooler and head copied.
    pub init_from_teacher_layers: Option<Vec<usize>>,
    /// `weights-layers`: with `weights`, the model's layers are these layers of the weights
    /// file (0-based; the file is as deep as `config` says), embeddings, pooler and head with
    /// them (DistilBERT's initialisation, from a pretrained model).
    pub weights_layers: Option<Vec<usize>>,
    /// `[….overrides]`: shape changes over the config file.
    pub overrides: Overrides,
}

/// `[….overrides]`: size overrides applied to the config (tiny test models; pruned shapes).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawKeys {
    weights: Option<String>,
    allow_fresh_head: Option<bool>,
    dropout: Option<f64>,
    init_from_teacher_layers: Option<Vec<usize>>,
    weights_layers: Option<Vec<usize>>,
    overrides: Option<toml::Table>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawOverrides {
    num_hidden_layers: Option<usize>,
    hidden_size: Option<usize>,
    num_attention_heads: Option<usize>,
    intermediate_size: Option<usize>,
    layer_heads: Option<Vec<usize>>,
    layer_intermediate_sizes: Option<Vec<usize>>,
    hidden_act: Option<String>,
}

impl BertModel {
    /// BERT's keys of the model table `m`, validated (errors name the table's keys).
    pub fn from_spec(m: &ModelSpec) -> Result<Self, RecipeError> {
        let raw: RawKeys = m.family_keys(ARCH)?;
        let weights = match &raw.weights {
            Some(w) => Some(m.input_file("weights", w)?),
            None => None,
        };
        if raw.weights_layers.is_some() && weights.is_none() {
            return Err(m.err(
                "weights-layers",
                "picks layers of the `weights` file, and there is none",
                "add `weights` (e.g. the pretrained model's model.safetensors, with its config.json as `config`)",
            ));
        }
        if raw.init_from_teacher_layers.is_some() && weights.is_some() {
            return Err(m.err(
                "init-from-teacher-layers",
                "conflicts with `weights`",
                "keep one way to initialise the student",
            ));
        }
        if let Some(p) = raw.dropout {
            if !(0.0..1.0).contains(&p) {
                return Err(m.err("dropout", format!("{p} is outside [0, 1)"), "use e.g. 0.1"));
            }
        }
        Ok(Self {
            weights,
            allow_fresh_head: raw.allow_fresh_head.unwrap_or(false),
            dropout: raw.dropout,
            init_from_teacher_layers: raw.init_from_teacher_layers,
            weights_layers: raw.weights_layers,
            overrides: overrides(m, raw.overrides.unwrap_or_default())?,
        })
    }
}

/// `[….overrides]`, validated in its own scope (`model.overrides.hidden-act`).
fn overrides(m: &ModelSpec, table: toml::Table) -> Result<Overrides, RecipeError> {
    let cx = m.scope.nested("overrides");
    let o: RawOverrides = cx.deserialize_keys(table, "a `bert` model table's [overrides]", &[])?;
    for (k, v) in [
        ("num-hidden-layers", o.num_hidden_layers),
        ("hidden-size", o.hidden_size),
        ("num-attention-heads", o.num_attention_heads),
        ("intermediate-size", o.intermediate_size),
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
                "hidden-act",
                format!("`{name}` is not an activation mopt knows"),
                "use \"gelu\" (exact) or \"gelu-tanh\" (tanh approximation)",
            )
        })?),
    };
    Ok(Overrides {
        num_hidden_layers: o.num_hidden_layers,
        hidden_size: o.hidden_size,
        num_attention_heads: o.num_attention_heads,
        intermediate_size: o.intermediate_size,
        layer_heads: o.layer_heads,
        layer_intermediate_sizes: o.layer_intermediate_sizes,
        hidden_act,
    })
}

/// BERT's keys as typed setters of a [`ModelBuilder`] (`ModelSpec::builder(config).weights(..)`),
/// each writing the key a recipe would.
pub trait BertModelKeys: Sized {
    /// `weights`: HF safetensors or a mopt `.bpk` (default: random init).
    fn weights(self, weights: impl AsRef<Path>) -> Self;
    /// `allow-fresh-head` (default false).
    fn allow_fresh_head(self, allow: bool) -> Self;
    /// `dropout`: overrides the config's hidden and attention dropout.
    fn dropout(self, p: f64) -> Self;
    /// `init-from-teacher-layers`: a student initialised from these teacher layers (0-based).
    fn init_from_teacher_layers(self, layers: &[usize]) -> Self;
    /// `weights-layers`: the model's layers are these layers of the `weights` file (0-based).
    fn weights_layers(self, layers: &[usize]) -> Self;
    /// `overrides.num-hidden-layers`.
    fn num_hidden_layers(self, n: usize) -> Self;
    /// `overrides.hidden-size`.
    fn hidden_size(self, n: usize) -> Self;
    /// `overrides.num-attention-heads`.
    fn num_attention_heads(self, n: usize) -> Self;
    /// `overrides.intermediate-size`.
    fn intermediate_size(self, n: usize) -> Self;
    /// `overrides.layer-heads`: the heads of each layer.
    fn layer_heads(self, heads: &[usize]) -> Self;
    /// `overrides.layer-intermediate-sizes`: the FFN width of each layer.
    fn layer_intermediate_sizes(self, sizes: &[usize]) -> Self;
    /// `overrides.hidden-act`: the FFN's activation.
    fn hidden_act(self, act: Activation) -> Self;
}

/// A list of sizes as a recipe writes it.
fn sizes(v: &[usize]) -> toml::Value {
    toml::Value::Array(v.iter().map(|&n| int(n)).collect())
}

fn int(n: usize) -> toml::Value {
    toml::Value::Integer(i64::try_from(n).unwrap_or(i64::MAX))
}

impl BertModelKeys for ModelBuilder {
    fn weights(self, weights: impl AsRef<Path>) -> Self {
        self.set_path("weights", weights)
    }
    fn allow_fresh_head(self, allow: bool) -> Self {
        self.set("allow-fresh-head", allow)
    }
    fn dropout(self, p: f64) -> Self {
        self.set("dropout", p)
    }
    fn init_from_teacher_layers(self, layers: &[usize]) -> Self {
        self.set("init-from-teacher-layers", sizes(layers))
    }
    fn weights_layers(self, layers: &[usize]) -> Self {
        self.set("weights-layers", sizes(layers))
    }
    fn num_hidden_layers(self, n: usize) -> Self {
        self.set("overrides.num-hidden-layers", int(n))
    }
    fn hidden_size(self, n: usize) -> Self {
        self.set("overrides.hidden-size", int(n))
    }
    fn num_attention_heads(self, n: usize) -> Self {
        self.set("overrides.num-attention-heads", int(n))
    }
    fn intermediate_size(self, n: usize) -> Self {
        self.set("overrides.intermediate-size", int(n))
    }
    fn layer_heads(self, heads: &[usize]) -> Self {
        self.set("overrides.layer-heads", sizes(heads))
    }
    fn layer_intermediate_sizes(self, sizes_: &[usize]) -> Self {
        self.set("overrides.layer-intermediate-sizes", sizes(sizes_))
    }
    fn hidden_act(self, act: Activation) -> Self {
        self.set("overrides.hidden-act", act.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mopt_recipe::{Invalid, Scope};

    fn invalid(e: RecipeError) -> Invalid {
        match e {
            RecipeError::Invalid(i) => *i,
            other => panic!("not a validation error: {other}"),
        }
    }

    /// The table's keys, typed; each bad value is refused under its own key.
    #[test]
    fn bert_keys_validate_under_their_own_names() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), "{}").unwrap();
        std::fs::write(dir.path().join("w.safetensors"), "").unwrap();
        let text = "[[stage]]\nkind = \"distill\"\n[stage.student]\nconfig = \"config.json\"\n";
        let scope = Scope::root(&dir.path().join("r.toml"), text)
            .stage(1)
            .nested("student");
        let b = || ModelSpec::builder("config.json");
        let m = BertModel::from_spec(
            &b().weights("w.safetensors")
                .weights_layers(&[0, 2, 4])
                .allow_fresh_head(true)
                .num_hidden_layers(3)
                .hidden_act(Activation::GeluTanh)
                .build(&scope)
                .unwrap(),
        )
        .unwrap();
        assert_eq!(m.weights, Some(dir.path().join("w.safetensors")));
        assert_eq!(m.weights_layers, Some(vec![0, 2, 4]));
        assert!(m.allow_fresh_head);
        assert_eq!(m.overrides.num_hidden_layers, Some(3));
        assert_eq!(m.overrides.hidden_act, Some(Activation::GeluTanh));
        let cases: Vec<(ModelBuilder, &str, &str)> = vec![
            (b().num_hidden_layers(0), "stage[1].student.overrides.num-hidden-layers", "must be at least 1"),
            (b().set("overrides.hidden-act", "relu"), "stage[1].student.overrides.hidden-act", "`relu` is not an activation"),
            (b().weights_layers(&[0]), "stage[1].student.weights-layers", "there is none"),
            (b().weights("w.safetensors").init_from_teacher_layers(&[0]), "stage[1].student.init-from-teacher-layers", "conflicts with `weights`"),
            (b().dropout(1.5), "stage[1].student.dropout", "outside [0, 1)"),
            (b().set("teacher-top-k", 8), "stage[1].student.teacher-top-k", "a `bert` model table has no key `teacher-top-k`; it takes `arch`, `config`, `weights`, `allow-fresh-head`, `dropout`, `init-from-teacher-layers`, `weights-layers`, `overrides`"),
            (b().set("overrides.rope-theta", 1.0), "stage[1].student.overrides.rope-theta", "[overrides] has no key `rope-theta`"),
        ];
        for (builder, key, needle) in cases {
            let e = invalid(BertModel::from_spec(&builder.build(&scope).unwrap()).unwrap_err());
            assert_eq!(e.key, key);
            assert!(e.message.contains(needle), "{key}: {}", e.message);
        }
    }
}
