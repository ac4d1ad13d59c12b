//! Bring your own model. A small MLP classifier for 28×28 digits is defined in this file, with
//! the `mopt-core` contracts implemented here (no line of the library knows it), and compressed
//! by the library's generic algorithms as a gated chain:
//!
//! teacher (fine-tuned) → distilled student (KD on the teacher's cached logits, beside its
//! hard-label twin) → neurons pruned in rounds with KD fine-tuning → INT8 post-training
//! quantization → ONNX (float and QDQ), each checked in ONNX Runtime.
//!
//! Every stage is judged by a gate (`mopt_stages::gate::decide`, the recipes' gates) on the
//! validation split; a failing stage is rolled back and the chain goes on from the last passing
//! model. Data: MNIST-5k (5,000 real digits, `datasets/fetch.sh --small`).
//!
//! ```sh
//! datasets/fetch.sh --small && python3 -m pip install -r requirements-export.txt
//! cargo run --example custom_model                 # 4,000 training digits, about a minute
//! cargo run --example custom_model -- --tiny       # what the test suite runs
//! ```
//!
//! The contracts, in the order a model implements them (each unlocks more of the chain):
//! [`ModelConfig`] (what the plan and reports print) → [`Examples`] / [`Labeled`] (its data) →
//! [`Classifier`] (fine-tuning, evaluation, gates) → [`Checkpoint`] (save, reload, rebuild from a
//! config) → [`Prunable`] (structured pruning) → [`Quantizable`] (PTQ, QAT) → [`Exportable`]
//! (ONNX with a parity check).

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;
use burn::store::{BurnpackStore, ModuleSnapshot};
use burn::tensor::activation::relu;
use mopt_core::prune::{GroupKind, Member, Prunable};
use mopt_core::quant::{calibrate, QuantSlot, QuantSlotRef};
use mopt_core::{
    Checkpoint, Classifier, Examples, Labeled, MemoryEstimate, ModelConfig, ModelFault, ParamTable,
    Quantizable,
};
use mopt_distill::{KdSettings, KdTask, LogitCache};
use mopt_export::graph::{int, GraphBuilder};
use mopt_export::onnx::{dtype, value_info, Dim, ModelProto};
use mopt_export::{
    export_checkpoint, tensor_json, ExportOptions, Exportable, InputSpec, InputType,
};
use mopt_prune::{select, units, Criterion, Progress, Ranking, Reduce, UnitLimits};
use mopt_quant::fake::quantize;
use mopt_quant::node::{LinearQuant, Phase, QuantConfig};
use mopt_recipe::{GateReference, GateSpec, TrainSpec};
use mopt_stages::gate::{decide, Action};
use mopt_train::metrics::EvalMetrics;
use mopt_train::trainer::{
    evaluate, fit, FinetuneTask, NoExtras, RunContext, Splits, Task, TrainOptions,
};
use mopt_train::DeviceSpec;
use serde::{Deserialize, Serialize};

// ---------------------------------------------------------------------------------------------
// The model: Config → init → Module.

/// An MLP: `inputs → hidden[0] → … → num_labels`, ReLU between layers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MlpConfig {
    pub inputs: usize,
    pub hidden: Vec<usize>,
    pub num_labels: usize,
    /// Quantized models: where and how (the scales are saved with the weights).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quant: Option<QuantConfig>,
}

impl MlpConfig {
    fn widths(&self) -> Vec<usize> {
        let mut w = vec![self.inputs];
        w.extend(&self.hidden);
        w.push(self.num_labels);
        w
    }
}

/// The module. `quant[i]` sits beside `layers[i]` (`None`: float).
#[derive(Module, Debug)]
pub struct Mlp {
    pub layers: Vec<Linear>,
    pub quant: Vec<Option<LinearQuant>>,
}

/// `x·W + b` with the layer's quantizers, if any, on its input and weight.
fn qlinear(l: &Linear, q: &Option<LinearQuant>, x: Tensor<2>) -> Tensor<2> {
    let (x, w) = match q {
        Some(q) => (q.input.forward(x), q.weight.forward(l.weight.val())),
        None => (x, l.weight.val()),
    };
    let y = x.matmul(w);
    match &l.bias {
        Some(b) => y + b.val().unsqueeze(),
        None => y,
    }
}

impl Mlp {
    /// # Shapes
    /// - x: `[batch, inputs]` → `[batch, num_labels]`
    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        let n = self.layers.len();
        let mut x = x;
        for (i, (l, q)) in self.layers.iter().zip(&self.quant).enumerate() {
            x = qlinear(l, q, x);
            if i + 1 < n {
                x = relu(x);
            }
        }
        x
    }
}

// ---------------------------------------------------------------------------------------------
// The data: MNIST-5k as `Examples`.

/// Digits with pixels scaled to [0, 1], shuffled and split (seeded).
pub struct Digits {
    pub train: (Vec<f32>, Vec<usize>),
    pub valid: (Vec<f32>, Vec<usize>),
    pub test: (Vec<f32>, Vec<usize>),
}

const PIXELS: usize = 784;

impl Digits {
    /// Read `mnist_5k.csv` (784 pixels then the label per line): 500 test, 500 validation and
    /// up to `max_train` training digits.
    pub fn load(path: &Path, max_train: usize, seed: u64) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            format!(
                "{}: {e}; run `datasets/fetch.sh --small` first",
                path.display()
            )
        })?;
        let mut rows: Vec<(Vec<f32>, usize)> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let v: Vec<&str> = line.split(',').collect();
            let bad = || format!("{}:{}: expected 785 numbers", path.display(), n + 1);
            if v.len() != PIXELS + 1 {
                return Err(bad());
            }
            let px: Result<Vec<f32>, _> = v[..PIXELS]
                .iter()
                .map(|p| p.parse::<f32>().map(|x| x / 255.0))
                .collect();
            rows.push((
                px.map_err(|_| bad())?,
                v[PIXELS].parse().map_err(|_| bad())?,
            ));
        }
        let mut order: Vec<usize> = (0..rows.len()).collect();
        mopt_data::SplitMix64::new(seed).shuffle(&mut order);
        let take = |ix: &[usize]| {
            let x = ix.iter().flat_map(|&i| rows[i].0.clone()).collect();
            (x, ix.iter().map(|&i| rows[i].1).collect())
        };
        let end = (1000 + max_train).min(order.len());
        Ok(Self {
            test: take(&order[..500]),
            valid: take(&order[500..1000]),
            train: take(&order[1000..end]),
        })
    }

    pub fn splits(&self) -> Splits<DigitSplit<'_>> {
        fn s((x, y): &(Vec<f32>, Vec<usize>)) -> DigitSplit<'_> {
            DigitSplit { x, y }
        }
        Splits {
            train: s(&self.train),
            valid: s(&self.valid),
            test: s(&self.test),
        }
    }
}

/// One split, borrowed.
#[derive(Debug, Clone, Copy)]
pub struct DigitSplit<'a> {
    x: &'a [f32],
    y: &'a [usize],
}

/// A batch of digits.
#[derive(Debug, Clone)]
pub struct DigitBatch {
    /// `[batch, 784]`
    pub x: Tensor<2>,
    /// `[batch]`
    pub y: Tensor<1, Int>,
}

impl Labeled for DigitBatch {
    fn labels(&self) -> Tensor<1, Int> {
        self.y.clone()
    }
}

impl Examples for DigitSplit<'_> {
    type Batch = DigitBatch;

    fn len(&self) -> usize {
        self.y.len()
    }

    fn label(&self, i: usize) -> usize {
        self.y[i]
    }

    fn batch(&self, indices: &[usize], device: &Device) -> DigitBatch {
        let x: Vec<f32> = indices
            .iter()
            .flat_map(|&i| &self.x[i * PIXELS..(i + 1) * PIXELS])
            .copied()
            .collect();
        let y: Vec<i64> = indices.iter().map(|&i| self.y[i] as i64).collect();
        DigitBatch {
            x: Tensor::from_data(TensorData::new(x, [indices.len(), PIXELS]), device),
            y: Tensor::from_data(TensorData::new(y, [indices.len()]), device),
        }
    }

    fn record(&self, i: usize) -> serde_json::Value {
        serde_json::json!({ "index": i, "label": self.y[i] })
    }
}

// ---------------------------------------------------------------------------------------------
// The contracts.

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
        self.widths()
            .windows(2)
            .map(|w| 2.0 * (w[0] * w[1]) as f64)
            .sum()
    }

    fn summary(&self) -> Vec<(String, String)> {
        vec![("widths".into(), format!("{:?}", self.widths()))]
    }

    fn training_memory(&self, batch: usize, _size: usize) -> MemoryEstimate {
        let acts: usize = self.widths().iter().map(|w| 2 * batch * w).sum();
        MemoryEstimate::adamw_f32(self.num_params(), acts as u64)
    }
}

impl Classifier for Mlp {
    type Batch = DigitBatch;

    fn logits(&self, b: &DigitBatch) -> Tensor<2> {
        self.forward(b.x.clone())
    }
}

fn fault(path: &Path, e: impl std::fmt::Display) -> ModelFault {
    ModelFault::input(format!("{}: {e}", path.display()))
}

impl Checkpoint for Mlp {
    type Config = MlpConfig;

    fn init(c: &MlpConfig, device: &Device) -> Self {
        let w = c.widths();
        let mut m = Mlp {
            layers: w
                .windows(2)
                .map(|p| LinearConfig::new(p[0], p[1]).init(device))
                .collect(),
            quant: (1..w.len()).map(|_| None).collect(),
        };
        if let Some(q) = &c.quant {
            m.attach_quantizers(q, Phase::Quantize, device);
        }
        m
    }

    fn save(&self, config: &MlpConfig, dir: &Path) -> Result<(), ModelFault> {
        let cfg = dir.join("config.json");
        let json = serde_json::to_string_pretty(config).expect("config serialises");
        std::fs::write(&cfg, json).map_err(|e| fault(&cfg, e))?;
        let weights = dir.join("model.bpk");
        let mut store = BurnpackStore::from_file(&weights)
            .auto_extension(false)
            .overwrite(true);
        self.save_into(&mut store).map_err(|e| fault(&weights, e))
    }

    fn load(dir: &Path, device: &Device) -> Result<(Self, MlpConfig), ModelFault> {
        let cfg = dir.join("config.json");
        let text = std::fs::read_to_string(&cfg).map_err(|e| fault(&cfg, e))?;
        let config: MlpConfig = serde_json::from_str(&text).map_err(|e| fault(&cfg, e))?;
        let mut m = Mlp::init(&config, device);
        let weights = dir.join("model.bpk");
        let mut store = BurnpackStore::from_file(&weights).auto_extension(false);
        let r = m.load_from(&mut store).map_err(|e| fault(&weights, e))?;
        if !r.missing.is_empty() {
            return Err(fault(&weights, format!("missing tensors {:?}", r.missing)));
        }
        Ok((m, config))
    }
}

/// The hidden neurons of each hidden layer: column `j` (and bias `j`) of layer `s`, row `j` of
/// layer `s + 1`.
pub struct Neurons;

impl GroupKind for Neurons {
    type Config = MlpConfig;

    fn name(&self) -> &'static str {
        "neurons"
    }

    fn scopes(&self, c: &MlpConfig) -> usize {
        c.hidden.len()
    }

    fn layer_scoped(&self) -> bool {
        true
    }

    fn scope_path(&self, s: usize) -> String {
        format!("hidden.{s}")
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
        MlpConfig {
            hidden: keep.iter().map(Vec::len).collect(),
            ..c.clone()
        }
    }
}

impl Prunable for Mlp {
    fn group_kinds() -> Vec<&'static dyn GroupKind<Config = MlpConfig>> {
        vec![&Neurons]
    }
}

impl Quantizable for Mlp {
    fn quantization(c: &MlpConfig) -> Option<&QuantConfig> {
        c.quant.as_ref()
    }

    fn with_quantization(c: &MlpConfig, q: Option<QuantConfig>) -> MlpConfig {
        MlpConfig {
            quant: q,
            ..c.clone()
        }
    }

    fn quant_slots(&mut self) -> Vec<QuantSlot<'_>> {
        self.layers
            .iter_mut()
            .zip(self.quant.iter_mut())
            .enumerate()
            .map(|(i, (linear, quant))| QuantSlot::linear(format!("layers.{i}"), linear, quant))
            .collect()
    }

    fn quant_slots_ref(&self) -> Vec<QuantSlotRef<'_>> {
        self.layers
            .iter()
            .zip(&self.quant)
            .enumerate()
            .map(|(i, (linear, quant))| QuantSlotRef::linear(format!("layers.{i}"), linear, quant))
            .collect()
    }
}

fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec().expect("f32")
}

impl Exportable for Mlp {
    fn inputs(c: &MlpConfig) -> Vec<InputSpec> {
        vec![InputSpec {
            name: "x".into(),
            dtype: InputType::Float,
            dims: vec![Dim::Named("batch"), Dim::Fixed(c.inputs as i64)],
        }]
    }

    /// `Gemm` + `Relu` per layer; a quantized layer reads its input through
    /// `QuantizeLinear`/`DequantizeLinear` (uint8, per tensor) and its int8 weight through a
    /// per-channel `DequantizeLinear`, with the scales mopt trained or calibrated.
    fn onnx(&self, c: &MlpConfig) -> Result<ModelProto, mopt_export::ExportError> {
        let mut g = GraphBuilder::default();
        let mut x = "x".to_string();
        let n = self.layers.len();
        for (i, (l, q)) in self.layers.iter().zip(&self.quant).enumerate() {
            let w = l.weight.val();
            let [d_in, d_out] = w.dims();
            let b = g.f32s(
                &format!("fc{i}.bias"),
                &[d_out],
                &values(l.bias.as_ref().expect("bias").val()),
            );
            let w = match q {
                None => g.f32s(&format!("fc{i}.weight"), &[d_in, d_out], &values(w)),
                Some(q) => {
                    let a = q.input.qparams();
                    let s = g.f32s(&format!("fc{i}.x_scale"), &[], &a.scale);
                    let z = g.u8s(&format!("fc{i}.x_zero"), &[], &[a.zero_point[0] as u8]);
                    let xq = g.op(
                        "QuantizeLinear",
                        &[&x, &s, &z],
                        vec![],
                        &format!("fc{i}_xq"),
                    );
                    x = g.op(
                        "DequantizeLinear",
                        &[&xq, &s, &z],
                        vec![],
                        &format!("fc{i}_xdq"),
                    );
                    let p = q.weight.qparams();
                    let (lo, hi) = c.quant.as_ref().expect("quantized").weight.format.range();
                    let wv = values(w);
                    let wq: Vec<i8> = (0..d_in * d_out)
                        .map(|k| {
                            quantize(wv[k], p.scale[k % d_out], p.zero_point[k % d_out], lo, hi)
                                as i8
                        })
                        .collect();
                    let wq = g.i8s(&format!("fc{i}.weight_q"), &[d_in, d_out], &wq);
                    let ws = g.f32s(&format!("fc{i}.weight_scale"), &[d_out], &p.scale);
                    let zp: Vec<i8> = p.zero_point.iter().map(|&z| z as i8).collect();
                    let wz = g.i8s(&format!("fc{i}.weight_zero"), &[d_out], &zp);
                    g.op(
                        "DequantizeLinear",
                        &[&wq, &ws, &wz],
                        vec![int("axis", 1)],
                        &format!("fc{i}_w"),
                    )
                }
            };
            x = g.op("Gemm", &[&x, &w, &b], vec![], &format!("fc{i}"));
            if i + 1 < n {
                x = g.op("Relu", &[&x], vec![], &format!("relu{i}"));
            }
        }
        g.op_into("Identity", &[&x], vec![], "logits");
        let graph = g.finish(
            "mlp",
            vec![value_info("x", dtype::FLOAT, &Self::inputs(c)[0].dims)],
            vec![value_info(
                "logits",
                dtype::FLOAT,
                &[Dim::Named("batch"), Dim::Fixed(c.num_labels as i64)],
            )],
        );
        Ok(ModelProto::new(
            graph,
            "MLP exported by mopt (examples/custom_model.rs)",
            &[],
        ))
    }

    fn feed(b: &DigitBatch) -> serde_json::Map<String, serde_json::Value> {
        let mut m = serde_json::Map::new();
        m.insert("x".into(), tensor_json(b.x.clone().into_data()));
        m
    }

    /// The export is QDQ (judged by prediction agreement) when the model was quantized.
    fn quantization(c: &MlpConfig) -> Option<QuantConfig> {
        c.quant.clone()
    }

    fn card_facts(c: &MlpConfig) -> serde_json::Map<String, serde_json::Value> {
        let mut m = serde_json::Map::new();
        m.insert("hidden".into(), serde_json::json!(c.hidden));
        m
    }
}

// ---------------------------------------------------------------------------------------------
// The chain.

/// How big a run is.
#[derive(Debug, Clone)]
pub struct Options {
    pub train_examples: usize,
    pub teacher_hidden: Vec<usize>,
    pub student_hidden: Vec<usize>,
    pub epochs: usize,
    pub out: PathBuf,
}

impl Options {
    /// About a minute on 2 cores.
    pub fn full(out: PathBuf) -> Self {
        Self {
            train_examples: 4000,
            teacher_hidden: vec![512, 256],
            student_hidden: vec![64],
            epochs: 6,
            out,
        }
    }

    /// Seconds: what the test suite runs.
    pub fn tiny(out: PathBuf) -> Self {
        Self {
            train_examples: 1000,
            teacher_hidden: vec![128, 64],
            student_hidden: vec![64],
            epochs: 4,
            out,
        }
    }
}

/// One stage's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct StageResult {
    pub stage: String,
    pub action: String,
    pub reason: String,
    pub params: usize,
    pub valid_accuracy: f64,
    pub test_accuracy: f64,
    pub checkpoint: PathBuf,
}

/// What the chain produced.
#[derive(Debug, Clone, Serialize)]
pub struct ChainReport {
    pub stages: Vec<StageResult>,
    /// The distilled student's test accuracy minus its hard-label twin's.
    pub kd_gain_test: f64,
    pub float_parity_max_abs: f64,
    pub qdq_agreement: f64,
    pub qdq_max_abs: f64,
    pub onnx: Vec<PathBuf>,
}

/// The model the next stage starts from.
struct Current {
    model: Mlp,
    config: MlpConfig,
    /// Its checkpoint folder.
    dir: PathBuf,
    valid: EvalMetrics,
    logits: Vec<Vec<f32>>,
}

struct Chain<'a> {
    opts: &'a Options,
    data: Splits<DigitSplit<'a>>,
    device: Device,
    device_spec: DeviceSpec,
    train_opts: TrainOptions,
    teacher_valid: Option<EvalMetrics>,
    teacher_cache: Option<LogitCache>,
    current: Option<Current>,
    report: Vec<StageResult>,
}

fn max_abs(a: &[Vec<f32>], b: &[Vec<f32>]) -> f64 {
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs() as f64)
        .fold(0.0, f64::max)
}

impl<'a> Chain<'a> {
    fn train_spec(&self, lr: f64, epochs: usize) -> TrainSpec {
        TrainSpec {
            epochs,
            batch_size: 32,
            eval_batch_size: 250,
            lr,
            weight_decay: 0.0,
            log_every: 50,
            ..TrainSpec::default()
        }
    }

    /// Train `model` with `task` into `dir`; the best checkpoint by validation, reloaded, and
    /// its folder.
    fn train<T>(
        &self,
        name: &str,
        dir: &Path,
        spec: &TrainSpec,
        config: &MlpConfig,
        task: T,
        model: Mlp,
    ) -> Result<(Mlp, PathBuf), Box<dyn std::error::Error>>
    where
        T: Task<Model = Mlp, Classifier = Mlp>,
    {
        std::fs::create_dir_all(dir)?;
        let ctx = RunContext {
            name,
            train: spec,
            seed: 7,
            device_spec: &self.device_spec,
            run_dir: dir,
            opts: &self.train_opts,
            data: self.data,
            labels: &[],
            cache_hit: false,
            extras: &NoExtras,
            config,
        };
        let report = fit(&ctx, task, model)?;
        let best = Mlp::load(&report.checkpoint, &self.device)?.0;
        Ok((best, report.checkpoint))
    }

    fn measure(&self, m: &Mlp) -> (EvalMetrics, EvalMetrics, Vec<Vec<f32>>) {
        let v = evaluate(&m.valid(), &self.data.valid, 250, 10, &self.device);
        let t = evaluate(&m.valid(), &self.data.test, 250, 10, &self.device);
        (v.metrics, t.metrics, v.logits)
    }

    /// Judge a stage's output, saved in `dir`; keep it (it becomes the current model) or roll
    /// back.
    fn judge(
        &mut self,
        stage: &str,
        (model, dir): (Mlp, PathBuf),
        config: MlpConfig,
        gate: Option<GateSpec>,
    ) -> Result<bool, Box<dyn std::error::Error>> {
        let (valid, test, logits) = self.measure(&model);
        let baseline = self.teacher_valid.unwrap_or(valid);
        let (input_valid, err) = match &self.current {
            Some(c) => (c.valid, max_abs(&logits, &c.logits)),
            None => (valid, 0.0),
        };
        let d = decide(gate.as_ref(), &valid, &baseline, &input_valid, err);
        eprintln!(
            "{stage}: valid {:.4} test {:.4}, {} params, max |logit − input's| {err:.3e} — {} ({})",
            valid.accuracy,
            test.accuracy,
            config.num_params(),
            d.action.label(),
            d.reason
        );
        self.report.push(StageResult {
            stage: stage.into(),
            action: d.action.label().into(),
            reason: d.reason.clone(),
            params: config.num_params(),
            valid_accuracy: valid.accuracy,
            test_accuracy: test.accuracy,
            checkpoint: dir.clone(),
        });
        let kept = matches!(d.action, Action::Kept | Action::Baseline);
        if kept {
            self.current = Some(Current {
                model,
                config,
                dir,
                valid,
                logits,
            });
        }
        Ok(kept)
    }
}

/// Run the chain; everything lands in `opts.out` (replaced).
pub fn run(opts: &Options, digits: &Digits) -> Result<ChainReport, Box<dyn std::error::Error>> {
    if opts.out.exists() {
        eprintln!("replacing {}", opts.out.display());
        std::fs::remove_dir_all(&opts.out)?;
    }
    let device = Device::flex();
    let data = digits.splits();
    let mut chain = Chain {
        opts,
        data,
        device: device.clone(),
        device_spec: DeviceSpec::Cpu,
        train_opts: TrainOptions::default(),
        teacher_valid: None,
        teacher_cache: None,
        current: None,
        report: Vec::new(),
    };
    teacher(&mut chain)?;
    let kd_gain_test = distill(&mut chain)?;
    prune(&mut chain)?;
    let float_dir = chain.current.as_ref().expect("a model").dir.clone();
    ptq(&mut chain)?;
    let (float_parity_max_abs, qdq, onnx) = export(&chain, &float_dir)?;
    let report = ChainReport {
        stages: chain.report,
        kd_gain_test,
        float_parity_max_abs,
        qdq_agreement: qdq.agreement,
        qdq_max_abs: qdq.max_abs_diff,
        onnx,
    };
    let path = opts.out.join("report.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
    Ok(report)
}

fn teacher(chain: &mut Chain) -> Result<(), Box<dyn std::error::Error>> {
    let o = chain.opts;
    let config = MlpConfig {
        inputs: PIXELS,
        hidden: o.teacher_hidden.clone(),
        num_labels: 10,
        quant: None,
    };
    let ad = chain.device.clone().autodiff();
    ad.seed(1);
    let spec = chain.train_spec(3e-3, o.epochs);
    let dir = o.out.join("00-teacher");
    let (m, best) = chain.train(
        "teacher",
        &dir,
        &spec,
        &config,
        FinetuneTask::<Mlp>::new(&ad),
        Mlp::init(&config, &ad),
    )?;
    chain.judge("teacher", (m.clone(), best), config, None)?;
    chain.teacher_valid = chain.current.as_ref().map(|c| c.valid);
    chain.teacher_cache = Some(LogitCache::compute(
        &m,
        &chain.data.train,
        250,
        &chain.device,
    ));
    Ok(())
}

/// The student by KD and its hard-label twin (same init, same budget); returns the test gain.
fn distill(chain: &mut Chain) -> Result<f64, Box<dyn std::error::Error>> {
    let o = chain.opts;
    let config = MlpConfig {
        hidden: o.student_hidden.clone(),
        ..chain.current.as_ref().expect("teacher").config.clone()
    };
    let ad = chain.device.clone().autodiff();
    ad.seed(2);
    let init = Mlp::init(&config, &ad);
    let spec = chain.train_spec(3e-3, o.epochs);
    let dir = o.out.join("01-distill");
    let cache = chain.teacher_cache.clone().expect("teacher logits");
    let kd = KdTask::<Mlp>::new(KdSettings::default(), cache, &ad);
    let (student, best) = chain.train("distill", &dir, &spec, &config, kd, init.clone())?;
    let (twin, _) = chain.train(
        "twin",
        &dir.join("twin"),
        &spec,
        &config,
        FinetuneTask::<Mlp>::new(&ad),
        init,
    )?;
    let (_, twin_test, _) = chain.measure(&twin);
    let (_, student_test, _) = chain.measure(&student);
    eprintln!(
        "distill: student test {:.4} vs hard-label twin {:.4}",
        student_test.accuracy, twin_test.accuracy
    );
    chain.judge(
        "distill",
        (student, best),
        config,
        Some(GateSpec::max_drop(0.05, GateReference::Baseline)),
    )?;
    Ok(student_test.accuracy - twin_test.accuracy)
}

/// Half of the hidden neurons removed in two rounds (L1), KD fine-tuning after each.
fn prune(chain: &mut Chain) -> Result<(), Box<dyn std::error::Error>> {
    let o = chain.opts;
    let cur = chain.current.as_ref().expect("a model");
    let (mut model, mut config, mut best) =
        (cur.model.clone(), cur.config.clone(), cur.dir.clone());
    let kinds = Mlp::group_kinds();
    let limits = UnitLimits {
        min_heads: 1,
        ffn_multiple: 1,
        hidden_multiple: 1,
        ignore_layers: Vec::new(),
        scopes: Vec::new(),
    };
    let orig = units(&kinds, &config);
    let origin: Vec<usize> = (0..config.hidden.len()).collect();
    let ad = chain.device.clone().autodiff();
    for round in 1..=2 {
        let scores = mopt_prune::scores(
            &ParamTable::weights(&model),
            &config,
            &kinds,
            Criterion::L1,
            Reduce::Sum,
            None,
            0,
        );
        let rules: Vec<_> = kinds.iter().map(|k| (*k, k.rule(&limits))).collect();
        let at = Progress {
            orig: &orig,
            origin: &origin,
            progress: 0.25 * round as f64,
            target: 0.5,
        };
        let keep = select(&rules, &scores, &config, &at, &limits, Ranking::Local);
        let (pruned, pcfg) = mopt_prune::prune(&model, &config, &keep, &ad);
        let dir = o.out.join(format!("02-prune/round-{round}"));
        let cache = chain.teacher_cache.clone().expect("teacher logits");
        let kd = KdTask::<Mlp>::new(KdSettings::default(), cache, &ad);
        let spec = chain.train_spec(1e-3, 2);
        (model, best) = chain.train("prune", &dir, &spec, &pcfg, kd, pruned)?;
        config = pcfg;
    }
    chain.judge(
        "prune",
        (model, best),
        config,
        Some(GateSpec::max_drop(0.03, GateReference::Previous)),
    )?;
    Ok(())
}

/// INT8 post-training quantization: 7-bit symmetric per-channel weights (ONNX Runtime's u8·s8
/// kernels saturate with full-range weights on CPUs without VNNI), uint8 per-tensor inputs,
/// min-max observers over 256 training digits.
fn ptq(chain: &mut Chain) -> Result<(), Box<dyn std::error::Error>> {
    let cur = chain.current.as_ref().expect("a model");
    let (model, config) = (cur.model.clone(), cur.config.clone());
    let q = QuantConfig::int8(7, model.quant_paths());
    let train = chain.data.train;
    let device = chain.device.clone();
    let (quantized, unseen) = calibrate(model.valid(), &q, &device, |m| {
        let ix: Vec<usize> = (0..train.len().min(256)).collect();
        let _ = m.logits(&train.batch(&ix, &device));
    });
    assert!(unseen.is_empty(), "every layer saw calibration data");
    let qc = MlpConfig {
        quant: Some(q),
        ..config
    };
    let dir = chain.opts.out.join("03-ptq/model");
    std::fs::create_dir_all(&dir)?;
    quantized.save(&qc, &dir)?;
    chain.judge(
        "ptq",
        (quantized, dir),
        qc,
        Some(GateSpec::max_drop(0.01, GateReference::Previous)),
    )?;
    Ok(())
}

/// The chain's last float model (at `float_dir`) and the current model (its quantized successor
/// when PTQ was kept) exported by mopt's generic exporter: each a deployment folder (`model.onnx`,
/// `model-card.json`, sha256 sums) written only after ONNX Runtime matched mopt on the test
/// digits (float: max |Δ| ≤ 1e-4; QDQ: ≥ 99.5% of predictions equal).
fn export(
    chain: &Chain,
    float_dir: &Path,
) -> Result<(f64, mopt_export::Parity, Vec<PathBuf>), Box<dyn std::error::Error>> {
    let dir = chain.opts.out.join("04-export");
    let opts = ExportOptions {
        tolerance: 1e-4,
        input_notes: "x: 784 pixel intensities in [0, 1], row-major 28 x 28".into(),
        labels: (0..10).map(|d| d.to_string()).collect(),
        accuracy: None,
        force: true,
    };
    let float =
        export_checkpoint::<Mlp, _>(float_dir, &dir.join("float"), &chain.data.test, &opts)?;
    eprintln!(
        "export: float ONNX max |ORT − mopt| {:.2e} on {} digits",
        float.parity.max_abs_err, float.parity.samples
    );
    let current = chain.current.as_ref().expect("a model");
    let q = export_checkpoint::<Mlp, _>(&current.dir, &dir.join("int8"), &chain.data.test, &opts)?;
    eprintln!(
        "export: QDQ ONNX agrees with mopt's fake-quant forward on {:.2}% of {} digits (max |Δ| {:.2e})",
        100.0 * q.parity.agreement,
        q.parity.samples,
        q.parity.max_abs_err
    );
    let qp = mopt_export::Parity {
        max_abs_diff: q.parity.max_abs_err,
        agreement: q.parity.agreement,
        examples: q.parity.samples,
    };
    let files = vec![dir.join("float/model.onnx"), dir.join("int8/model.onnx")];
    Ok((float.parity.max_abs_err, qp, files))
}

#[allow(dead_code)]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    // As mopt-train starts: the allocator keeps freed memory, this thread is the kernels'
    // worker 0 (see mopt_kernels::init_pool).
    mopt_kernels::tune_allocator();
    mopt_kernels::init_pool(None)?;
    let tiny = std::env::args().any(|a| a == "--tiny");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = root.join(if tiny {
        "checkpoints/custom-model-tiny"
    } else {
        "checkpoints/custom-model"
    });
    let opts = if tiny {
        Options::tiny(out)
    } else {
        Options::full(out)
    };
    let digits = Digits::load(
        &root.join("datasets/data/mnist-5k/mnist_5k.csv"),
        opts.train_examples,
        42,
    )?;
    let r = run(&opts, &digits)?;
    println!(
        "{:<10} {:<12} {:>8} {:>8} {:>8}",
        "stage", "decision", "params", "valid", "test"
    );
    for s in &r.stages {
        println!(
            "{:<10} {:<12} {:>8} {:>8.4} {:>8.4}",
            s.stage, s.action, s.params, s.valid_accuracy, s.test_accuracy
        );
    }
    println!(
        "KD vs hard-label twin (test): {:+.2} points; float ONNX max |ORT − mopt| {:.2e}; INT8 QDQ agreement {:.2}%",
        100.0 * r.kd_gain_test,
        r.float_parity_max_abs,
        100.0 * r.qdq_agreement
    );
    println!("report: {}", opts.out.join("report.json").display());
    Ok(())
}
