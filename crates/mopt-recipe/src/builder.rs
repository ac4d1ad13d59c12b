//! A recipe built in Rust: typed settings with the recipe's defaults, no TOML file.
//!
//! [`RecipeBuilder`] writes each setting under the key a recipe file would use (`.max_len(64)` is
//! `[tokenizer] max-len = 64`), and [`RecipeBuilder::build`] renders the equivalent TOML and
//! validates it with [`crate::parse`], exactly as [`crate::load`] validates a file: a built
//! recipe is the recipe of that text (defaults included), a bad value is the same typed error
//! naming the key (the file shows as `<rust builder>`), relative paths resolve against
//! [`RecipeBuilder::base_dir`] (as a file's resolve against its folder), and [`Recipe::source`]
//! is that text, which the run folder keeps as `recipe.toml`.
//!
//! A setter given `None` removes its key (back to the default). Stages are not set here: push
//! them with `mopt_stages::Pipeline::shared(recipe).push(…)` (a built recipe has the one implicit
//! `finetune` stage of a recipe without `[[stage]]`, which `Pipeline::shared` replaces).
//! [`ModelBuilder`] makes the [`ModelSpec`] of a model table (a distill stage's student) the same
//! way.

use std::path::{Path, PathBuf};

use crate::device::DeviceRef;
use crate::error::{Invalid, RecipeError};
use crate::model::{model_spec, ModelSpec};
use crate::raw::RawModel;
use crate::scope::Scope;
use crate::spec::Recipe;
use crate::train::{BestMetric, Precision};

/// How a built recipe's "file" shows in errors and reports.
pub const BUILDER_FILE: &str = "<rust builder>";

/// The order of the shared sections in the rendered TOML.
const SECTIONS: [&str; 7] = [
    "run",
    "teacher",
    "model",
    "data",
    "train",
    "lr-find",
    "evaluation",
];

/// A setting's value as a recipe writes it.
trait Setting {
    fn value(self) -> Result<toml::Value, String>;
}

/// The largest integer a TOML file holds.
fn integer<T: TryInto<i64> + std::fmt::Display + Copy>(v: T) -> Result<toml::Value, String> {
    v.try_into().map(toml::Value::Integer).map_err(|_| {
        format!(
            "{v} is above {}, the largest integer a recipe holds",
            i64::MAX
        )
    })
}

impl Setting for usize {
    fn value(self) -> Result<toml::Value, String> {
        integer(self)
    }
}

impl Setting for u64 {
    fn value(self) -> Result<toml::Value, String> {
        integer(self)
    }
}

impl Setting for f64 {
    fn value(self) -> Result<toml::Value, String> {
        Ok(toml::Value::Float(self))
    }
}

impl Setting for f32 {
    /// Through its shortest decimal form, so that `0.9_f32` is written `0.9` and reads back as
    /// the same `f32`.
    fn value(self) -> Result<toml::Value, String> {
        Ok(toml::Value::Float(
            self.to_string().parse().unwrap_or(f64::from(self)),
        ))
    }
}

impl Setting for bool {
    fn value(self) -> Result<toml::Value, String> {
        Ok(toml::Value::Boolean(self))
    }
}

impl Setting for &str {
    fn value(self) -> Result<toml::Value, String> {
        Ok(toml::Value::String(self.to_string()))
    }
}

impl Setting for &DeviceRef {
    fn value(self) -> Result<toml::Value, String> {
        match self {
            DeviceRef::Local(i) => i.value(),
            DeviceRef::Remote(a) => a.to_string().as_str().value(),
        }
    }
}

impl Setting for BestMetric {
    fn value(self) -> Result<toml::Value, String> {
        self.name().value()
    }
}

impl Setting for Precision {
    fn value(self) -> Result<toml::Value, String> {
        self.name().value()
    }
}

impl<T: Setting + Copy> Setting for &[T] {
    fn value(self) -> Result<toml::Value, String> {
        self.iter()
            .map(|v| v.value())
            .collect::<Result<Vec<_>, _>>()
            .map(toml::Value::Array)
    }
}

/// The table that holds the dotted `key` (`model.overrides.hidden-act`: `[model.overrides]`,
/// made where missing) and the key's last part.
fn dotted<'t, 'k>(root: &'t mut toml::Table, key: &'k str) -> (&'t mut toml::Table, &'k str) {
    let (tables, leaf) = key.rsplit_once('.').unwrap_or(("", key));
    let mut table = root;
    for t in tables.split('.').filter(|t| !t.is_empty()) {
        let entry = table
            .entry(t)
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if !entry.is_table() {
            *entry = toml::Value::Table(toml::Table::new());
        }
        table = entry.as_table_mut().expect("a table was just put there");
    }
    (table, leaf)
}

/// A path as a recipe writes it (relative ones resolve against the base directory).
fn path_value(p: &Path) -> Result<toml::Value, String> {
    p.to_str()
        .map(|s| toml::Value::String(s.to_string()))
        .ok_or_else(|| format!("`{}` is not valid UTF-8", p.display()))
}

/// Typed setters, one a key: `name: type => "section.key"`.
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident: $ty:ty => $key:literal;)*) => {
        $(
            $(#[$doc])*
            #[doc = concat!("\n\nThe recipe key `", $key, "`; `None` leaves the default.")]
            pub fn $name(self, value: impl Into<Option<$ty>>) -> Self {
                let value = value.into().map(Setting::value);
                self.put($key, value)
            }
        )*
    };
}

/// The shared sections of a recipe, set in Rust (see the [module](self)).
///
/// ```no_run
/// # fn main() -> Result<(), mopt_recipe::RecipeError> {
/// use mopt_recipe::Recipe;
/// let recipe = Recipe::builder("distill-in-rust")
///     .teacher("checkpoints/finetune-teacher/best")
///     .teacher_recipe("recipes/finetune_teacher.toml")
///     .set_path("tokenizer.path", "datasets/data/models/all-MiniLM-L6-v2/tokenizer.json")
///     .set("tokenizer.max-len", 64)
///     .data("rotten-tomatoes", "datasets/data/rotten_tomatoes/rotten_tomatoes_corpus_full.csv.bz2")
///     .epochs(2)
///     .lr(8e-5)
///     .build()?;
/// assert_eq!(recipe.train.batch_size, 32); // the default
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RecipeBuilder {
    /// What relative paths resolve against (a recipe file's folder).
    base: PathBuf,
    /// The recipe as TOML tables, section by section.
    doc: toml::Table,
    /// The first setting that no recipe can hold (a path that is not UTF-8, an integer above
    /// `i64::MAX`), reported by `build`.
    error: Option<(String, String)>,
}

impl Recipe {
    /// A recipe built in Rust, whose run folder is `checkpoints/name` until set otherwise (see
    /// [`RecipeBuilder`]).
    pub fn builder(name: &str) -> RecipeBuilder {
        RecipeBuilder {
            base: PathBuf::from("."),
            doc: toml::Table::new(),
            error: None,
        }
        .put("run.name", Some(name.value()))
    }
}

impl RecipeBuilder {
    /// Resolve relative paths against `dir` (default: the current directory), as a recipe
    /// file's resolve against its folder.
    pub fn base_dir(mut self, dir: impl AsRef<Path>) -> Self {
        self.base = dir.as_ref().to_path_buf();
        self
    }

    /// Set any recipe key of the shared sections, dotted (`model.overrides.num-hidden-layers`):
    /// the keys the typed setters leave out. A wrong key or type is the error a recipe file
    /// would get.
    pub fn set(self, key: &str, value: impl Into<toml::Value>) -> Self {
        self.put(key, Some(Ok(value.into())))
    }

    /// Write (`Some(Ok)`), remove (`None`) or refuse (`Some(Err)`) the dotted `key`.
    fn put(mut self, key: &str, value: Option<Result<toml::Value, String>>) -> Self {
        let (table, leaf) = dotted(&mut self.doc, key);
        match value {
            Some(Ok(v)) => {
                table.insert(leaf.to_string(), v);
            }
            Some(Err(message)) => {
                self.error.get_or_insert((key.to_string(), message));
            }
            None => {
                table.remove(leaf);
            }
        }
        self
    }

    /// Set a key that names a file or folder (relative paths resolve against
    /// [`base_dir`](Self::base_dir)), as [`set`](Self::set) sets any key: the keys of a data
    /// format's own sections (`tokenizer.path`), say.
    pub fn set_path(self, key: &str, path: impl AsRef<Path>) -> Self {
        self.put_path(key, path.as_ref())
    }

    fn put_path(self, key: &str, path: &Path) -> Self {
        self.put(key, Some(path_value(path)))
    }

    /// `[data] cache-dir`: where the data's caches go (default `.mopt-cache/` beside the data).
    pub fn data_cache_dir(self, dir: impl AsRef<Path>) -> Self {
        self.put_path("data.cache-dir", dir.as_ref())
    }

    /// `[run] output-dir`: the run folder's parent (default `checkpoints`).
    pub fn output_dir(self, dir: impl AsRef<Path>) -> Self {
        self.put_path("run.output-dir", dir.as_ref())
    }

    /// `[run] seeds`: run the recipe once per seed (two or more) and summarize.
    pub fn seeds(self, seeds: &[u64]) -> Self {
        self.put("run.seeds", Some(seeds.value()))
    }

    /// `[run] device` (default `cpu`).
    pub fn device(self, device: &str) -> Self {
        self.put("run.device", Some(device.value()))
    }

    /// `[run] devices`: data-parallel devices (indices of `device`'s backend, remote servers).
    pub fn devices(self, devices: &[DeviceRef]) -> Self {
        self.put(
            "run.devices",
            Some(devices.iter().collect::<Vec<_>>().as_slice().value()),
        )
    }

    /// `[run] token-file`: the credential remote devices' servers check.
    pub fn token_file(self, file: impl AsRef<Path>) -> Self {
        self.put_path("run.token-file", file.as_ref())
    }

    /// `[teacher] checkpoint`: the baseline, a mopt checkpoint folder (it must exist unless
    /// [`teacher_recipe`](Self::teacher_recipe) trains it).
    pub fn teacher(self, checkpoint: impl AsRef<Path>) -> Self {
        self.put_path("teacher.checkpoint", checkpoint.as_ref())
    }

    /// `[teacher] recipe`: the recipe that trains the teacher when its checkpoint is missing.
    pub fn teacher_recipe(self, recipe: impl AsRef<Path>) -> Self {
        self.put_path("teacher.recipe", recipe.as_ref())
    }

    /// `[model] config`: the baseline built from a model config instead of a teacher.
    pub fn model(self, config: impl AsRef<Path>) -> Self {
        self.put_path("model.config", config.as_ref())
    }

    /// `[model] arch` (default `bert`).
    pub fn model_arch(self, arch: &str) -> Self {
        self.put("model.arch", Some(arch.value()))
    }

    /// `[model] weights` (default: random init).
    pub fn model_weights(self, weights: impl AsRef<Path>) -> Self {
        self.put_path("model.weights", weights.as_ref())
    }

    /// `[data] format` and `path`: one file, split by `valid-fraction` and `test-fraction`.
    /// The format's own keys (a text format's columns, an image format's `pixel-max`) and its
    /// sections (`[tokenizer]`) are set with [`set`](Self::set) and [`set_path`](Self::set_path),
    /// or the setters of the data crate's `TextRecipe` / `ImageRecipe` traits.
    pub fn data(self, format: &str, path: impl AsRef<Path>) -> Self {
        self.put("data.format", Some(format.value()))
            .put_path("data.path", path.as_ref())
    }

    /// `[data] format`, `train` and `test`: split files (see [`data_valid`](Self::data_valid)).
    pub fn data_files(self, format: &str, train: impl AsRef<Path>, test: impl AsRef<Path>) -> Self {
        self.put("data.format", Some(format.value()))
            .put_path("data.train", train.as_ref())
            .put_path("data.test", test.as_ref())
    }

    /// `[data] valid`: a validation file beside `train` and `test`.
    pub fn data_valid(self, valid: impl AsRef<Path>) -> Self {
        self.put_path("data.valid", valid.as_ref())
    }

    setters! {
        /// `[run] seed` (default 42).
        seed: u64 => "run.seed";
        /// `[data] valid-fraction` (default 0.1).
        valid_fraction: f64 => "data.valid-fraction";
        /// `[data] test-fraction` (default 0.1; one `path` only).
        test_fraction: f64 => "data.test-fraction";
        /// `[data] split-seed` (default 42).
        split_seed: u64 => "data.split-seed";
        /// `[data] max-train`: keep at most this many training examples.
        max_train: usize => "data.max-train";
        /// `[data] max-eval`: keep at most this many validation and test examples each.
        max_eval: usize => "data.max-eval";
        /// `[train] epochs` (default 3).
        epochs: usize => "train.epochs";
        /// `[train] batch-size`, per device (default 32).
        batch_size: usize => "train.batch-size";
        /// `[train] eval-batch-size` (default twice `batch-size`).
        eval_batch_size: usize => "train.eval-batch-size";
        /// `[train] grad-accum-steps` (default 1).
        grad_accum_steps: usize => "train.grad-accum-steps";
        /// `[train] lr`, the peak learning rate (default 5e-5).
        lr: f64 => "train.lr";
        /// `[train] weight-decay` (default 0.01).
        weight_decay: f64 => "train.weight-decay";
        /// `[train] adam-beta1` (default 0.9).
        adam_beta1: f32 => "train.adam-beta1";
        /// `[train] adam-beta2` (default 0.999).
        adam_beta2: f32 => "train.adam-beta2";
        /// `[train] adam-epsilon` (default 1e-8).
        adam_epsilon: f32 => "train.adam-epsilon";
        /// `[train] warmup-fraction` (default 0.1).
        warmup_fraction: f64 => "train.warmup-fraction";
        /// `[train] final-lr-ratio` (default 0.1).
        final_lr_ratio: f64 => "train.final-lr-ratio";
        /// `[train] grad-clip-norm` (default 1.0; 0 turns clipping off).
        grad_clip_norm: f32 => "train.grad-clip-norm";
        /// `[train] best-metric` (default accuracy).
        best_metric: BestMetric => "train.best-metric";
        /// `[train] log-every`, in optimizer steps (default 20).
        log_every: usize => "train.log-every";
        /// `[train] gradient-checkpointing` (default false).
        gradient_checkpointing: bool => "train.gradient-checkpointing";
        /// `[train] max-nonfinite-steps` (default 10).
        max_nonfinite_steps: usize => "train.max-nonfinite-steps";
        /// `[train] state-every`, in optimizer steps (default 200).
        state_every: usize => "train.state-every";
        /// `[train] precision` (default fp32).
        precision: Precision => "train.precision";
        /// `[train] loss-scale-init` (fp16; default 65536).
        loss_scale_init: f64 => "train.loss-scale-init";
        /// `[train] loss-scale-growth-interval` (fp16; default 2000).
        loss_scale_growth_interval: usize => "train.loss-scale-growth-interval";
        /// `[train] loss-scale-growth-factor` (fp16; default 2).
        loss_scale_growth_factor: f64 => "train.loss-scale-growth-factor";
        /// `[train] loss-scale-backoff` (fp16; default 0.5).
        loss_scale_backoff: f64 => "train.loss-scale-backoff";
        /// `[lr-find] start-lr` (default 1e-7).
        lr_find_start_lr: f64 => "lr-find.start-lr";
        /// `[lr-find] end-lr` (default 1e-2).
        lr_find_end_lr: f64 => "lr-find.end-lr";
        /// `[lr-find] steps` (default 200).
        lr_find_steps: usize => "lr-find.steps";
        /// `[evaluation] golden-samples` (default: the whole validation split).
        golden_samples: usize => "evaluation.golden-samples";
        /// `[evaluation] latency-warmup` (default 10).
        latency_warmup: usize => "evaluation.latency-warmup";
        /// `[evaluation] latency-runs` (default 30; 0 skips the benchmark).
        latency_runs: usize => "evaluation.latency-runs";
        /// `[evaluation] latency-seq-len` (default: the data's example size, `max-len` for text).
        latency_seq_len: usize => "evaluation.latency-seq-len";
        /// `[evaluation] analysis` (default true).
        analysis: bool => "evaluation.analysis";
    }

    /// The "file" a built recipe names in errors, inside the base directory.
    fn path(&self) -> PathBuf {
        if self.base == Path::new(".") || self.base.as_os_str().is_empty() {
            PathBuf::from(BUILDER_FILE)
        } else {
            self.base.join(BUILDER_FILE)
        }
    }

    /// The equivalent recipe file: a comment, then the sections set, in the usual order.
    pub fn to_toml(&self) -> String {
        let mut out = format!(
            "# Built in Rust (mopt_recipe::RecipeBuilder); relative paths resolve against `{}`.\n",
            self.base.display()
        );
        let known = SECTIONS.iter().map(|s| s.to_string());
        let others = self.doc.keys().filter(|k| !SECTIONS.contains(&k.as_str()));
        for k in known.chain(others.cloned()) {
            if let Some(v) = self.doc.get(&k) {
                let mut section = toml::Table::new();
                section.insert(k, v.clone());
                let text = toml::to_string(&section)
                    .unwrap_or_else(|e| format!("# not representable: {e}\n"));
                out.push('\n');
                out.push_str(&text);
            }
        }
        out
    }

    /// Validate the recipe as [`crate::parse`] validates its TOML ([`to_toml`](Self::to_toml)):
    /// the same [`Recipe`], or the same error naming the key (shown without a line: the text is
    /// generated).
    pub fn build(self) -> Result<Recipe, RecipeError> {
        let path = self.path();
        let invalid = |key: &str, message: String, hint: &str| {
            RecipeError::Invalid(Box::new(Invalid {
                path: path.clone(),
                key: key.to_string(),
                line: None,
                message,
                hint: hint.to_string(),
            }))
        };
        if let Some((key, message)) = &self.error {
            return Err(invalid(
                key,
                message.clone(),
                "give a value a recipe file could hold",
            ));
        }
        let data = self.doc.get("data").and_then(toml::Value::as_table);
        if !data.is_some_and(|d| d.contains_key("format")) {
            return Err(invalid(
                "data.format",
                "a recipe needs a data set".into(),
                "call `.data(format, path)` or `.data_files(format, train, test)`",
            ));
        }
        crate::parse(&path, &self.to_toml()).map_err(|e| match e {
            RecipeError::Invalid(mut i) => {
                i.line = None;
                RecipeError::Invalid(i)
            }
            other => other,
        })
    }
}

/// A model table (`[model]`, a distill stage's `[stage.student]`) set in Rust, validated as a
/// recipe's: [`ModelSpec::builder`]. The shared keys have setters (`arch`); a family's own keys
/// are set by name ([`ModelBuilder::set`]) or through the typed setters a family offers on
/// this builder (BERT's: `mopt_models::bert::BertModelKeys`).
#[derive(Debug, Clone)]
pub struct ModelBuilder {
    config: PathBuf,
    arch: Option<String>,
    keys: toml::Table,
    /// The first key no recipe can hold (a path that is not UTF-8), reported by `build`.
    error: Option<(String, String)>,
}

impl ModelSpec {
    /// A model built from the config file at `config` (relative to the recipe's folder, or the
    /// builder's base directory), defaults as in a recipe's model table.
    ///
    /// ```no_run
    /// # use mopt_recipe::{ModelSpec, Recipe, RecipeError};
    /// # fn student(recipe: &Recipe) -> Result<ModelSpec, RecipeError> {
    /// ModelSpec::builder("datasets/data/models/all-MiniLM-L6-v2/config.json")
    ///     .set("init-from-teacher-layers", vec![1, 4])
    ///     .set("overrides.num-hidden-layers", 2)
    ///     .build(&recipe.scope.stage(1).nested("student"))
    /// # }
    /// ```
    pub fn builder(config: impl AsRef<Path>) -> ModelBuilder {
        ModelBuilder {
            config: config.as_ref().to_path_buf(),
            arch: None,
            keys: toml::Table::new(),
            error: None,
        }
    }
}

impl ModelBuilder {
    /// `arch`: the registered family that builds the model (default: the run's).
    pub fn arch(mut self, arch: &str) -> Self {
        self.arch = Some(arch.to_string());
        self
    }

    /// A key of the model's family, dotted for a sub-table (`overrides.num-hidden-layers`),
    /// as a recipe writes it; its family validates it as it validates a file's.
    pub fn set(mut self, key: &str, value: impl Into<toml::Value>) -> Self {
        let (table, leaf) = dotted(&mut self.keys, key);
        table.insert(leaf.to_string(), value.into());
        self
    }

    /// A family key that names a file (`weights`), relative to the recipe's folder.
    pub fn set_path(mut self, key: &str, path: impl AsRef<Path>) -> Self {
        match path_value(path.as_ref()) {
            Ok(v) => self.set(key, v),
            Err(message) => {
                self.error.get_or_insert((key.to_string(), message));
                self
            }
        }
    }

    /// Validate the table's shared keys as a recipe's, in `scope` (the table's own:
    /// `recipe.scope.nested("model")`, `recipe.scope.stage(1).nested("student")`), whose folder
    /// relative paths resolve against. The family validates its keys when it reads them.
    pub fn build(self, scope: &Scope) -> Result<ModelSpec, RecipeError> {
        if let Some((key, message)) = self.error {
            return Err(scope.err(&key, message, "use a UTF-8 path"));
        }
        let config =
            path_value(&self.config).map_err(|m| scope.err("config", m, "use a UTF-8 path"))?;
        let raw = RawModel {
            arch: self.arch,
            config: config.as_str().unwrap_or_default().to_string(),
            keys: self.keys,
        };
        model_spec(scope, raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch folder laid out like the repository: `recipes/`, the files
    /// `recipes/distill_bert.toml` names (empty: validation only checks they exist), and the
    /// teacher's recipe.
    struct Repo(PathBuf);

    const TOKENIZER: &str = "datasets/data/models/all-MiniLM-L6-v2/tokenizer.json";
    /// A WordPiece vocabulary: the tokenizer `lowercase` applies to.
    const VOCAB: &str = "datasets/data/models/all-MiniLM-L6-v2/vocab.txt";
    const CONFIG: &str = "datasets/data/models/all-MiniLM-L6-v2/config.json";
    const WEIGHTS: &str = "datasets/data/models/all-MiniLM-L6-v2/model.safetensors";
    const CORPUS: &str = "datasets/data/rotten_tomatoes/rotten_tomatoes_corpus_full.csv.bz2";

    impl Repo {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir()
                .join(format!("mopt-recipe-builder-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            for f in [
                TOKENIZER,
                VOCAB,
                CONFIG,
                WEIGHTS,
                CORPUS,
                "recipes/finetune_teacher.toml",
            ] {
                let p = dir.join(f);
                std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                std::fs::write(p, "").unwrap();
            }
            Repo(dir)
        }
    }

    impl Drop for Repo {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// The shared sections of `recipes/distill_bert.toml`, the example's settings: only what
    /// differs from the defaults.
    fn distill_bert(base: &Path) -> RecipeBuilder {
        Recipe::builder("distill-bert")
            .base_dir(base)
            .teacher("checkpoints/finetune-teacher/best")
            .teacher_recipe("recipes/finetune_teacher.toml")
            .set_path("tokenizer.path", TOKENIZER)
            .set("tokenizer.max-len", 64)
            .data("rotten-tomatoes", CORPUS)
            .epochs(2)
            .lr(8e-5)
    }

    /// The validated shared sections, as text (the specs have no `PartialEq`; their `Debug`
    /// shows every field).
    fn shared(r: &Recipe) -> Vec<String> {
        vec![
            format!("{:?}", r.run),
            // Where the table was written (a file or the builder) aside.
            format!("{:?}", r.model.as_ref().map(ModelSpec::identity)),
            format!("{:?}", r.teacher),
            // Where the table was written aside; a section's `path` resolved as its owner does.
            r.data.identity(),
            format!(
                "{:?}",
                r.sections.values().map(resolved).collect::<Vec<_>>()
            ),
            format!("{:?}", r.train),
            format!("{:?}", r.lr_find),
            // The latency benchmark's size, with the tokenizer's `max-len` as the data's size.
            format!(
                "{:?}",
                crate::EvaluationSpec {
                    latency_seq_len: Some(r.evaluation.seq_len(max_len(r))),
                    ..r.evaluation.clone()
                }
            ),
        ]
    }

    /// A section's keys with its `path` resolved against the recipe's folder.
    fn resolved(s: &crate::Section) -> toml::Table {
        let mut keys = s.keys.clone();
        if let Some(p) = keys.get("path").and_then(|p| p.as_str()) {
            let full = s.scope.resolve(p).display().to_string();
            keys.insert("path".into(), full.into());
        }
        keys
    }

    /// `[tokenizer] max-len` (128 when not written).
    fn max_len(r: &Recipe) -> usize {
        r.section("tokenizer")
            .and_then(|t| t.keys.get("max-len"))
            .and_then(|v| v.as_integer())
            .map_or(128, |n| n as usize)
    }

    fn invalid(e: RecipeError) -> Invalid {
        match e {
            RecipeError::Invalid(i) => *i,
            other => panic!("expected a validation error, got {other}"),
        }
    }

    #[test]
    fn the_example_settings_are_the_shipped_distill_bert_recipe() {
        let repo = Repo::new("shipped");
        let shipped = include_str!("../../../recipes/distill_bert.toml");
        let file = crate::parse(&repo.0.join("recipes/distill_bert.toml"), shipped).unwrap();
        let built = distill_bert(&repo.0).build().unwrap();
        assert_eq!(shared(&built), shared(&file));
        // Real values, defaults included, not only equal ones.
        let dir = &repo.0;
        assert_eq!(built.run.output_dir, dir.join("checkpoints"));
        assert_eq!(built.run.seed, 42);
        let teacher = built.teacher.as_ref().unwrap();
        assert_eq!(
            teacher.checkpoint,
            dir.join("checkpoints/finetune-teacher/best")
        );
        assert_eq!(
            teacher.recipe.as_deref(),
            Some(dir.join("recipes/finetune_teacher.toml").as_path())
        );
        let tok = &built.section("tokenizer").unwrap().keys;
        assert_eq!(tok["max-len"].as_integer(), Some(64));
        assert_eq!(built.data.format, "rotten-tomatoes");
        match &built.data.source {
            crate::DataSource::Single {
                path,
                valid_fraction,
                test_fraction,
            } => assert_eq!(
                (path.clone(), *valid_fraction, *test_fraction),
                (dir.join(CORPUS), 0.1, 0.1)
            ),
            other => panic!("{other:?}"),
        }
        assert_eq!(built.data.split_seed(), 42);
        let t = &built.train;
        assert_eq!((t.epochs, t.batch_size, t.eval_batch_size), (2, 32, 64));
        assert_eq!((t.lr, t.weight_decay, t.warmup_fraction), (8e-5, 0.01, 0.1));
        assert_eq!((t.final_lr_ratio, t.grad_clip_norm), (0.1, Some(1.0)));
        assert_eq!((t.best_metric, t.log_every), (BestMetric::Accuracy, 20));
        let e = &built.evaluation;
        assert_eq!(
            (e.latency_warmup, e.latency_runs, e.seq_len(64)),
            (10, 30, 64)
        );
        assert!(e.analysis && e.golden_samples.is_none());
        // No stages set: the implicit finetune stage of a recipe without [[stage]], which
        // `Pipeline::shared` replaces with the pushed ones.
        assert_eq!(built.stages.len(), 1);
        assert_eq!(built.stages[0].kind, "finetune");
        assert_eq!(format!("{:?}", built.stages[0].train), format!("{t:?}"));
    }

    #[test]
    fn every_setter_gives_the_recipe_of_its_toml() {
        let repo = Repo::new("every");
        let dir = &repo.0;
        let toml = format!(
            r#"
[run]
name = "every"
output-dir = "out"
seed = 7
seeds = [7, 8]
device = "cpu"
devices = [0, 1]

[teacher]
checkpoint = "checkpoints/t/best"
recipe = "recipes/finetune_teacher.toml"

[tokenizer]
path = "{VOCAB}"
max-len = 48
lowercase = false

[data]
format = "rotten-tomatoes"
path = "{CORPUS}"
valid-fraction = 0.15
test-fraction = 0.2
split-seed = 3
max-train = 500
max-eval = 100
labels = ["fresh", "rotten"]

[train]
epochs = 4
batch-size = 16
eval-batch-size = 8
grad-accum-steps = 2
lr = 3e-4
weight-decay = 0.02
adam-beta1 = 0.8
adam-beta2 = 0.99
adam-epsilon = 1e-6
warmup-fraction = 0.05
final-lr-ratio = 0.0
grad-clip-norm = 0.0
best-metric = "macro-f1"
log-every = 5
gradient-checkpointing = true
max-nonfinite-steps = 3
state-every = 50
precision = "fp16"
loss-scale-init = 1024.0
loss-scale-growth-interval = 100
loss-scale-growth-factor = 4.0
loss-scale-backoff = 0.25

[lr-find]
start-lr = 1e-6
end-lr = 0.1
steps = 50

[evaluation]
golden-samples = 64
latency-warmup = 2
latency-runs = 0
latency-seq-len = 32
analysis = false
"#
        );
        let file = crate::parse(&dir.join("every.toml"), &toml).unwrap();
        let built = Recipe::builder("every")
            .base_dir(dir)
            .output_dir("out")
            .seed(7)
            .seeds(&[7, 8])
            .device("cpu")
            .devices(&[DeviceRef::Local(0), DeviceRef::Local(1)])
            .teacher("checkpoints/t/best")
            .teacher_recipe("recipes/finetune_teacher.toml")
            .set_path("tokenizer.path", VOCAB)
            .set("tokenizer.max-len", 48)
            .set("tokenizer.lowercase", false)
            .data("rotten-tomatoes", CORPUS)
            .valid_fraction(0.15)
            .test_fraction(0.2)
            .split_seed(3)
            .max_train(Some(500))
            .max_eval(100)
            .set("data.labels", vec!["fresh", "rotten"])
            .epochs(4)
            .batch_size(16)
            .eval_batch_size(8)
            .grad_accum_steps(2)
            .lr(3e-4)
            .weight_decay(0.02)
            .adam_beta1(0.8)
            .adam_beta2(0.99)
            .adam_epsilon(1e-6)
            .warmup_fraction(0.05)
            .final_lr_ratio(0.0)
            .grad_clip_norm(0.0)
            .best_metric(BestMetric::MacroF1)
            .log_every(5)
            .gradient_checkpointing(true)
            .max_nonfinite_steps(3)
            .state_every(50)
            .precision(Precision::Fp16)
            .loss_scale_init(1024.0)
            .loss_scale_growth_interval(100)
            .loss_scale_growth_factor(4.0)
            .loss_scale_backoff(0.25)
            .lr_find_start_lr(1e-6)
            .lr_find_end_lr(0.1)
            .lr_find_steps(50)
            .golden_samples(64)
            .latency_warmup(2)
            .latency_runs(0)
            .latency_seq_len(32)
            .analysis(false)
            .build()
            .unwrap();
        assert_eq!(shared(&built), shared(&file));
        assert_eq!(built.run.output_dir, dir.join("out"));
        assert_eq!(
            built.run.devices,
            vec![DeviceRef::Local(0), DeviceRef::Local(1)]
        );
        assert_eq!(built.data.max_train, Some(500));
        assert_eq!(
            built.data.keys["labels"],
            toml::Value::from(vec!["fresh", "rotten"])
        );
        let t = &built.train;
        assert_eq!(
            (t.adam_beta1, t.adam_beta2, t.adam_epsilon),
            (0.8, 0.99, 1e-6)
        );
        assert_eq!((t.grad_clip_norm, t.precision), (None, Precision::Fp16));
        assert_eq!(t.loss_scale.unwrap().backoff, 0.25);
        assert_eq!(built.lr_find.steps, 50);
        assert_eq!(built.evaluation.latency_seq_len, Some(32));
        // The copy the run folder keeps is a recipe file of the same settings, sections in order.
        let at = |h: &str| built.source.find(h).unwrap();
        assert!(at("[run]") < at("[teacher]") && at("[teacher]") < at("[tokenizer]"));
        assert!(at("[data]") < at("[train]") && at("[lr-find]") < at("[evaluation]"));
        let again = crate::parse(&dir.join("again.toml"), &built.source).unwrap();
        assert_eq!(shared(&again), shared(&built));
        // `None` removes a key: back to the default.
        let unset = distill_bert(dir)
            .max_train(500)
            .max_train(None)
            .build()
            .unwrap();
        assert_eq!(unset.data.max_train, None);
    }

    #[test]
    fn a_model_baseline_and_split_files_validate_as_in_a_file() {
        let repo = Repo::new("model");
        let dir = &repo.0;
        let toml = format!(
            "[run]\nname = \"m\"\n[model]\narch = \"bert\"\nconfig = \"{CONFIG}\"\nallow-fresh-head = true\ndropout = 0.2\n[model.overrides]\nnum-hidden-layers = 2\n[tokenizer]\npath = \"{TOKENIZER}\"\n[data]\nformat = \"tsv\"\ntrain = \"{CORPUS}\"\ntest = \"{CORPUS}\"\nvalid = \"{CORPUS}\"\ntext-column = \"s\"\nlabel-column = \"l\"\n"
        );
        let file = crate::parse(&dir.join("m.toml"), &toml).unwrap();
        let built = Recipe::builder("m")
            .base_dir(dir)
            .model(CONFIG)
            .model_arch("bert")
            .set("model.allow-fresh-head", true)
            .set("model.dropout", 0.2)
            .set("model.overrides.num-hidden-layers", 2)
            .set_path("tokenizer.path", TOKENIZER)
            .data_files("tsv", CORPUS, CORPUS)
            .data_valid(CORPUS)
            .set("data.text-column", "s")
            .set("data.label-column", "l")
            .build()
            .unwrap();
        assert_eq!(shared(&built), shared(&file));
        let m = built.model.as_ref().unwrap();
        assert_eq!(m.config, dir.join(CONFIG));
        assert_eq!(
            m.keys["overrides"]["num-hidden-layers"].as_integer(),
            Some(2)
        );
        assert_eq!(m.keys["allow-fresh-head"].as_bool(), Some(true));
        assert_eq!(built.data.format, "tsv");
        assert_eq!(built.data.keys["text-column"].as_str(), Some("s"));
    }

    #[test]
    fn bad_values_are_the_recipe_errors_naming_the_key() {
        let repo = Repo::new("bad");
        // The data format's keys and sections (`[tokenizer]`) are its own: the stage runner
        // validates them against the registered formats (mopt-families' `data_keys` test).
        let cases: [(RecipeBuilder, &str, &str); 4] = [
            (
                distill_bert(&repo.0).valid_fraction(1.5),
                "data.valid-fraction",
                "1.5 is outside [0, 1)",
            ),
            (
                distill_bert(&repo.0).epochs(0),
                "train.epochs",
                "must be at least 1",
            ),
            (
                distill_bert(&repo.0).data("rotten-tomatoes", "nowhere/corpus.csv"),
                "data.path",
                "does not exist",
            ),
            (
                distill_bert(&repo.0).seed(u64::MAX),
                "run.seed",
                "the largest integer a recipe holds",
            ),
        ];
        for (builder, key, message) in cases {
            let e = invalid(builder.build().unwrap_err());
            assert_eq!(e.key, key);
            assert!(e.message.contains(message), "{key}: {}", e.message);
            assert_eq!(e.path, repo.0.join(BUILDER_FILE));
            assert_eq!(e.line, None);
        }
        // The same value in a file is the same error, with its line.
        let shipped = include_str!("../../../recipes/distill_bert.toml")
            .replace("valid-fraction = 0.1", "valid-fraction = 1.5");
        let e = invalid(crate::parse(&repo.0.join("recipes/d.toml"), &shipped).unwrap_err());
        assert_eq!(e.key, "data.valid-fraction");
        assert_eq!(e.message, "1.5 is outside [0, 1)");
        // No data set: named, not a serde message.
        let e = invalid(Recipe::builder("x").build().unwrap_err());
        assert_eq!(e.key, "data.format");
        assert_eq!(e.path, PathBuf::from(BUILDER_FILE));
    }

    #[test]
    fn relative_paths_default_to_the_current_directory() {
        let repo = Repo::new("cwd");
        let abs = |p: &str| repo.0.join(p);
        let r = Recipe::builder("here")
            .teacher(abs("checkpoints/t"))
            .teacher_recipe(abs("recipes/finetune_teacher.toml"))
            .set_path("tokenizer.path", abs(TOKENIZER))
            .data("rotten-tomatoes", abs(CORPUS))
            .build()
            .unwrap();
        assert_eq!(r.run.output_dir, PathBuf::from("checkpoints"));
        assert_eq!(r.run.run_dir(), PathBuf::from("checkpoints/here"));
        assert_eq!(r.path, PathBuf::from(BUILDER_FILE));
        assert_eq!(r.teacher.unwrap().checkpoint, abs("checkpoints/t"));
    }

    #[test]
    fn a_student_table_validates_as_in_a_file() {
        let repo = Repo::new("student");
        let shipped = include_str!("../../../recipes/distill_bert.toml");
        let file = crate::parse(&repo.0.join("recipes/distill_bert.toml"), shipped).unwrap();
        let entry = &file.stages[0];
        let raw: RawModel = entry
            .scope
            .deserialize(
                entry
                    .settings
                    .get("student")
                    .unwrap()
                    .as_table()
                    .unwrap()
                    .clone(),
            )
            .unwrap();
        let scope = entry.scope.nested("student");
        let from_file = model_spec(&scope, raw).unwrap();
        // The shipped student, relative to the recipe's folder as the file writes it.
        let built = ModelSpec::builder(format!("../{CONFIG}"))
            .set_path("weights", format!("../{WEIGHTS}"))
            .set("weights-layers", vec![0, 2, 4])
            .set("allow-fresh-head", true)
            .set("overrides.num-hidden-layers", 3)
            .build(&scope)
            .unwrap();
        assert_eq!(format!("{built:?}"), format!("{from_file:?}"));
        assert_eq!(built.config, repo.0.join(CONFIG));
        assert_eq!(built.arch, None, "no arch written: the run's family");
        assert_eq!(built.keys.len(), 4, "{:?}", built.keys);
        // A family's keys are refused by the family's own struct, naming section, key and list.
        #[derive(Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "kebab-case")]
        #[allow(dead_code)]
        struct Only {
            weights: Option<String>,
            weights_layers: Option<Vec<usize>>,
        }
        let e = invalid(built.family_keys::<Only>("tiny").unwrap_err());
        assert_eq!(e.key, "stage[1].student.allow-fresh-head");
        assert_eq!(
            e.message,
            "a `tiny` model table has no key `allow-fresh-head`; it takes `arch`, `config`, `weights`, `weights-layers`"
        );
        #[derive(Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct NoKeys {}
        let e = invalid(built.family_keys::<NoKeys>("bare").unwrap_err());
        assert!(
            e.message.ends_with("; it takes `arch`, `config`"),
            "{}",
            e.message
        );
    }
}
