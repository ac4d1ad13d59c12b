//! ResNets on grey images (`mopt_models::resnet`) as an image family; they quantize (BatchNorm
//! folded into the convolutions first).

use std::path::Path;

use mopt_core::Quantizable;
use mopt_models::resnet::{ResNet, ResNetConfig};
use mopt_recipe::StageEntry;

use super::image::{ImageFamily, ImageModel};
use crate::error::StageError;
use crate::kinds::quantize::QuantStage;
use crate::shape::Shape;
use crate::stage::{PlanContext, StageContext, StageOutput, StagePlan};

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

    fn quant_default_exclude() -> Option<Vec<String>> {
        Some(ResNet::default_float_paths())
    }

    fn plan_quantize(
        stage: &QuantStage,
        entry: &StageEntry,
        input: &Shape,
        cx: &PlanContext,
    ) -> Result<StagePlan, StageError> {
        stage.plan::<ResNet>(entry, input, cx)
    }

    fn quantize(
        stage: &QuantStage,
        input: &Path,
        cx: &StageContext,
    ) -> Result<StageOutput, StageError> {
        stage.run::<ResNet>(input, cx)
    }
}
