//! The plain CNN as an ONNX graph through `mopt_export::cnn`: Conv with BatchNorm folded, Relu,
//! MaxPool, GlobalAveragePool, Flatten, Gemm. Input `image`, output `logits`.

use mopt_data::ImageBatch;
use mopt_export::cnn::{export_cnn, CnnLayer};
use mopt_export::onnx::ModelProto;
use mopt_export::{ExportError, Exportable, InputSpec};
use serde_json::{Map, Value};

use super::{Cnn, CnnConfig};

impl Exportable for Cnn {
    fn inputs(c: &CnnConfig) -> Vec<InputSpec> {
        crate::shape_file::image_input(c.channels, c.image_size)
    }

    fn onnx(&self, c: &CnnConfig) -> Result<ModelProto, ExportError> {
        let mut layers = Vec::new();
        for b in &self.blocks {
            layers.push(CnnLayer::Conv {
                conv: &b.conv,
                bn: Some(&b.bn),
            });
            layers.push(CnnLayer::Relu);
            layers.push(CnnLayer::MaxPool(&b.pool));
        }
        layers.extend([
            CnnLayer::GlobalAvgPool,
            CnnLayer::Flatten,
            CnnLayer::Linear(&self.classifier),
        ]);
        let side = c.image_size;
        Ok(export_cnn(&layers, c.channels, side, side, c.num_labels))
    }

    fn feed(batch: &ImageBatch) -> Map<String, Value> {
        crate::shape_file::image_feed(batch)
    }

    /// A single image and a batch of 64.
    fn bench_batches() -> Vec<usize> {
        vec![1, 64]
    }

    fn card_facts(c: &CnnConfig) -> Map<String, Value> {
        mopt_core::ModelConfig::facts(c)
    }
}
