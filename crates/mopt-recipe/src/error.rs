//! Recipe errors: every one names the file, the key (with its line when known), what is wrong and the fix.

use std::fmt;
use std::path::PathBuf;

/// A problem with a recipe, found while reading, parsing or validating it.
#[derive(Debug, thiserror::Error)]
pub enum RecipeError {
    /// The recipe file could not be read.
    #[error("{}: cannot read the recipe: {source}", path.display())]
    Read {
        /// The recipe file.
        path: PathBuf,
        #[source]
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The TOML is malformed, or a key is unknown or has the wrong type.
    #[error("{}:{line}: {message}\n  fix: {hint}", path.display())]
    Parse {
        /// The recipe file.
        path: PathBuf,
        /// The line of the problem.
        line: usize,
        /// What is wrong.
        message: String,
        /// How to fix it.
        hint: String,
    },
    /// A value parsed but is not acceptable.
    #[error("{0}")]
    Invalid(Box<Invalid>),
}

/// A validation failure: `file:line: [key] message` plus a fix.
#[derive(Debug, Clone)]
pub struct Invalid {
    /// The recipe file.
    pub path: PathBuf,
    /// The key, with its section (`train.lr`, `stage[2].target`).
    pub key: String,
    /// The key's line, when found.
    pub line: Option<usize>,
    /// What is wrong.
    pub message: String,
    /// How to fix it.
    pub hint: String,
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}: ", self.path.display())?,
            None => write!(f, "{}: ", self.path.display())?,
        }
        write!(f, "`{}`: {}\n  fix: {}", self.key, self.message, self.hint)
    }
}

/// Find the 1-based line where `key` (dotted: `train.lr`) is set in TOML `source`.
///
/// Tracks `[section]` headers; for a bare section key (`train`) returns the header line.
pub fn locate(source: &str, key: &str) -> Option<usize> {
    let (section, leaf) = match key.rsplit_once('.') {
        Some((s, l)) => (s, l),
        None => ("", key),
    };
    let mut current = String::new();
    let mut section_line = None;
    for (i, raw) in source.lines().enumerate() {
        let line = raw.trim();
        if let Some(header) = line.strip_prefix('[') {
            let name = header.trim_start_matches('[');
            let name = name.split(']').next().unwrap_or("").trim();
            current = name.to_string();
            if current == key {
                return Some(i + 1);
            }
            if current == section && section_line.is_none() {
                section_line = Some(i + 1);
            }
            continue;
        }
        if current == section {
            if let Some((k, _)) = line.split_once('=') {
                if k.trim().trim_matches('"') == leaf {
                    return Some(i + 1);
                }
            }
        }
    }
    section_line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locate_finds_keys_in_sections() {
        let src = "[run]\nname = \"x\"\n\n[train]\nepochs = 3\nlr = 1e-4\n";
        assert_eq!(locate(src, "run.name"), Some(2));
        assert_eq!(locate(src, "train.lr"), Some(6));
        assert_eq!(locate(src, "train"), Some(4));
        assert_eq!(locate(src, "train.missing"), Some(4));
        assert_eq!(locate(src, "model.kind"), None);
    }
}
