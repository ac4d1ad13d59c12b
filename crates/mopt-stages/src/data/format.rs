//! A data format: what `[data] format = "…"` names. A format is registered like a model family
//! (`Registry::with_data_format`): it declares its modality, validates its own keys of `[data]`
//! and reads one file of the data set. The modality's loader ([`super::text`], [`super::image`],
//! [`super::lm`]) does the rest: the split, the classes, the tokenizer or the normalisation, the
//! caches. The shipped formats are in [`super::formats`]; a user's crate adds one with one file
//! and one registration line.

use std::path::Path;

use mopt_data::{DataError, Example, RawImages};
use mopt_recipe::{DataSpec, Recipe, RecipeError};

/// What a data format's examples are, and so which loader reads them and which families can
/// train on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Modality {
    /// Labelled texts, tokenized (`[tokenizer]`).
    Text,
    /// A language model's running text: whole works, tokenized and packed into windows.
    RunningText,
    /// Grey images of a fixed size.
    Images,
}

impl Modality {
    /// How messages name it.
    pub fn name(self) -> &'static str {
        match self {
            Modality::Text => "text",
            Modality::RunningText => "running text",
            Modality::Images => "images",
        }
    }

    /// The sections besides `[data]` its loader reads (each required).
    pub fn sections(self) -> &'static [&'static str] {
        match self {
            Modality::Text | Modality::RunningText => &[mopt_data::TokenizerSpec::SECTION],
            Modality::Images => &[],
        }
    }

    /// The keys of `[data]` every format of the modality takes (validated by its loader).
    pub fn keys(self) -> &'static [&'static str] {
        match self {
            Modality::Text => super::text::TEXT_KEYS,
            Modality::Images => super::image::IMAGE_KEYS,
            Modality::RunningText => &[],
        }
    }

    /// Validate the modality's keys of `data` and its sections; the format's keys are returned
    /// (what the modality left).
    fn check(self, recipe: &Recipe) -> Result<toml::Table, RecipeError> {
        for name in self.sections() {
            if recipe.section(name).is_none() {
                return Err(recipe.invalid(
                    name,
                    format!(
                        "{} data (`format = \"{}\"`) needs a [{name}]",
                        self.name(),
                        recipe.data.format
                    ),
                    "add [tokenizer] path = \"…/tokenizer.json\" (and max-len)",
                ));
            }
        }
        if let Some(t) = recipe.section(mopt_data::TokenizerSpec::SECTION) {
            mopt_data::TokenizerSpec::from_section(t)?;
        }
        match self {
            Modality::Text => super::text::TextKeys::read(&recipe.data).map(|(_, rest)| rest),
            Modality::Images => super::image::ImageKeys::read(&recipe.data).map(|(_, rest)| rest),
            Modality::RunningText => Ok(recipe.data.keys.clone()),
        }
    }
}

/// A registered data format (`[data] format = "…"`).
pub trait DataFormat: Send + Sync {
    /// The `format` value (`csv`).
    fn name(&self) -> &'static str;

    /// What its examples are.
    fn modality(&self) -> Modality;

    /// Validate the format's own keys of `[data]` (`rest`: those its modality did not take, for
    /// [`DataSpec::format_keys`]) and the shared keys it cannot use (`path` where the data
    /// comes in files, say).
    fn check(&self, data: &DataSpec, rest: toml::Table) -> Result<(), RecipeError>;

    /// Read one file of labelled text (a [`Modality::Text`] format).
    fn read_text(&self, _data: &DataSpec, path: &Path) -> Result<Vec<Example>, DataError> {
        Err(not_read(self.name(), path, "labelled text"))
    }

    /// Read one file of images, grey values scaled to 0..=255 by `pixel_max` (a
    /// [`Modality::Images`] format).
    fn read_images(
        &self,
        _data: &DataSpec,
        path: &Path,
        _pixel_max: f64,
    ) -> Result<RawImages, DataError> {
        Err(not_read(self.name(), path, "images"))
    }
}

fn not_read(format: &str, path: &Path, what: &str) -> DataError {
    DataError::format(
        path,
        format!("`format = \"{format}\"` does not hold {what}"),
        "pair the model family with data of its kind",
    )
}

/// Validate the recipe's `[data]` keys and sections against `format`: the modality's, then the
/// format's own; a section no one reads is refused naming it.
pub fn check(format: &dyn DataFormat, recipe: &Recipe) -> Result<(), RecipeError> {
    let modality = format.modality();
    if let Some((name, _)) = recipe
        .sections
        .iter()
        .find(|(name, _)| !modality.sections().contains(&name.as_str()))
    {
        let reads = match modality.sections() {
            [] => "no section besides [data]".to_string(),
            s => s
                .iter()
                .map(|n| format!("[{n}]"))
                .collect::<Vec<_>>()
                .join(", "),
        };
        return Err(recipe.invalid(
            name,
            format!(
                "[{name}] is not a section of this recipe: `{}` data ({}) reads {reads}",
                format.name(),
                modality.name()
            ),
            "remove the section (the recipe reference, docs/src/recipe-reference.md, lists each data format's sections)",
        ));
    }
    let rest = modality.check(recipe)?;
    format.check(&recipe.data, rest)
}

/// The recipe's `[tokenizer]` where its data is text (`None` for images).
pub fn tokenizer(
    format: &dyn DataFormat,
    recipe: &Recipe,
) -> Result<Option<mopt_data::TokenizerSpec>, RecipeError> {
    match format.modality() {
        Modality::Images => Ok(None),
        Modality::Text | Modality::RunningText => super::text::tokenizer(recipe).map(Some),
    }
}

/// The size of one example the plan and the latency benchmark assume: a tokenizer's `max-len`
/// for text, 0 for fixed-shape inputs (images).
pub fn example_size(format: &dyn DataFormat, recipe: &Recipe) -> Result<usize, RecipeError> {
    match format.modality() {
        Modality::Images => Ok(0),
        Modality::Text | Modality::RunningText => Ok(super::text::tokenizer(recipe)?.max_len),
    }
}
