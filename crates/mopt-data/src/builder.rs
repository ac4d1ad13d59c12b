//! Typed setters of the shipped data formats' keys for a recipe built in Rust
//! ([`mopt_recipe::RecipeBuilder`]): what `[tokenizer]` and the text and image formats'
//! `[data]` keys are, as [`RecipeBuilder::set`](mopt_recipe::RecipeBuilder::set) writes them.

use std::path::Path;

use mopt_recipe::RecipeBuilder;

/// An integer as a recipe holds it (larger than `i64::MAX`: refused by validation as too big).
fn int(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// `[tokenizer]` and the keys of labelled text in `[data]`.
pub trait TextRecipe: Sized {
    /// `[tokenizer] path`: `tokenizer.json` or a WordPiece `vocab.txt`.
    fn tokenizer(self, path: impl AsRef<Path>) -> Self;
    /// `[tokenizer] max-len`, in tokens (default 128).
    fn max_len(self, tokens: usize) -> Self;
    /// `[tokenizer] lowercase` (default true; `vocab.txt` only).
    fn lowercase(self, lowercase: bool) -> Self;
    /// `[data] text-column` (csv, tsv, jsonl, orange-tab).
    fn text_column(self, column: &str) -> Self;
    /// `[data] label-column` (csv, tsv, jsonl, orange-tab).
    fn label_column(self, column: &str) -> Self;
    /// `[data] labels`: a fixed label order.
    fn labels(self, labels: &[&str]) -> Self;
}

impl TextRecipe for RecipeBuilder {
    fn tokenizer(self, path: impl AsRef<Path>) -> Self {
        self.set_path("tokenizer.path", path)
    }
    fn max_len(self, tokens: usize) -> Self {
        self.set("tokenizer.max-len", int(tokens))
    }
    fn lowercase(self, lowercase: bool) -> Self {
        self.set("tokenizer.lowercase", lowercase)
    }
    fn text_column(self, column: &str) -> Self {
        self.set("data.text-column", column)
    }
    fn label_column(self, column: &str) -> Self {
        self.set("data.label-column", column)
    }
    fn labels(self, labels: &[&str]) -> Self {
        self.set("data.labels", labels.to_vec())
    }
}

/// The keys of images in `[data]`.
pub trait ImageRecipe: Sized {
    /// `[data] pixel-max` (default 255).
    fn pixel_max(self, max: f64) -> Self;
    /// `[data.augment] crop` (default 0).
    fn augment_crop(self, pixels: usize) -> Self;
    /// `[data.augment] flip` (default false).
    fn augment_flip(self, flip: bool) -> Self;
}

impl ImageRecipe for RecipeBuilder {
    fn pixel_max(self, max: f64) -> Self {
        self.set("data.pixel-max", max)
    }
    fn augment_crop(self, pixels: usize) -> Self {
        self.set("data.augment.crop", int(pixels))
    }
    fn augment_flip(self, flip: bool) -> Self {
        self.set("data.augment.flip", flip)
    }
}
