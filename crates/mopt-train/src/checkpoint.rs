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
    pub labels: &'a LabelMap,
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

/// Save a complete checkpoint folder atomically: write `<dir>.tmp`, then swap it in.
pub fn save_checkpoint_dir<C: Checkpoint>(
    model: &C,
    config: &C::Config,
    extras: &dyn CheckpointExtras,
    dir: &Path,
) -> Result<(), TrainError> {
    let tmp = dir.with_extension("tmp");
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| TrainError::io(&tmp, e))?;
    }
    std::fs::create_dir_all(&tmp).map_err(|e| TrainError::io(&tmp, e))?;
    model.save(config, &tmp)?;
    extras.write(&tmp)?;
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| TrainError::io(dir, e))?;
    }
    std::fs::rename(&tmp, dir).map_err(|e| TrainError::io(dir, e))
}

/// Golden reference written with the best checkpoint: the first test examples (as their split
/// records them: a text's token ids) and their logits, so that a reload (or an export) can be
/// checked against what training saw.
#[derive(Debug, Serialize, Deserialize)]
pub struct Golden {
    pub input_ids: Vec<serde_json::Value>,
    pub logits: Vec<Vec<f32>>,
}
