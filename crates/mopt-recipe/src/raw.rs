//! Raw serde mirror of the recipe's shared sections. Only the validators read these; stage kinds
//! deserialize their own settings.

use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct RawRecipe {
    pub run: RawRun,
    pub model: Option<RawModel>,
    pub data: RawData,
    /// Kept as a table: each stage's `[stage.train]` overrides are merged over it.
    #[serde(default)]
    pub train: toml::Table,
    #[serde(default)]
    pub lr_find: RawLrFind,
    pub teacher: Option<RawTeacher>,
    #[serde(default)]
    pub evaluation: RawEvaluation,
    /// `[[stage]]` blocks; each kind validates its own keys.
    #[serde(default)]
    pub stage: Vec<toml::Table>,
    /// The pre-stages form (`[distill]`, `[report]`): refused with a migration hint.
    pub distill: Option<toml::Value>,
    pub report: Option<toml::Value>,
    /// Every other section: the data format's (a tokenizer's), validated by its owner.
    #[serde(flatten)]
    pub sections: toml::Table,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawTeacher {
    pub checkpoint: String,
    pub recipe: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawRun {
    pub name: String,
    pub output_dir: Option<String>,
    pub seed: Option<u64>,
    pub seeds: Option<Vec<u64>>,
    pub device: Option<String>,
    pub devices: Option<Vec<RawDevice>>,
    pub token_file: Option<String>,
}

/// One `[run] devices` entry as written: a device index of `[run] device`'s backend, or a
/// remote server's address.
#[derive(Debug, Clone)]
pub enum RawDevice {
    /// `0`, `1`, ...
    Index(usize),
    /// `"ws://host:port"` (device 0 of that server) or `"ws://host:port#N"`.
    Address(String),
}

impl<'de> Deserialize<'de> for RawDevice {
    /// An index or an address, with a message that says so for anything else (an untagged
    /// enum's would only say that nothing matched).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Entry;
        impl serde::de::Visitor<'_> for Entry {
            type Value = RawDevice;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a device index (0, 1, ...) or a server's address (\"ws://HOST:PORT\")")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<RawDevice, E> {
                usize::try_from(v)
                    .map(RawDevice::Index)
                    .map_err(|_| E::custom(format!("device index {v} is too large")))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<RawDevice, E> {
                u64::try_from(v)
                    .map_err(|_| {
                        E::custom(format!(
                            "device index {v} is negative: indices count from 0"
                        ))
                    })
                    .and_then(|v| self.visit_u64(v))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RawDevice, E> {
                Ok(RawDevice::Address(v.to_string()))
            }
        }
        d.deserialize_any(Entry)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "kebab-case")]
/// A `[model]` or `[stage.student]` table as written (validated into a [`ModelSpec`](crate::ModelSpec)):
/// the shared keys, and the family's own, which its family validates.
pub struct RawModel {
    /// `arch`.
    pub arch: Option<String>,
    /// `config`.
    pub config: String,
    /// Every other key: the family's.
    #[serde(flatten)]
    pub keys: toml::Table,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct RawData {
    pub format: String,
    pub path: Option<String>,
    pub train: Option<String>,
    pub valid: Option<String>,
    pub test: Option<String>,
    pub valid_fraction: Option<f64>,
    pub test_fraction: Option<f64>,
    pub split_seed: Option<u64>,
    pub max_train: Option<usize>,
    pub max_eval: Option<usize>,
    pub cache_dir: Option<String>,
    /// Every other key: the data format's.
    #[serde(flatten)]
    pub keys: toml::Table,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawTrain {
    pub epochs: Option<usize>,
    pub batch_size: Option<usize>,
    pub eval_batch_size: Option<usize>,
    pub grad_accum_steps: Option<usize>,
    pub lr: Option<f64>,
    pub weight_decay: Option<f64>,
    pub adam_beta1: Option<f32>,
    pub adam_beta2: Option<f32>,
    pub adam_epsilon: Option<f32>,
    pub warmup_fraction: Option<f64>,
    pub final_lr_ratio: Option<f64>,
    pub grad_clip_norm: Option<f32>,
    pub best_metric: Option<String>,
    pub log_every: Option<usize>,
    pub gradient_checkpointing: Option<bool>,
    pub max_nonfinite_steps: Option<usize>,
    pub state_every: Option<usize>,
    pub precision: Option<String>,
    pub loss_scale_init: Option<f64>,
    pub loss_scale_growth_interval: Option<usize>,
    pub loss_scale_growth_factor: Option<f64>,
    pub loss_scale_backoff: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawLrFind {
    pub start_lr: Option<f64>,
    pub end_lr: Option<f64>,
    pub steps: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawEvaluation {
    pub golden_samples: Option<usize>,
    pub latency_warmup: Option<usize>,
    pub latency_runs: Option<usize>,
    pub latency_seq_len: Option<usize>,
    pub analysis: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawGate {
    pub metric: Option<String>,
    pub against: Option<String>,
    pub max_drop: Option<f64>,
    pub max_relative_drop: Option<f64>,
    pub max_rise: Option<f64>,
    pub max_relative_rise: Option<f64>,
    pub max_logit_error: Option<f64>,
    pub on_fail: Option<String>,
}
