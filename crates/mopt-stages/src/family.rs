//! Model families as the runner and the stage kinds see them. A family says what its models
//! are (arch name, data, shape, how the recipe's `[model]` builds one, how a checkpoint is
//! measured: the six methods of [`Family`]) and lists its capabilities ([`Capabilities`]): one
//! object per stage capability, each a trait its stage kind declares (`CanPrune` in
//! [`crate::kinds::prune`], `CanQuantize`, `CanDistill`, `CanExport`, …) and most built
//! generically from the model type's contracts (`kinds::prune::capability::<M>()`).
//!
//! The layers: the kinds know this module and the capability traits they declare, never a
//! family; the families live in crates above this one (the shipped ones in `mopt-families`,
//! a user's in their own crate) and know the kinds whose capabilities they register; the
//! registry and the runner take them as values. A family without a capability is a family
//! without that stage: the kind says so by name when it parses the recipe. Adding a kind
//! touches no family (a family opts in to a new capability with one line); adding a family
//! touches no kind.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::path::Path;

use burn::prelude::*;
use mopt_data::TokenizerSpec;
use mopt_recipe::{Metric, ModelSpec, Recipe, RecipeError, Scope, StageEntry};

use crate::analysis::Analysis;
use crate::data::{DataSource, RunData};
use crate::error::StageError;
use crate::record::{EvalSettings, ModelFacts};
use crate::shape::Shape;

/// What every model family says of its models; its stage capabilities come from
/// [`Family::capabilities`].
pub trait Family: Send + Sync {
    /// The `[model] arch` name (`bert`).
    fn arch(&self) -> &'static str;

    /// Other names recipes may use for it.
    fn aliases(&self) -> &'static [&'static str] {
        &[]
    }

    /// The data its models read (a recipe's `[data] format` must be of its modality).
    fn data(&self) -> &'static dyn DataSource;

    /// The shape the recipe's `[model]` builds (errors name keys in `scope`).
    fn model_shape(
        &self,
        model: &ModelSpec,
        tokenizer: Option<&TokenizerSpec>,
        scope: &Scope,
        labels: &[String],
        vocab: usize,
    ) -> Result<Shape, StageError>;

    /// Build the recipe's `[model]` for `data` (its weights; a fresh head where allowed) on
    /// `device` and save it as the checkpoint folder `ckpt` (the run's baseline).
    fn build(
        &self,
        recipe: &Recipe,
        data: &RunData,
        device: &Device,
        ckpt: &Path,
    ) -> Result<(), StageError>;

    /// The shape of the checkpoint in the folder `dir` (its config file).
    fn read_shape(&self, dir: &Path) -> Result<Shape, StageError>;

    /// Measure the checkpoint at `ckpt` on `data`: its facts (accuracy, size, FLOPs, latency)
    /// and its logits on the golden set ([`crate::record::measure_checkpoint`]).
    fn measure(
        &self,
        ckpt: &Path,
        data: &RunData,
        ev: &EvalSettings,
    ) -> Result<(ModelFacts, Vec<Vec<f32>>), StageError>;

    /// The headline metric of its models' task: the report's and the seeds summary's columns,
    /// deltas and chart (classification's accuracy, the default; a language model's perplexity).
    /// Gates and `best-metric` name theirs in the recipe.
    fn metric(&self) -> Metric {
        Metric::Accuracy
    }

    /// Where the recipe's `[model]` gets its weights, for the plan (`random init`, the
    /// default's words; a family with a weights key names its file).
    fn weights_source(&self, _model: &ModelSpec) -> String {
        "random init".into()
    }

    /// The stage capabilities of its models (none by default): `finetune`, `prune`, …, each
    /// one line (`.with(kinds::prune::capability::<M>())`).
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

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
}

/// A family's stage capabilities, by the trait each is: one object of `dyn CanPrune`, one of
/// `dyn CanExport`, … (a stage kind of a program's own declares its own trait and finds it
/// here the same way).
#[derive(Default)]
pub struct Capabilities(HashMap<TypeId, Box<dyn Any + Send + Sync>>);

impl Capabilities {
    /// Add (or replace) the capability `C` (`Box<dyn CanPrune>`).
    pub fn with<C: ?Sized + 'static>(mut self, capability: Box<C>) -> Self
    where
        Box<C>: Send + Sync,
    {
        self.0.insert(TypeId::of::<Box<C>>(), Box::new(capability));
        self
    }

    /// The capability `C`, when the family has it.
    pub fn get<C: ?Sized + 'static>(&self) -> Option<&C> {
        self.0
            .get(&TypeId::of::<Box<C>>())
            .and_then(|c| c.downcast_ref::<Box<C>>())
            .map(|b| &**b)
    }
}

/// A registered family: the family and its capabilities, asked once.
pub struct FamilyEntry {
    family: Box<dyn Family>,
    capabilities: Capabilities,
}

impl FamilyEntry {
    /// `family` with the capabilities it lists.
    pub fn new(family: impl Family + 'static) -> Self {
        let capabilities = family.capabilities();
        Self {
            family: Box::new(family),
            capabilities,
        }
    }

    /// The family's capability `C` (`dyn CanPrune`), when it has it.
    pub fn capability<C: ?Sized + 'static>(&self) -> Option<&C> {
        self.capabilities.get::<C>()
    }

    /// The capability `C` a stage of `kind` needs, or the error saying which (`needs`: what
    /// the family would have to be; `why`: what it lacks).
    pub fn require<C: ?Sized + 'static>(
        &self,
        kind: &str,
        needs: &str,
        why: &str,
    ) -> Result<&C, StageError> {
        self.capability::<C>()
            .ok_or_else(|| StageError::Unsupported(self.lacks(kind, needs, why)))
    }

    /// At parse time: that the family has the capability `C` a stage of `entry`'s kind needs,
    /// or the recipe error (at the stage's `kind`) saying what it lacks and `fix`.
    pub fn check<C: ?Sized + 'static>(
        &self,
        entry: &StageEntry,
        (needs, why): (&str, &str),
        fix: &str,
    ) -> Result<(), RecipeError> {
        match self.capability::<C>() {
            Some(_) => Ok(()),
            None => Err(entry
                .scope
                .err("kind", self.lacks(&entry.kind, needs, why), fix)),
        }
    }

    /// The message of a stage kind that needs a capability this family lacks.
    pub fn lacks(&self, kind: &str, needs: &str, why: &str) -> String {
        format!("kind `{kind}` needs {needs}: `{}` {why}", self.arch())
    }
}

impl std::ops::Deref for FamilyEntry {
    type Target = dyn Family;

    fn deref(&self) -> &Self::Target {
        self.family.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mopt_recipe::{StageEntry, TrainSpec};

    /// A family that declares the required methods only: no capability.
    struct Bare;

    impl Family for Bare {
        fn arch(&self) -> &'static str {
            "bare"
        }
        fn data(&self) -> &'static dyn DataSource {
            &crate::data::text::Text
        }
        fn read_shape(&self, _: &Path) -> Result<Shape, StageError> {
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
        let registry = crate::Registry::builtin_kinds();
        let bare = FamilyEntry::new(Bare);
        let lacks = [
            (
                "finetune",
                "a trainable model: `bare` lists no finetune capability",
            ),
            (
                "prune",
                "a prunable model: `bare` declares no dependency groups",
            ),
            (
                "ptq",
                "a quantizable model: `bare` declares no quantizable layers",
            ),
            (
                "qat",
                "a quantizable model: `bare` declares no quantizable layers",
            ),
            ("vocab", "a token-embedding table: `bare` declares none"),
            ("distill", "distillation support: `bare` declares none"),
            ("export", "an ONNX exporter: `bare` declares none"),
        ];
        for (kind, why) in lacks {
            let err = crate::stage::parse_stages(&registry, &[entry(kind)], &bare)
                .err()
                .unwrap_or_else(|| panic!("a bare family has no `{kind}`"))
                .to_string();
            assert!(err.contains(&format!("kind `{kind}` needs {why}")), "{err}");
        }
    }
}
