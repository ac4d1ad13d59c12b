//! The stage abstraction: a stage takes a checkpoint in and gives a checkpoint out plus facts for
//! the report. A stage *kind* owns its recipe keys (schema and validation) and builds the stage;
//! adding a kind is one module and one [`crate::Registry::with_kind`] (the shipped ones:
//! [`crate::Registry::builtin_kinds`]).

use std::path::{Path, PathBuf};

use mopt_core::{Examples, MemoryEstimate};
use mopt_data::TokenizerSpec;
use mopt_recipe::{DataSpec, EvaluationSpec, RecipeError, StageEntry};
use mopt_train::metrics::EvalMetrics;
use mopt_train::trainer::{RunContext, Splits, TrainOptions};
use mopt_train::DeviceSpec;
use serde::{Deserialize, Serialize};

use crate::data::{RunData, Split};
use crate::error::StageError;
use crate::family::FamilyEntry;
use crate::shape::Shape;

/// A kind of stage (`finetune`, `distill`, `export`, …): validates a `[[stage]]` block's own keys
/// and builds the stage.
pub trait StageKind: Send + Sync {
    /// The `kind = "…"` value.
    fn name(&self) -> &'static str;
    /// One line for `--check` and error messages.
    fn about(&self) -> &'static str;
    /// Validate `entry.settings` (errors through `entry.scope`) into a stage for a model of
    /// `family` (a kind that needs a capability the family lacks says so here).
    fn parse(
        &self,
        entry: &StageEntry,
        family: &FamilyEntry,
    ) -> Result<Box<dyn Stage>, RecipeError>;
    /// Whether the kind has a gentler retry for `on-fail = "retry"`.
    fn has_retry(&self) -> bool {
        false
    }
}

/// What `--check` learns from a stage without running it.
pub struct StagePlan {
    /// The output model's shape.
    pub output: Shape,
    /// The stage's settings as a recipe writes them (`alpha = 0.5`), one per line.
    pub settings: Vec<String>,
    /// Training memory of the stage, when it trains.
    pub memory: Option<MemoryEstimate>,
    /// Memory the stage holds besides training (a teacher and its cache), in bytes, described.
    pub extra_memory: Vec<(String, u64)>,
}

/// Read-only context of planning.
pub struct PlanContext<'a> {
    /// The model family of the run (`[model] arch`).
    pub family: &'a crate::family::FamilyEntry,
    /// The families and kinds of the run (a stage that plans another recipe looks them up here).
    pub registry: &'a crate::Registry,
    /// `[tokenizer]` (text data only).
    pub tokenizer: Option<TokenizerSpec>,
    /// `[data]`.
    pub data: &'a DataSpec,
    /// Tokenizer vocabulary size (0 for images).
    pub vocab: usize,
    /// Training examples (after `max-train`).
    pub train_examples: usize,
    /// Mean tokens per training example (from a sample of 1000).
    pub mean_tokens: f64,
    /// Mean of its square (attention memory grows with it).
    pub mean_tokens_sq: f64,
    /// Names of the models before this stage: `baseline` and the earlier stages.
    pub earlier: Vec<String>,
}

impl PlanContext<'_> {
    /// The size of one example that estimates assume: `max-len` tokens; 0 for images.
    pub fn size(&self) -> usize {
        self.tokenizer.as_ref().map_or(0, |t| t.max_len)
    }
}

/// Everything a running stage may read.
pub struct StageContext<'a> {
    /// The stage's recipe entry.
    pub entry: &'a StageEntry,
    /// The model family of the run (`[model] arch`): the stage's capabilities.
    pub family: &'a crate::family::FamilyEntry,
    /// The families and kinds of the run (a stage that runs another recipe looks them up here).
    pub registry: &'a crate::Registry,
    /// The device.
    pub device: &'a DeviceSpec,
    /// The run's splits (and the golden set), as the family's loader read them.
    pub data: &'a RunData,
    /// `[data]`.
    pub data_spec: &'a DataSpec,
    /// The size of one example that estimates assume: `max-len` tokens; 0 for images.
    pub size: usize,
    /// `[evaluation]`.
    pub evaluation: &'a EvaluationSpec,
    /// The run's seed.
    pub seed: u64,
    /// Options of the invocation.
    pub opts: &'a TrainOptions,
    /// The run's golden baseline checkpoint.
    pub baseline: &'a Path,
    /// Validation metrics of the baseline and of this stage's input (what gates compare with).
    pub baseline_valid: &'a EvalMetrics,
    /// The stage input's validation metrics.
    pub input_valid: &'a EvalMetrics,
    /// The input's logits on the golden set, as the runner measured them (logit errors against
    /// the input compare with these).
    pub input_logits: &'a [Vec<f32>],
    /// Models before this stage, by name: `baseline`, then each earlier stage's output.
    pub earlier: &'a [(String, PathBuf)],
    /// This stage's own folder (empty when the stage starts).
    pub dir: &'a Path,
}

impl<'a> StageContext<'a> {
    /// This stage's gate applied to a candidate's validation metrics and logit error against the
    /// input: for kinds whose gentler retry judges intermediate models (pruning rounds,
    /// quantization fallbacks) before handing one back. The runner judges the final output
    /// the same way.
    pub fn judge(&self, valid: &EvalMetrics, logit_error_vs_input: f64) -> crate::gate::Decision {
        crate::gate::decide(
            self.entry.gate.as_ref(),
            valid,
            self.baseline_valid,
            self.input_valid,
            logit_error_vs_input,
        )
    }

    /// The trainer's context for this stage's training of a model shaped `config` that reads
    /// `B` batches, in its folder.
    pub fn run_context<B: 'static, K>(
        &self,
        config: &'a K,
    ) -> Result<RunContext<'a, &'a dyn Examples<Batch = B>, K>, StageError> {
        Ok(RunContext {
            name: &self.entry.name,
            train: &self.entry.train,
            seed: self.seed,
            device_spec: self.device,
            run_dir: self.dir,
            opts: self.opts,
            data: self.splits()?,
            labels: &self.data.labels().labels,
            cache_hit: self.data.cache_hit(),
            extras: self.data,
            config,
        })
    }

    /// The run's training, validation and test splits as the algorithms read them.
    pub fn splits<B: 'static>(&self) -> Result<Splits<&'a dyn Examples<Batch = B>>, StageError> {
        self.data.splits()
    }

    /// The validation examples of the golden reference (gates and logit errors use them).
    pub fn golden<B: 'static>(&self) -> Result<&'a dyn Examples<Batch = B>, StageError> {
        self.data.split(Split::Golden)
    }

    /// Number of golden examples.
    pub fn golden_len(&self) -> usize {
        self.data.len(Split::Golden)
    }
}

/// A model that is reported beside the chain but not passed on (e.g. distillation's hard-label twin).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReferenceModel {
    /// Its name in the report.
    pub name: String,
    /// What it is.
    pub about: String,
    /// Its checkpoint.
    pub checkpoint: PathBuf,
    /// The stage's hard-label twin (the same model, init and budget without the teacher): the
    /// runner hands it on instead of the stage's model when it is better on validation.
    #[serde(default)]
    pub twin: bool,
}

/// What a stage produced.
pub struct StageOutput {
    /// The output checkpoint folder (the input's, for stages that do not change the model).
    pub checkpoint: PathBuf,
    /// Optimizer steps run.
    pub steps: usize,
    /// Kind-specific facts for the report (JSON object).
    pub facts: serde_json::Value,
    /// Markdown lines for the report's section on this stage.
    pub notes: Vec<String>,
    /// Models reported beside the chain.
    pub references: Vec<ReferenceModel>,
    /// Max |logit error| against the input measured by the stage itself (export: ONNX Runtime
    /// against mopt); `None`: the runner compares the output checkpoint's logits.
    pub logit_error_vs_input: Option<f64>,
    /// Further files whose sha256 is checked before a resumed run reuses the stage.
    pub artifacts: Vec<PathBuf>,
}

/// One stage of a pipeline.
pub trait Stage {
    /// The kind's name.
    fn kind(&self) -> &str;
    /// Output shape, settings and memory, without running.
    fn plan(
        &self,
        entry: &StageEntry,
        input: &Shape,
        cx: &PlanContext,
    ) -> Result<StagePlan, StageError>;
    /// Run on the checkpoint at `input`; write only inside `cx.dir`.
    fn run(&self, input: &Path, cx: &StageContext) -> Result<StageOutput, StageError>;

    /// The validated settings that shape this stage's output, as the stage will use them (not
    /// the recipe text it came from, so a stage declared or edited in Rust differs from the
    /// TOML stage it replaced): another run's finished stage is reused only when these, the
    /// merged training settings, the data, the seed, the input and the baseline are all the
    /// same (see [`crate::donor`]). Leave out what does not change the output (comparisons,
    /// reference models). `None` (the default): never reused across runs.
    fn reuse_key(&self) -> Option<String> {
        None
    }

    /// The family of its output when the stage names one, and the key that names it (a
    /// distill stage's `student.arch`): the later stages are validated against it. `None` (the
    /// default): the input's family.
    fn output_arch(&self) -> Option<(&'static str, &str)> {
        None
    }
}

/// Validate every stage of a recipe with its kind, each against the family of its input: the
/// recipe's `family`, or the family an earlier stage's output is of.
pub fn parse_stages(
    registry: &crate::Registry,
    entries: &[StageEntry],
    family: &FamilyEntry,
) -> Result<Vec<Box<dyn Stage>>, RecipeError> {
    let mut family = family;
    entries
        .iter()
        .map(|e| {
            let kind = registry.kind(&e.kind).ok_or_else(|| {
                e.scope.err(
                    "kind",
                    format!("unknown stage kind `{}`", e.kind),
                    format!(
                        "use one of: {}",
                        registry
                            .kinds()
                            .map(|k| format!("`{}` ({})", k.name(), k.about()))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
            })?;
            if e.gate.as_ref().is_some_and(|g| g.on_fail == mopt_recipe::OnFail::Retry)
                && !kind.has_retry()
            {
                return Err(e.scope.err(
                    "gate.on-fail",
                    format!("kind `{}` has no gentler retry", e.kind),
                    "use on-fail = \"rollback\" or \"abort\" (pruning and quantization stages retry)",
                ));
            }
            let stage = kind.parse(e, family)?;
            if let Some((key, arch)) = stage.output_arch() {
                let next = registry.output_family(family, arch, &e.scope, key)?;
                family = next;
            }
            Ok(stage)
        })
        .collect()
}
