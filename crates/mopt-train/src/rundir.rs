//! The run folder: refused when it exists unless `--force`; holds a copy of the recipe.

use std::path::{Path, PathBuf};

use crate::error::TrainError;

/// Create `dir` for a new run. An existing folder is an input error unless `force`, in which case
/// it is replaced. The recipe's text is copied to `dir/recipe.toml`.
pub fn create_run_dir(
    recipe: &mopt_recipe::Recipe,
    dir: &Path,
    force: bool,
) -> Result<PathBuf, TrainError> {
    if dir.exists() {
        if !force {
            return Err(TrainError::Input(format!(
                "run folder {} already exists (from an earlier run of `{}`); pass --force to replace it, or change [run] name",
                dir.display(),
                recipe.run.name
            )));
        }
        std::fs::remove_dir_all(dir).map_err(|e| TrainError::io(dir, e))?;
    }
    std::fs::create_dir_all(dir).map_err(|e| TrainError::io(dir, e))?;
    let copy = dir.join("recipe.toml");
    std::fs::write(&copy, &recipe.source).map_err(|e| TrainError::io(&copy, e))?;
    Ok(dir.to_path_buf())
}
