//! Model families as the runner and the stage kinds see them: one object per family that does
//! each capability with the family's own types, so a kind calls `cx.family.export(…)` and never
//! names a model. A family implements the `mopt-core` / `mopt-export` contracts in its own crate
//! and is registered here with one line in [`families`].
//!
//! Transitional: the runner's data is still tokenised text (`TextExamples`), so every family
//! registered today reads text batches.

mod bert;

use std::path::Path;

use burn::prelude::*;
use mopt_core::{Checkpoint, Examples, Labeled, ModelConfig};
use mopt_data::TextExamples;
use mopt_export::{ExportOptions, ModelCard};
use mopt_recipe::{Arch, ModelSpec, Recipe, Scope, StageEntry, TokenizerSpec};
use mopt_train::trainer::evaluate;

use crate::error::StageError;
use crate::kinds::prune::PruneStage;
use crate::shape::Shape;
use crate::stage::{PlanContext, StageContext, StageOutput, StagePlan};

/// What the stage kinds ask of a model family.
pub trait Family: Sync {
    /// The `[model] arch` name (`bert`).
    fn arch(&self) -> &'static str;

    /// How a deployment feeds the exported graph (padding, truncation at `max_len` tokens),
    /// for the model card.
    fn input_notes(&self, max_len: usize) -> String;

    /// The shape of the checkpoint in the folder `dir` (its config file).
    fn read_shape(&self, dir: &Path) -> Result<Shape, StageError>;

    /// The shape the recipe's `[model]` builds (errors name keys in `scope`).
    fn model_shape(
        &self,
        model: &ModelSpec,
        tokenizer: &TokenizerSpec,
        scope: &Scope,
        labels: &[String],
        vocab: usize,
    ) -> Result<Shape, StageError>;

    /// Run a `finetune` stage on the checkpoint at `input` ([`crate::kinds::finetune::run`]).
    fn finetune(&self, input: &Path, cx: &StageContext) -> Result<StageOutput, StageError>;

    /// The dependency-group kinds a `prune` stage can target, in the order pruning applies
    /// them (the first two are the default targets); empty (the default): not prunable.
    fn prune_targets(&self) -> Vec<&'static str> {
        Vec::new()
    }

    /// Plan a `prune` stage ([`PruneStage::plan`]).
    fn plan_prune(
        &self,
        _stage: &PruneStage,
        _entry: &StageEntry,
        _input: &Shape,
        _cx: &PlanContext,
    ) -> Result<StagePlan, StageError> {
        Err(self.lacks("prune", "a prunable model", "declares no dependency groups"))
    }

    /// Run a `prune` stage ([`PruneStage::run`]).
    fn prune(
        &self,
        _stage: &PruneStage,
        _input: &Path,
        _cx: &StageContext,
    ) -> Result<StageOutput, StageError> {
        Err(self.lacks("prune", "a prunable model", "declares no dependency groups"))
    }

    /// The error of a stage kind that needs a capability this family lacks.
    fn lacks(&self, kind: &str, needs: &str, why: &str) -> StageError {
        StageError::Unsupported(format!(
            "kind `{kind}` needs {needs}: `{}` {why}",
            self.arch()
        ))
    }

    /// Test accuracy of the checkpoint at `ckpt` on `examples` (inference device).
    fn accuracy(&self, ckpt: &Path, examples: &TextExamples) -> Result<f64, StageError>;

    /// Export the checkpoint at `ckpt` to the folder `out`, parity checked on `examples`.
    fn export(
        &self,
        ckpt: &Path,
        out: &Path,
        examples: &TextExamples,
        opts: &ExportOptions,
    ) -> Result<ModelCard, StageError>;

    /// ONNX Runtime latency of the graph at `onnx` exported from `ckpt`, on synthetic inputs
    /// of `size` tokens; `None` when the family declares no benchmark input.
    fn ort_latency(
        &self,
        ckpt: &Path,
        onnx: &Path,
        size: usize,
        warmup_runs: (usize, usize),
    ) -> Result<Option<serde_json::Value>, StageError>;
}

/// The registered families.
pub fn families() -> &'static [&'static dyn Family] {
    &[&bert::Bert]
}

/// The family of a recipe: its `[model] arch`. A recipe without `[model]` continues from
/// checkpoints, which today are all BERT's (the only family with recipe-level data).
pub fn recipe_family(recipe: &Recipe) -> &'static dyn Family {
    family(
        recipe
            .model
            .as_ref()
            .map_or(Arch::BertClassifier, |m| m.arch),
    )
}

/// The family of an `[model] arch`.
pub fn family(arch: Arch) -> &'static dyn Family {
    let name = match arch {
        Arch::BertClassifier => "bert",
    };
    families()
        .iter()
        .copied()
        .find(|f| f.arch() == name)
        .expect("every Arch has a registered family")
}

/// Test accuracy of an `M` checkpoint on `examples`, on the inference device (batches of 64).
pub fn checkpoint_accuracy<M, E>(ckpt: &Path, examples: &E) -> Result<f64, StageError>
where
    M: Checkpoint<Batch: Labeled>,
    E: Examples<Batch = M::Batch>,
{
    let device = Device::flex();
    let (model, config) = M::load(ckpt, &device)?;
    let eval = evaluate(&model.valid(), examples, 64, config.num_labels(), &device);
    Ok(eval.metrics.accuracy)
}
