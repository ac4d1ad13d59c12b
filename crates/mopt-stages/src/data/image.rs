//! Images: the image formats of `[data]` (IDX, CSV of pixels), no tokenizer.

use std::path::Path;

use mopt_core::Examples;
use mopt_data::{
    load_image_splits, Augmentation, ImageBatch, ImageShape, ImageSplit, LabelMap, Normalize,
};
use mopt_recipe::Recipe;
use mopt_train::TrainError;

use super::{RunSplits, Split};
use crate::error::StageError;

/// Grey images ([`ImageData`]) as a family's data source.
pub struct Images;

impl super::DataSource for Images {
    fn modality(&self) -> &'static str {
        "images"
    }

    fn plan(&self, r: &Recipe) -> Result<super::PlanData, StageError> {
        let s = load_image_splits(&r.data, None).map_err(TrainError::from)?;
        let shape = s.train.shape;
        Ok(super::PlanData {
            labels: s.labels,
            train_examples: s.train.labels.len(),
            vocab: 0,
            mean_tokens: 0.0,
            mean_tokens_sq: 0.0,
            inputs: format!(
                "images     {}x{}x{} (channels x side x side), normalised by the training split (mean {:.4}, std {:.4} of pixel / {})",
                shape.channels, shape.side, shape.side, s.normalize.mean, s.normalize.std, s.normalize.pixel_max
            ),
        })
    }

    fn load(
        &self,
        recipe: &Recipe,
        labels: Option<LabelMap>,
        golden: usize,
    ) -> Result<super::RunData, StageError> {
        Ok(super::RunData::new(ImageData::load(
            recipe, labels, golden,
        )?))
    }
}

/// The splits of an image recipe, normalised by the training split's statistics.
pub struct ImageData {
    /// The training split.
    pub train: ImageSplit,
    /// The validation split.
    pub valid: ImageSplit,
    /// The test split.
    pub test: ImageSplit,
    /// The golden examples (the first validation images).
    pub golden: ImageSplit,
    /// Class names.
    pub labels: LabelMap,
    /// What a deployment does to raw grey values (saved beside every checkpoint).
    pub normalize: Normalize,
}

impl ImageData {
    /// Read the recipe's images; the label map is `labels` (a teacher's) when given. The
    /// golden set is the first `golden` validation images.
    pub fn load(
        recipe: &Recipe,
        labels: Option<LabelMap>,
        golden: usize,
    ) -> Result<Self, StageError> {
        let mut s = load_image_splits(&recipe.data, labels).map_err(TrainError::from)?;
        let a = recipe.data.augment;
        if a.is_on() {
            let side = s.train.shape.side;
            if 4 * a.crop > side {
                let why = format!(
                    "[data.augment] crop = {} pads more than a quarter of these {side}×{side} images",
                    a.crop
                );
                let e = mopt_data::DataError::Format {
                    path: recipe.data.anchor().to_path_buf(),
                    message: why,
                    hint: format!("at most {} here", side / 4),
                };
                return Err(TrainError::from(e).into());
            }
            s.train.augment = Some(Augmentation {
                spec: a,
                seed: recipe.run.seed,
                fill: -s.normalize.mean / s.normalize.std,
            });
        }
        Ok(Self {
            golden: s.valid.head(golden),
            train: s.train,
            valid: s.valid,
            test: s.test,
            labels: s.labels,
            normalize: s.normalize,
        })
    }

    /// The images' geometry.
    pub fn shape(&self) -> ImageShape {
        self.train.shape
    }
}

impl RunSplits for ImageData {
    type Batch = ImageBatch;

    fn split(&self, which: Split) -> &dyn Examples<Batch = ImageBatch> {
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

    /// `labels.json` and `preprocess.json` (the normalisation a deployment applies).
    fn write_extras(&self, dir: &Path) -> Result<(), TrainError> {
        self.labels.save(&dir.join("labels.json"))?;
        let p = dir.join("preprocess.json");
        let json = serde_json::json!({
            "input": "grey image, [batch, channels, side, side]",
            "channels": self.shape().channels,
            "side": self.shape().side,
            "normalize": self.normalize,
            "formula": "(pixel / pixel_max - mean) / std",
        });
        std::fs::write(&p, serde_json::to_vec_pretty(&json).expect("json"))
            .map_err(|e| TrainError::io(&p, e))
    }

    fn describe(&self) -> String {
        let s = self.shape();
        format!(
            "{} train / {} valid / {} test images of {}×{}×{}, {} labels {:?}",
            self.train.len(),
            self.valid.len(),
            self.test.len(),
            s.channels,
            s.side,
            s.side,
            self.labels.len(),
            self.labels.labels
        )
    }
}
