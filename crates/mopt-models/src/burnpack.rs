//! Burn-format weights (`model.bpk`) of any module: written whole, read back only when the
//! checkpoint's manifest (when it has one) agrees with the file's sha256 and every tensor is
//! there and fits (a truncated file or another shape is an error naming the file).

use std::path::Path;

use burn::module::Module;
use burn::store::{BurnpackStore, ModuleSnapshot};

use crate::ModelError;

/// Write `model`'s tensors (BatchNorm statistics included) to `path`, replacing it. The same
/// weights give the same bytes (no parameter ids are written: see [`mopt_core::WithoutIds`]).
pub fn save_burnpack<M: Module>(model: &M, path: &Path) -> Result<(), ModelError> {
    let mut store = BurnpackStore::from_file(path)
        .auto_extension(false)
        .overwrite(true)
        .with_to_adapter(mopt_core::WithoutIds);
    model.save_into(&mut store).map_err(|e| ModelError::Save {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// Load Burn-format weights into a model of matching shape; every tensor must be present.
pub fn load_burnpack<M: Module>(model: &mut M, path: &Path) -> Result<(), ModelError> {
    mopt_core::manifest::verify(path).map_err(|message| {
        let old = path.parent().map(|d| d.with_extension("old"));
        ModelError::Load {
            path: path.to_path_buf(),
            message,
            hint: match old.filter(|o| o.join("model.bpk").is_file()) {
                Some(o) => format!("the previous checkpoint is at {}", o.display()),
                None => {
                    "train it again (the run folder's earlier stages are kept: `--resume`)".into()
                }
            },
        }
    })?;
    let mut store = BurnpackStore::from_file(path).auto_extension(false);
    let result = model.load_from(&mut store).map_err(|e| ModelError::Load {
        path: path.to_path_buf(),
        message: e.to_string(),
        hint: "the checkpoint's config.json must match its weights; was the file truncated?".into(),
    })?;
    if !result.is_success() || !result.missing.is_empty() {
        return Err(ModelError::Load {
            path: path.to_path_buf(),
            message: format!(
                "{} missing, {} unused, {} mismatched tensors",
                result.missing.len(),
                result.unused.len(),
                result.errors.len()
            ),
            hint: "use the config.json saved with these weights".into(),
        });
    }
    Ok(())
}
