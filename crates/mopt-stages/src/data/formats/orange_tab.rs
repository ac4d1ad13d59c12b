//! `orange-tab`: Orange `.tab` files (20 Newsgroups, Reuters R8/R52): three header lines,
//! tab-separated; the columns default to `text` and the one flagged `class`.

use std::path::Path;

use mopt_data::{DataError, Example};
use mopt_recipe::{DataSpec, RecipeError};

use super::Columns;
use crate::data::{DataFormat, Modality};

/// Orange's tab-separated files with three header lines.
pub struct OrangeTab;

impl OrangeTab {
    fn columns(data: &DataSpec) -> Result<(String, String), RecipeError> {
        let c = Columns::of(data)?;
        Ok((
            c.text_column.unwrap_or_else(|| "text".into()),
            c.label_column.unwrap_or_else(|| "category".into()),
        ))
    }
}

impl DataFormat for OrangeTab {
    fn name(&self) -> &'static str {
        "orange-tab"
    }

    fn modality(&self) -> Modality {
        Modality::Text
    }

    fn check(&self, data: &DataSpec, rest: toml::Table) -> Result<(), RecipeError> {
        Columns::refuse_others(data, rest)?;
        Self::columns(data).map(|_| ())
    }

    fn read_text(&self, data: &DataSpec, path: &Path) -> Result<Vec<Example>, DataError> {
        let (text, label) = Self::columns(data).map_err(|e| super::recipe_error(path, e))?;
        mopt_data::read_orange_tab(path, &text, &label)
    }
}
