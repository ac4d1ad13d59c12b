//! A run's data as the runner carries it: the splits a model family's loader read, type-erased
//! like [`crate::shape::Shape`], so the runner, the gates and the report never name a modality.
//! A stage kind generic over a model `M` asks for `M::Batch` splits ([`RunData::splits`]);
//! a family that needs its own data type asks for it ([`RunData::get`]).
//!
//! One loader per kind of data, picked by the family's [`DataSource`]: [`text`] (a tokenizer and
//! labelled text files), [`image`] (grey images) and [`lm`] (a language model's text: whole
//! works tokenised by a GGUF's tokenizer, packed into windows). Each reads the files with the
//! recipe's registered [`DataFormat`] (the shipped ones: [`formats`]).

mod format;
pub mod formats;
pub mod image;
pub mod lm;
pub mod text;

pub use format::{check, example_size, tokenizer, DataFormat, Modality};

use std::any::Any;
use std::path::Path;
use std::sync::Arc;

use mopt_core::{Examples, Labeled};
use mopt_data::LabelMap;
use mopt_train::trainer::{CheckpointExtras, Splits};
use mopt_train::TrainError;

use crate::error::StageError;

/// Which examples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// The training split.
    Train,
    /// The validation split.
    Valid,
    /// The test split.
    Test,
    /// The golden reference: the first validation examples (`[evaluation] golden-samples`).
    Golden,
}

/// Where a family's data comes from: the modality a recipe's `[data] format` must be, and the
/// loader that reads it ([`text::Text`], [`image::Images`]) with the format's reader.
pub trait DataSource: Send + Sync {
    /// What the data is (a `[data] format`'s modality).
    fn modality(&self) -> Modality;

    /// What `--check` plans with, read without loading everything ([`PlanData`]); `format`
    /// reads the files.
    fn plan(
        &self,
        recipe: &mopt_recipe::Recipe,
        format: &dyn DataFormat,
    ) -> Result<PlanData, StageError>;

    /// Load the recipe's data, each file read by `format` (`labels`: a teacher's label map;
    /// the golden set is the first `golden` validation examples).
    fn load(
        &self,
        recipe: &mopt_recipe::Recipe,
        format: &dyn DataFormat,
        labels: Option<LabelMap>,
        golden: usize,
    ) -> Result<RunData, StageError>;
}

/// What planning reads from the data: the classes, the training-set size, for tokenised data
/// the vocabulary and the token counts of a sample of examples, and a line on the inputs.
pub struct PlanData {
    /// The classes (a language model's: its vocabulary).
    pub labels: LabelMap,
    /// Training examples (after `max-train`).
    pub train_examples: usize,
    /// Vocabulary size (0 for images).
    pub vocab: usize,
    /// Mean tokens an example.
    pub mean_tokens: f64,
    /// Mean of its square (attention memory grows with it).
    pub mean_tokens_sq: f64,
    /// The plan's line on the model inputs (the tokenizer; the images' shape).
    pub inputs: String,
}

/// What a modality's loader hands the runner.
pub trait RunSplits: Send + Sync + 'static {
    /// What the models of this data read.
    type Batch: Labeled + Clone + Send + 'static;

    /// The examples of `which`.
    fn split(&self, which: Split) -> &dyn Examples<Batch = Self::Batch>;

    /// Class names in label order.
    fn labels(&self) -> &LabelMap;

    /// Whether the examples came from an on-disk cache (the report's `token_cache_hit`).
    fn cache_hit(&self) -> bool {
        false
    }

    /// Write the files every checkpoint trained on this data carries (the label map, the
    /// tokenizer, the image normalisation) into the checkpoint folder `dir`.
    fn write_extras(&self, dir: &Path) -> Result<(), TrainError>;

    /// One line for the log: sizes and source.
    fn describe(&self) -> String;
}

/// The batch-free part of [`RunSplits`], object-safe.
trait Erased: Send + Sync {
    fn any(&self) -> &dyn Any;
    fn len(&self, which: Split) -> usize;
    fn record(&self, which: Split, i: usize) -> serde_json::Value;
    fn labels(&self) -> &LabelMap;
    fn cache_hit(&self) -> bool;
    fn write_extras(&self, dir: &Path) -> Result<(), TrainError>;
    fn describe(&self) -> String;
    fn batch_type(&self) -> &'static str;
}

impl<D: RunSplits> Erased for D {
    fn any(&self) -> &dyn Any {
        self
    }
    fn len(&self, which: Split) -> usize {
        self.split(which).len()
    }
    fn record(&self, which: Split, i: usize) -> serde_json::Value {
        self.split(which).record(i)
    }
    fn labels(&self) -> &LabelMap {
        RunSplits::labels(self)
    }
    fn cache_hit(&self) -> bool {
        RunSplits::cache_hit(self)
    }
    fn write_extras(&self, dir: &Path) -> Result<(), TrainError> {
        RunSplits::write_extras(self, dir)
    }
    fn describe(&self) -> String {
        RunSplits::describe(self)
    }
    fn batch_type(&self) -> &'static str {
        std::any::type_name::<D::Batch>()
    }
}

/// The splits of batch type `B`, object-safe (stored behind `Any` and found by `B`).
trait SplitsOf<B>: Send + Sync {
    fn split(&self, which: Split) -> &dyn Examples<Batch = B>;
}

impl<D: RunSplits> SplitsOf<D::Batch> for D {
    fn split(&self, which: Split) -> &dyn Examples<Batch = D::Batch> {
        RunSplits::split(self, which)
    }
}

/// A run's data behind a pointer.
#[derive(Clone)]
pub struct RunData {
    erased: Arc<dyn Erased>,
    /// An `Arc<dyn SplitsOf<D::Batch>>` of the same object.
    typed: Arc<dyn Any + Send + Sync>,
}

impl RunData {
    /// The run's data, loaded by a family's loader.
    pub fn new<D: RunSplits>(data: D) -> Self {
        let data = Arc::new(data);
        let typed: Arc<dyn SplitsOf<D::Batch>> = data.clone();
        Self {
            erased: data,
            typed: Arc::new(typed),
        }
    }

    /// The examples of `which` as batches of `B`; an error when the data's examples are of
    /// another kind than the model reads (an image model on text data).
    pub fn split<B: 'static>(&self, which: Split) -> Result<&dyn Examples<Batch = B>, StageError> {
        let typed = self
            .typed
            .downcast_ref::<Arc<dyn SplitsOf<B>>>()
            .ok_or_else(|| {
                StageError::Unsupported(format!(
                    "the model reads `{}` batches, and the recipe's data gives `{}`: pair the [model] arch with data of its kind",
                    std::any::type_name::<B>(),
                    self.erased.batch_type()
                ))
            })?;
        Ok(typed.split(which))
    }

    /// The training, validation and test splits as the algorithms read them.
    pub fn splits<B: 'static>(&self) -> Result<Splits<&dyn Examples<Batch = B>>, StageError> {
        Ok(Splits {
            train: self.split(Split::Train)?,
            valid: self.split(Split::Valid)?,
            test: self.split(Split::Test)?,
        })
    }

    /// The loader's own type (a family that needs its tokenizer, say).
    pub fn get<D: RunSplits>(&self) -> Result<&D, StageError> {
        self.erased.any().downcast_ref::<D>().ok_or_else(|| {
            StageError::Unsupported(format!(
                "this step needs `{}` data, and the recipe's data is of another kind",
                std::any::type_name::<D>()
            ))
        })
    }

    /// Number of examples in `which`.
    pub fn len(&self, which: Split) -> usize {
        self.erased.len(which)
    }

    /// Example `i` of `which` as the golden reference records it.
    pub fn record(&self, which: Split, i: usize) -> serde_json::Value {
        self.erased.record(which, i)
    }

    /// Class names.
    pub fn labels(&self) -> &LabelMap {
        self.erased.labels()
    }

    /// Whether the data came from a cache.
    pub fn cache_hit(&self) -> bool {
        self.erased.cache_hit()
    }

    /// One line on the data for the plan and the log.
    pub fn describe(&self) -> String {
        self.erased.describe()
    }
}

/// Every checkpoint of a run carries its data's extras.
impl CheckpointExtras for RunData {
    fn write(&self, dir: &Path) -> Result<(), TrainError> {
        self.erased.write_extras(dir)
    }
}
