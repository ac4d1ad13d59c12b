//! `[tokenizer]`: the section text data reads (its data formats own it; images have none).

use std::path::PathBuf;

use mopt_recipe::{RecipeError, Section};
use serde::Deserialize;

/// `[tokenizer]`, validated.
#[derive(Debug, Clone)]
pub struct TokenizerSpec {
    /// `tokenizer.json` or a WordPiece `vocab.txt`.
    pub path: PathBuf,
    /// Truncation length in tokens, `[CLS]` and `[SEP]` included (the model's position table
    /// or context is the upper limit: its family checks it).
    pub max_len: usize,
    /// Lower-case text (only used with `vocab.txt`; `tokenizer.json` carries its own normalizer).
    pub lowercase: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawTokenizer {
    path: String,
    max_len: Option<usize>,
    lowercase: Option<bool>,
}

impl TokenizerSpec {
    /// The section's name in a recipe.
    pub const SECTION: &'static str = "tokenizer";

    /// Validate the recipe's `[tokenizer]` section.
    pub fn from_section(section: &Section) -> Result<Self, RecipeError> {
        let raw: RawTokenizer = section.keys("the [tokenizer] of text data")?;
        let path = section.input_file("path", &raw.path)?;
        if raw.lowercase.is_some() && path.extension().is_none_or(|e| e != "txt") {
            return Err(section.err(
                "lowercase",
                "a `tokenizer.json` carries its own normalizer, which decides the case",
                "remove `lowercase` (it applies to a WordPiece `vocab.txt` only)",
            ));
        }
        let max_len = raw.max_len.unwrap_or(128);
        if max_len < 3 {
            return Err(section.err(
                "max-len",
                format!("{max_len} is below 3 tokens"),
                "use e.g. 64 for short snippets on a CPU; the model's position table is the upper limit",
            ));
        }
        Ok(Self {
            path,
            max_len,
            lowercase: raw.lowercase.unwrap_or(true),
        })
    }

    /// The same with its file named by an absolute path ([`mopt_recipe::absolute`]).
    pub fn absolute(&self) -> Self {
        Self {
            path: mopt_recipe::absolute(&self.path),
            ..self.clone()
        }
    }
}
