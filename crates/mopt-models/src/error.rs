//! Errors of model building, loading and saving.

use std::path::PathBuf;

use mopt_core::ModelFault;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: bad model config: {message}", path.display())]
    Config { path: PathBuf, message: String },
    #[error("{}: cannot load weights: {message}\n  fix: {hint}", path.display())]
    Load {
        path: PathBuf,
        message: String,
        hint: String,
    },
    #[error("{}: cannot save weights: {message}", path.display())]
    Save { path: PathBuf, message: String },
    /// A key of the recipe's model table that does not fit the model.
    #[error(transparent)]
    Recipe(#[from] mopt_recipe::RecipeError),
}

/// Config and load errors are the user's input (exit code 2); the rest happen while running.
impl From<ModelError> for ModelFault {
    fn from(e: ModelError) -> Self {
        let input = matches!(
            e,
            ModelError::Config { .. } | ModelError::Load { .. } | ModelError::Recipe(_)
        );
        ModelFault {
            input,
            source: Box::new(e),
        }
    }
}
