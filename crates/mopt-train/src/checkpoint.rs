//! Checkpoint folders: the model with its config (the family's [`Checkpoint`]), the files a run
//! keeps beside it (label map, tokenizer), written atomically; the golden reference.

use std::path::Path;

use mopt_core::Checkpoint;
use mopt_data::LabelMap;
use serde::{Deserialize, Serialize};

use crate::error::TrainError;

/// Files a checkpoint folder carries besides the model (what a reader needs to use it).
pub trait CheckpointExtras: Sync {
    /// Write them into `dir` (the checkpoint's folder, being written).
    fn write(&self, dir: &Path) -> Result<(), TrainError>;
}

/// Nothing besides the model.
pub struct NoExtras;

impl CheckpointExtras for NoExtras {
    fn write(&self, _dir: &Path) -> Result<(), TrainError> {
        Ok(())
    }
}

/// A text classifier's extras: `labels.json` and a copy of the tokenizer file.
pub struct TextExtras<'a> {
    /// Class names.
    pub labels: &'a LabelMap,
    /// The tokenizer file, copied beside the model.
    pub tokenizer_file: &'a Path,
}

impl CheckpointExtras for TextExtras<'_> {
    fn write(&self, dir: &Path) -> Result<(), TrainError> {
        self.labels.save(&dir.join("labels.json"))?;
        if let Some(name) = self.tokenizer_file.file_name() {
            std::fs::copy(self.tokenizer_file, dir.join(name))
                .map_err(|e| TrainError::io(self.tokenizer_file, e))?;
        }
        Ok(())
    }
}

/// Save a complete checkpoint folder atomically: written as `<dir>.tmp` with a `manifest.json`
/// of its files' sha256 (checked whenever the weights are read back), flushed to disk, then
/// swapped in; a crash at any moment leaves a complete checkpoint at `dir` or at `<dir>.old`.
pub fn save_checkpoint_dir<C: Checkpoint>(
    model: &C,
    config: &C::Config,
    extras: &dyn CheckpointExtras,
    dir: &Path,
) -> Result<(), TrainError> {
    write_folder(dir, None, |tmp| {
        model.save(config, tmp)?;
        extras.write(tmp)
    })
}

/// Write the folder `dir` atomically: `fill` writes `<dir>.tmp`, which gets a `manifest.json`
/// of its files' sha256 and is flushed to disk, then swapped in. The folder it replaces is
/// renamed to `previous` (kept: an older good copy to fall back on) or, without one, to
/// `<dir>.old` and removed last.
pub(crate) fn write_folder(
    dir: &Path,
    previous: Option<&Path>,
    fill: impl FnOnce(&Path) -> Result<(), TrainError>,
) -> Result<(), TrainError> {
    let tmp = dir.with_extension("tmp");
    let old = previous.map_or_else(|| dir.with_extension("old"), Path::to_path_buf);
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| TrainError::io(&tmp, e))?;
    }
    std::fs::create_dir_all(&tmp).map_err(|e| TrainError::io(&tmp, e))?;
    let written = fill(&tmp)
        .and_then(|()| mopt_core::manifest::write(&tmp).map_err(|e| TrainError::io(&tmp, e)))
        .and_then(|()| sync_folder(&tmp).map_err(|e| TrainError::io(&tmp, e)));
    if let Err(e) = written {
        // A full disk or a failed write: the half-written folder goes, the one in place stays.
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    if dir.exists() {
        if old.exists() {
            std::fs::remove_dir_all(&old).map_err(|e| TrainError::io(&old, e))?;
        }
        std::fs::rename(dir, &old).map_err(|e| TrainError::io(dir, e))?;
    }
    std::fs::rename(&tmp, dir).map_err(|e| TrainError::io(dir, e))?;
    if let Some(parent) = dir.parent() {
        let _ = std::fs::File::open(parent).and_then(|f| f.sync_all());
    }
    if previous.is_none() && old.exists() {
        std::fs::remove_dir_all(&old).map_err(|e| TrainError::io(&old, e))?;
    }
    Ok(())
}

/// fsync every file of `dir`, then `dir` itself.
fn sync_folder(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            std::fs::File::open(entry.path())?.sync_all()?;
        }
    }
    std::fs::File::open(dir)?.sync_all()
}

/// Golden reference written with the best checkpoint: the first test examples (as their split
/// records them: a text's token ids) and their logits, so that a reload (or an export) can be
/// checked against what training saw.
#[derive(Debug, Serialize, Deserialize)]
pub struct Golden {
    /// The examples' records (a text's token ids).
    pub input_ids: Vec<serde_json::Value>,
    /// Their logits.
    pub logits: Vec<Vec<f32>>,
}
