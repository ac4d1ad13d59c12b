//! # mopt-stages
//!
//! A recipe is an ordered list of compression stages over shared sections. Before the first stage
//! the baseline (the teacher, or the recipe's model) is measured and its logits on the validation
//! split stored as the golden reference; every stage then takes a checkpoint in, gives one out,
//! is measured the same way (validation and test metrics, max logit error against its input and
//! the baseline, size, FLOPs, CPU latency) and passes or fails its gate. A failed stage is rolled
//! back (the next stage gets the last passing model) or aborts the run. A killed run continues with
//! `--resume` at the first unfinished stage, reusing finished ones after checking their outputs'
//! sha256. One `report.md`/`report.json` with `chart.svg` covers the whole run.
//!
//! Model families and stage kinds are looked up in a [`Registry`] the program passes in
//! (`mopt_families::builtin()` is what `mopt-train` ships, and a program adds its own family to
//! it). Stage kinds own their recipe keys and their runner; Rust programs add their own stages
//! with [`Pipeline::push`].
//!
//! ```no_run
//! use mopt_stages::{Pipeline, Registry, RunOptions};
//! use mopt_train::DeviceSpec;
//! # fn run(registry: &Registry) -> Result<(), mopt_stages::StageError> {
//! let pipeline = Pipeline::load("recipes/distill_bert.toml", registry)?;
//! print!("{}", pipeline.check(&DeviceSpec::Cpu)?);
//! let report = pipeline.run(&RunOptions::new(DeviceSpec::Cpu))?;
//! println!("final model: test accuracy {:.4}", report.final_model.test.accuracy);
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]
pub mod analysis;
pub mod chart;
pub mod clock;
pub mod convert;
pub mod data;
pub mod donor;
pub mod env;
mod error;
pub mod export_recipe;
pub mod family;
pub mod gate;
pub mod generate;
pub mod kinds;
pub mod lr_find;
pub mod plan;
pub mod predict;
pub mod record;
mod registry;
pub mod report;
mod runner;
pub mod seeds;
pub mod shape;
pub mod stage;
pub mod zero_shot;

use std::path::Path;

pub use error::StageError;
pub use predict::{Prediction, Predictor};
pub use registry::Registry;
pub use report::PipelineReport;
pub use runner::{
    obtain_checkpoint, recipe_device, recipe_devices, DeviceFlags, GoldenReference, RunOptions,
};
pub use stage::{Stage, StageContext, StageKind, StageOutput, StagePlan};

use mopt_recipe::{Recipe, StageEntry, TrainSpec};

/// A recipe's shared sections and its validated stages.
pub struct Pipeline {
    /// The recipe's shared sections.
    pub recipe: Recipe,
    /// The stages, each with its recipe entry.
    pub stages: Vec<(StageEntry, Box<dyn Stage>)>,
    /// The families and stage kinds the recipe's names are looked up in.
    pub registry: Registry,
}

impl Pipeline {
    /// Read and validate a recipe, every stage with its kind, with the families and kinds of
    /// `registry` (`mopt_families::builtin()`: what `mopt-train` ships).
    pub fn load(path: impl AsRef<Path>, registry: &Registry) -> Result<Self, StageError> {
        Self::from_recipe(mopt_recipe::load(path)?, registry)
    }

    /// Validate the stages of a loaded recipe with the kinds and families of `registry`.
    pub fn from_recipe(recipe: Recipe, registry: &Registry) -> Result<Self, StageError> {
        let parsed =
            stage::parse_stages(registry, &recipe.stages, registry.recipe_family(&recipe)?)?;
        let stages = recipe.stages.iter().cloned().zip(parsed).collect();
        Ok(Self {
            recipe,
            stages,
            registry: registry.clone(),
        })
    }

    /// The recipe's shared sections with no stages yet (for pipelines declared in Rust), its
    /// families looked up in `registry`.
    pub fn shared(mut recipe: Recipe, registry: &Registry) -> Self {
        recipe.stages.clear();
        Self {
            recipe,
            stages: Vec::new(),
            registry: registry.clone(),
        }
    }

    /// Append a stage declared in Rust: `name` names its folder, `train` its training settings
    /// (start from `self.recipe.train`), `gate` its tolerance.
    pub fn push(
        mut self,
        name: &str,
        train: TrainSpec,
        gate: Option<mopt_recipe::GateSpec>,
        stage: impl Stage + 'static,
    ) -> Self {
        let index = self.stages.len() + 1;
        let entry = StageEntry {
            index,
            kind: stage.kind().to_string(),
            name: name.to_string(),
            train_overridden: false,
            train,
            gate,
            settings: Default::default(),
            scope: self.recipe.scope.stage(index),
        };
        self.stages.push((entry, Box::new(stage)));
        self
    }

    /// Set the run's name (its folder is `[run] output-dir / name`).
    pub fn named(mut self, name: &str) -> Self {
        self.recipe.run.name = name.to_string();
        self
    }
}
