//! The data formats mopt ships, each registered by `Registry::builtin_kinds` as a user's format
//! is (`Registry::with_data_format`): one file each.

mod delimited;
mod idx;
mod jsonl;
mod orange_tab;
mod pixels_csv;
mod rotten_tomatoes;
mod text_files;

pub use delimited::Delimited;
pub use idx::Idx;
pub use jsonl::Jsonl;
pub use orange_tab::OrangeTab;
pub use pixels_csv::PixelsCsv;
pub use rotten_tomatoes::RottenTomatoes;
pub use text_files::TextFiles;

use mopt_recipe::{DataSpec, RecipeError};
use serde::Deserialize;

/// The columns of a table of labelled text (`text-column`, `label-column`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Columns {
    /// The column that holds the text.
    pub text_column: Option<String>,
    /// The column that holds the label.
    pub label_column: Option<String>,
}

impl Columns {
    /// The keys.
    pub const KEYS: &'static [&'static str] = &["text-column", "label-column"];

    /// The columns `data` names, as written.
    pub fn of(data: &DataSpec) -> Result<Self, RecipeError> {
        data.take_keys::<Columns>(Self::KEYS).map(|(c, _)| c)
    }

    /// The columns `data` names, both required; `rest` (the keys its modality left) holds no
    /// other key.
    pub fn required(data: &DataSpec, rest: toml::Table) -> Result<(String, String), RecipeError> {
        Self::refuse_others(data, rest)?;
        Self::of(data)?.both(data)
    }

    /// Refuse a key of `rest` that is not a column.
    pub fn refuse_others(data: &DataSpec, rest: toml::Table) -> Result<(), RecipeError> {
        let rest = rest
            .into_iter()
            .filter(|(k, _)| !Self::KEYS.contains(&k.as_str()))
            .collect();
        let also: Vec<&str> = crate::data::Modality::Text
            .keys()
            .iter()
            .chain(Self::KEYS)
            .copied()
            .collect();
        data.format_keys::<NoKeys>(rest, &also, "remove the key")
            .map(|_| ())
    }

    /// Both columns as a reader of `path` needs them (validated before any file is read).
    pub fn for_reading(
        data: &DataSpec,
        path: &std::path::Path,
    ) -> Result<(String, String), mopt_data::DataError> {
        Self::of(data)
            .and_then(|c| c.both(data))
            .map_err(|e| recipe_error(path, e))
    }

    /// Both columns, or an error naming the missing one.
    pub fn both(self, data: &DataSpec) -> Result<(String, String), RecipeError> {
        let need = |key: &str, v: Option<String>, e: &str| {
            v.ok_or_else(|| {
                data.err(
                    key,
                    format!("required for {} data", data.format),
                    format!("name the column that holds the {e}"),
                )
            })
        };
        Ok((
            need(
                "text-column",
                self.text_column,
                "text, e.g. `text-column = \"sentence\"`",
            )?,
            need(
                "label-column",
                self.label_column,
                "label, e.g. `label-column = \"label\"`",
            )?,
        ))
    }
}

/// A recipe error met while reading `path` (the keys were validated before: not expected).
pub(super) fn recipe_error(path: &std::path::Path, e: RecipeError) -> mopt_data::DataError {
    mopt_data::DataError::format(path, e.to_string(), "correct the [data] keys")
}

/// A format with no keys of its own.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoKeys {}

/// Refuse the shared key `key` where the recipe wrote it.
pub fn refuse(data: &DataSpec, key: &str, why: &str, fix: &str) -> Result<(), RecipeError> {
    match data.wrote(key) {
        true => Err(data.err(key, why, fix)),
        false => Ok(()),
    }
}
