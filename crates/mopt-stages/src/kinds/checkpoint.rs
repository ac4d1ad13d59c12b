//! `kind = "checkpoint"`: continue from a model another recipe produced (e.g. the distilled
//! student of `distill_bert.toml`), reused when it exists, produced by its recipe first when it
//! does not. The stage's input is not used; the model is judged by the stage's gate like any
//! other stage's output.

use std::path::{Path, PathBuf};

use mopt_recipe::{RecipeError, StageEntry};
use serde::Deserialize;
use serde_json::json;

use crate::error::StageError;
use crate::family::FamilyEntry;
use crate::record::shown;
use crate::runner::{obtain_checkpoint, RunOptions};
use crate::shape::Shape;
use crate::stage::{PlanContext, Stage, StageContext, StageKind, StageOutput, StagePlan};
use crate::Pipeline;

/// The `checkpoint` kind (named apart from the `mopt_core::Checkpoint` contract).
pub struct CheckpointKind;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawCheckpoint {
    path: String,
    recipe: Option<String>,
}

/// A checkpoint stage.
#[derive(Debug, Clone)]
pub struct CheckpointStage {
    /// The checkpoint folder (`model.bpk`, `config.json`).
    pub path: PathBuf,
    /// The recipe whose run writes it, run first when it is missing.
    pub recipe: Option<PathBuf>,
}

impl StageKind for CheckpointKind {
    fn name(&self) -> &'static str {
        "checkpoint"
    }

    fn about(&self) -> &'static str {
        "continue from another recipe's model, reused when it exists"
    }

    fn parse(
        &self,
        entry: &StageEntry,
        _family: &FamilyEntry,
    ) -> Result<Box<dyn Stage>, RecipeError> {
        let cx = &entry.scope;
        let r: RawCheckpoint = cx.deserialize(entry.settings.clone())?;
        if entry.train_overridden {
            return Err(cx.err(
                "train",
                "a checkpoint stage does not train",
                "remove [stage.train]; its `recipe` trains with its own [train]",
            ));
        }
        let path = cx.resolve(&r.path);
        let recipe = match &r.recipe {
            Some(p) => Some(cx.input_file("recipe", p)?),
            None => None,
        };
        if recipe.is_none() && !path.join("model.bpk").is_file() {
            return Err(cx.err(
                "path",
                format!("no mopt checkpoint at `{}`", shown(&path)),
                "run the recipe that writes it first, or add `recipe = \"…toml\"` so mopt runs it when missing",
            ));
        }
        Ok(Box::new(CheckpointStage { path, recipe }))
    }
}

impl Stage for CheckpointStage {
    fn kind(&self) -> &str {
        "checkpoint"
    }

    fn plan(
        &self,
        _: &StageEntry,
        _input: &Shape,
        cx: &PlanContext,
    ) -> Result<StagePlan, StageError> {
        let cfg = self.path.join("config.json");
        let (output, state) = if cfg.is_file() {
            (cx.family.read_shape(&self.path)?, "exists".to_string())
        } else {
            let recipe = self
                .recipe
                .as_ref()
                .expect("validated: recipe or checkpoint");
            let chain = Pipeline::load(recipe, cx.registry)?.plan_chain()?;
            let out = chain
                .stages
                .last()
                .map_or(chain.baseline.clone(), |s| s.output.clone());
            (out, format!("missing: produced first by {}", shown(recipe)))
        };
        Ok(StagePlan {
            output,
            settings: vec![format!("path = \"{}\" ({state})", shown(&self.path))],
            memory: None,
            extra_memory: Vec::new(),
        })
    }

    fn run(&self, _input: &Path, cx: &StageContext) -> Result<StageOutput, StageError> {
        let (ckpt, note) = match &self.recipe {
            Some(recipe) => {
                let opts = RunOptions {
                    max_steps: cx.opts.max_steps,
                    ..RunOptions::new(cx.device.clone())
                };
                obtain_checkpoint(
                    cx.registry,
                    &self.path,
                    recipe,
                    &cx.dir.join("producer-run"),
                    &opts,
                )?
            }
            None => (self.path.clone(), format!("{} (reused)", shown(&self.path))),
        };
        Ok(StageOutput {
            checkpoint: ckpt.clone(),
            steps: 0,
            facts: json!({ "checkpoint": shown(&ckpt) }),
            notes: vec![format!("Model: {note}.")],
            references: Vec::new(),
            logit_error_vs_input: None,
            artifacts: Vec::new(),
        })
    }

    fn reuse_key(&self) -> Option<String> {
        let recipe = self.recipe.as_deref().map(mopt_recipe::absolute);
        Some(format!(
            "path {:?} recipe {recipe:?}",
            mopt_recipe::absolute(&self.path)
        ))
    }
}
