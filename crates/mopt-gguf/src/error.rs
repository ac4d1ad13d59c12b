//! GGUF errors: each names the file and the field (the header, a metadata key, a tensor).

use std::path::{Path, PathBuf};

use crate::ggml::GgmlType;

/// What went wrong reading, writing or using a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The operating system refused a read or a write.
    #[error("{}: {field}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being read or written.
        field: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The file does not start with the magic bytes `GGUF`.
    #[error("{}: not a GGUF file: it starts with {found:02x?}, not the magic bytes `GGUF` (47 47 55 46)", path.display())]
    NotGguf {
        /// The file.
        path: PathBuf,
        /// Its first four bytes.
        found: [u8; 4],
    },
    /// A GGUF version other than 2 or 3.
    #[error("{}: header: GGUF version {version} is not supported (this reader reads versions 2 and 3{})",
        path.display(), version_hint(*version))]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// The version the header states.
        version: u32,
    },
    /// The file's structure is broken: a length past the end, a bad type id, a duplicate, …
    #[error("{}: {field}: {reason}", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// Where: `header`, `metadata key `general.alignment``, `tensor `token_embd.weight``.
        field: String,
        /// What is wrong, with the numbers.
        reason: String,
    },
    /// A metadata key the caller needs is absent.
    #[error("{}: metadata key `{key}` is missing", path.display())]
    MissingKey {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
    },
    /// A metadata key holds another type than the caller expects.
    #[error("{}: metadata key `{key}`: expected {expected}, found {found}", path.display())]
    WrongType {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
        /// The type asked for (`u32`, `array of string`).
        expected: String,
        /// The type in the file.
        found: String,
    },
    /// No tensor of that name.
    #[error("{}: tensor `{name}` is not in the file ({count} tensors)", path.display())]
    MissingTensor {
        /// The file.
        path: PathBuf,
        /// The name asked for.
        name: String,
        /// How many tensors the file has.
        count: usize,
    },
    /// A tensor whose ggml type this crate does not dequantize (Q4_K, Q6_K, an unknown id, …).
    #[error("{}: tensor `{name}`: ggml type {ggml_type} cannot be read (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1)", path.display())]
    UnsupportedType {
        /// The file.
        path: PathBuf,
        /// The tensor.
        name: String,
        /// Its type.
        ggml_type: GgmlType,
    },
    /// The tokenizer the metadata describes cannot be built.
    #[error("{}: tokenizer: {field}: {reason}", path.display())]
    Tokenizer {
        /// The file.
        path: PathBuf,
        /// The metadata key (or `encode`, `decode`).
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// [`crate::GgufWriter`] was given something it cannot write.
    #[error("{}: writing {field}: {reason}", path.display())]
    InvalidInput {
        /// The file being written.
        path: PathBuf,
        /// The metadata key or tensor.
        field: String,
        /// What is wrong.
        reason: String,
    },
}

fn version_hint(version: u32) -> &'static str {
    match version {
        1 => "; v1 files come from llama.cpp before August 2023: convert them again",
        v if v.swap_bytes() <= 3 => "; this looks like a big-endian GGUF",
        _ => "",
    }
}

impl GgufError {
    pub(crate) fn malformed(
        path: &Path,
        field: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        GgufError::Malformed {
            path: path.to_path_buf(),
            field: field.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn io(path: &Path, field: impl Into<String>, source: std::io::Error) -> Self {
        GgufError::Io {
            path: path.to_path_buf(),
            field: field.into(),
            source,
        }
    }

    pub(crate) fn tokenizer(path: &Path, field: &str, reason: impl Into<String>) -> Self {
        GgufError::Tokenizer {
            path: path.to_path_buf(),
            field: field.to_string(),
            reason: reason.into(),
        }
    }
}
