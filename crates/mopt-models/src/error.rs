//! Errors of model building, loading and saving.

use std::path::PathBuf;

use mopt_core::ModelFault;

/// What went wrong building, loading or saving a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A config file that does not describe a valid model.
    #[error("{}: bad model config: {message}", path.display())]
    Config {
        /// The config file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// Weights that do not load into the model (missing, mismatched, corrupt).
    #[error("{}: cannot load weights: {message}\n  fix: {hint}", path.display())]
    Load {
        /// The weights file.
        path: PathBuf,
        /// What is wrong.
        message: String,
        /// How to fix it.
        hint: String,
    },
    /// Weights that could not be written.
    #[error("{}: cannot save weights: {message}", path.display())]
    Save {
        /// The weights file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A model the output format cannot hold (nothing is written): what, named, and why.
    #[error("{}: cannot export {what}: {reason}", path.display())]
    Inexpressible {
        /// The file that was to be written.
        path: PathBuf,
        /// What cannot be written: a tensor, a layer's width, a metadata key.
        what: String,
        /// Why, with the numbers.
        reason: String,
    },
    /// A key of the recipe's model table that does not fit the model.
    #[error(transparent)]
    Recipe(#[from] mopt_recipe::RecipeError),
}

/// Config, load and export refusals are the user's input (exit code 2); the rest happen while
/// running.
impl From<ModelError> for ModelFault {
    fn from(e: ModelError) -> Self {
        let input = matches!(
            e,
            ModelError::Config { .. }
                | ModelError::Load { .. }
                | ModelError::Inexpressible { .. }
                | ModelError::Recipe(_)
        );
        ModelFault {
            input,
            source: Box::new(e),
        }
    }
}
