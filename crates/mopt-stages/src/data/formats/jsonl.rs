//! `jsonl`: one JSON object a line, the text and the label in the fields `text-column` and
//! `label-column` name.

use std::path::Path;

use mopt_data::{DataError, Example};
use mopt_recipe::{DataSpec, RecipeError};

use super::Columns;
use crate::data::{DataFormat, Modality};

/// JSON lines of labelled text.
pub struct Jsonl;

impl DataFormat for Jsonl {
    fn name(&self) -> &'static str {
        "jsonl"
    }

    fn modality(&self) -> Modality {
        Modality::Text
    }

    fn check(&self, data: &DataSpec, rest: toml::Table) -> Result<(), RecipeError> {
        Columns::required(data, rest).map(|_| ())
    }

    fn read_text(&self, data: &DataSpec, path: &Path) -> Result<Vec<Example>, DataError> {
        let (text, label) = Columns::for_reading(data, path)?;
        mopt_data::read_jsonl(path, &text, &label)
    }
}
