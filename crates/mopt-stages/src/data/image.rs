//! Images: the image formats of `[data]` (IDX, CSV of pixels), no tokenizer.

use std::path::Path;

use mopt_core::Examples;
use mopt_data::{
    load_image_splits, Augment, Augmentation, ImageBatch, ImageShape, ImageSplit, ImageSplits,
    LabelMap, Normalize,
};
use mopt_recipe::{DataSpec, Recipe, RecipeError};
use mopt_train::TrainError;

use super::{DataFormat, Modality, RunSplits, Split};
use crate::error::StageError;

/// The keys of `[data]` every image format takes.
pub const IMAGE_KEYS: &[&str] = &["labels", "pixel-max", "augment"];

/// The keys of `[data]` every image format takes, validated.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ImageKeys {
    /// A fixed label order; default: the sorted distinct labels of the training split.
    pub labels: Option<Vec<String>>,
    /// The largest grey value (255 for 8-bit pixels, 16 for scikit-learn's digits); pixels are
    /// scaled by it before the training split's mean and deviation normalise them.
    pub pixel_max: Option<f64>,
    /// Random crops and flips of the training batches (`[data.augment]`; none by default).
    pub augment: Option<Augment>,
}

impl ImageKeys {
    /// The keys of `data`, and those left for its format.
    pub fn read(data: &DataSpec) -> Result<(Self, toml::Table), RecipeError> {
        let (keys, rest) = data.take_keys::<Self>(IMAGE_KEYS)?;
        if let Some(labels) = &keys.labels {
            super::text::check_labels(data, labels)?;
        }
        if let Some(m) = keys.pixel_max.filter(|m| !(m.is_finite() && *m > 0.0)) {
            return Err(data.err(
                "pixel-max",
                format!("{m} is not a positive grey value"),
                "255 for 8-bit images, 16 for scikit-learn's digits",
            ));
        }
        if let Some(crop) = keys.augment.map(|a| a.crop).filter(|c| *c > 8) {
            return Err(data.err(
                "augment.crop",
                format!("{crop} pixels of padding is more than a small image keeps"),
                "at most 8; 2 for 28×28 Fashion-MNIST, 4 for 32×32 images",
            ));
        }
        Ok((keys, rest))
    }

    /// The grey value pixels are scaled by (255 when not written).
    pub fn pixel_max(&self) -> f64 {
        self.pixel_max.unwrap_or(255.0)
    }
}

/// The recipe's `[data.augment]` (none when not written).
pub fn augment(data: &DataSpec) -> Result<Augment, RecipeError> {
    Ok(ImageKeys::read(data)?.0.augment.unwrap_or_default())
}

/// Read and split the recipe's images with `format` (the label map: `labels`, else the
/// recipe's, else the training split's).
fn splits(
    recipe: &Recipe,
    format: &dyn DataFormat,
    labels: Option<LabelMap>,
) -> Result<(ImageSplits, Augment), StageError> {
    let (keys, _) = ImageKeys::read(&recipe.data)?;
    let pixel_max = keys.pixel_max();
    let labels = labels.or_else(|| keys.labels.clone().map(LabelMap::new));
    let read = |p: &Path| format.read_images(&recipe.data, p, pixel_max);
    let s =
        load_image_splits(&recipe.data, (&read, pixel_max), labels).map_err(TrainError::from)?;
    Ok((s, keys.augment.unwrap_or_default()))
}

/// Grey images ([`ImageData`]) as a family's data source.
pub struct Images;

impl super::DataSource for Images {
    fn modality(&self) -> Modality {
        Modality::Images
    }

    fn plan(&self, r: &Recipe, format: &dyn DataFormat) -> Result<super::PlanData, StageError> {
        let (s, _) = splits(r, format, None)?;
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
        format: &dyn DataFormat,
        labels: Option<LabelMap>,
        golden: usize,
    ) -> Result<super::RunData, StageError> {
        Ok(super::RunData::new(ImageData::load(
            recipe, format, labels, golden,
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
    /// Read the recipe's images with `format`; the label map is `labels` (a teacher's) when
    /// given. The golden set is the first `golden` validation images.
    pub fn load(
        recipe: &Recipe,
        format: &dyn DataFormat,
        labels: Option<LabelMap>,
        golden: usize,
    ) -> Result<Self, StageError> {
        let (mut s, a) = splits(recipe, format, labels)?;
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
