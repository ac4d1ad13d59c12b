//! The ResNet as an ONNX graph: every convolution with its BatchNorm folded in
//! ([`mopt_export::cnn::fold_batch_norm`]), ReLU, `Add` for the residual sums, global average
//! pooling and a `Gemm` classifier. Input `image` `[batch, channels, side, side]`, normalised as
//! the checkpoint's `preprocess.json` says.

use mopt_data::ImageBatch;
use mopt_export::cnn::fold_batch_norm;
use mopt_export::graph::{data, dims, int, ints, GraphBuilder};
use mopt_export::onnx::{dtype, value_info, Dim, ModelProto};
use mopt_export::{tensor_json, ExportError, Exportable, InputSpec, InputType};
use serde_json::{Map, Value};

use super::{ConvBn, ResNet, ResNetConfig};

/// A folded convolution reading `x`, named `name`.
fn conv(g: &mut GraphBuilder, c: &ConvBn, x: &str, name: &str) -> String {
    let (w, b) = fold_batch_norm(&c.conv, Some(&c.bn));
    let wd = dims(&c.conv.weight);
    let (k, s) = (c.conv.kernel_size[0] as i64, c.conv.stride[0] as i64);
    let p = k / 2;
    let w = g.f32s(&format!("{name}.weight"), &wd, &w);
    let b = g.f32s(&format!("{name}.bias"), &[wd[0]], &b);
    let attrs = vec![
        ints("kernel_shape", &[k, k]),
        ints("strides", &[s, s]),
        ints("pads", &[p, p, p, p]),
        int("group", 1),
    ];
    g.op("Conv", &[x, &w, &b], attrs, name)
}

impl Exportable for ResNet {
    fn inputs(c: &ResNetConfig) -> Vec<InputSpec> {
        vec![InputSpec {
            name: "image".into(),
            dtype: InputType::Float,
            dims: vec![
                Dim::Named("batch"),
                Dim::Fixed(c.channels as i64),
                Dim::Fixed(c.image_size as i64),
                Dim::Fixed(c.image_size as i64),
            ],
        }]
    }

    fn onnx(&self, c: &ResNetConfig) -> Result<ModelProto, ExportError> {
        let mut g = GraphBuilder::default();
        let stem = conv(&mut g, &self.stem, "image", "stem");
        let mut x = g.op("Relu", &[&stem], vec![], "stem_relu");
        for (s, stage) in self.stages.iter().enumerate() {
            for (b, block) in stage.iter().enumerate() {
                let p = format!("stages.{s}.{b}");
                let y = conv(&mut g, &block.conv1, &x, &format!("{p}.conv1"));
                let y = g.op("Relu", &[&y], vec![], &format!("{p}.relu1"));
                let y = conv(&mut g, &block.conv2, &y, &format!("{p}.conv2"));
                let skip = match &block.shortcut {
                    Some(sc) => conv(&mut g, sc, &x, &format!("{p}.shortcut")),
                    None => x.clone(),
                };
                let sum = g.op("Add", &[&y, &skip], vec![], &format!("{p}.add"));
                x = g.op("Relu", &[&sum], vec![], &format!("{p}.relu"));
            }
        }
        let pooled = g.op("GlobalAveragePool", &[&x], vec![], "pool");
        let flat = g.op("Flatten", &[&pooled], vec![int("axis", 1)], "flatten");
        let l = &self.classifier;
        let w = g.f32s("classifier.weight", &dims(&l.weight), &data(&l.weight));
        let bias = l.bias.as_ref().expect("the classifier has a bias");
        let b = g.f32s("classifier.bias", &dims(bias), &data(bias));
        let logits = g.op("Gemm", &[&flat, &w, &b], vec![], "classifier");
        g.op_into("Identity", &[&logits], vec![], "logits");
        let graph = g.finish(
            "mopt_resnet",
            vec![value_info(
                "image",
                dtype::FLOAT,
                &[
                    Dim::Named("batch"),
                    Dim::Fixed(c.channels as i64),
                    Dim::Fixed(c.image_size as i64),
                    Dim::Fixed(c.image_size as i64),
                ],
            )],
            vec![value_info(
                "logits",
                dtype::FLOAT,
                &[Dim::Named("batch"), Dim::Fixed(c.num_labels as i64)],
            )],
        );
        Ok(ModelProto::new(
            graph,
            "ResNet image classifier exported by mopt",
            &[],
        ))
    }

    fn feed(batch: &ImageBatch) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("image".into(), tensor_json(batch.images.to_data()));
        m
    }

    /// Stage widths and block widths (a pruned network's shape).
    fn card_facts(c: &ResNetConfig) -> Map<String, Value> {
        mopt_core::ModelConfig::facts(c)
    }
}
