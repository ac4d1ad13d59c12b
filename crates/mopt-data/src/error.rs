//! Data errors: each names the file and the fix.

use std::path::PathBuf;

/// What went wrong reading or preparing data.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A file's contents do not fit its format.
    #[error("{}: {message}\n  fix: {hint}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
        /// How to fix it.
        hint: String,
    },
    /// The tokenizer file could not be loaded or used.
    #[error("{}: tokenizer: {message}", path.display())]
    Tokenizer {
        /// The tokenizer file.
        path: PathBuf,
        /// The tokenizer library's message.
        message: String,
    },
}

impl DataError {
    /// A malformed file: what is wrong and the fix.
    pub fn format(
        path: &std::path::Path,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) -> Self {
        DataError::Format {
            path: path.to_path_buf(),
            message: message.into(),
            hint: hint.into(),
        }
    }
    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> Self {
        DataError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}
