//! Tokenized text: `[tokenizer]` and the text formats of `[data]` (the BERT family's data).

use std::path::Path;

use mopt_core::Examples;
use mopt_data::{load_splits, LabelMap, TextBatch, TextSplit, TextTokenizer};
use mopt_recipe::{Recipe, TokenizerSpec};
use mopt_train::setup::prepare_data;
use mopt_train::trainer::{CheckpointExtras, TextExtras};
use mopt_train::TrainError;

use super::{RunSplits, Split};
use crate::error::StageError;

/// Tokenized text ([`TextData`]) as a family's data source.
pub struct Text;

impl super::DataSource for Text {
    fn modality(&self) -> &'static str {
        "text"
    }

    /// The label map, the training-set size, the vocabulary and the token counts of a sample
    /// of 1000 training examples.
    fn plan(&self, r: &Recipe) -> Result<super::PlanData, StageError> {
        let t = r.text_tokenizer()?;
        let tok =
            TextTokenizer::from_file(&t.path, t.max_len, t.lowercase).map_err(TrainError::from)?;
        let splits = load_splits(&r.data).map_err(TrainError::from)?;
        let labels = r.data.labels.clone().map(LabelMap::new).unwrap_or_else(|| {
            LabelMap::from_examples(splits.train.iter().map(|e| e.label.as_str()))
        });
        let train_examples = r
            .data
            .max_train
            .map_or(splits.train.len(), |m| m.min(splits.train.len()));
        let sample: Vec<&str> = splits
            .train
            .iter()
            .take(1000)
            .map(|e| e.text.as_str())
            .collect();
        let lens: Vec<f64> = tok
            .encode_all(&sample)
            .map_err(TrainError::from)?
            .iter()
            .map(|ids| ids.len() as f64)
            .collect();
        let n = lens.len().max(1) as f64;
        Ok(super::PlanData {
            labels,
            train_examples,
            vocab: tok.vocab_size(),
            mean_tokens: lens.iter().sum::<f64>() / n,
            mean_tokens_sq: lens.iter().map(|l| l * l).sum::<f64>() / n,
            inputs: format!(
                "tokenizer  {} (vocab {}, max-len {})",
                crate::record::shown(&t.path),
                tok.vocab_size(),
                t.max_len
            ),
        })
    }

    fn load(
        &self,
        recipe: &Recipe,
        labels: Option<LabelMap>,
        golden: usize,
    ) -> Result<super::RunData, StageError> {
        Ok(super::RunData::new(TextData::load(recipe, labels, golden)?))
    }
}

/// The splits of a text recipe, tokenized, with their tokenizer.
pub struct TextData {
    /// The training split.
    pub train: TextSplit,
    /// The validation split.
    pub valid: TextSplit,
    /// The test split.
    pub test: TextSplit,
    /// The golden examples (the first validation texts).
    pub golden: TextSplit,
    /// Class names.
    pub labels: LabelMap,
    /// The tokenizer.
    pub tokenizer: TextTokenizer,
    /// The recipe's `[tokenizer]`.
    pub spec: TokenizerSpec,
    from_cache: bool,
}

impl TextData {
    /// Tokenize the recipe's data (token ids cached beside it); the label map is `labels` (a
    /// teacher's) when given. The golden set is the first `golden` validation examples.
    pub fn load(
        recipe: &Recipe,
        labels: Option<LabelMap>,
        golden: usize,
    ) -> Result<Self, StageError> {
        let spec = recipe.text_tokenizer()?.clone();
        let prepared = prepare_data(&spec, &recipe.data, labels)?;
        let pad_id = prepared.tokenizer.pad_id;
        let d = prepared.data;
        let split = |examples| TextSplit { examples, pad_id };
        let golden = split(d.valid[..golden.min(d.valid.len())].to_vec());
        Ok(Self {
            train: split(d.train),
            valid: split(d.valid),
            test: split(d.test),
            golden,
            labels: d.labels,
            tokenizer: prepared.tokenizer,
            spec,
            from_cache: d.from_cache,
        })
    }

    /// Token id of padding.
    pub fn pad_id(&self) -> u32 {
        self.tokenizer.pad_id
    }

    /// Vocabulary size.
    pub fn vocab(&self) -> usize {
        self.tokenizer.vocab_size()
    }
}

impl RunSplits for TextData {
    type Batch = TextBatch;

    fn split(&self, which: Split) -> &dyn Examples<Batch = TextBatch> {
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

    fn cache_hit(&self) -> bool {
        self.from_cache
    }

    /// `labels.json` and a copy of the tokenizer file.
    fn write_extras(&self, dir: &Path) -> Result<(), TrainError> {
        TextExtras {
            labels: &self.labels,
            tokenizer_file: &self.tokenizer.path,
        }
        .write(dir)
    }

    fn describe(&self) -> String {
        format!(
            "{} train / {} valid / {} test, {} labels {:?}, tokens {}",
            self.train.len(),
            self.valid.len(),
            self.test.len(),
            self.labels.len(),
            self.labels.labels,
            if self.from_cache {
                "from cache"
            } else {
                "encoded"
            }
        )
    }
}
