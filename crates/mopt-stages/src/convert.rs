//! Writing a checkpoint folder in another program's format (transformers' safetensors, llama.cpp's
//! GGUF): a capability a family lists with the formats it writes. `mopt-train convert` finds the
//! checkpoint's family and calls it.

use std::path::Path;

use crate::error::StageError;

/// A family's `convert` capability.
pub trait CanConvert: Send + Sync {
    /// The formats it writes: each name (`--to`) with what it writes.
    fn formats(&self) -> Vec<(&'static str, &'static str)>;

    /// Write the checkpoint folder `checkpoint` as `format` (one of [`CanConvert::formats`]) to
    /// `out` (a folder or a file, as the format is); returns what was written, for the user.
    fn convert(&self, checkpoint: &Path, format: &str, out: &Path) -> Result<String, StageError>;

    /// The name a stage gives the file or folder of `format` it writes (`model.<format>` by
    /// default).
    fn file_name(&self, format: &str) -> String {
        format!("model.{format}")
    }
}

/// The error for a format the family does not write, listing those it does.
pub fn unknown_format(format: &str, arch: &str, c: &dyn CanConvert) -> StageError {
    let known: Vec<String> = c
        .formats()
        .iter()
        .map(|(n, what)| format!("`{n}` ({what})"))
        .collect();
    StageError::Unsupported(format!(
        "`{arch}` checkpoints do not convert to `{format}`: use {}",
        known.join(", ")
    ))
}
