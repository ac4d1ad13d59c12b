//! The error a model family reports through the contracts.

/// An error of a model family (a config that does not parse, weights that do not load), with
/// whether the user can fix it by changing the input (exit code 2) or it happened while
/// running (exit code 1).
///
/// Transparent: its message is the underlying error's, and its [`std::error::Error::source`]
/// is that error's source, so that a chain printed whole (`{:#}`) says each thing once.
#[derive(Debug)]
pub struct ModelFault {
    /// `true`: bad input (a file, a key, a shape); the message names it and the fix.
    pub input: bool,
    /// The underlying error.
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

impl std::fmt::Display for ModelFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.source.fmt(f)
    }
}

impl std::error::Error for ModelFault {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.source()
    }
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
