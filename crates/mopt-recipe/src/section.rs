//! A section of the recipe that its owner validates: a data format's (`[tokenizer]` for text),
//! not the recipe's own grammar. The recipe keeps it as written with where it is; the stage
//! runner refuses a section that no registered owner reads.

use std::path::PathBuf;

use serde::de::DeserializeOwned;

use crate::error::RecipeError;
use crate::scope::Scope;

/// A top-level section the recipe's grammar does not know, kept for its owner.
#[derive(Debug, Clone)]
pub struct Section {
    /// Its name (`tokenizer`).
    pub name: String,
    /// Its keys as written.
    pub keys: toml::Table,
    /// Where it is: errors about its keys name it (`tokenizer.max-len`).
    pub scope: Scope,
}

impl Section {
    /// Its keys as `T`, a `#[serde(deny_unknown_fields, rename_all = "kebab-case")]` struct of
    /// the owner (`what`: `the [tokenizer] of text data`): a key `T` does not declare is refused
    /// naming the keys the section takes.
    pub fn keys<T: DeserializeOwned>(&self, what: &str) -> Result<T, RecipeError> {
        self.scope.deserialize_owned(
            self.keys.clone(),
            (what, &[]),
            "remove the key (each section's keys: docs/src/recipe-reference.md)",
        )
    }

    /// The file a key names, resolved against the recipe's folder; it must exist.
    pub fn input_file(&self, key: &str, path: &str) -> Result<PathBuf, RecipeError> {
        self.scope.input_file(key, path)
    }

    /// An error about `key` of this section.
    pub fn err(
        &self,
        key: &str,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) -> RecipeError {
        self.scope.err(key, message, hint)
    }
}

/// The sections of `raw` (what the grammar left), each a table.
pub(crate) fn sections(
    cx: &Scope,
    raw: toml::Table,
) -> Result<std::collections::BTreeMap<String, Section>, RecipeError> {
    raw.into_iter()
        .map(|(name, value)| match value {
            toml::Value::Table(keys) => Ok((
                name.clone(),
                Section {
                    scope: cx.nested(&name),
                    name,
                    keys,
                },
            )),
            _ => Err(cx.err(
                &name,
                format!("`{name}` is not a section of a recipe"),
                "remove it; the recipe reference (docs/src/recipe-reference.md) lists the sections",
            )),
        })
        .collect()
}
