//! A language model's text: `[data] format = "text-files"` (whole works a split: `train` a
//! folder or file, `valid` and `test` the works held out), tokenised by the GGUF file that
//! `[tokenizer] path` names (its byte-level BPE, as transformers builds it) and packed into
//! windows of `max-len` positions ([`WindowSplit`]); a split's works are joined by the
//! tokenizer's end-of-text token. The classes are the vocabulary's tokens.

use std::path::{Path, PathBuf};

use mopt_core::Examples;
use mopt_data::{LabelMap, TokenWindows, WindowSplit};
use mopt_gguf::{Gguf, GgufTokenizer};
use mopt_recipe::{DataSource as Source, Recipe};
use mopt_train::TrainError;

use super::{RunSplits, Split};
use crate::error::StageError;

/// The tokenizer file of a language model's checkpoint folder.
pub const TOKENIZER_FILE: &str = "tokenizer.gguf";

/// Copy the tokenizer of the GGUF file `source` (its `tokenizer.*` metadata) into a GGUF file of
/// its own at `out`.
pub fn write_tokenizer(source: &Path, out: &Path) -> Result<(), TrainError> {
    let fail = |p: &Path, e: mopt_gguf::GgufError| TrainError::io(p, std::io::Error::other(e));
    let gguf = Gguf::open(source).map_err(|e| fail(source, e))?;
    let mut w = mopt_gguf::GgufWriter::new(out);
    for (key, value) in gguf.metadata().filter(|(k, _)| k.starts_with("tokenizer.")) {
        w.metadata(key, value.clone()).map_err(|e| fail(out, e))?;
    }
    w.write().map_err(|e| fail(out, e))
}

/// Text files tokenised into windows, as a family's data source.
pub struct LmText;

impl super::DataSource for LmText {
    fn modality(&self) -> super::Modality {
        super::Modality::RunningText
    }

    /// The works tokenised and packed (as a run reads them), every window `max-len` tokens.
    fn plan(
        &self,
        r: &Recipe,
        _format: &dyn super::DataFormat,
    ) -> Result<super::PlanData, StageError> {
        let d = LmData::load(r, 0)?;
        let len = d.train.window_len() as f64;
        Ok(super::PlanData {
            train_examples: d.train.len(),
            vocab: d.labels.len(),
            mean_tokens: len,
            mean_tokens_sq: len * len,
            inputs: format!(
                "tokenizer  {} (GGUF, vocab {}); {}",
                crate::record::shown(&d.tokenizer),
                d.labels.len(),
                d.describe()
            ),
            labels: d.labels,
        })
    }

    fn load(
        &self,
        recipe: &Recipe,
        _format: &dyn super::DataFormat,
        _labels: Option<LabelMap>,
        golden: usize,
    ) -> Result<super::RunData, StageError> {
        Ok(super::RunData::new(LmData::load(recipe, golden)?))
    }
}

/// The windows of a language-model recipe's three splits (and the golden windows: the first
/// validation windows), with the works each came from.
pub struct LmData {
    /// The training windows.
    pub train: WindowSplit,
    /// The validation windows.
    pub valid: WindowSplit,
    /// The test windows.
    pub test: WindowSplit,
    /// The golden windows.
    pub golden: WindowSplit,
    /// The vocabulary's tokens, one class each.
    pub labels: LabelMap,
    /// The GGUF file whose tokenizer encoded the text.
    pub tokenizer: PathBuf,
    /// The works of each split (train, validation, test).
    pub works: [Vec<PathBuf>; 3],
}

fn input(path: &Path, why: String) -> StageError {
    TrainError::Input(format!("{}: {why}", path.display())).into()
}

impl LmData {
    /// Read, tokenise and pack the recipe's works (`golden`: how many validation windows the
    /// golden reference keeps).
    pub fn load(recipe: &Recipe, golden: usize) -> Result<Self, StageError> {
        let spec = super::text::tokenizer(recipe)?;
        // A GGUF error names the file itself.
        let gguf_input =
            |e: mopt_gguf::GgufError| StageError::from(TrainError::Input(e.to_string()));
        let gguf = Gguf::open(&spec.path).map_err(gguf_input)?;
        let tokenizer = GgufTokenizer::from_gguf(&gguf).map_err(gguf_input)?;
        let Source::Files {
            train, valid, test, ..
        } = &recipe.data.source
        else {
            return Err(input(
                &recipe.path,
                "[data] text-files need `train`, `valid` and `test`".into(),
            ));
        };
        let valid = valid.as_ref().expect("validated: text-files name `valid`");
        let (valid_works, test_works) = (works(valid, &[])?, works(test, &[])?);
        let held_out = [valid_works.as_slice(), test_works.as_slice()].concat();
        let works = [works(train, &held_out)?, valid_works, test_works];
        let len = spec.max_len;
        // At most `limit` windows of `ids`: `len + 1` ids for the first, `len` more for each next.
        let pack = |ids: &[u32], limit: Option<usize>| -> Result<WindowSplit, StageError> {
            let ids = match limit {
                Some(n) => &ids[..ids.len().min(n.saturating_mul(len).saturating_add(1))],
                None => ids,
            };
            WindowSplit::pack(ids, len, None).map_err(|e| input(&spec.path, e.to_string()))
        };
        // The golden windows are the first validation windows: its works are encoded once.
        let [train_ids, valid_ids, test_ids] = [0, 1, 2].map(|k| encode(&tokenizer, &works[k]));
        let (train_ids, valid_ids, test_ids) = (train_ids?, valid_ids?, test_ids?);
        let (max_train, max_eval) = (recipe.data.max_train, recipe.data.max_eval);
        let labels = (0..tokenizer.vocab_size() as u32)
            .map(|i| tokenizer.token(i).unwrap_or("").to_string())
            .collect();
        Ok(Self {
            train: pack(&train_ids, max_train)?,
            valid: pack(&valid_ids, max_eval)?,
            test: pack(&test_ids, max_eval)?,
            golden: pack(&valid_ids, Some(golden.min(max_eval.unwrap_or(usize::MAX))))?,
            labels: LabelMap::new(labels),
            tokenizer: spec.path.clone(),
            works,
        })
    }
}

/// The works at `path`: the file, or the folder's `*.txt` files in name order, less `skip`.
fn works(path: &Path, skip: &[PathBuf]) -> Result<Vec<PathBuf>, StageError> {
    if path.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let entries = std::fs::read_dir(path).map_err(|e| StageError::io(path, e))?;
    let mut out = Vec::new();
    for e in entries {
        let p = e.map_err(|e| StageError::io(path, e))?.path();
        let same = |s: &PathBuf| s.file_name() == p.file_name() && s.parent() == p.parent();
        if p.extension().is_some_and(|x| x == "txt") && !skip.iter().any(same) {
            out.push(p);
        }
    }
    out.sort();
    if out.is_empty() {
        return Err(input(path, "no `*.txt` works in this folder".into()));
    }
    Ok(out)
}

/// The works' token ids, joined by the end-of-text token; a file that is not UTF-8 is named
/// with the byte where it stops being so.
fn encode(tokenizer: &GgufTokenizer, files: &[PathBuf]) -> Result<Vec<u32>, StageError> {
    let mut ids = Vec::new();
    for (k, f) in files.iter().enumerate() {
        let bytes = std::fs::read(f).map_err(|e| StageError::io(f, e))?;
        let text = String::from_utf8(bytes).map_err(|e| {
            input(
                f,
                format!(
                    "not UTF-8 text (invalid byte at offset {}); save the work as UTF-8",
                    e.utf8_error().valid_up_to()
                ),
            )
        })?;
        if k > 0 {
            ids.extend(tokenizer.eos_id());
        }
        ids.extend(
            tokenizer
                .encode(&text)
                .map_err(|e| input(f, e.to_string()))?,
        );
    }
    Ok(ids)
}

impl RunSplits for LmData {
    type Batch = TokenWindows;

    fn split(&self, which: Split) -> &dyn Examples<Batch = TokenWindows> {
        match which {
            Split::Train => &self.train,
            Split::Valid => &self.valid,
            Split::Test => &self.test,
            Split::Golden => &self.golden,
        }
    }

    fn labels(&self) -> &LabelMap {
        &self.labels
    }

    /// `labels.json` (the vocabulary) and `tokenizer.gguf`: the tokenizer the ids came from
    /// (every `tokenizer.*` key of its GGUF file, no tensor), so that a checkpoint folder
    /// encodes and decodes text on its own.
    fn write_extras(&self, dir: &Path) -> Result<(), TrainError> {
        self.labels.save(&dir.join("labels.json"))?;
        write_tokenizer(&self.tokenizer, &dir.join(TOKENIZER_FILE))
    }

    fn describe(&self) -> String {
        let names = |w: &[PathBuf]| w.len();
        format!(
            "{} / {} / {} windows of {} tokens from {} / {} / {} works, vocabulary {}",
            self.train.len(),
            self.valid.len(),
            self.test.len(),
            self.train.window_len(),
            names(&self.works[0]),
            names(&self.works[1]),
            names(&self.works[2]),
            self.labels.len()
        )
    }
}
