//! `csv` and `tsv`: delimited text with a header row, the columns named by `text-column` and
//! `label-column`.

use std::path::Path;

use mopt_data::{DataError, Example};
use mopt_recipe::{DataSpec, RecipeError};

use super::Columns;
use crate::data::{DataFormat, Modality};

/// Delimited text with a header row: `csv` (`,`) or `tsv` (tab).
pub struct Delimited {
    /// The format's name.
    pub name: &'static str,
    /// The delimiter byte.
    pub delimiter: u8,
}

impl Delimited {
    /// Comma-separated values.
    pub const CSV: Self = Self {
        name: "csv",
        delimiter: b',',
    };
    /// Tab-separated values.
    pub const TSV: Self = Self {
        name: "tsv",
        delimiter: b'\t',
    };
}

impl DataFormat for Delimited {
    fn name(&self) -> &'static str {
        self.name
    }

    fn modality(&self) -> Modality {
        Modality::Text
    }

    fn check(&self, data: &DataSpec, rest: toml::Table) -> Result<(), RecipeError> {
        Columns::required(data, rest).map(|_| ())
    }

    fn read_text(&self, data: &DataSpec, path: &Path) -> Result<Vec<Example>, DataError> {
        let (text, label) = Columns::for_reading(data, path)?;
        mopt_data::read_delimited(path, self.delimiter, &text, &label)
    }
}
