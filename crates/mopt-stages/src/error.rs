//! Pipeline errors. Input errors are the user's to fix (exit code 2); the rest are failures while
//! running (exit code 1).

use mopt_export::ExportError;
use mopt_recipe::RecipeError;
use mopt_train::TrainError;

#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error(transparent)]
    Train(#[from] TrainError),
    #[error(transparent)]
    Export(#[from] ExportError),
    /// A stage failed its gate with `on-fail = "abort"`; the report was written.
    #[error("stage {index} ({name}) failed its gate: {reason}; on-fail = \"abort\" stopped the run (report: {report})")]
    Aborted {
        index: usize,
        name: String,
        reason: String,
        report: String,
    },
}

impl From<RecipeError> for StageError {
    fn from(e: RecipeError) -> Self {
        StageError::Train(TrainError::Recipe(e))
    }
}

impl From<mopt_models::ModelError> for StageError {
    fn from(e: mopt_models::ModelError) -> Self {
        StageError::Train(TrainError::Model(e.into()))
    }
}

impl From<mopt_core::ModelFault> for StageError {
    fn from(e: mopt_core::ModelFault) -> Self {
        StageError::Train(TrainError::Model(e))
    }
}

impl From<mopt_data::DataError> for StageError {
    fn from(e: mopt_data::DataError) -> Self {
        StageError::Train(TrainError::Data(e))
    }
}

impl StageError {
    /// Whether the user can fix this by changing the input (exit code 2).
    pub fn is_input_error(&self) -> bool {
        match self {
            StageError::Train(e) => e.is_input_error(),
            StageError::Export(e) => e.is_input_error(),
            StageError::Aborted { .. } => false,
        }
    }

    pub(crate) fn io(path: &std::path::Path, e: std::io::Error) -> Self {
        StageError::Train(TrainError::Io {
            path: path.display().to_string(),
            source: e,
        })
    }
}
