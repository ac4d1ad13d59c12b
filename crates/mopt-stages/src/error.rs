//! Pipeline errors. Input errors are the user's to fix (exit code 2); the rest are failures while
//! running (exit code 1).

use mopt_export::ExportError;
use mopt_recipe::RecipeError;
use mopt_train::TrainError;

#[derive(Debug, thiserror::Error)]
/// What went wrong running a pipeline.
pub enum StageError {
    #[error(transparent)]
    /// A training, recipe, data or model error.
    Train(#[from] TrainError),
    #[error(transparent)]
    /// An export error.
    Export(#[from] ExportError),
    /// A stage's own run failed: which stage (a stage pushed in Rust has no recipe line to name).
    #[error("stage {index} `{name}` (kind {kind}): {error}")]
    InStage {
        /// The stage's position.
        index: usize,
        /// Its name.
        name: String,
        /// Its kind.
        kind: String,
        /// What went wrong (its message is part of this one's, so it is not a `source`).
        error: Box<StageError>,
    },
    /// The model's family lacks what a stage needs (a capability, or the model is of another
    /// family than a typed step expects).
    #[error("{0}")]
    Unsupported(String),
    /// A stage failed its gate with `on-fail = "abort"`; the report was written.
    #[error("stage {index} ({name}) failed its gate: {reason}; on-fail = \"abort\" stopped the run (report: {report})")]
    Aborted {
        /// The stage's position.
        index: usize,
        /// Its name.
        name: String,
        /// Why the gate failed.
        reason: String,
        /// The report written.
        report: String,
    },
}

impl From<RecipeError> for StageError {
    fn from(e: RecipeError) -> Self {
        StageError::Train(TrainError::Recipe(e))
    }
}

impl From<mopt_models::ModelError> for StageError {
    /// A recipe's error stays one (naming file, key and fix); the rest are the model's.
    fn from(e: mopt_models::ModelError) -> Self {
        match e {
            mopt_models::ModelError::Recipe(r) => r.into(),
            e => StageError::Train(TrainError::Model(e.into())),
        }
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
            StageError::InStage { error, .. } => error.is_input_error(),
            StageError::Aborted { .. } => false,
            StageError::Unsupported(_) => true,
        }
    }

    /// This error, raised while stage `entry` ran, with the stage named.
    pub fn in_stage(self, entry: &mopt_recipe::StageEntry) -> Self {
        match self {
            e @ (StageError::InStage { .. } | StageError::Aborted { .. }) => e,
            e => StageError::InStage {
                index: entry.index,
                name: entry.name.clone(),
                kind: entry.kind.clone(),
                error: Box::new(e),
            },
        }
    }

    /// A file-system error on `path`.
    pub fn io(path: &std::path::Path, e: std::io::Error) -> Self {
        StageError::Train(TrainError::Io {
            path: path.display().to_string(),
            source: e,
        })
    }
}
