//! The ResNet as an ONNX graph: every convolution with its BatchNorm folded in
//! ([`mopt_export::cnn::fold_batch_norm`]), ReLU, `Add` for the residual sums, global average
//! pooling and a `Gemm` classifier. Input `image` `[batch, channels, side, side]`, normalised as
//! the checkpoint's `preprocess.json` says.
//!
//! A quantized network exports as QDQ: a quantized convolution reads `DequantizeLinear` of its
//! quantized input, its int8 weight (per output channel, axis 0) and its int32 bias, and writes
//! through `QuantizeLinear → DequantizeLinear` where its output is quantized; ONNX Runtime fuses
//! that into `QLinearConv` (a ReLU before a zero-point-0 `QuantizeLinear` is dropped), and the
//! residual `Add` of two dequantized inputs followed by a quantized ReLU into `QLinearAdd`.

use mopt_data::ImageBatch;
use mopt_export::cnn::{fold_batch_norm, image_io};
use mopt_export::graph::{data, dims, int, ints, GraphBuilder};
use mopt_export::onnx::ModelProto;
use mopt_export::qdq::{dq_bias, dq_weight, qdq_activation, QdqCache};
use mopt_export::{ExportError, Exportable, InputSpec};
use mopt_quant::node::QuantConfig;
use serde_json::{Map, Value};

use super::{BasicBlock, ConvBn, ResNet, ResNetConfig};

/// The graph being written: the builder and the shared quantized activations.
#[derive(Default)]
struct Writer {
    g: GraphBuilder,
    cache: QdqCache,
}

impl Writer {
    /// A folded convolution reading `x`, named `name` (QDQ when quantized).
    fn conv(&mut self, c: &ConvBn, x: &str, name: &str) -> String {
        let (w, b) = fold_batch_norm(&c.conv, c.bn.as_ref());
        let wd = dims(&c.conv.weight);
        let (k, s) = (c.conv.kernel_size[0] as i64, c.conv.stride[0] as i64);
        let p = k / 2;
        let g = &mut self.g;
        let (x, w, b) = match &c.quant {
            Some(q) => (
                qdq_activation(g, x, &q.input, &format!("{name}.input"), &mut self.cache),
                dq_weight(g, name, &wd, &w, &q.weight),
                dq_bias(g, name, &b, &q.input, &q.weight),
            ),
            None => (
                x.to_string(),
                g.f32s(&format!("{name}.weight"), &wd, &w),
                g.f32s(&format!("{name}.bias"), &[wd[0]], &b),
            ),
        };
        let attrs = vec![
            ints("kernel_shape", &[k, k]),
            ints("strides", &[s, s]),
            ints("pads", &[p, p, p, p]),
            int("group", 1),
        ];
        let y = g.op("Conv", &[&x, &w, &b], attrs, name);
        match c.quant.as_ref().and_then(|q| q.output.as_ref()) {
            Some(o) => qdq_activation(g, &y, o, &format!("{name}.output"), &mut self.cache),
            None => y,
        }
    }

    /// A BasicBlock reading `x`, its folder `p` (`stages.0.1`).
    fn block(&mut self, block: &BasicBlock, x: &str, p: &str) -> String {
        let y = self.conv(&block.conv1, x, &format!("{p}.conv1"));
        let y = self.g.op("Relu", &[&y], vec![], &format!("{p}.relu1"));
        let y = self.conv(&block.conv2, &y, &format!("{p}.conv2"));
        let out_quantized = block
            .conv2
            .quant
            .as_ref()
            .is_some_and(|q| q.output.is_some());
        let skip = match (&block.shortcut, &block.conv1.quant) {
            (Some(sc), _) => self.conv(sc, x, &format!("{p}.shortcut")),
            // The identity shortcut reads x as the first convolution quantizes it (the
            // same `DequantizeLinear`, from the cache).
            (None, Some(q)) if out_quantized => {
                let prefix = format!("{p}.conv1.input");
                qdq_activation(&mut self.g, x, &q.input, &prefix, &mut self.cache)
            }
            (None, _) => x.to_string(),
        };
        let sum = self.g.op("Add", &[&y, &skip], vec![], &format!("{p}.add"));
        self.g.op("Relu", &[&sum], vec![], &format!("{p}.relu"))
    }

    /// The classifier on the pooled features `x` (MatMul on quantized inputs when quantized).
    fn classifier(&mut self, net: &ResNet, x: &str) -> String {
        let l = &net.classifier;
        let bias = l.bias.as_ref().expect("the classifier has a bias");
        let g = &mut self.g;
        let b = g.f32s("classifier.bias", &dims(bias), &data(bias));
        match &net.classifier_quant {
            Some(q) => {
                let x = qdq_activation(g, x, &q.input, "classifier.input", &mut self.cache);
                let w = dq_weight(
                    g,
                    "classifier",
                    &dims(&l.weight),
                    &data(&l.weight),
                    &q.weight,
                );
                let y = g.op("MatMul", &[&x, &w], vec![], "classifier.matmul");
                g.op("Add", &[&y, &b], vec![], "classifier")
            }
            None => {
                let w = g.f32s("classifier.weight", &dims(&l.weight), &data(&l.weight));
                g.op("Gemm", &[x, &w, &b], vec![], "classifier")
            }
        }
    }
}

impl Exportable for ResNet {
    fn inputs(c: &ResNetConfig) -> Vec<InputSpec> {
        crate::shape_file::image_input(c.channels, c.image_size)
    }

    fn onnx(&self, c: &ResNetConfig) -> Result<ModelProto, ExportError> {
        let mut w = Writer::default();
        let stem = w.conv(&self.stem, "image", "stem");
        let mut x = w.g.op("Relu", &[&stem], vec![], "stem_relu");
        for (s, stage) in self.stages.iter().enumerate() {
            for (b, block) in stage.iter().enumerate() {
                x = w.block(block, &x, &format!("stages.{s}.{b}"));
            }
        }
        let pooled = w.g.op("GlobalAveragePool", &[&x], vec![], "pool");
        let flat =
            w.g.op("Flatten", &[&pooled], vec![int("axis", 1)], "flatten");
        let logits = w.classifier(self, &flat);
        let mut g = w.g;
        g.op_into("Identity", &[&logits], vec![], "logits");
        let side = (c.image_size, c.image_size);
        let (inputs, outputs) = image_io(c.channels, side, c.num_labels);
        let graph = g.finish("mopt_resnet", inputs, outputs);
        Ok(ModelProto::new(
            graph,
            "ResNet image classifier exported by mopt",
            &[],
        ))
    }

    fn feed(batch: &ImageBatch) -> Map<String, Value> {
        crate::shape_file::image_feed(batch)
    }

    /// Stage widths and block widths (a pruned network's shape).
    fn card_facts(c: &ResNetConfig) -> Map<String, Value> {
        mopt_core::ModelConfig::facts(c)
    }

    /// A single image and a batch of 64 (the image path's serving batch).
    fn bench_batches() -> Vec<usize> {
        vec![1, 64]
    }

    fn quantization(c: &ResNetConfig) -> Option<QuantConfig> {
        c.quant.clone()
    }
}
