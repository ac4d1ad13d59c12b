//! The model families and stage kinds a run can name, as a value: [`Registry::builtin_kinds`]
//! holds the stage kinds this crate ships, `mopt_families::builtin()` adds the shipped
//! families (what `mopt-train` runs with), and a program of its own adds its families (and
//! stage kinds) before it loads a recipe, without editing a mopt crate:
//!
//! ```ignore
//! use mopt_stages::Pipeline;
//! let registry = mopt_families::builtin().with_family(my_family());
//! let pipeline = Pipeline::load("recipe.toml", &registry)?;
//! ```
//!
//! The runner, `--check`, predict, the report and export look families up here, never in a
//! global list; a recipe's `[model] arch` (or its teacher checkpoint's `model_type`) picks one.

use std::path::Path;
use std::sync::Arc;

use mopt_recipe::{Recipe, RecipeError};

use crate::data::{formats, DataFormat};
use crate::family::{Family, FamilyEntry};
use crate::kinds;
use crate::shape::Shape;
use crate::stage::StageKind;

/// Model families and stage kinds by name. Cloning is cheap (shared entries).
#[derive(Clone, Default)]
pub struct Registry {
    families: Vec<Arc<FamilyEntry>>,
    kinds: Vec<Arc<dyn StageKind>>,
    formats: Vec<Arc<dyn DataFormat>>,
    default_family: Option<&'static str>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field(
                "families",
                &self.families().map(|x| x.arch()).collect::<Vec<_>>(),
            )
            .field("kinds", &self.kinds().map(|k| k.name()).collect::<Vec<_>>())
            .field(
                "formats",
                &self.formats.iter().map(|f| f.name()).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Registry {
    /// No family and no stage kind.
    pub fn empty() -> Self {
        Self::default()
    }

    /// Every stage kind this crate ships, in the order the book (docs/src/stages/) lists them,
    /// and the data formats it ships ([`crate::data::formats`]); no family
    /// (`mopt_families::builtin()` adds the shipped ones).
    pub fn builtin_kinds() -> Self {
        Self::empty()
            .with_kind(kinds::finetune::Finetune)
            .with_kind(kinds::checkpoint::CheckpointKind)
            .with_kind(kinds::distill::Distill)
            .with_kind(kinds::prune::Prune)
            .with_kind(kinds::vocab::Vocab)
            .with_kind(kinds::quantize::Ptq)
            .with_kind(kinds::quantize::Qat)
            .with_kind(kinds::export::Export)
            .with_data_format(formats::RottenTomatoes)
            .with_data_format(formats::OrangeTab)
            .with_data_format(formats::Delimited::CSV)
            .with_data_format(formats::Delimited::TSV)
            .with_data_format(formats::Jsonl)
            .with_data_format(formats::TextFiles)
            .with_data_format(formats::Idx)
            .with_data_format(formats::PixelsCsv)
    }

    /// Add a data format (`[data] format = "…"`).
    ///
    /// # Panics
    /// When a format of the same name is already registered.
    pub fn with_data_format(mut self, format: impl DataFormat + 'static) -> Self {
        assert!(
            self.data_format_named(format.name()).is_none(),
            "data format `{}` is registered twice",
            format.name()
        );
        self.formats.push(Arc::new(format));
        self
    }

    /// The registered data format `name`.
    pub fn data_format_named(&self, name: &str) -> Option<&dyn DataFormat> {
        self.formats
            .iter()
            .find(|f| f.name() == name)
            .map(|f| f.as_ref())
    }

    /// The data format of a recipe (`[data] format`): an unknown name is an error naming the
    /// key and the registered formats.
    pub fn data_format(&self, recipe: &Recipe) -> Result<&dyn DataFormat, RecipeError> {
        let name = &recipe.data.format;
        self.data_format_named(name).ok_or_else(|| {
            let known: Vec<String> = self
                .formats
                .iter()
                .map(|f| format!("`{}` ({})", f.name(), f.modality().name()))
                .collect();
            recipe.data.err(
                "format",
                format!("unknown data format `{name}`"),
                format!(
                    "use one of {} (a format of your own is registered with `with_data_format`)",
                    known.join(", ")
                ),
            )
        })
    }

    /// The size of one example of the recipe's data that estimates assume: a tokenizer's
    /// `max-len` for text, 0 for fixed-shape inputs (images).
    pub fn example_size(&self, recipe: &Recipe) -> Result<usize, RecipeError> {
        crate::data::example_size(self.data_format(recipe)?, recipe)
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

    /// The family of a recipe that names no architecture (no `[model] arch`, and no teacher
    /// checkpoint naming its `model_type`). Without one such a recipe is an error asking for
    /// `arch`.
    pub fn with_default_family(mut self, arch: &'static str) -> Self {
        self.default_family = Some(arch);
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

    /// The family of a model of shape `shape` (its config's `arch`; a cross-family distill
    /// stage's output is the student's family), or `run` (the run's family) when no registered
    /// family answers to it.
    pub fn shape_family<'a>(&'a self, shape: &Shape, run: &'a FamilyEntry) -> &'a FamilyEntry {
        self.family(shape.arch()).unwrap_or(run)
    }

    /// The registered family `arch` that a stage's output of a model of the family `input` is
    /// of (named by `key` of `scope`: a distill stage's `student.arch`): an unknown name, or a
    /// family reading other data than `input`'s, is an error naming the key.
    pub fn output_family(
        &self,
        input: &FamilyEntry,
        arch: &str,
        scope: &mopt_recipe::Scope,
        key: &str,
    ) -> Result<&FamilyEntry, RecipeError> {
        let known: Vec<String> = self.families().map(|f| format!("`{}`", f.arch())).collect();
        let next = self.family(arch).ok_or_else(|| {
            scope.err(
                key,
                format!("unknown architecture `{arch}`"),
                format!(
                    "use one of {} (a family of your own is registered with `with_family`)",
                    known.join(", ")
                ),
            )
        })?;
        let (read, had) = (
            next.data().modality().name(),
            input.data().modality().name(),
        );
        if read != had {
            return Err(scope.err(
                key,
                format!(
                    "`{arch}` models read {read}, and the stage's input (`{}`) {had}: its output must read the run's data",
                    input.arch()
                ),
                format!("name a family of {had} models"),
            ));
        }
        Ok(next)
    }

    /// The stage kind named `name`.
    pub fn kind(&self, name: &str) -> Option<&dyn StageKind> {
        self.kinds().find(|k| k.name() == name)
    }

    /// The family of a model at `path`: a checkpoint folder's (its `config.json`'s
    /// `model_type`), or a GGUF file's (its `general.architecture`).
    pub fn source_family(&self, path: &Path) -> Option<&FamilyEntry> {
        let arch = if path.is_dir() {
            checkpoint_arch(path)?
        } else {
            let gguf = mopt_gguf::Gguf::open(path).ok()?;
            gguf.get_str("general.architecture").ok()?.to_string()
        };
        self.family(&arch)
    }

    /// The family of a recipe: its `[model] arch`, or for a recipe that continues from a
    /// `[teacher]` checkpoint, the family that checkpoint's `config.json` names (`model_type`),
    /// else the registry's default family ([`Registry::with_default_family`]). An unknown name is an error naming the key and the registered
    /// families; so is data of another modality than the family reads.
    ///
    /// The recipe's `[data]` keys and its sections are validated here against its data format
    /// ([`crate::data::check`]): every path to a run asks for the recipe's family first.
    pub fn recipe_family(&self, recipe: &Recipe) -> Result<&FamilyEntry, RecipeError> {
        let f = self.named_family(recipe)?;
        let format = self.data_format(recipe)?;
        let (holds, reads) = (format.modality(), f.data().modality());
        if holds != reads {
            return Err(recipe.data.err(
                "format",
                format!(
                    "`{}` holds {}, and `{}` models read {}",
                    format.name(),
                    holds.name(),
                    f.arch(),
                    reads.name()
                ),
                "pair the model with data of its kind (a ResNet or a CNN with `idx` / `pixels-csv`, BERT with text)",
            ));
        }
        crate::data::check(format, recipe)?;
        Ok(f)
    }

    fn named_family(&self, recipe: &Recipe) -> Result<&FamilyEntry, RecipeError> {
        let Some(arch) = recipe.model.as_ref().and_then(|m| m.arch.as_deref()) else {
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
        self.family(arch)
            .ok_or_else(|| self.unknown(recipe, &format!("unknown architecture `{arch}`")))
    }

    /// The family of a recipe that names none.
    fn default_family(&self, recipe: &Recipe) -> Result<&FamilyEntry, RecipeError> {
        match self.default_family {
            Some(arch) => self
                .family(arch)
                .ok_or_else(|| self.unknown(recipe, &format!("unknown architecture `{arch}`"))),
            None => Err(self.unknown(recipe, "the recipe names no architecture")),
        }
    }

    fn unknown(&self, recipe: &Recipe, what: &str) -> RecipeError {
        let known: Vec<String> = self.families().map(|f| format!("`{}`", f.arch())).collect();
        recipe.scope.nested("model").err(
            "arch",
            what,
            format!(
                "use one of {} (a model family of your own is added to the registry your program passes to the runner: `mopt_families::builtin().with_family(..)`)",
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
