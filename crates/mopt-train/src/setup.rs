//! Turning a validated recipe's data sections into tokenized splits.

use std::path::PathBuf;

use mopt_data::{
    encode_splits, load_splits, EncodedSplits, LabelMap, ReadText, TextTokenizer, TokenizerSpec,
};
use mopt_recipe::DataSpec;

use crate::error::TrainError;
use crate::trainer::TextExtras;

/// Tokenizer and tokenized splits.
pub struct PreparedData {
    /// The tokenizer.
    pub tokenizer: TextTokenizer,
    /// The encoded splits.
    pub data: EncodedSplits,
}

impl PreparedData {
    /// What every checkpoint trained on this data carries: the label map and the tokenizer file.
    pub fn extras(&self) -> TextExtras<'_> {
        TextExtras {
            labels: &self.data.labels,
            tokenizer_file: &self.tokenizer.path,
        }
    }
}

/// Load (each file read by the data format's `read`), split and tokenize the recipe's data
/// (token ids cached in [`cache_dir`]). The label map is `labels` (a teacher's, the recipe's),
/// else the training split's.
pub fn prepare_data(
    tok: &TokenizerSpec,
    (data, read): (&DataSpec, ReadText),
    labels: Option<LabelMap>,
) -> Result<PreparedData, TrainError> {
    let tokenizer = TextTokenizer::from_file(&tok.path, tok.max_len, tok.lowercase)?;
    let splits = load_splits(data, read)?;
    let cache_dir = cache_dir(data);
    let data = encode_splits(
        &tokenizer,
        &splits,
        labels,
        cache_dir.as_deref(),
        data.split_files(),
    )?;
    Ok(PreparedData { tokenizer, data })
}

/// Folder for caches derived from the recipe's data (token ids, teacher outputs): `[data]
/// cache-dir`, else `.mopt-cache/` beside the data.
pub fn cache_dir(data: &DataSpec) -> Option<PathBuf> {
    data.cache_dir
        .clone()
        .or_else(|| data.anchor().parent().map(|p| p.join(".mopt-cache")))
}
