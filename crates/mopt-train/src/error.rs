//! Training errors. `Input` errors are the user's to fix (exit code 2), the rest are failures while
//! running (exit code 1).

#[derive(Debug, thiserror::Error)]
/// What went wrong training.
pub enum TrainError {
    #[error(transparent)]
    /// A recipe error.
    Recipe(#[from] mopt_recipe::RecipeError),
    #[error(transparent)]
    /// A data error.
    Data(#[from] mopt_data::DataError),
    #[error(transparent)]
    /// A model file error.
    Model(#[from] mopt_core::ModelFault),
    /// Bad input that is not a recipe key (an existing run folder, a bad device name).
    #[error("{0}")]
    Input(String),
    #[error("{path}: {}", io_hint(.source))]
    /// A file could not be read or written.
    Io {
        /// The file.
        path: String,
        #[source]
        /// The operating system's error.
        source: std::io::Error,
    },
    #[error("training failed: {0}")]
    /// Training failed while running (a non-finite run, a device error).
    Failed(String),
}

impl TrainError {
    /// Whether the user can fix this by changing the input (exit code 2).
    pub fn is_input_error(&self) -> bool {
        matches!(
            self,
            TrainError::Recipe(_) | TrainError::Data(_) | TrainError::Input(_)
        ) || matches!(self, TrainError::Model(f) if f.input)
    }

    /// A failure writing or reading `path` reported as text (Burn's record errors carry the
    /// OS's message, not its error): an I/O error when the text holds an OS error code (so that
    /// a full disk or a read-only folder gets its fix), a failure otherwise.
    pub fn from_message(path: &std::path::Path, message: &str) -> Self {
        let code = message
            .split("(os error ")
            .nth(1)
            .and_then(|rest| rest.split(')').next())
            .and_then(|n| n.parse::<i32>().ok());
        match code {
            Some(code) => Self::io(path, std::io::Error::from_raw_os_error(code)),
            None => TrainError::Failed(format!("{}: {message}", path.display())),
        }
    }

    /// An I/O error on `path`.
    pub fn io(path: &std::path::Path, source: std::io::Error) -> Self {
        TrainError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

/// What an I/O error means for a run, and its fix; the OS's own message follows as the source.
fn io_hint(e: &std::io::Error) -> &'static str {
    use std::io::ErrorKind::*;
    match e.kind() {
        PermissionDenied | ReadOnlyFilesystem => {
            "cannot write here: make the folder writable or set [run] output-dir to another folder (finished stages and the last training state are kept for --resume)"
        }
        StorageFull | QuotaExceeded | FileTooLarge => {
            "the disk is full: free space, then --resume (finished stages and the last training state are kept)"
        }
        NotFound => "not found",
        _ => "I/O error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn os_error_codes_in_messages_become_io_errors_with_their_fix() {
        let p = Path::new("/run/state.tmp/model.bpk");
        let msg = "Record I/O error: cannot write to 'x.tmp': File too large (os error 27)";
        let e = TrainError::from_message(p, msg);
        assert!(
            matches!(&e, TrainError::Io { source, .. } if source.kind() == std::io::ErrorKind::FileTooLarge)
        );
        assert!(e
            .to_string()
            .starts_with("/run/state.tmp/model.bpk: the disk is full"));
        let e = TrainError::from_message(p, "Permission denied (os error 13)");
        assert!(e.to_string().contains("make the folder writable"), "{e}");
        let e = TrainError::from_message(p, "bad header");
        assert!(matches!(&e, TrainError::Failed(m) if m.ends_with("model.bpk: bad header")));
    }
}
