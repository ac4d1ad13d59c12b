//! Bring your own model: an MLP for 28×28 digits, defined here with the `mopt-core` contracts
//! implemented here (no mopt crate knows it), registered as a model family and run through the
//! same recipe runner and command line as `mopt-train`: fine-tune → distill (beside its
//! hard-label twin) → prune neurons in rounds → INT8 PTQ → ONNX, every stage gated, one report.
//!
//! ```sh
//! datasets/fetch.sh --small && python3 -m pip install -r requirements-export.txt
//! cargo run --example custom_model -- examples/recipes/custom_mlp.toml            # ~1 minute
//! cargo run --example custom_model -- examples/recipes/custom_mlp.toml --check    # the plan
//! ```
//!
//! The contracts, in the order a model implements them: [`ModelConfig`] and [`ShapeFile`] (its
//! config) → [`Classifier`] (fine-tuning, evaluation, gates) → [`Checkpoint`] (save, reload) →
//! [`FeatureMaps`] (distillation) → [`Prunable`] (`prune`) → [`Quantizable`] (`ptq`, `qat`) →
//! [`Exportable`] (`export`). [`ImageModel`] turns the type into a family of image classifiers.

use std::path::Path;

use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::activation::relu;
use mopt_core::prune::{GroupKind, Member, Prunable};
use mopt_core::quant::{QuantSlot, QuantSlotRef};
use mopt_core::{
    Checkpoint, Classifier, FeatureMaps, MemoryEstimate, ModelConfig, ModelFault, Quantizable,
};
use mopt_data::ImageBatch;
use mopt_export::graph::{data, dims, int, GraphBuilder};
use mopt_export::onnx::{dtype, value_info, Dim, ModelProto};
use mopt_export::qdq::{dq_weight, qdq_activation, QdqCache};
use mopt_export::{ExportError, Exportable, InputSpec};
use mopt_families::image::{ImageFamily, ImageModel};
use mopt_models::burnpack::load_burnpack;
use mopt_models::shape_file::{self, ShapeFile};
use mopt_quant::node::{LinearQuant, Phase, QuantConfig};
use mopt_stages::family::Capabilities;
use mopt_stages::kinds::quantize;
use serde::{Deserialize, Serialize};

/// An MLP on `channels × image_size²` pixels: `hidden[0] → … → num_labels`, ReLU between.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MlpConfig {
    pub channels: usize,
    pub image_size: usize,
    pub hidden: Vec<usize>,
    /// The data's classes (filled in from the data set).
    #[serde(default)]
    pub num_labels: usize,
    #[serde(default)]
    pub labels: Option<Vec<String>>,
    /// Quantized models: where and how (the scales are saved with the weights).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quant: Option<QuantConfig>,
}

impl MlpConfig {
    fn widths(&self) -> Vec<usize> {
        let inputs = self.channels * self.image_size * self.image_size;
        [&[inputs][..], &self.hidden, &[self.num_labels]].concat()
    }
}

/// The module. `quant[i]` sits beside `layers[i]` (`None`: float).
#[derive(Module, Debug)]
pub struct Mlp {
    pub layers: Vec<Linear>,
    pub quant: Vec<Option<LinearQuant>>,
}

impl Mlp {
    /// # Shapes
    /// - images: `[batch, channels, side, side]` → `[batch, num_labels]`
    pub fn forward(&self, images: Tensor<4>) -> Tensor<2> {
        let mut x: Tensor<2> = images.flatten(1, 3);
        for (i, (l, q)) in self.layers.iter().zip(&self.quant).enumerate() {
            let (xq, w) = match q {
                Some(q) => (q.input.forward(x), q.weight.forward(l.weight.val())),
                None => (x, l.weight.val()),
            };
            x = xq.matmul(w) + l.bias.as_ref().expect("bias").val().unsqueeze();
            if i + 1 < self.layers.len() {
                x = relu(x);
            }
        }
        x
    }
}

impl ModelConfig for MlpConfig {
    fn arch(&self) -> &'static str {
        "mlp"
    }
    fn num_params(&self) -> usize {
        self.widths().windows(2).map(|w| w[0] * w[1] + w[1]).sum()
    }
    fn num_labels(&self) -> usize {
        self.num_labels
    }
    fn flops(&self, _size: usize) -> f64 {
        2.0 * (self.num_params() - self.widths()[1..].iter().sum::<usize>()) as f64
    }
    fn summary(&self) -> Vec<(String, String)> {
        vec![("widths".into(), format!("{:?}", self.widths()))]
    }
    fn is_quantized(&self) -> bool {
        self.quant.is_some()
    }
    fn training_memory(&self, batch: usize, _size: usize) -> MemoryEstimate {
        let acts: usize = self.widths().iter().map(|w| 2 * batch * w).sum();
        MemoryEstimate::adamw_f32(self.num_params(), acts as u64)
    }
}

impl ShapeFile for MlpConfig {
    const KEYS: &'static str = "an MLP config: channels, image_size, hidden";
    fn validate(&self) -> Result<(), String> {
        match self.widths().contains(&0) {
            true => Err(format!("widths {:?}: every one positive", self.widths())),
            false => Ok(()),
        }
    }
    fn classes_mut(&mut self) -> (&mut usize, &mut Option<Vec<String>>) {
        (&mut self.num_labels, &mut self.labels)
    }
    fn class_names(&self) -> Option<&[String]> {
        self.labels.as_deref()
    }
}

impl Classifier for Mlp {
    type Batch = ImageBatch;
    fn logits(&self, b: &ImageBatch) -> Tensor<2> {
        self.forward(b.images.clone())
    }
}

impl Checkpoint for Mlp {
    type Config = MlpConfig;
    fn init(c: &MlpConfig, device: &Device) -> Self {
        let w = c.widths();
        let linear = |p: &[usize]| LinearConfig::new(p[0], p[1]).init(device);
        let mut m = Mlp {
            layers: w.windows(2).map(linear).collect(),
            quant: (1..w.len()).map(|_| None).collect(),
        };
        if let Some(q) = &c.quant {
            m.attach_quantizers(q, Phase::Quantize, device);
        }
        m
    }
    fn save(&self, config: &MlpConfig, dir: &Path) -> Result<(), ModelFault> {
        Ok(shape_file::save(self, config, "mlp", dir)?)
    }
    fn load(dir: &Path, device: &Device) -> Result<(Self, MlpConfig), ModelFault> {
        let config = MlpConfig::from_file(&dir.join("config.json"))?;
        let mut model = Mlp::init(&config, device);
        load_burnpack(&mut model, &dir.join("model.bpk"))?;
        Ok((model, config))
    }
    fn bench_batch(c: &MlpConfig, n: usize, _: usize, d: &Device) -> Option<ImageBatch> {
        Some(shape_file::pattern_batch(n, c.channels, c.image_size, d))
    }
}

/// No feature maps to match: distillation works on the logits.
impl FeatureMaps for Mlp {
    fn feature_shapes(_: &MlpConfig) -> Vec<[usize; 3]> {
        Vec::new()
    }
    fn forward_maps(&self, batch: &ImageBatch) -> (Vec<Tensor<4>>, Tensor<2>) {
        (Vec::new(), self.logits(batch))
    }
}

/// The neurons of each hidden layer: column `j` (and bias `j`) of layer `s`, row `j` of `s + 1`.
pub struct Neurons;

impl GroupKind for Neurons {
    type Config = MlpConfig;
    fn name(&self) -> &'static str {
        "neurons"
    }
    fn scopes(&self, c: &MlpConfig) -> usize {
        c.hidden.len()
    }
    fn units(&self, c: &MlpConfig, s: usize) -> usize {
        c.hidden[s]
    }
    fn members(&self, _: &MlpConfig, s: usize, j: usize) -> Vec<Member> {
        vec![
            Member::new(format!("layers.{s}.weight"), 1, vec![j]),
            Member::new(format!("layers.{s}.bias"), 0, vec![j]),
            Member::new(format!("layers.{}.weight", s + 1), 0, vec![j]),
        ]
    }
    fn resize(&self, c: &MlpConfig, keep: &[Vec<usize>]) -> MlpConfig {
        let hidden = keep.iter().map(Vec::len).collect();
        MlpConfig {
            hidden,
            ..c.clone()
        }
    }
}

impl Prunable for Mlp {
    fn group_kinds() -> Vec<&'static dyn GroupKind<Config = MlpConfig>> {
        vec![&Neurons]
    }
    fn layers(c: &MlpConfig) -> usize {
        c.hidden.len()
    }
}

impl Quantizable for Mlp {
    fn quantization(c: &MlpConfig) -> Option<&QuantConfig> {
        c.quant.as_ref()
    }
    fn with_quantization(c: &MlpConfig, quant: Option<QuantConfig>) -> MlpConfig {
        MlpConfig { quant, ..c.clone() }
    }
    fn quant_slots(&mut self) -> Vec<QuantSlot<'_>> {
        let pairs = self.layers.iter_mut().zip(self.quant.iter_mut());
        let slot = |(i, (l, q))| QuantSlot::linear(format!("layers.{i}"), l, q);
        pairs.enumerate().map(slot).collect()
    }
    fn quant_slots_ref(&self) -> Vec<QuantSlotRef<'_>> {
        let pairs = self.layers.iter().zip(&self.quant);
        let slot = |(i, (l, q))| QuantSlotRef::linear(format!("layers.{i}"), l, q);
        pairs.enumerate().map(slot).collect()
    }
}

impl Exportable for Mlp {
    fn inputs(c: &MlpConfig) -> Vec<InputSpec> {
        shape_file::image_input(c.channels, c.image_size)
    }

    /// `Flatten`, then `Gemm` (+ `Relu`) per layer; a quantized layer reads its input through
    /// `QuantizeLinear → DequantizeLinear` and its int8 weight through `DequantizeLinear`.
    fn onnx(&self, c: &MlpConfig) -> Result<ModelProto, ExportError> {
        let (mut g, mut cache) = (GraphBuilder::default(), QdqCache::new());
        let mut x = g.op("Flatten", &["image"], vec![int("axis", 1)], "flatten");
        for (i, (l, q)) in self.layers.iter().zip(&self.quant).enumerate() {
            let (name, shape) = (format!("layers.{i}"), dims(&l.weight));
            let b = data(l.bias.as_ref().expect("bias"));
            let b = g.f32s(&format!("{name}.bias"), &[shape[1]], &b);
            x = match q {
                None => {
                    let w = g.f32s(&format!("{name}.weight"), &shape, &data(&l.weight));
                    g.op("Gemm", &[&x, &w, &b], vec![], &name)
                }
                Some(q) => {
                    let xq =
                        qdq_activation(&mut g, &x, &q.input, &format!("{name}.input"), &mut cache);
                    let w = dq_weight(&mut g, &name, &shape, &data(&l.weight), &q.weight);
                    let y = g.op("MatMul", &[&xq, &w], vec![], &format!("{name}.matmul"));
                    g.op("Add", &[&y, &b], vec![], &name)
                }
            };
            if i + 1 < self.layers.len() {
                x = g.op("Relu", &[&x], vec![], &format!("relu{i}"));
            }
        }
        g.op_into("Identity", &[&x], vec![], "logits");
        let input = value_info("image", dtype::FLOAT, &Self::inputs(c)[0].dims);
        let n = Dim::Fixed(c.num_labels as i64);
        let output = value_info("logits", dtype::FLOAT, &[Dim::Named("batch"), n]);
        let graph = g.finish("mlp", vec![input], vec![output]);
        Ok(ModelProto::new(
            graph,
            "MLP (examples/custom_model.rs)",
            &[],
        ))
    }

    fn feed(b: &ImageBatch) -> serde_json::Map<String, serde_json::Value> {
        shape_file::image_feed(b)
    }

    /// The export is QDQ (judged by prediction agreement) when the model was quantized.
    fn quantization(c: &MlpConfig) -> Option<QuantConfig> {
        c.quant.clone()
    }
}

/// The MLP as a family of image classifiers: `[model] arch = "mlp"`.
impl ImageModel for Mlp {
    type Shape = MlpConfig;
    const ARCH: &'static str = "mlp";
    const NAME: &'static str = "an MLP";

    fn more_capabilities(capabilities: Capabilities) -> Capabilities {
        capabilities.with(quantize::capability::<Mlp>())
    }
}

/// `mopt-train`'s whole command line, with the MLP family registered beside the shipped ones.
fn main() -> std::process::ExitCode {
    let registry = mopt::builtin().with_family(ImageFamily::<Mlp>::new());
    mopt::cli::main(registry)
}
