//! A fastText-style text classifier as a model family of its own, written against mopt's public
//! API from outside the repository's crates: token embeddings of the run's WordPiece ids,
//! averaged over the tokens (padding masked), a hidden layer with ReLU, the logits. The stock
//! `distill` stage distils the shipped BERT teacher into it (logit KD across families: the
//! teacher's logits on the same batches), then `prune` removes hidden neurons, `ptq` quantizes
//! both layers to int8 and `export` writes QDQ ONNX. `[model]` / `[stage.student]` keys of its
//! own: `embedding-dim` and `hidden` (over the shape file's).

use std::path::Path;

use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::activation::relu;
use mopt_core::prune::{GroupKind, Member, Prunable};
use mopt_core::quant::{QuantSlot, QuantSlotRef};
use mopt_core::{Checkpoint, Classifier, MemoryEstimate, ModelConfig, ModelFault, Quantizable};
use mopt_data::{TextBatch, TokenizerSpec};
use mopt_export::graph::{data, dims, int, GraphBuilder};
use mopt_export::onnx::{dtype, value_info, Dim, ModelProto};
use mopt_export::qdq::{dq_weight, qdq_activation, QdqCache};
use mopt_export::{ExportError, Exportable, InputSpec, InputType};
use mopt_models::burnpack::load_burnpack;
use mopt_models::shape_file;
use mopt_quant::node::{LinearQuant, Phase, QuantConfig};
use mopt_recipe::{ModelSpec, Recipe, StageEntry};
use mopt_stages::data::text::{Text, TextData};
use mopt_stages::data::{DataSource, RunData};
use mopt_stages::family::{Capabilities, Family};
use mopt_stages::kinds::distill::{CanDistill, DistillStage};
use mopt_stages::kinds::{export, finetune, kd, kd_student, prune, quantize};
use mopt_stages::record::{measure_checkpoint, EvalSettings, ModelFacts};
use mopt_stages::shape::Shape;
use mopt_stages::stage::{PlanContext, StageContext, StageOutput, StagePlan};
use mopt_stages::StageError;
use serde::{Deserialize, Serialize};

/// The family's `[model] arch`.
pub const ARCH: &str = "fasttext";

/// The shape: `vocab_size × embedding_dim` table → `hidden` → `num_labels`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FastTextConfig {
    /// Token ids the table holds (the tokenizer's vocabulary).
    #[serde(default)]
    pub vocab_size: usize,
    /// Width of a token's embedding.
    pub embedding_dim: usize,
    /// Neurons of the hidden layer.
    pub hidden: usize,
    /// Classes, and their names (from the data).
    #[serde(default)]
    pub num_labels: usize,
    #[serde(default)]
    pub labels: Option<Vec<String>>,
    /// Quantized models: where and how (the scales are saved with the weights).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quant: Option<QuantConfig>,
}

/// The model. `quant[i]` sits beside `layers[i]` (`None`: float).
#[derive(Module, Debug)]
pub struct FastText {
    pub embedding: Embedding,
    pub layers: Vec<Linear>,
    pub quant: Vec<Option<LinearQuant>>,
}

impl FastText {
    /// # Shapes
    /// - ids, mask: `[batch, seq]` → `[batch, num_labels]`
    pub fn forward(&self, ids: Tensor<2, Int>, mask: Tensor<2>) -> Tensor<2> {
        let [b, _] = ids.dims();
        let e = self.embedding.forward(ids); // [batch, seq, dim]
        let d = e.dims()[2];
        let sum = (e * mask.clone().unsqueeze_dim(2))
            .sum_dim(1)
            .reshape([b, d]);
        let mut x = sum / mask.sum_dim(1).clamp_min(1.0);
        for (i, (l, q)) in self.layers.iter().zip(&self.quant).enumerate() {
            let (xq, w) = match q {
                Some(q) => (q.input.forward(x), q.weight.forward(l.weight.val())),
                None => (x, l.weight.val()),
            };
            x = xq.matmul(w) + l.bias.as_ref().expect("bias").val().unsqueeze();
            if i == 0 {
                x = relu(x);
            }
        }
        x
    }
}

impl ModelConfig for FastTextConfig {
    fn arch(&self) -> &'static str {
        ARCH
    }
    fn num_params(&self) -> usize {
        let (v, e, h, l) = (
            self.vocab_size,
            self.embedding_dim,
            self.hidden,
            self.num_labels,
        );
        v * e + e * h + h + h * l + l
    }
    fn num_labels(&self) -> usize {
        self.num_labels
    }
    fn flops(&self, size: usize) -> f64 {
        let (e, h, l) = (self.embedding_dim, self.hidden, self.num_labels);
        (size * e + 2 * (e * h + h * l)) as f64
    }
    fn summary(&self) -> Vec<(String, String)> {
        let w = format!(
            "{} x {} -> {} -> {}",
            self.vocab_size, self.embedding_dim, self.hidden, self.num_labels
        );
        vec![("widths".into(), w)]
    }
    fn is_quantized(&self) -> bool {
        self.quant.is_some()
    }
    fn training_memory(&self, batch: usize, size: usize) -> MemoryEstimate {
        let acts = 2 * batch * (size * self.embedding_dim + self.hidden + self.num_labels);
        MemoryEstimate::adamw_f32(self.num_params(), acts as u64)
    }
}

impl Classifier for FastText {
    type Batch = TextBatch;
    fn logits(&self, b: &TextBatch) -> Tensor<2> {
        self.forward(b.input_ids.clone(), b.attention_mask.clone())
    }
}

impl Checkpoint for FastText {
    type Config = FastTextConfig;
    fn init(c: &FastTextConfig, device: &Device) -> Self {
        let mut m = FastText {
            embedding: EmbeddingConfig::new(c.vocab_size, c.embedding_dim).init(device),
            layers: vec![
                LinearConfig::new(c.embedding_dim, c.hidden).init(device),
                LinearConfig::new(c.hidden, c.num_labels).init(device),
            ],
            quant: vec![None, None],
        };
        if let Some(q) = &c.quant {
            m.attach_quantizers(q, Phase::Quantize, device);
        }
        m
    }
    fn save(&self, config: &FastTextConfig, dir: &Path) -> Result<(), ModelFault> {
        Ok(shape_file::save(self, config, ARCH, dir)?)
    }
    fn load(dir: &Path, device: &Device) -> Result<(Self, FastTextConfig), ModelFault> {
        let config = read_config(&dir.join("config.json"))?;
        let mut model = FastText::init(&config, device);
        load_burnpack(&mut model, &dir.join("model.bpk"))?;
        Ok((model, config))
    }
    /// `n` rows of `size` tokens (ids spread over the table), for the latency benchmarks.
    fn bench_batch(c: &FastTextConfig, n: usize, size: usize, d: &Device) -> Option<TextBatch> {
        let ids: Vec<i64> = (0..n * size)
            .map(|i| (i * 7919 % c.vocab_size) as i64)
            .collect();
        Some(TextBatch {
            input_ids: Tensor::from_data(TensorData::new(ids, [n, size]), d),
            attention_mask: Tensor::ones([n, size], d),
            token_type_ids: Tensor::zeros([n, size], d),
            labels: Tensor::zeros([n], d),
        })
    }
}

/// The hidden layer's neurons: column `j` (and bias `j`) of layer 0, row `j` of layer 1.
pub struct Neurons;

impl GroupKind for Neurons {
    type Config = FastTextConfig;
    fn name(&self) -> &'static str {
        "neurons"
    }
    fn scopes(&self, _: &FastTextConfig) -> usize {
        1
    }
    fn units(&self, c: &FastTextConfig, _: usize) -> usize {
        c.hidden
    }
    fn members(&self, _: &FastTextConfig, _: usize, j: usize) -> Vec<Member> {
        vec![
            Member::new("layers.0.weight", 1, vec![j]),
            Member::new("layers.0.bias", 0, vec![j]),
            Member::new("layers.1.weight", 0, vec![j]),
        ]
    }
    fn resize(&self, c: &FastTextConfig, keep: &[Vec<usize>]) -> FastTextConfig {
        FastTextConfig {
            hidden: keep[0].len(),
            ..c.clone()
        }
    }
}

impl Prunable for FastText {
    fn group_kinds() -> Vec<&'static dyn GroupKind<Config = FastTextConfig>> {
        vec![&Neurons]
    }
    /// One layer of neurons: the hidden one.
    fn layers(_: &FastTextConfig) -> usize {
        1
    }
}

impl Quantizable for FastText {
    fn quantization(c: &FastTextConfig) -> Option<&QuantConfig> {
        c.quant.as_ref()
    }
    fn with_quantization(c: &FastTextConfig, quant: Option<QuantConfig>) -> FastTextConfig {
        FastTextConfig { quant, ..c.clone() }
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

const INPUTS: [&str; 2] = ["input_ids", "attention_mask"];

impl Exportable for FastText {
    fn inputs(_: &FastTextConfig) -> Vec<InputSpec> {
        let dims = || vec![Dim::Named("batch"), Dim::Named("sequence")];
        let spec = |n: &str| InputSpec {
            name: n.into(),
            dtype: InputType::Int64,
            dims: dims(),
        };
        INPUTS.iter().map(|n| spec(n)).collect()
    }

    /// `Gather` → masked mean (`Mul`, `ReduceSum`, `Div`) → `Gemm` + `Relu` → `Gemm`; a
    /// quantized layer reads its input through `QuantizeLinear → DequantizeLinear` and its int8
    /// weight through `DequantizeLinear`.
    fn onnx(&self, c: &FastTextConfig) -> Result<ModelProto, ExportError> {
        let (mut g, mut cache) = (GraphBuilder::default(), QdqCache::new());
        let w = &self.embedding.weight;
        let table = g.f32s("embedding.weight", &dims(w), &data(w));
        let e = g.op(
            "Gather",
            &[&table, INPUTS[0]],
            vec![int("axis", 0)],
            "embed",
        );
        let to_float = vec![int("to", dtype::FLOAT as i64)];
        let m = g.op("Cast", &[INPUTS[1]], to_float, "mask_f");
        let (axis1, axis2) = (g.shape("axis1", &[1]), g.shape("axis2", &[2]));
        let m3 = g.op("Unsqueeze", &[&m, &axis2], vec![], "mask_u");
        let masked = g.op("Mul", &[&e, &m3], vec![], "masked");
        let keep = vec![int("keepdims", 0)];
        let sum = g.op("ReduceSum", &[&masked, &axis1], keep, "sum");
        let n = g.op(
            "ReduceSum",
            &[&m, &axis1],
            vec![int("keepdims", 1)],
            "count",
        );
        let one = g.scalar("one", 1.0);
        let n = g.op("Max", &[&n, &one], vec![], "count_min1");
        let mut x = g.op("Div", &[&sum, &n], vec![], "mean");
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
                    let input = format!("{name}.input");
                    let xq = qdq_activation(&mut g, &x, &q.input, &input, &mut cache);
                    let w = dq_weight(&mut g, &name, &shape, &data(&l.weight), &q.weight);
                    let y = g.op("MatMul", &[&xq, &w], vec![], &format!("{name}.matmul"));
                    g.op("Add", &[&y, &b], vec![], &name)
                }
            };
            if i == 0 {
                x = g.op("Relu", &[&x], vec![], "relu");
            }
        }
        g.op_into("Identity", &[&x], vec![], "logits");
        let inputs = Self::inputs(c)
            .iter()
            .map(|s| value_info(&s.name, dtype::INT64, &s.dims))
            .collect();
        let classes = Dim::Fixed(c.num_labels as i64);
        let output = value_info("logits", dtype::FLOAT, &[Dim::Named("batch"), classes]);
        let graph = g.finish(ARCH, inputs, vec![output]);
        Ok(ModelProto::new(
            graph,
            "fastText-style classifier (examples/fasttext)",
            &[],
        ))
    }

    fn feed(b: &TextBatch) -> serde_json::Map<String, serde_json::Value> {
        let mut m = serde_json::Map::new();
        m.insert(
            INPUTS[0].into(),
            mopt_export::tensor_json(b.input_ids.to_data()),
        );
        m.insert(
            INPUTS[1].into(),
            mopt_export::tensor_json(b.attention_mask.to_data()),
        );
        m
    }

    fn quantization(c: &FastTextConfig) -> Option<QuantConfig> {
        c.quant.clone()
    }
}

fn read_config(path: &Path) -> Result<FastTextConfig, ModelFault> {
    let fault = |message: String| ModelFault::input(format!("{}: {message}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| fault(e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| {
        fault(format!(
            "not a fastText shape ({e}): give embedding_dim and hidden"
        ))
    })
}

/// The family's keys of a model table: the shape file's sizes, overridden.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Keys {
    embedding_dim: Option<usize>,
    hidden: Option<usize>,
}

/// The shape a model table builds for `labels` over a vocabulary of `vocab` token ids.
fn model_config(
    m: &ModelSpec,
    labels: &[String],
    vocab: usize,
) -> Result<FastTextConfig, StageError> {
    let keys: Keys = m.family_keys(ARCH)?;
    let mut c = read_config(&m.config)?;
    c.embedding_dim = keys.embedding_dim.unwrap_or(c.embedding_dim);
    c.hidden = keys.hidden.unwrap_or(c.hidden);
    if c.embedding_dim == 0 || c.hidden == 0 {
        let fix = "give embedding-dim and hidden of at least 1";
        return Err(m.err("hidden", "a width of 0", fix).into());
    }
    (c.vocab_size, c.num_labels, c.labels) = (vocab, labels.len(), Some(labels.to_vec()));
    Ok(c)
}

/// The family: `[model] arch = "fasttext"` on text data.
pub struct FastTextFamily;

impl Family for FastTextFamily {
    fn arch(&self) -> &'static str {
        ARCH
    }
    fn data(&self) -> &'static dyn DataSource {
        &Text
    }
    fn model_shape(
        &self,
        m: &ModelSpec,
        _: Option<&TokenizerSpec>,
        _: &mopt_recipe::Scope,
        labels: &[String],
        vocab: usize,
    ) -> Result<Shape, StageError> {
        Ok(Shape::new(model_config(m, labels, vocab)?))
    }
    fn build(
        &self,
        r: &Recipe,
        data: &RunData,
        device: &Device,
        ckpt: &Path,
    ) -> Result<(), StageError> {
        let text: &TextData = data.get()?;
        let m = r.model.as_ref().expect("validated: [model] or [teacher]");
        let config = model_config(m, &text.labels.labels, text.vocab())?;
        device.seed(r.run.seed);
        let model = FastText::init(&config, device);
        mopt_train::trainer::save_checkpoint_dir(&model, &config, data, ckpt)?;
        Ok(())
    }
    fn read_shape(&self, dir: &Path) -> Result<Shape, StageError> {
        Ok(Shape::new(read_config(&dir.join("config.json"))?))
    }
    fn measure(
        &self,
        ckpt: &Path,
        data: &RunData,
        ev: &EvalSettings,
    ) -> Result<(ModelFacts, Vec<Vec<f32>>), StageError> {
        measure_checkpoint::<FastText>(ckpt, data, ev, |m| m)
    }
    fn capabilities(&self) -> Capabilities {
        let notes = |len| {
            format!("WordPiece ids of the run's tokenizer (right padding, attention_mask 1 for tokens), up to {len} tokens")
        };
        Capabilities::default()
            .with(finetune::capability::<FastText>())
            .with(prune::capability::<FastText>())
            .with(quantize::capability::<FastText>())
            .with(export::capability::<FastText>(notes))
            .with(kd::teach_capability::<FastText>())
            .with::<dyn CanDistill>(Box::new(Distill))
    }
}

/// A fastText student of any teacher on the same text and classes: logit KD.
struct Distill;

impl CanDistill for Distill {
    fn plan(
        &self,
        stage: &DistillStage,
        entry: &StageEntry,
        input: &Shape,
        cx: &PlanContext,
    ) -> Result<StagePlan, StageError> {
        let labels: Vec<String> = (0..input.num_labels())
            .map(|i| format!("<class {i}>"))
            .collect();
        let student = model_config(&stage.student, &labels, cx.vocab)?;
        kd_student::plan(stage, entry, (input, student), cx)
    }
    fn run(
        &self,
        stage: &DistillStage,
        input: &Path,
        cx: &StageContext,
    ) -> Result<StageOutput, StageError> {
        let text: &TextData = cx.data.get()?;
        let student = model_config(&stage.student, &text.labels.labels, text.vocab())?;
        kd_student::run::<FastText>(stage, input, cx, &student)
    }
}
