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
    #[error("{path}: {source}")]
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

    /// An I/O error on `path`.
    pub fn io(path: &std::path::Path, source: std::io::Error) -> Self {
        TrainError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}
