//! Plain CNNs on grey images (`mopt_models::cnn`) as an image family (no quantization yet).

use std::path::Path;

use mopt_models::cnn::{Cnn, CnnConfig};
use mopt_models::ModelError;

use super::image::{ImageFamily, ImageModel};

/// The plain-CNN family.
pub const CNN: ImageFamily<Cnn> = ImageFamily::new();

impl ImageModel for Cnn {
    const ARCH: &'static str = "cnn";
    const NAME: &'static str = "a CNN";

    fn read_config(path: &Path) -> Result<CnnConfig, ModelError> {
        CnnConfig::from_file(path)
    }

    fn config_for_labels(path: &Path, labels: &[String]) -> Result<CnnConfig, ModelError> {
        CnnConfig::for_labels(path, labels)
    }

    fn class_names(config: &CnnConfig) -> Option<Vec<String>> {
        config.labels.clone()
    }
}
