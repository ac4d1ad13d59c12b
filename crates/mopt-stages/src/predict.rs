//! Classify new text with a trained checkpoint of any registered family:
//!
//! ```no_run
//! # fn run(registry: &mopt_stages::Registry) -> Result<(), mopt_stages::StageError> {
//! let recipe = mopt_recipe::load("recipes/distill_bert.toml")?;
//! let best = "checkpoints/distill-bert/best".as_ref();
//! let model = mopt_stages::Predictor::load(registry, &recipe, best)?;
//! for p in model.predict(&["a warm, funny film", "a tedious mess"])? {
//!     println!("{} ({:.2})", p.label, p.probability);
//! }
//! # Ok(())
//! # }
//! ```

use std::path::Path;

use burn::prelude::*;
use mopt_data::{Batcher, Encoded, LabelMap, TextBatch, TextTokenizer};
use mopt_recipe::Recipe;
use mopt_train::TrainError;

use crate::error::StageError;
use crate::Registry;

/// A loaded text classifier (inference mode), whatever its family.
pub trait TextClassifier {
    /// # Shapes
    /// - output: `[batch, num_labels]`
    fn logits(&self, batch: &TextBatch) -> Tensor<2>;
}

impl<M: mopt_core::Classifier<Batch = TextBatch>> TextClassifier for M {
    fn logits(&self, batch: &TextBatch) -> Tensor<2> {
        mopt_core::Classifier::logits(self, batch)
    }
}

/// A family's `predict` capability: load a checkpoint as a [`TextClassifier`].
pub trait CanClassifyText: Send + Sync {
    /// The checkpoint at `ckpt` loaded as a text classifier on `device`.
    fn load(&self, ckpt: &Path, device: &Device) -> Result<Box<dyn TextClassifier>, StageError>;
}

/// The `predict` capability of the text classifier type `M`.
pub fn capability<M>() -> Box<dyn CanClassifyText>
where
    M: mopt_core::Checkpoint<Batch = TextBatch> + 'static,
{
    Box::new(Generic::<M>(std::marker::PhantomData))
}

struct Generic<M>(std::marker::PhantomData<fn() -> M>);

impl<M> CanClassifyText for Generic<M>
where
    M: mopt_core::Checkpoint<Batch = TextBatch> + 'static,
{
    fn load(&self, ckpt: &Path, device: &Device) -> Result<Box<dyn TextClassifier>, StageError> {
        let (model, _) = M::load(ckpt, device)?;
        Ok(Box::new(burn::module::Module::valid(&model)))
    }
}

/// One text's prediction.
#[derive(Debug, Clone, PartialEq)]
pub struct Prediction {
    /// The most probable class.
    pub label: String,
    /// Its probability.
    pub probability: f32,
    /// Every class's probability, in the label map's order.
    pub probabilities: Vec<f32>,
}

/// A checkpoint with the recipe's tokenizer and the checkpoint's label map.
pub struct Predictor {
    model: Box<dyn TextClassifier>,
    tokenizer: TextTokenizer,
    labels: LabelMap,
    device: Device,
}

impl Predictor {
    /// The checkpoint folder `checkpoint` (a run's `best`, a stage's model), tokenised as
    /// `recipe`'s `[tokenizer]` says, on the CPU, the recipe's family looked up in `registry`.
    pub fn load(
        registry: &Registry,
        recipe: &Recipe,
        checkpoint: &Path,
    ) -> Result<Self, StageError> {
        let device = Device::flex();
        let labels = LabelMap::load(&checkpoint.join("labels.json")).map_err(TrainError::from)?;
        let t = crate::data::text::tokenizer(recipe)?;
        let tokenizer =
            TextTokenizer::from_file(&t.path, t.max_len, t.lowercase).map_err(TrainError::from)?;
        let family = match registry.source_family(checkpoint) {
            Some(f) => f,
            None => registry.recipe_family(recipe)?,
        };
        let model = family
            .require::<dyn CanClassifyText>("predict", "a text classifier", "reads no text")?
            .load(checkpoint, &device)?;
        Ok(Self {
            model,
            tokenizer,
            labels,
            device,
        })
    }

    /// The class names, in logit order.
    pub fn labels(&self) -> &[String] {
        &self.labels.labels
    }

    /// Predictions for `texts`, in order (one batch).
    pub fn predict(&self, texts: &[&str]) -> Result<Vec<Prediction>, StageError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let encoded: Vec<Encoded> = self
            .tokenizer
            .encode_all(texts)
            .map_err(TrainError::from)?
            .into_iter()
            .map(|ids| Encoded { ids, label: 0 })
            .collect();
        let items: Vec<&Encoded> = encoded.iter().collect();
        let batch = Batcher::new(self.tokenizer.pad_id).batch(&items, &self.device);
        let probs = burn::tensor::activation::softmax(self.model.logits(&batch), 1);
        let n = self.labels.len();
        let probs: Vec<f32> = probs.into_data().try_to_vec().expect("f32 logits");
        Ok(probs
            .chunks(n)
            .map(|row| {
                let best = mopt_train::trainer::argmax(row);
                Prediction {
                    label: self.labels.labels[best].clone(),
                    probability: row[best],
                    probabilities: row.to_vec(),
                }
            })
            .collect())
    }
}
