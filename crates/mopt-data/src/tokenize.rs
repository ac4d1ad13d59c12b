//! Tokenization with the `tokenizers` crate, parallel over examples and cached beside the data.

use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokenizers::models::wordpiece::WordPiece;
use tokenizers::normalizers::BertNormalizer;
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::processors::bert::BertProcessing;
use tokenizers::{Tokenizer, TruncationParams};

use crate::error::DataError;
use crate::labels::LabelMap;
use crate::text::{Example, Splits};

/// A BERT WordPiece tokenizer with padding off and truncation at `max_len`.
pub struct TextTokenizer {
    inner: Tokenizer,
    /// The tokenizer file (`tokenizer.json` or a WordPiece `vocab.txt`).
    pub path: PathBuf,
    /// Truncation length in tokens.
    pub max_len: usize,
    /// Token id of padding.
    pub pad_id: u32,
    /// Bytes of the tokenizer file, for cache keys.
    fingerprint: String,
}

impl TextTokenizer {
    /// From a `tokenizer.json`, or from a WordPiece `vocab.txt` with BERT's normalizer,
    /// pre-tokenizer and `[CLS] … [SEP]` post-processor.
    pub fn from_file(path: &Path, max_len: usize, lowercase: bool) -> Result<Self, DataError> {
        let err = |message: String| DataError::Tokenizer {
            path: path.to_path_buf(),
            message,
        };
        let is_vocab = path.extension().is_some_and(|e| e == "txt");
        let mut inner = if is_vocab {
            let path_str = path
                .to_str()
                .ok_or_else(|| err("path is not UTF-8".into()))?;
            let wp = WordPiece::from_file(path_str)
                .unk_token("[UNK]".into())
                .build()
                .map_err(|e| err(e.to_string()))?;
            let mut t = Tokenizer::new(wp);
            let id = |tok: &str| {
                t.token_to_id(tok)
                    .ok_or_else(|| err(format!("vocabulary lacks {tok}")))
            };
            let (cls, sep) = (id("[CLS]")?, id("[SEP]")?);
            t.with_normalizer(Some(BertNormalizer::new(true, true, None, lowercase)))
                .map_err(|e| err(e.to_string()))?;
            t.with_pre_tokenizer(Some(BertPreTokenizer));
            t.with_post_processor(Some(BertProcessing::new(
                ("[SEP]".into(), sep),
                ("[CLS]".into(), cls),
            )));
            t
        } else {
            Tokenizer::from_file(path).map_err(|e| err(e.to_string()))?
        };
        inner.with_padding(None);
        inner
            .with_truncation(Some(TruncationParams {
                max_length: max_len,
                ..Default::default()
            }))
            .map_err(|e| err(e.to_string()))?;
        let pad_id = inner.token_to_id("[PAD]").unwrap_or(0);
        let bytes = std::fs::read(path).map_err(|e| DataError::io(path, e))?;
        let fingerprint = format!("{:x}", Sha256::digest(&bytes));
        Ok(Self {
            inner,
            path: path.to_path_buf(),
            max_len,
            pad_id,
            fingerprint,
        })
    }

    /// Token ids of one text, `[CLS] … [SEP]`, at most `max_len`.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, DataError> {
        self.inner
            .encode(text, true)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| DataError::Tokenizer {
                path: self.path.clone(),
                message: e.to_string(),
            })
    }

    /// Id of `token` in the vocabulary, if it has one.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The token of `id` (`"movie"`, `"##ing"`), if the vocabulary has it.
    pub fn token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Ids of the special tokens (`[PAD]`, `[UNK]`, `[CLS]`, `[SEP]`, `[MASK]`) the vocabulary has.
    pub fn special_ids(&self) -> Vec<u32> {
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
            .iter()
            .filter_map(|t| self.token_id(t))
            .collect()
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Encode many texts in parallel.
    pub fn encode_all(&self, texts: &[&str]) -> Result<Vec<Vec<u32>>, DataError> {
        texts.par_iter().map(|t| self.encode(t)).collect()
    }
}

/// One tokenized example.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Encoded {
    /// Token ids, `[CLS]` … `[SEP]`, truncated.
    pub ids: Vec<u32>,
    /// Label id.
    pub label: usize,
}

/// Tokenized splits with their label map.
#[derive(Debug, Clone)]
pub struct EncodedSplits {
    /// The training split.
    pub train: Vec<Encoded>,
    /// The validation split.
    pub valid: Vec<Encoded>,
    /// The test split.
    pub test: Vec<Encoded>,
    /// Class names in label order.
    pub labels: LabelMap,
    /// Whether the ids came from the on-disk cache.
    pub from_cache: bool,
    /// The token cache read or written, if any.
    pub cache_file: Option<PathBuf>,
}

#[derive(Serialize, Deserialize)]
struct CacheFile {
    train: Vec<Vec<u32>>,
    valid: Vec<Vec<u32>>,
    test: Vec<Vec<u32>>,
}

fn cache_key(tok: &TextTokenizer, splits: &Splits) -> String {
    let mut h = Sha256::new();
    h.update(tok.fingerprint.as_bytes());
    h.update((tok.max_len as u64).to_le_bytes());
    for (name, part) in [
        ("train", &splits.train),
        ("valid", &splits.valid),
        ("test", &splits.test),
    ] {
        h.update(name.as_bytes());
        h.update((part.len() as u64).to_le_bytes());
        for e in part.iter() {
            h.update((e.text.len() as u64).to_le_bytes());
            h.update(e.text.as_bytes());
        }
    }
    format!("{:x}", h.finalize())[..24].to_string()
}

/// Map labels to ids with `labels`, failing on a label it does not know.
fn label_ids(
    part: &[Example],
    labels: &LabelMap,
    which: &str,
    data_file: &Path,
) -> Result<Vec<usize>, DataError> {
    part.iter()
        .map(|e| {
            labels.id(&e.label).ok_or_else(|| {
                DataError::format(
                    data_file,
                    format!(
                        "{which} label `{}` is not in the label map {:?}",
                        e.label, labels.labels
                    ),
                    "list every class under [data] labels, or check the label column",
                )
            })
        })
        .collect()
}

/// Tokenize the splits, reusing `cache_dir/<key>.json` when the tokenizer, max length and texts
/// are unchanged. The label map is `labels` or the sorted labels of the training split.
pub fn encode_splits(
    tok: &TextTokenizer,
    splits: &Splits,
    labels: Option<LabelMap>,
    cache_dir: Option<&Path>,
    [train_file, valid_file, test_file]: [&Path; 3],
) -> Result<EncodedSplits, DataError> {
    let data_file = train_file;
    let labels = labels
        .unwrap_or_else(|| LabelMap::from_examples(splits.train.iter().map(|e| e.label.as_str())));
    if labels.len() < 2 {
        return Err(DataError::format(
            data_file,
            "fewer than two classes in the training split",
            "check the label column",
        ));
    }
    let key = cache_key(tok, splits);
    let cache_file = cache_dir.map(|d| d.join(format!("{key}.json")));
    let cached: Option<CacheFile> = cache_file
        .as_ref()
        .and_then(|f| std::fs::File::open(f).ok())
        .and_then(|f| serde_json::from_reader(std::io::BufReader::new(f)).ok());
    let from_cache = cached.is_some();
    let ids = match cached {
        Some(c) => c,
        None => {
            let enc = |part: &[Example]| {
                tok.encode_all(&part.iter().map(|e| e.text.as_str()).collect::<Vec<_>>())
            };
            let c = CacheFile {
                train: enc(&splits.train)?,
                valid: enc(&splits.valid)?,
                test: enc(&splits.test)?,
            };
            if let Some(f) = &cache_file {
                // Best effort: a cache that cannot be written only costs time.
                if let Some(dir) = f.parent() {
                    let _ = std::fs::create_dir_all(dir);
                }
                // Streamed to the file: no second copy of the ids as text in memory.
                let tmp = f.with_extension(format!("{}.part", std::process::id()));
                let written = std::fs::File::create(&tmp).ok().is_some_and(|file| {
                    let mut w = std::io::BufWriter::new(file);
                    serde_json::to_writer(&mut w, &c).is_ok()
                        && std::io::Write::flush(&mut w).is_ok()
                });
                if written {
                    let _ = std::fs::rename(&tmp, f);
                }
            }
            c
        }
    };
    let join =
        |ids: Vec<Vec<u32>>, part: &[Example], which: &str| -> Result<Vec<Encoded>, DataError> {
            let file = match which {
                "valid" => valid_file,
                "test" => test_file,
                _ => train_file,
            };
            let l = label_ids(part, &labels, which, file)?;
            Ok(ids
                .into_iter()
                .zip(l)
                .map(|(ids, label)| Encoded { ids, label })
                .collect())
        };
    Ok(EncodedSplits {
        train: join(ids.train, &splits.train, "train")?,
        valid: join(ids.valid, &splits.valid, "valid")?,
        test: join(ids.test, &splits.test, "test")?,
        labels,
        from_cache,
        cache_file,
    })
}
