//! `kind = "finetune"`: train the input model on the labels (cross-entropy), best epoch by
//! validation. A recipe without `[[stage]]` is one finetune stage of its `[model]`.

use std::path::Path;

use mopt_core::Checkpoint;
use mopt_recipe::{RecipeError, StageEntry};
use mopt_train::lr_find::{LrFindResult, LrFindRun};
use mopt_train::trainer::{fit, FinetuneTask};
use serde::Deserialize;
use serde_json::json;

use crate::data::{RunData, Split};
use crate::error::StageError;
use crate::family::FamilyEntry;
use crate::plan::train_settings;
use crate::shape::Shape;
use crate::stage::{PlanContext, Stage, StageContext, StageKind, StageOutput, StagePlan};

/// The kind.
pub struct Finetune;

/// What a family without the capability lacks.
const NEEDS: (&str, &str) = ("a trainable model", "lists no finetune capability");

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
        family: &FamilyEntry,
    ) -> Result<Box<dyn Stage>, RecipeError> {
        family.check::<dyn CanFinetune>(
            entry,
            NEEDS,
            "register `kinds::finetune::capability::<M>()` in the family's `capabilities`",
        )?;
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
        cx.family
            .require::<dyn CanFinetune>("finetune", NEEDS.0, NEEDS.1)?
            .finetune(input, cx)
    }

    fn reuse_key(&self) -> Option<String> {
        // Everything that shapes the output is in the merged training settings.
        Some("finetune".into())
    }
}

/// A family's `finetune` capability: train a checkpoint of its models on the run's data.
pub trait CanFinetune: Send + Sync {
    /// Fine-tune the checkpoint at `input` on the stage's data.
    fn finetune(&self, input: &Path, cx: &StageContext) -> Result<StageOutput, StageError>;

    /// The LR range test ([`mopt_train::lr_find`]) from the checkpoint at `ckpt` over the
    /// training split of `data` (`mopt-train lr-find`).
    fn lr_find(
        &self,
        ckpt: &Path,
        data: &RunData,
        run: &LrFindRun,
    ) -> Result<LrFindResult, StageError>;
}

/// The `finetune` capability of the model type `M` ([`run`]).
pub fn capability<M>() -> Box<dyn CanFinetune>
where
    M: Checkpoint<Batch: mopt_core::Labeled> + 'static,
{
    Box::new(Generic::<M>(std::marker::PhantomData))
}

struct Generic<M>(std::marker::PhantomData<fn() -> M>);

impl<M> CanFinetune for Generic<M>
where
    M: Checkpoint<Batch: mopt_core::Labeled> + 'static,
{
    fn finetune(&self, input: &Path, cx: &StageContext) -> Result<StageOutput, StageError> {
        run::<M>(input, cx)
    }

    fn lr_find(
        &self,
        ckpt: &Path,
        data: &RunData,
        run: &LrFindRun,
    ) -> Result<LrFindResult, StageError> {
        let (model, _) = M::load(ckpt, run.device)?;
        let train = data.split::<M::Batch>(Split::Train)?;
        Ok(mopt_train::lr_find::lr_find(run, model, &train)?)
    }
}

/// Fine-tune the `M` checkpoint at `input` on the stage's data.
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
