//! `[model]` (and a stage's student): which family, its config file, and the family's own keys.
//!
//! Two keys are every family's: `arch` (which registered family builds the model) and
//! `config` (the file its shape comes from). Every other key of the table belongs to the
//! family, which declares and validates it ([`ModelSpec::family_keys`] with a
//! `deny_unknown_fields` struct of its own): BERT reads `weights`, `init-from-teacher-layers`
//! and `[model.overrides]`, a Llama reads none, a user's family what it declares. A key its
//! family does not declare is an error naming the section, the key and the keys the section
//! takes; no family ignores a key in silence.

use std::path::PathBuf;

use serde::de::DeserializeOwned;

use crate::error::RecipeError;
use crate::raw::RawModel;
use crate::scope::Scope;

/// `[model]` (or `[stage.student]`): which family, its config file and the family's own keys.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    /// `arch` as the recipe writes it; the stage runner resolves it against its registered
    /// model families (an unknown name is an error there). `None`: the run's family (a
    /// student's, its teacher's; a recipe's, its teacher checkpoint's or the registry's default).
    pub arch: Option<String>,
    /// `config`: the file the family reads the model's shape from (a `config.json`, a shape
    /// file, a GGUF file), resolved against the recipe's folder; it exists.
    pub config: PathBuf,
    /// The table's other keys as written, for the family to validate
    /// ([`ModelSpec::family_keys`]).
    pub keys: toml::Table,
    /// Where the table is (`model.`, `stage[2].student.`): errors about its keys name it.
    pub scope: Scope,
}

impl ModelSpec {
    /// The family's keys of this table as `T`, a `#[serde(deny_unknown_fields, rename_all =
    /// "kebab-case")]` struct of the family `arch`'s: a key that `T` does not declare is an
    /// error naming the section, the key, the keys the section takes and `arch`.
    pub fn family_keys<T: DeserializeOwned>(&self, arch: &str) -> Result<T, RecipeError> {
        self.scope.deserialize_keys(
            self.keys.clone(),
            &format!("a `{arch}` model table"),
            &["arch", "config"],
        )
    }

    /// For a family whose model table has no keys of its own (`arch`): any key is refused as
    /// [`ModelSpec::family_keys`] refuses it, with `fix` as the hint.
    pub fn no_family_keys(&self, arch: &str, fix: &str) -> Result<(), RecipeError> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct NoKeys {}
        self.family_keys::<NoKeys>(arch)
            .map(|_| ())
            .map_err(|e| match e {
                RecipeError::Invalid(mut i) => {
                    i.hint = fix.into();
                    RecipeError::Invalid(i)
                }
                other => other,
            })
    }

    /// The file a family key names (`weights`), resolved against the recipe's folder; it must
    /// exist.
    pub fn input_file(&self, key: &str, path: &str) -> Result<PathBuf, RecipeError> {
        self.scope.input_file(key, path)
    }

    /// What the table says, for keys that decide whether a finished stage can be reused: its
    /// arch, its config file (absolute), its keys as written and the folder their relative
    /// paths resolve against (absolute), not where in which recipe file it was written.
    pub fn identity(&self) -> String {
        format!(
            "arch {:?}, config {}, keys {:?} (relative to {})",
            self.arch,
            crate::scope::absolute(&self.config).display(),
            self.keys,
            crate::scope::absolute(self.scope.dir()).display()
        )
    }

    /// An error about `key` of this table.
    pub fn err(
        &self,
        key: &str,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) -> RecipeError {
        self.scope.err(key, message, hint)
    }
}

/// Validate a model table's shared keys; `cx` is the scope of the table itself (`model.` or
/// `stage[2].student.`). Its family validates the rest.
pub fn model_spec(cx: &Scope, raw: RawModel) -> Result<ModelSpec, RecipeError> {
    Ok(ModelSpec {
        arch: raw.arch,
        config: cx.input_file("config", &raw.config)?,
        keys: raw.keys,
        scope: cx.clone(),
    })
}
