//! Data errors: each names the file and the fix.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {message}\n  fix: {hint}", path.display())]
    Format {
        path: PathBuf,
        message: String,
        hint: String,
    },
    #[error("{}: tokenizer: {message}", path.display())]
    Tokenizer { path: PathBuf, message: String },
}

impl DataError {
    pub(crate) fn format(
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
