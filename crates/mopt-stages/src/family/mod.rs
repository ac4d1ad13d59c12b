//! Model families as the runner and the stage kinds see them: one object per family that does
//! each capability with the family's own types, so a kind calls `cx.family.export(…)` and never
//! names a model. A family implements the `mopt-core` / `mopt-export` contracts in its own crate
//! and joins a run through the [`crate::Registry`] its program passes to the runner
//! ([`crate::Registry::builtin`] lists the shipped ones).
//!
//! A family also loads the run's data ([`crate::data`]: the loader of the modality its models
//! read) and measures its checkpoints on it ([`Family::measure`]).

pub mod bert;
pub mod cnn;
pub mod image;
pub mod resnet;

use std::path::Path;

use burn::prelude::*;
use mopt_core::{Checkpoint, Examples, Labeled, ModelConfig};
use mopt_data::LabelMap;
use mopt_export::{ExportOptions, ModelCard};
use mopt_recipe::{ModelSpec, Recipe, Scope, StageEntry, TokenizerSpec};
use mopt_train::trainer::evaluate;

use crate::analysis::Analysis;
use crate::data::{RunData, Split};
use crate::error::StageError;
use crate::kinds::distill::DistillStage;
use crate::kinds::prune::PruneStage;
use crate::kinds::quantize::QuantStage;
use crate::kinds::vocab::VocabStage;
use crate::record::{EvalSettings, ModelFacts};
use crate::shape::Shape;
use crate::stage::{PlanContext, StageContext, StageOutput, StagePlan};

/// What the stage kinds ask of a model family.
pub trait Family: Send + Sync {
    /// The `[model] arch` name (`bert`).
    fn arch(&self) -> &'static str;

    /// What its models read: `"text"` or `"images"` (a recipe's `[data] format` must give it).
    fn modality(&self) -> &'static str;

    /// Other names recipes may use for it.
    fn aliases(&self) -> &'static [&'static str] {
        &[]
    }

    /// How a deployment feeds the exported graph (padding, truncation at `size` tokens; an
    /// image's normalisation), for the model card.
    fn input_notes(&self, size: usize) -> String;

    /// Load the recipe's data as this family's models read it (`labels`: a teacher's label map;
    /// the golden set is the first `golden` validation examples).
    fn load_data(
        &self,
        recipe: &Recipe,
        labels: Option<LabelMap>,
        golden: usize,
    ) -> Result<RunData, StageError>;

    /// Build the recipe's `[model]` for `data` (its weights; a fresh head where allowed) on
    /// `device` and save it as the checkpoint folder `ckpt` (the run's baseline).
    fn build(
        &self,
        recipe: &Recipe,
        data: &RunData,
        device: &Device,
        ckpt: &Path,
    ) -> Result<(), StageError>;

    /// Measure the checkpoint at `ckpt` on `data`: its facts (accuracy, size, FLOPs, latency)
    /// and its logits on the golden set ([`crate::record::measure_checkpoint`]).
    fn measure(
        &self,
        ckpt: &Path,
        data: &RunData,
        ev: &EvalSettings,
    ) -> Result<(ModelFacts, Vec<Vec<f32>>), StageError>;

    /// Where the checkpoint's parameters, FLOPs and forward time go, module by module, at
    /// `size` (the report's baseline analysis); `None` (the default): not analysed.
    fn analyse(
        &self,
        _ckpt: &Path,
        _size: usize,
        _runs: usize,
        _device: &Device,
    ) -> Result<Option<Analysis>, StageError> {
        Ok(None)
    }

    /// The shape of the checkpoint in the folder `dir` (its config file).
    fn read_shape(&self, dir: &Path) -> Result<Shape, StageError>;

    /// The shape the recipe's `[model]` builds (errors name keys in `scope`).
    fn model_shape(
        &self,
        model: &ModelSpec,
        tokenizer: Option<&TokenizerSpec>,
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

    /// Plan a `vocab` stage ([`VocabStage::plan`]).
    fn plan_vocab(
        &self,
        _stage: &VocabStage,
        _entry: &StageEntry,
        _input: &Shape,
        _cx: &PlanContext,
    ) -> Result<StagePlan, StageError> {
        Err(self.lacks("vocab", "a token-embedding table", "declares none"))
    }

    /// Run a `vocab` stage ([`VocabStage::run`] with the run's token ids).
    fn prune_vocab(
        &self,
        _stage: &VocabStage,
        _input: &Path,
        _cx: &StageContext,
    ) -> Result<StageOutput, StageError> {
        Err(self.lacks("vocab", "a token-embedding table", "declares none"))
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

    /// The checkpoint at `ckpt` loaded as a text classifier on `device` ([`crate::Predictor`]);
    /// by default an error (the family does not read text).
    fn classifier(
        &self,
        _ckpt: &Path,
        _device: &Device,
    ) -> Result<Box<dyn crate::predict::TextClassifier>, StageError> {
        Err(self.lacks("predict", "a text classifier", "reads no text"))
    }

    /// Accuracy of the checkpoint at `ckpt` on the split `which` of `data` (inference device).
    fn accuracy(&self, ckpt: &Path, data: &RunData, which: Split) -> Result<f64, StageError>;

    /// Export the checkpoint at `ckpt` to the folder `out`, parity checked on the first
    /// `samples` examples of the split `which` of `data`; by default an error (no exporter).
    fn export(
        &self,
        _ckpt: &Path,
        _out: &Path,
        _data: &RunData,
        _samples: (Split, usize),
        _opts: &ExportOptions,
    ) -> Result<ModelCard, StageError> {
        Err(self.lacks("export", "an ONNX exporter", "declares none"))
    }

    /// The synthetic inputs (`size` tokens, or ignored) that ONNX Runtime latency is timed on
    /// for the model saved at `ckpt`, one per batch size; `None` (the default) when the family
    /// declares no benchmark input.
    fn bench_feeds(
        &self,
        _ckpt: &Path,
        _size: usize,
    ) -> Result<Option<serde_json::Value>, StageError> {
        Ok(None)
    }
}

/// Accuracy of an `M` checkpoint on the split `which` of `data`, on the inference device
/// (batches of 64).
pub fn checkpoint_accuracy<M>(ckpt: &Path, data: &RunData, which: Split) -> Result<f64, StageError>
where
    M: Checkpoint<Batch: Labeled>,
{
    let examples = data.split::<M::Batch>(which)?;
    let device = Device::flex();
    let (model, config) = M::load(ckpt, &device)?;
    let eval = evaluate(&model.valid(), &examples, 64, config.num_labels(), &device);
    Ok(eval.metrics.accuracy)
}

/// Export the `M` checkpoint at `ckpt` to `out`, parity checked on the first `n` examples of
/// the split `which` of `data` (what a family's [`Family::export`] calls with its model type).
pub fn export_split<M>(
    ckpt: &Path,
    out: &Path,
    data: &RunData,
    (which, n): (Split, usize),
    opts: &ExportOptions,
) -> Result<ModelCard, StageError>
where
    M: mopt_export::Exportable<Batch: Labeled>,
{
    let examples = Head {
        examples: data.split::<M::Batch>(which)?,
        n,
    };
    Ok(mopt_export::export_checkpoint::<M, _>(
        ckpt, out, &examples, opts,
    )?)
}

/// ONNX Runtime latency of `models` (name, checkpoint, exported graph), interleaved, with
/// `family`'s benchmark inputs; models without inputs are left out and named in `notes`.
pub fn ort_latency(
    family: &dyn Family,
    models: &[(String, std::path::PathBuf, std::path::PathBuf)],
    (size, warmup_runs): (usize, (usize, usize)),
    notes: &mut Vec<String>,
) -> Result<Vec<serde_json::Value>, StageError> {
    let mut bench = Vec::new();
    for (name, ckpt, onnx) in models {
        match family.bench_feeds(ckpt, size)? {
            Some(feeds) => bench.push(mopt_export::BenchModel {
                name: name.clone(),
                onnx: onnx.clone(),
                feeds,
            }),
            None => notes.push(format!(
                "No ONNX Runtime latency for the {name}: its family declares no benchmark input."
            )),
        }
    }
    let work = models
        .first()
        .and_then(|m| m.2.parent())
        .unwrap_or(Path::new("."));
    Ok(mopt_export::ort_latency_interleaved(
        &bench,
        warmup_runs,
        work,
    )?)
}

/// The first `n` examples of a split.
pub struct Head<E> {
    /// The split.
    pub examples: E,
    /// How many of its first examples.
    pub n: usize,
}

impl<E: Examples> Examples for Head<E> {
    type Batch = E::Batch;

    fn len(&self) -> usize {
        self.n.min(self.examples.len())
    }

    fn label(&self, i: usize) -> usize {
        self.examples.label(i)
    }

    fn size(&self, i: usize) -> usize {
        self.examples.size(i)
    }

    fn batch(&self, indices: &[usize], device: &Device) -> Self::Batch {
        self.examples.batch(indices, device)
    }

    fn record(&self, i: usize) -> serde_json::Value {
        self.examples.record(i)
    }
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
        fn modality(&self) -> &'static str {
            "text"
        }
        fn input_notes(&self, _: usize) -> String {
            unreachable!()
        }
        fn read_shape(&self, _: &Path) -> Result<Shape, StageError> {
            unreachable!()
        }
        fn load_data(
            &self,
            _: &Recipe,
            _: Option<LabelMap>,
            _: usize,
        ) -> Result<RunData, StageError> {
            unreachable!()
        }
        fn build(&self, _: &Recipe, _: &RunData, _: &Device, _: &Path) -> Result<(), StageError> {
            unreachable!()
        }
        fn measure(
            &self,
            _: &Path,
            _: &RunData,
            _: &EvalSettings,
        ) -> Result<(ModelFacts, Vec<Vec<f32>>), StageError> {
            unreachable!()
        }
        fn model_shape(
            &self,
            _: &ModelSpec,
            _: Option<&TokenizerSpec>,
            _: &Scope,
            _: &[String],
            _: usize,
        ) -> Result<Shape, StageError> {
            unreachable!()
        }
        fn finetune(&self, _: &Path, _: &StageContext) -> Result<StageOutput, StageError> {
            unreachable!()
        }
        fn accuracy(&self, _: &Path, _: &RunData, _: Split) -> Result<f64, StageError> {
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
        let registry = crate::Registry::builtin();
        let err = crate::stage::parse_stages(&registry, &[entry("prune")], &Bare)
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
            let err = crate::stage::parse_stages(&registry, &[entry(kind)], &Bare)
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
        let bert = registry
            .family("bert-classifier")
            .expect("BERT is registered under its alias");
        assert_eq!(bert.prune_targets(), ["heads", "ffn", "hidden", "layers"]);
        for kind in ["prune", "ptq", "qat"] {
            assert!(
                crate::stage::parse_stages(&registry, &[entry(kind)], bert).is_ok(),
                "{kind}"
            );
        }
    }
}
