//! Model families as the runner and the stage kinds see them: one object per family that does
//! each capability with the family's own types, so a kind calls `cx.family.export(…)` and never
//! names a model. A family implements the `mopt-core` / `mopt-export` contracts in its own crate
//! and is registered here with one line in [`families`].
//!
//! Transitional: the runner's data is still tokenised text (`TextExamples`), so every family
//! registered today reads text batches.

pub mod bert;

use std::path::Path;

use burn::prelude::*;
use mopt_core::{Checkpoint, Examples, Labeled, ModelConfig};
use mopt_data::TextExamples;
use mopt_export::{ExportOptions, ModelCard};
use mopt_recipe::{ModelSpec, Recipe, Scope, StageEntry, TokenizerSpec, DEFAULT_ARCH};
use mopt_train::trainer::evaluate;

use crate::error::StageError;
use crate::kinds::distill::DistillStage;
use crate::kinds::prune::PruneStage;
use crate::kinds::quantize::QuantStage;
use crate::shape::Shape;
use crate::stage::{PlanContext, StageContext, StageOutput, StagePlan};

/// What the stage kinds ask of a model family.
pub trait Family: Sync {
    /// The `[model] arch` name (`bert`).
    fn arch(&self) -> &'static str;

    /// Other names recipes may use for it.
    fn aliases(&self) -> &'static [&'static str] {
        &[]
    }

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

    /// Whether `ptq` / `qat` stages can quantize this family's models (false by default).
    fn quantizable(&self) -> bool {
        false
    }

    /// The layers `ptq` / `qat` keep float unless a recipe sets `exclude`
    /// ([`mopt_core::Quantizable::default_float_paths`]).
    fn quant_default_exclude(&self) -> Vec<String> {
        Vec::new()
    }

    /// Plan a `ptq` / `qat` stage ([`QuantStage::plan`]).
    fn plan_quantize(
        &self,
        _stage: &QuantStage,
        _entry: &StageEntry,
        _input: &Shape,
        _cx: &PlanContext,
    ) -> Result<StagePlan, StageError> {
        Err(self.lacks(
            "ptq/qat",
            "a quantizable model",
            "declares no quantizable layers",
        ))
    }

    /// Run a `ptq` / `qat` stage ([`QuantStage::run`]).
    fn quantize(
        &self,
        _stage: &QuantStage,
        _input: &Path,
        _cx: &StageContext,
    ) -> Result<StageOutput, StageError> {
        Err(self.lacks(
            "ptq/qat",
            "a quantizable model",
            "declares no quantizable layers",
        ))
    }

    /// Plan a `distill` stage (BERT's: `family::bert::distill::plan`).
    fn plan_distill(
        &self,
        _stage: &DistillStage,
        _entry: &StageEntry,
        _input: &Shape,
        _cx: &PlanContext,
    ) -> Result<StagePlan, StageError> {
        Err(self.lacks("distill", "distillation support", "declares none"))
    }

    /// Run a `distill` stage.
    fn distill(
        &self,
        _stage: &DistillStage,
        _input: &Path,
        _cx: &StageContext,
    ) -> Result<StageOutput, StageError> {
        Err(self.lacks("distill", "distillation support", "declares none"))
    }

    /// The error of a stage kind that needs a capability this family lacks.
    fn lacks(&self, kind: &str, needs: &str, why: &str) -> StageError {
        StageError::Unsupported(format!(
            "kind `{kind}` needs {needs}: `{}` {why}",
            self.arch()
        ))
    }

    /// The checkpoint at `ckpt` loaded for inference on `device` ([`crate::Predictor`]).
    fn classifier(
        &self,
        ckpt: &Path,
        device: &Device,
    ) -> Result<Box<dyn crate::predict::TextClassifier>, StageError>;

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

/// The family of a recipe: its `[model] arch`; an unknown name is an error naming the key and
/// the registered families. A recipe without `[model]` continues from checkpoints, which today
/// are all BERT's (the only family with recipe-level data).
pub fn recipe_family(recipe: &Recipe) -> Result<&'static dyn Family, mopt_recipe::RecipeError> {
    let Some(m) = &recipe.model else {
        return Ok(family(DEFAULT_ARCH).expect("the default family is registered"));
    };
    family(&m.arch).ok_or_else(|| {
        let known: Vec<String> = families()
            .iter()
            .map(|f| format!("`{}`", f.arch()))
            .collect();
        recipe.scope.nested("model").err(
            "arch",
            format!("unknown architecture `{}`", m.arch),
            format!(
                "use one of {} (a model family of your own is registered in mopt-stages/src/family/)",
                known.join(", ")
            ),
        )
    })
}

/// The family named `arch` (its name or an alias).
pub fn family(arch: &str) -> Option<&'static dyn Family> {
    families()
        .iter()
        .copied()
        .find(|f| f.arch() == arch || f.aliases().contains(&arch))
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

#[cfg(test)]
mod tests {
    use super::*;
    use mopt_recipe::{StageEntry, TrainSpec};

    /// A family that declares the required methods only: no optional capability.
    struct Bare;

    impl Family for Bare {
        fn arch(&self) -> &'static str {
            "bare"
        }
        fn input_notes(&self, _: usize) -> String {
            unreachable!()
        }
        fn read_shape(&self, _: &Path) -> Result<Shape, StageError> {
            unreachable!()
        }
        fn model_shape(
            &self,
            _: &ModelSpec,
            _: &TokenizerSpec,
            _: &Scope,
            _: &[String],
            _: usize,
        ) -> Result<Shape, StageError> {
            unreachable!()
        }
        fn finetune(&self, _: &Path, _: &StageContext) -> Result<StageOutput, StageError> {
            unreachable!()
        }
        fn accuracy(&self, _: &Path, _: &TextExamples) -> Result<f64, StageError> {
            unreachable!()
        }
        fn classifier(
            &self,
            _: &Path,
            _: &Device,
        ) -> Result<Box<dyn crate::predict::TextClassifier>, StageError> {
            unreachable!()
        }
        fn export(
            &self,
            _: &Path,
            _: &Path,
            _: &TextExamples,
            _: &ExportOptions,
        ) -> Result<ModelCard, StageError> {
            unreachable!()
        }
        fn ort_latency(
            &self,
            _: &Path,
            _: &Path,
            _: usize,
            _: (usize, usize),
        ) -> Result<Option<serde_json::Value>, StageError> {
            unreachable!()
        }
    }

    fn entry(kind: &str) -> StageEntry {
        let source = format!("[[stage]]\nkind = \"{kind}\"\n");
        let scope = Scope::root(Path::new("recipe.toml"), &source).stage(1);
        StageEntry {
            index: 1,
            kind: kind.into(),
            name: kind.into(),
            train: TrainSpec::default(),
            train_overridden: false,
            gate: None,
            settings: Default::default(),
            scope,
        }
    }

    #[test]
    fn a_stage_that_needs_a_capability_the_family_lacks_says_which() {
        let err = crate::stage::parse_stages(&[entry("prune")], &Bare)
            .err()
            .expect("a bare family cannot prune")
            .to_string();
        assert!(
            err.contains(
                "kind `prune` needs a prunable model: `bare` declares no dependency groups"
            ),
            "{err}"
        );
        for kind in ["ptq", "qat"] {
            let err = crate::stage::parse_stages(&[entry(kind)], &Bare)
                .err()
                .expect("a bare family cannot quantize")
                .to_string();
            assert!(
                err.contains(&format!(
                    "kind `{kind}` needs a quantizable model: `bare` declares no quantizable layers"
                )),
                "{err}"
            );
        }
        // The same stages parse for BERT, whose family declares its group kinds and layers.
        let bert = family("bert-classifier").expect("BERT is registered under its alias");
        assert_eq!(bert.prune_targets(), ["heads", "ffn", "hidden", "layers"]);
        for kind in ["prune", "ptq", "qat"] {
            assert!(
                crate::stage::parse_stages(&[entry(kind)], bert).is_ok(),
                "{kind}"
            );
        }
    }
}
