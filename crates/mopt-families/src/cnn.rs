//! Plain CNNs on grey images (`mopt_models::cnn`) as an image family (no quantization yet).

use mopt_models::cnn::{Cnn, CnnConfig};

use crate::image::{ImageFamily, ImageModel};

/// The plain-CNN family.
pub const CNN: ImageFamily<Cnn> = ImageFamily::new();

impl ImageModel for Cnn {
    const ARCH: &'static str = "cnn";
    type Shape = CnnConfig;
    const NAME: &'static str = "a CNN";
}
