//! `kind = "finetune"`: train the input model on the labels (cross-entropy), best epoch by
//! validation. A recipe without `[[stage]]` is one finetune stage of its `[model]`.

use std::path::Path;

use mopt_core::Checkpoint;
use mopt_recipe::{RecipeError, StageEntry};
use mopt_train::trainer::{fit, FinetuneTask};
use serde::Deserialize;
use serde_json::json;

use crate::error::StageError;
use crate::family::Family;
use crate::plan::train_settings;
use crate::shape::Shape;
use crate::stage::{PlanContext, Stage, StageContext, StageKind, StageOutput, StagePlan};

/// The kind.
pub struct Finetune;

/// A finetune stage has no keys of its own besides `[stage.train]` and `[stage.gate]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawFinetune {}

impl StageKind for Finetune {
    fn name(&self) -> &'static str {
        "finetune"
    }

    fn about(&self) -> &'static str {
        "fine-tune the input model on the labels"
    }

    fn parse(
        &self,
        entry: &StageEntry,
        _family: &dyn Family,
    ) -> Result<Box<dyn Stage>, RecipeError> {
        let _: RawFinetune = entry.scope.deserialize(entry.settings.clone())?;
        Ok(Box::new(FinetuneStage))
    }
}

/// A finetune stage.
pub struct FinetuneStage;

impl Stage for FinetuneStage {
    fn kind(&self) -> &str {
        "finetune"
    }

    fn plan(
        &self,
        entry: &StageEntry,
        input: &Shape,
        cx: &PlanContext,
    ) -> Result<StagePlan, StageError> {
        Ok(StagePlan {
            output: input.clone(),
            settings: train_settings(&entry.train, entry.train_overridden),
            memory: Some(input.training_memory(entry.train.batch_size, cx.size())),
            extra_memory: Vec::new(),
        })
    }

    fn run(&self, input: &Path, cx: &StageContext) -> Result<StageOutput, StageError> {
        cx.family.finetune(input, cx)
    }

    fn reuse_key(&self) -> Option<String> {
        // Everything that shapes the output is in the merged training settings.
        Some("finetune".into())
    }
}

/// Fine-tune the `M` checkpoint at `input` on the stage's data (what a family's
/// [`crate::family::Family::finetune`] calls with its model type).
pub fn run<M>(input: &Path, cx: &StageContext) -> Result<StageOutput, StageError>
where
    M: Checkpoint<Batch: mopt_core::Labeled>,
{
    let entry = cx.entry;
    let ad = cx.device.train_device(&entry.train);
    let (model, config) = M::load(input, &ad)?;
    let run = cx.run_context::<M::Batch, _>(&config)?;
    let report = fit(&run, FinetuneTask::new(&ad), model)?;
    Ok(StageOutput {
        checkpoint: report.checkpoint.clone(),
        steps: report.steps,
        facts: json!({
            "best_epoch": report.best_epoch,
            "epochs": report.epochs.len(),
            "train_samples_per_s": report.train_samples_per_s,
        }),
        notes: vec![format!(
            "{} optimizer steps, best epoch {} by validation {}, {:.1} train samples/s.",
            report.steps, report.best_epoch, report.best_metric, report.train_samples_per_s
        )],
        references: Vec::new(),
        logit_error_vs_input: None,
        artifacts: Vec::new(),
    })
}
