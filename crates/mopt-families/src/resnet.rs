//! ResNets on grey images (`mopt_models::resnet`) as an image family; they quantize (BatchNorm
//! folded into the convolutions first).

use mopt_core::Quantizable;
use mopt_models::resnet::{ResNet, ResNetConfig};

use crate::image::{ImageFamily, ImageModel};
use mopt_stages::family::Capabilities;
use mopt_stages::kinds::quantize;

/// The ResNet family.
pub const RESNET: ImageFamily<ResNet> = ImageFamily::new();

impl ImageModel for ResNet {
    const ARCH: &'static str = "resnet";
    type Shape = ResNetConfig;
    const NAME: &'static str = "a ResNet";

    /// Quantized checkpoints are measured with their weights fake-quantized once.
    fn for_measurement(self) -> Self {
        self.with_baked_weights()
    }

    fn more_capabilities(capabilities: Capabilities) -> Capabilities {
        capabilities.with(quantize::capability::<ResNet>())
    }
}
