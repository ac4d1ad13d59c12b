//! Training errors. `Input` errors are the user's to fix (exit code 2), the rest are failures while
//! running (exit code 1).

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Recipe(#[from] mopt_recipe::RecipeError),
    #[error(transparent)]
    Data(#[from] mopt_data::DataError),
    #[error(transparent)]
    Model(#[from] mopt_core::ModelFault),
    /// Bad input that is not a recipe key (an existing run folder, a bad device name).
    #[error("{0}")]
    Input(String),
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("training failed: {0}")]
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

    pub fn io(path: &std::path::Path, source: std::io::Error) -> Self {
        TrainError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}
