//! What the image model types share: their shape files (JSON read, completed with the data's
//! classes, validated), their checkpoint files (`model.bpk` and `config.json` tagged with the
//! `model_type`), a synthetic benchmark batch and their ONNX input and feed.

use std::path::Path;

use burn::module::Module;
use burn::prelude::*;
use mopt_data::ImageBatch;
use mopt_export::onnx::Dim;
use mopt_export::{InputSpec, InputType};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::burnpack::save_burnpack;
use crate::ModelError;

/// An image model's shape: a JSON file (a recipe's `[model] config`, or a checkpoint's
/// `config.json` with its classes), read, completed with the data's classes and validated.
pub trait ShapeFile: DeserializeOwned {
    /// The fields, named in the message of a file that does not parse.
    const KEYS: &'static str;

    /// Every value usable (the message says which is not).
    fn validate(&self) -> Result<(), String>;

    /// The number of classes and their names, to fill in.
    fn classes_mut(&mut self) -> (&mut usize, &mut Option<Vec<String>>);

    /// The class names it records.
    fn class_names(&self) -> Option<&[String]>;

    /// Read a mopt checkpoint's `config.json` (its classes included).
    fn from_file(path: &Path) -> Result<Self, ModelError> {
        read(path, |_: &mut Self| {})
    }

    /// The shape at `path` (a recipe's `[model] config`) for a data set of classes `labels`.
    fn for_labels(path: &Path, labels: &[String]) -> Result<Self, ModelError> {
        read(path, |c: &mut Self| {
            let (n, names) = c.classes_mut();
            *n = labels.len();
            *names = Some(labels.to_vec());
        })
    }
}

/// Parse the JSON shape at `path`, `complete` it (classes), then validate it.
fn read<C: ShapeFile>(path: &Path, complete: impl FnOnce(&mut C)) -> Result<C, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let bad = |message: String| ModelError::Config {
        path: path.to_path_buf(),
        message,
    };
    let mut config: C =
        serde_json::from_str(&text).map_err(|e| bad(format!("{e} ({})", C::KEYS)))?;
    complete(&mut config);
    config.validate().map_err(bad)?;
    Ok(config)
}

/// Write `model` to `dir/model.bpk` and `config` to `dir/config.json`, tagged `model_type`.
pub fn save<M: Module, C: Serialize>(
    model: &M,
    config: &C,
    model_type: &str,
    dir: &Path,
) -> Result<(), ModelError> {
    save_burnpack(model, &dir.join("model.bpk"))?;
    let path = dir.join("config.json");
    let mut value = serde_json::to_value(config).expect("config serialises");
    value["model_type"] = model_type.into();
    std::fs::write(&path, serde_json::to_string_pretty(&value).expect("json"))
        .map_err(|source| ModelError::Io { path, source })
}

/// `batch` images of `channels × side × side` of a smooth pattern (benchmarks), labels 0.
pub fn pattern_batch(batch: usize, channels: usize, side: usize, device: &Device) -> ImageBatch {
    let n = batch * channels * side * side;
    let values: Vec<f32> = (0..n).map(|i| ((i % 97) as f32 / 48.0) - 1.0).collect();
    ImageBatch {
        images: Tensor::from_data(
            TensorData::new(values, [batch, channels, side, side]),
            device,
        ),
        labels: Tensor::zeros([batch], device),
    }
}

/// The ONNX input `image` `[batch, channels, side, side]`.
pub fn image_input(channels: usize, side: usize) -> Vec<InputSpec> {
    vec![InputSpec {
        name: "image".into(),
        dtype: InputType::Float,
        dims: vec![
            Dim::Named("batch"),
            Dim::Fixed(channels as i64),
            Dim::Fixed(side as i64),
            Dim::Fixed(side as i64),
        ],
    }]
}

/// An image batch as ONNX Runtime is fed it: the input `image`.
pub fn image_feed(batch: &ImageBatch) -> serde_json::Map<String, serde_json::Value> {
    let mut m = serde_json::Map::new();
    m.insert(
        "image".into(),
        mopt_export::tensor_json(batch.images.to_data()),
    );
    m
}
