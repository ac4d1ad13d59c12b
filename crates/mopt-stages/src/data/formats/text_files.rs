//! `text-files`: plain UTF-8 text files, one work a file, for a language model: `train`,
//! `valid` and `test` each name a file or a folder (its `*.txt` files; the training folder's
//! files that `valid` or `test` name are left out), so that a work is never split across
//! splits. The language-model loader ([`crate::data::lm`]) reads them.

use mopt_recipe::{DataSpec, RecipeError};

use super::{refuse, NoKeys};
use crate::data::{DataFormat, Modality};

/// Whole works of running text.
pub struct TextFiles;

impl DataFormat for TextFiles {
    fn name(&self) -> &'static str {
        "text-files"
    }

    fn modality(&self) -> Modality {
        Modality::RunningText
    }

    fn check(&self, data: &DataSpec, rest: toml::Table) -> Result<(), RecipeError> {
        let by_work = "a language model's text is split by work";
        let files =
            "give `train` (a folder or file), `valid` and `test` (whole works: files or folders)";
        refuse(data, "path", by_work, files)?;
        if data.wrote("train") && !data.wrote("valid") {
            return Err(data.err("valid", "`valid` names the validation works", files));
        }
        refuse(
            data,
            "valid-fraction",
            by_work,
            "remove it: `valid` names the works",
        )?;
        refuse(
            data,
            "split-seed",
            "works are split by the files `train`, `valid` and `test` name, with no shuffle",
            "remove it",
        )?;
        data.format_keys::<NoKeys>(
            rest,
            &[],
            "remove it: the text is its own target (the next token)",
        )
        .map(|_| ())
    }
}
