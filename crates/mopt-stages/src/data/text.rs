//! Tokenized text: `[tokenizer]` and the labelled-text formats of `[data]` (the BERT family's
//! data).

use std::path::Path;

use mopt_core::Examples;
use mopt_data::{load_splits, LabelMap, TextBatch, TextSplit, TextTokenizer, TokenizerSpec};
use mopt_recipe::{DataSpec, Recipe, RecipeError};
use mopt_train::setup::prepare_data;
use mopt_train::trainer::{CheckpointExtras, TextExtras};
use mopt_train::TrainError;

use super::{DataFormat, Modality, RunSplits, Split};
use crate::error::StageError;

/// The keys of `[data]` every labelled-text format takes.
pub const TEXT_KEYS: &[&str] = &["labels"];

/// The keys of `[data]` every labelled-text format takes, validated.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextKeys {
    /// A fixed label order; default: the sorted distinct labels of the training split.
    pub labels: Option<Vec<String>>,
}

impl TextKeys {
    /// The keys of `data`, and those left for its format.
    pub fn read(data: &DataSpec) -> Result<(Self, toml::Table), RecipeError> {
        refuse_image_keys(data)?;
        let (keys, rest) = data.take_keys::<Self>(TEXT_KEYS)?;
        if let Some(labels) = &keys.labels {
            check_labels(data, labels)?;
        }
        Ok((keys, rest))
    }

    /// The recipe's label map (`labels`), if it fixes one.
    pub fn label_map(data: &DataSpec) -> Result<Option<LabelMap>, RecipeError> {
        Ok(Self::read(data)?.0.labels.map(LabelMap::new))
    }
}

/// Refuse the keys of images (`pixel-max`, `[data.augment]`, its keys checked first) on text.
fn refuse_image_keys(data: &DataSpec) -> Result<(), RecipeError> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "kebab-case")]
    struct ImageOnly {
        pixel_max: Option<f64>,
        augment: Option<mopt_data::Augment>,
    }
    let (keys, _) = data.take_keys::<ImageOnly>(&["pixel-max", "augment"])?;
    for (key, set, why) in [
        (
            "pixel-max",
            keys.pixel_max.is_some(),
            "only images have pixels",
        ),
        (
            "augment",
            keys.augment.is_some(),
            "only images are cropped and flipped",
        ),
    ] {
        if set {
            return Err(data.err(
                key,
                why,
                "remove it (or use an image format: `format = \"idx\"` / `\"pixels-csv\"`)",
            ));
        }
    }
    Ok(())
}

/// Refuse a `labels` list with fewer than two labels or a label listed twice.
pub fn check_labels(data: &DataSpec, labels: &[String]) -> Result<(), RecipeError> {
    let mut sorted = labels.to_vec();
    sorted.sort();
    sorted.dedup();
    if labels.len() < 2 || sorted.len() != labels.len() {
        return Err(data.err(
            "labels",
            "needs at least two distinct labels",
            "list each class name once",
        ));
    }
    Ok(())
}

/// The recipe's `[tokenizer]`, validated: every recipe of text data has one.
pub fn tokenizer(recipe: &Recipe) -> Result<TokenizerSpec, RecipeError> {
    let section = recipe.section(TokenizerSpec::SECTION).ok_or_else(|| {
        recipe.invalid(
            "tokenizer",
            "this needs text data and a [tokenizer]",
            "use a recipe of text data",
        )
    })?;
    TokenizerSpec::from_section(section)
}

/// Tokenized text ([`TextData`]) as a family's data source.
pub struct Text;

impl super::DataSource for Text {
    fn modality(&self) -> Modality {
        Modality::Text
    }

    /// The label map, the training-set size, the vocabulary and the token counts of a sample
    /// of 1000 training examples.
    fn plan(&self, r: &Recipe, format: &dyn DataFormat) -> Result<super::PlanData, StageError> {
        let t = tokenizer(r)?;
        let tok =
            TextTokenizer::from_file(&t.path, t.max_len, t.lowercase).map_err(TrainError::from)?;
        let splits = read_splits(format, r)?;
        let labels = TextKeys::label_map(&r.data)?.unwrap_or_else(|| {
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
        format: &dyn DataFormat,
        labels: Option<LabelMap>,
        golden: usize,
    ) -> Result<super::RunData, StageError> {
        Ok(super::RunData::new(TextData::load(
            recipe, format, labels, golden,
        )?))
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
    /// Tokenize the recipe's data, each file read by `format` (token ids cached beside it);
    /// the label map is `labels` (a teacher's) when given, else the recipe's. The golden set is
    /// the first `golden` validation examples.
    pub fn load(
        recipe: &Recipe,
        format: &dyn DataFormat,
        labels: Option<LabelMap>,
        golden: usize,
    ) -> Result<Self, StageError> {
        let spec = tokenizer(recipe)?;
        let prepared = prepare(format, recipe, labels)?;
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

/// The recipe's labelled texts, split (not tokenized), each file read by `format`.
pub fn read_splits(
    format: &dyn DataFormat,
    recipe: &Recipe,
) -> Result<mopt_data::Splits, StageError> {
    let read = |p: &Path| format.read_text(&recipe.data, p);
    Ok(load_splits(&recipe.data, &read).map_err(TrainError::from)?)
}

/// The recipe's texts tokenized with its `[tokenizer]`, each file read by `format` (the label
/// map: `labels`, else the recipe's, else the training split's).
pub fn prepare(
    format: &dyn DataFormat,
    recipe: &Recipe,
    labels: Option<LabelMap>,
) -> Result<mopt_train::setup::PreparedData, StageError> {
    let labels = match labels {
        Some(l) => Some(l),
        None => TextKeys::label_map(&recipe.data)?,
    };
    let read = |p: &Path| format.read_text(&recipe.data, p);
    Ok(prepare_data(
        &tokenizer(recipe)?,
        (&recipe.data, &read),
        labels,
    )?)
}
