//! # mopt-recipe
//!
//! The TOML recipe schema of mopt. A recipe is parsed once with serde (`deny_unknown_fields`,
//! kebab-case keys) and validated into the typed [`Recipe`]; nothing downstream sees strings
//! where an enum belongs. Relative paths resolve against the recipe's folder. Every error names the
//! file, the key (and its line), what is wrong and how to fix it.
//!
//! Shared sections, once: `[run]`, `[teacher]` or `[model]` (the baseline), `[data]`, `[train]` (defaults for every stage), `[evaluation]`, `[lr-find]`. Then any number of
//! ordered `[[stage]]` blocks, each with a `kind`, its own `[stage.train]` overrides and
//! `[stage.gate]`. The common parts of a stage are validated here ([`StageEntry`]); each stage
//! kind validates its own keys through the [`Scope`] it is handed (`mopt_stages`).
//!
//! [`Recipe::builder`] sets the shared sections in Rust instead, typed, with the same defaults
//! and the same validation (see [`RecipeBuilder`]).

#![deny(missing_docs)]
mod builder;
pub use builder::{ModelBuilder, RecipeBuilder, BUILDER_FILE};
mod data;
pub mod device;
mod error;
mod metric;
mod model;
mod raw;
pub use raw::RawModel;
mod scope;
mod section;
mod spec;
mod stage;
mod train;

pub use data::*;
pub use device::{DeviceError, DeviceRef, RemoteAddr};
pub use error::{locate, Invalid, RecipeError};
pub use metric::Metric;
pub use model::*;
pub use scope::{absolute, normalize, Scope};
pub use section::Section;
pub use spec::*;
pub use stage::*;
pub use train::*;

use std::path::Path;

/// Read, parse and validate the recipe at `path`.
pub fn load(path: impl AsRef<Path>) -> Result<Recipe, RecipeError> {
    let path = path.as_ref();
    let source = std::fs::read_to_string(path).map_err(|source| RecipeError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(path, &source)
}

/// Parse and validate recipe text; `path` names the file in errors and anchors relative paths.
pub fn parse(path: &Path, source: &str) -> Result<Recipe, RecipeError> {
    let raw: raw::RawRecipe = toml::from_str(source).map_err(|e| parse_error(path, source, e))?;
    spec::validate(path, source, raw)
}

/// `section.key` of a `key = value` line (1-based), from the section header above it.
fn key_at_line(source: &str, line: usize) -> Option<String> {
    let lines: Vec<&str> = source.lines().collect();
    let (key, _) = lines.get(line.checked_sub(1)?)?.split_once('=')?;
    let key = key.trim().trim_matches('"');
    let section = lines[..line - 1]
        .iter()
        .rev()
        .find_map(|l| l.trim().strip_prefix('['))
        .map(|h| {
            h.trim_start_matches('[')
                .split(']')
                .next()
                .unwrap_or("")
                .trim()
        });
    Some(match section {
        Some(s) if !s.is_empty() => format!("{s}.{key}"),
        _ => key.to_string(),
    })
}

fn parse_error(path: &Path, source: &str, e: toml::de::Error) -> RecipeError {
    let line = e
        .span()
        .map(|s| source[..s.start.min(source.len())].matches('\n').count() + 1)
        .unwrap_or(1);
    let mut message = e.message().trim().to_string();
    // A wrong type or value names no key: take it from the line the error points at.
    if !message.contains(" field `") {
        if let Some(key) = key_at_line(source, line) {
            message = format!("`{key}`: {message}");
        }
    }
    let hint = if message.contains("unknown field") {
        "remove or rename the key; the recipe reference (docs/src/recipe-reference.md) lists every key of each section"
            .to_string()
    } else if message.contains("missing field") {
        "add the key; the recipe reference (docs/src/recipe-reference.md) gives its meaning and an example".to_string()
    } else if message.contains("unknown variant") {
        "use one of the values the message lists".to_string()
    } else {
        "correct the TOML syntax or value type at that line".to_string()
    };
    RecipeError::Parse {
        path: path.to_path_buf(),
        line,
        message,
        hint,
    }
}
