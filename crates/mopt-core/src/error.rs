//! The error a model family reports through the contracts.

/// An error of a model family (a config that does not parse, weights that do not load), with
/// whether the user can fix it by changing the input (exit code 2) or it happened while
/// running (exit code 1).
#[derive(Debug, thiserror::Error)]
#[error("{source}")]
pub struct ModelFault {
    /// `true`: bad input (a file, a key, a shape); the message names it and the fix.
    pub input: bool,
    #[source]
    /// The underlying error.
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

impl ModelFault {
    /// A fault the user fixes by changing the input.
    pub fn input(source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self {
            input: true,
            source: source.into(),
        }
    }
}
