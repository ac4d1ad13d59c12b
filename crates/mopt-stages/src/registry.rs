//! The model families and stage kinds a run can name, as a value: [`Registry::builtin`] is what
//! `mopt-train` ships, and a program of its own adds its families (and stage kinds) to it before
//! it loads a recipe, without editing a mopt crate:
//!
//! ```no_run
//! use mopt_stages::{Pipeline, Registry};
//! # fn my_family() -> mopt_stages::family::image::ImageFamily<mopt_models::cnn::Cnn> {
//! #     mopt_stages::family::image::ImageFamily::new()
//! # }
//! let registry = Registry::builtin().with_family(my_family());
//! let pipeline = Pipeline::load_with("recipe.toml", &registry)?;
//! # Ok::<(), mopt_stages::StageError>(())
//! ```
//!
//! The runner, `--check`, predict, the report and export look families up here, never in a
//! global list; a recipe's `[model] arch` (or its teacher checkpoint's `model_type`) picks one.

use std::path::Path;
use std::sync::Arc;

use mopt_recipe::{Recipe, RecipeError, DEFAULT_ARCH};

use crate::family::{bert, cnn, llama, resnet, Family, FamilyEntry};
use crate::kinds;
use crate::stage::StageKind;

/// Model families and stage kinds by name. Cloning is cheap (shared entries).
#[derive(Clone, Default)]
pub struct Registry {
    families: Vec<Arc<FamilyEntry>>,
    kinds: Vec<Arc<dyn StageKind>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field(
                "families",
                &self.families().map(|x| x.arch()).collect::<Vec<_>>(),
            )
            .field("kinds", &self.kinds().map(|k| k.name()).collect::<Vec<_>>())
            .finish()
    }
}

impl Registry {
    /// No family and no stage kind.
    pub fn empty() -> Self {
        Self::default()
    }

    /// What `mopt-train` ships: the BERT, ResNet, CNN and Llama families and every stage kind, in the
    /// order the book (docs/src/stages/) lists the kinds.
    pub fn builtin() -> Self {
        Self::empty()
            .with_family(bert::Bert)
            .with_family(resnet::RESNET)
            .with_family(cnn::CNN)
            .with_family(llama::Llama)
            .with_kind(kinds::finetune::Finetune)
            .with_kind(kinds::checkpoint::CheckpointKind)
            .with_kind(kinds::distill::Distill)
            .with_kind(kinds::prune::Prune)
            .with_kind(kinds::vocab::Vocab)
            .with_kind(kinds::quantize::Ptq)
            .with_kind(kinds::quantize::Qat)
            .with_kind(kinds::export::Export)
    }

    /// Add a model family.
    ///
    /// # Panics
    /// When its arch name (or an alias) is already registered: two families answering to one
    /// `[model] arch` is a mistake of the program, not of a recipe.
    pub fn with_family(mut self, family: impl Family + 'static) -> Self {
        let names = std::iter::once(family.arch()).chain(family.aliases().iter().copied());
        for name in names {
            assert!(
                self.family(name).is_none(),
                "model family `{name}` is registered twice"
            );
        }
        self.families.push(Arc::new(FamilyEntry::new(family)));
        self
    }

    /// Add a stage kind.
    ///
    /// # Panics
    /// When a kind of the same name is already registered.
    pub fn with_kind(mut self, kind: impl StageKind + 'static) -> Self {
        assert!(
            self.kind(kind.name()).is_none(),
            "stage kind `{}` is registered twice",
            kind.name()
        );
        self.kinds.push(Arc::new(kind));
        self
    }

    /// The registered families, in registration order.
    pub fn families(&self) -> impl Iterator<Item = &FamilyEntry> {
        self.families.iter().map(|f| f.as_ref())
    }

    /// The registered stage kinds, in registration order.
    pub fn kinds(&self) -> impl Iterator<Item = &dyn StageKind> {
        self.kinds.iter().map(|k| k.as_ref())
    }

    /// The family named `arch` (its name or an alias).
    pub fn family(&self, arch: &str) -> Option<&FamilyEntry> {
        self.families()
            .find(|f| f.arch() == arch || f.aliases().contains(&arch))
    }

    /// The stage kind named `name`.
    pub fn kind(&self, name: &str) -> Option<&dyn StageKind> {
        self.kinds().find(|k| k.name() == name)
    }

    /// The family of a recipe: its `[model] arch`, or for a recipe that continues from a
    /// `[teacher]` checkpoint, the family that checkpoint's `config.json` names (`model_type`;
    /// BERT when it names none). An unknown name is an error naming the key and the registered
    /// families; so is data of another modality than the family reads.
    pub fn recipe_family(&self, recipe: &Recipe) -> Result<&FamilyEntry, RecipeError> {
        let f = self.named_family(recipe)?;
        let format = &recipe.data.format;
        if f.data().modality() != format.modality() {
            return Err(recipe.scope.nested("data").err(
                "format",
                format!(
                    "`{}` holds {}, and `{}` models read {}",
                    format.name(),
                    format.modality(),
                    f.arch(),
                    f.data().modality()
                ),
                "pair the model with data of its kind (a ResNet or a CNN with `idx` / `pixels-csv`, BERT with text)",
            ));
        }
        Ok(f)
    }

    fn named_family(&self, recipe: &Recipe) -> Result<&FamilyEntry, RecipeError> {
        let Some(m) = &recipe.model else {
            // The teacher's family: its checkpoint's, or the family of the recipe that trains it.
            let Some(t) = &recipe.teacher else {
                return self.default_family(recipe);
            };
            if let Some(f) = checkpoint_arch(&t.checkpoint).and_then(|a| self.family(&a)) {
                return Ok(f);
            }
            return match &t.recipe {
                Some(p) => self.named_family(&mopt_recipe::load(p)?),
                None => self.default_family(recipe),
            };
        };
        self.family(&m.arch)
            .ok_or_else(|| self.unknown(recipe, "arch", &m.arch))
    }

    /// The family of a recipe that names none (BERT's, when registered).
    fn default_family(&self, recipe: &Recipe) -> Result<&FamilyEntry, RecipeError> {
        self.family(DEFAULT_ARCH)
            .ok_or_else(|| self.unknown(recipe, "arch", DEFAULT_ARCH))
    }

    fn unknown(&self, recipe: &Recipe, key: &str, arch: &str) -> RecipeError {
        let known: Vec<String> = self.families().map(|f| format!("`{}`", f.arch())).collect();
        recipe.scope.nested("model").err(
            key,
            format!("unknown architecture `{arch}`"),
            format!(
                "use one of {} (a model family of your own is added to the registry your program passes to the runner: `Registry::builtin().with_family(..)`)",
                known.join(", ")
            ),
        )
    }
}

/// The family a checkpoint folder's `config.json` names in `model_type`.
fn checkpoint_arch(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    Some(v.get("model_type")?.as_str()?.to_string())
}
