//! `kind = "ptq"` and `kind = "qat"`: INT8 (or INT4-weight) quantization of the input's linear
//! layers with fake-quant nodes computed exactly as ONNX QuantizeLinear/DequantizeLinear.
//!
//! Both calibrate first: activation ranges from forward passes over `calibration-samples`
//! training examples (never validation or test) with the chosen observer, weight scales per
//! output channel by min-max. `ptq` stops there; with `sensitivity = true` it then quantizes
//! one layer at a time, ranks the layers by the validation drop (and logit error) that each
//! causes alone, and falls back the worst to float until the stage's gate holds (at most
//! `max-fallback`). `qat` trains the calibrated model, with the straight-through estimator
//! (and learned scales, LSQ, when `learned-scales = true`) and the KD loss against the
//! baseline teacher, at a reduced LR. The quantization config is saved in the checkpoint's
//! `config.json` (`mopt_quant`), the scales in its weights.

use std::path::{Path, PathBuf};

use mopt_core::quant::calibrate;
use mopt_core::{Labeled, ModelConfig, Quantizable};
use mopt_data::epoch_order;
use mopt_quant::node::{Phase, QuantConfig};
use mopt_quant::{Granularity, IntFormat, ObserverKind, QuantScheme};
use mopt_recipe::{RecipeError, Scope, StageEntry};
use mopt_train::metrics::EvalMetrics;
use mopt_train::trainer::{evaluate_keeping, fit, save_checkpoint_dir, TrainReport};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::error::StageError;
use crate::family::FamilyEntry;
use crate::kinds::kd::kd_objective;
use crate::plan::train_settings;
use crate::record::max_abs_diff;
use crate::shape::Shape;
use crate::stage::{PlanContext, Stage, StageContext, StageKind, StageOutput, StagePlan};

/// `kind = "ptq"`.
pub struct Ptq;
/// `kind = "qat"`.
pub struct Qat;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawQuant {
    weight_bits: Option<Bits>,
    weight_granularity: Option<String>,
    activation_bits: Option<u32>,
    activation_symmetric: Option<bool>,
    observer: Option<String>,
    percentile: Option<f64>,
    momentum: Option<f32>,
    calibration_samples: Option<usize>,
    include: Option<Vec<String>>,
    exclude: Option<Vec<String>>,
    sensitivity: Option<bool>,
    max_fallback: Option<usize>,
    learned_scales: Option<bool>,
    embeddings: Option<bool>,
    smooth: Option<f64>,
    distill: Option<bool>,
    alpha: Option<f64>,
    temperature: Option<f64>,
    teacher_top_k: Option<usize>,
}

/// `weight-bits`: a number, or `"auto"`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Bits {
    Number(u32),
    Name(String),
}

/// Whether this CPU has VNNI (AVX-512 VNNI or AVX-VNNI): ONNX Runtime's u8·s8 kernels then
/// take full-range 8-bit weights; without it they sum pairs of products in int16 and need the
/// 7-bit range.
pub fn cpu_has_vnni() -> bool {
    crate::env::Environment::detect()
        .simd
        .iter()
        .any(|f| f == "avx512_vnni" || f == "avx_vnni")
}

/// `weight-bits`: 8, 7 or 4; `"auto"` is 8 on a CPU with VNNI and 7 without.
fn parse_weight_bits(cx: &Scope, bits: Option<&Bits>) -> Result<u32, RecipeError> {
    let bits = match bits {
        None => 7,
        Some(Bits::Number(n)) => *n,
        Some(Bits::Name(n)) if n == "auto" => 7 + u32::from(cpu_has_vnni()),
        Some(Bits::Name(n)) => {
            return Err(cx.err(
                "weight-bits",
                format!("`{n}` is not a bit width"),
                "use 8, 7, 4 or \"auto\" (8 where the CPU has VNNI, 7 otherwise)",
            ))
        }
    };
    if ![4, 7, 8].contains(&bits) {
        return Err(cx.err(
            "weight-bits",
            format!("{bits} bits are not supported"),
            "use 8, 7 (the 8-bit type's reduced range, which ONNX Runtime's u8·s8 kernels need on CPUs without VNNI), 4, or \"auto\"",
        ));
    }
    Ok(bits)
}

/// A calibrated model, its config, the layers whose input saw no data, and what smoothing did.
type Calibrated<M> = (
    M,
    <M as mopt_core::Checkpoint>::Config,
    Vec<String>,
    Option<mopt_core::smooth::SmoothReport>,
);

/// A quantization stage, validated.
#[derive(Debug, Clone)]
pub struct QuantStage {
    /// `true`: QAT (train after calibrating); `false`: PTQ.
    pub train: bool,
    /// Schemes, observer, learned scales; `layers` is resolved against the input's shape.
    pub base: QuantConfig,
    /// Module-path globs of the quantized linear layers, and of those left float.
    pub include: Vec<String>,
    /// Layer globs kept float.
    pub exclude: Vec<String>,
    /// Training examples calibration reads.
    pub calibration_samples: usize,
    /// `weight-bits = "auto"`: the width was chosen for this CPU ([`cpu_has_vnni`]).
    pub auto_bits: bool,
    /// Store the family's embedding tables as int8, one scale per row
    /// ([`mopt_core::Quantizable::embedding_tables`]).
    pub embeddings: bool,
    /// SmoothQuant's migration strength α before calibration ([`mopt_core::smooth`]);
    /// `None`: no smoothing.
    pub smooth: Option<f64>,
    /// Rank layers by sensitivity (ptq).
    pub sensitivity: bool,
    /// Float fallbacks at most (ptq).
    pub max_fallback: usize,
    /// QAT: fine-tune with KD from the baseline (when it is not the input).
    pub distill: bool,
    /// KD weight of the hard labels (qat).
    pub alpha: f64,
    /// KD temperature (qat).
    pub temperature: f64,
    /// KD from each teacher row's `k` largest logits and the remaining mass (qat; `None`: all).
    pub teacher_top_k: Option<usize>,
}

/// Keys that belong to the other quantization kind are refused.
fn check_kind_keys(cx: &Scope, r: &RawQuant, train: bool) -> Result<(), RecipeError> {
    if !train {
        for (key, set) in [
            ("learned-scales", r.learned_scales.is_some()),
            ("distill", r.distill.is_some()),
            ("alpha", r.alpha.is_some()),
            ("temperature", r.temperature.is_some()),
            ("teacher-top-k", r.teacher_top_k.is_some()),
        ] {
            if set {
                return Err(cx.err(
                    key,
                    "only a `qat` stage trains",
                    "remove it, or use kind = \"qat\"",
                ));
            }
        }
    } else if r.sensitivity.is_some() || r.max_fallback.is_some() {
        return Err(cx.err(
            if r.sensitivity.is_some() { "sensitivity" } else { "max-fallback" },
            "the sensitivity analysis and float fallback belong to `ptq`",
            "run a `ptq` stage with sensitivity = true to choose the layers, then list the float ones in this stage's `exclude`",
        ));
    }
    Ok(())
}

/// `observer` and its own keys (`momentum`, `percentile`).
fn parse_observer(cx: &Scope, r: &RawQuant) -> Result<ObserverKind, RecipeError> {
    let observer = match r.observer.as_deref().unwrap_or("percentile") {
        "min-max" => ObserverKind::MinMax,
        "moving-average" => {
            let momentum = r.momentum.unwrap_or(0.1);
            if !(momentum > 0.0 && momentum <= 1.0) {
                return Err(cx.err(
                    "momentum",
                    format!("{momentum} is outside (0, 1]"),
                    "e.g. 0.1",
                ));
            }
            ObserverKind::MovingAverage { momentum }
        }
        "percentile" => {
            let percentile = r.percentile.unwrap_or(99.99);
            if !(percentile > 50.0 && percentile <= 100.0) {
                return Err(cx.err(
                    "percentile",
                    format!("{percentile} is outside (50, 100]"),
                    "e.g. 99.99",
                ));
            }
            ObserverKind::Percentile { percentile }
        }
        "mse" => ObserverKind::Mse,
        other => {
            return Err(cx.err(
                "observer",
                format!("unknown observer `{other}`"),
                "use \"min-max\", \"moving-average\", \"percentile\" or \"mse\"",
            ))
        }
    };
    if r.momentum.is_some() && !matches!(observer, ObserverKind::MovingAverage { .. }) {
        return Err(cx.err(
            "momentum",
            "set, but the observer is not `moving-average`",
            "remove it or set observer = \"moving-average\"",
        ));
    }
    if r.percentile.is_some() && !matches!(observer, ObserverKind::Percentile { .. }) {
        return Err(cx.err(
            "percentile",
            "set, but the observer is not `percentile`",
            "remove it or set observer = \"percentile\"",
        ));
    }
    Ok(observer)
}

/// `smooth`: SmoothQuant's α, in (0, 1].
fn parse_smooth(cx: &Scope, alpha: Option<f64>) -> Result<Option<f64>, RecipeError> {
    match alpha {
        Some(a) if !(a > 0.0 && a <= 1.0) => Err(cx.err(
            "smooth",
            format!("{a} is outside (0, 1]"),
            "set SmoothQuant's migration strength between 0 and 1 (0.5 balances activations and weights), or remove the key",
        )),
        a => Ok(a),
    }
}

fn parse(
    entry: &StageEntry,
    train: bool,
    family: &FamilyEntry,
) -> Result<Box<dyn Stage>, RecipeError> {
    let Some(can) = family.capability::<dyn CanQuantize>() else {
        return Err(entry.scope.err(
            "kind",
            family.lacks(&entry.kind, NEEDS.0, NEEDS.1),
            "implement `mopt_core::Quantizable` for the model and register `kinds::quantize::capability::<M>()` in the family's `capabilities`",
        ));
    };
    let cx: &Scope = &entry.scope;
    let r: RawQuant = cx.deserialize(entry.settings.clone())?;
    check_kind_keys(cx, &r, train)?;
    let weight_bits = parse_weight_bits(cx, r.weight_bits.as_ref())?;
    let granularity = match r.weight_granularity.as_deref().unwrap_or("per-channel") {
        "per-channel" => Granularity::PerChannel(1),
        "per-tensor" => Granularity::PerTensor,
        other => {
            return Err(cx.err(
                "weight-granularity",
                format!("unknown granularity `{other}`"),
                "use \"per-channel\" (one scale per output channel) or \"per-tensor\"",
            ))
        }
    };
    let activation_bits = r.activation_bits.unwrap_or(8);
    if activation_bits != 8 {
        return Err(cx.err(
            "activation-bits",
            format!("{activation_bits}-bit activations are not supported"),
            "use 8",
        ));
    }
    let symmetric_act = r.activation_symmetric.unwrap_or(false);
    let observer = parse_observer(cx, &r)?;
    // Which layers a pattern matches depends on the input's shape: checked by `plan`.
    let (alpha, temperature) = crate::kinds::kd::kd_settings(cx, r.alpha, r.temperature)?;
    Ok(Box::new(QuantStage {
        train,
        base: QuantConfig {
            weight: QuantScheme {
                format: IntFormat {
                    bits: weight_bits,
                    signed: true,
                },
                symmetric: true,
                granularity,
            },
            activation: QuantScheme {
                format: if symmetric_act {
                    IntFormat::INT8
                } else {
                    IntFormat::UINT8
                },
                symmetric: symmetric_act,
                granularity: Granularity::PerTensor,
            },
            learned_scales: r.learned_scales.unwrap_or(false),
            observer,
            layers: Vec::new(),
            outputs: Vec::new(),
            embeddings: Vec::new(),
        },
        include: r.include.unwrap_or_else(|| vec!["*".into()]),
        // The family's default float layers (BERT: the pooler and classifier, tiny and right
        // before the logits).
        exclude: r.exclude.unwrap_or_else(|| can.default_exclude()),
        calibration_samples: cx.positive("calibration-samples", r.calibration_samples, 512)?,
        embeddings: r.embeddings.unwrap_or(false),
        smooth: parse_smooth(cx, r.smooth)?,
        auto_bits: matches!(&r.weight_bits, Some(Bits::Name(_))),
        // on-fail = "retry" is the float fallback, which needs the ranking.
        sensitivity: r.sensitivity.unwrap_or(
            entry
                .gate
                .as_ref()
                .is_some_and(|g| g.on_fail == mopt_recipe::OnFail::Retry),
        ),
        max_fallback: r.max_fallback.unwrap_or(4),
        distill: r.distill.unwrap_or(true),
        alpha,
        temperature,
        teacher_top_k: crate::kinds::kd::teacher_top_k(cx, r.teacher_top_k)?,
    }))
}

impl StageKind for Ptq {
    fn name(&self) -> &'static str {
        "ptq"
    }
    fn about(&self) -> &'static str {
        "post-training quantization: calibrate, optional per-layer sensitivity with float fallback"
    }
    fn has_retry(&self) -> bool {
        true
    }
    fn parse(
        &self,
        entry: &StageEntry,
        family: &FamilyEntry,
    ) -> Result<Box<dyn Stage>, RecipeError> {
        parse(entry, false, family)
    }
}

impl StageKind for Qat {
    fn name(&self) -> &'static str {
        "qat"
    }
    fn about(&self) -> &'static str {
        "quantization-aware training: calibrate, then train with fake-quant (STE, optional LSQ) and KD"
    }
    fn parse(
        &self,
        entry: &StageEntry,
        family: &FamilyEntry,
    ) -> Result<Box<dyn Stage>, RecipeError> {
        parse(entry, true, family)
    }
}

/// What a family without the capability lacks.
const NEEDS: (&str, &str) = ("a quantizable model", "declares no quantizable layers");

/// A family's `ptq` / `qat` capability: the stage generic over its model type ([`capability`]).
pub trait CanQuantize: Send + Sync {
    /// The layers kept float unless a recipe sets `exclude`
    /// ([`mopt_core::Quantizable::default_float_paths`]).
    fn default_exclude(&self) -> Vec<String>;
    /// Plan a `ptq` / `qat` stage ([`QuantStage::plan`]).
    fn plan(
        &self,
        stage: &QuantStage,
        entry: &StageEntry,
        input: &Shape,
        cx: &PlanContext,
    ) -> Result<StagePlan, StageError>;
    /// Run a `ptq` / `qat` stage ([`QuantStage::run`]).
    fn run(
        &self,
        stage: &QuantStage,
        input: &Path,
        cx: &StageContext,
    ) -> Result<StageOutput, StageError>;
}

/// The `ptq` / `qat` capability of the model type `M`: its [`Quantizable`] layers.
pub fn capability<M: Quantizable<Batch: Labeled> + 'static>() -> Box<dyn CanQuantize> {
    Box::new(Generic::<M>(std::marker::PhantomData))
}

struct Generic<M>(std::marker::PhantomData<fn() -> M>);

impl<M: Quantizable<Batch: Labeled> + 'static> CanQuantize for Generic<M> {
    fn default_exclude(&self) -> Vec<String> {
        M::default_float_paths()
    }

    fn plan(
        &self,
        stage: &QuantStage,
        entry: &StageEntry,
        input: &Shape,
        cx: &PlanContext,
    ) -> Result<StagePlan, StageError> {
        stage.plan::<M>(entry, input, cx)
    }

    fn run(
        &self,
        stage: &QuantStage,
        input: &Path,
        cx: &StageContext,
    ) -> Result<StageOutput, StageError> {
        stage.run::<M>(input, cx)
    }
}

/// One row of the sensitivity ranking.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sensitivity {
    /// The layer's path.
    pub layer: String,
    /// Validation accuracy with only this layer quantized.
    pub valid_accuracy: f64,
    /// Points lost against the float input.
    pub drop_points: f64,
    /// Max |logit error| against the float input on the golden set.
    pub max_logit_error: f64,
}

impl QuantStage {
    fn name(&self) -> &'static str {
        if self.train {
            "qat"
        } else {
            "ptq"
        }
    }

    /// The quantization config for an `M` shaped `config` whose quantizable layers are
    /// `paths`: the included, not excluded ones (and the outputs the family quantizes among
    /// them), and its embedding tables when `embeddings` is set.
    fn config_for<M: Quantizable>(&self, paths: &[String], config: &M::Config) -> QuantConfig {
        let layers: Vec<String> = paths
            .iter()
            .filter(|p| self.include.iter().any(|g| mopt_prune::glob(g, p)))
            .filter(|p| !self.exclude.iter().any(|g| mopt_prune::glob(g, p)))
            .cloned()
            .collect();
        QuantConfig {
            outputs: M::quantized_outputs(&layers),
            layers,
            embeddings: if self.embeddings {
                M::embedding_paths(config)
            } else {
                Vec::new()
            },
            ..self.base.clone()
        }
    }

    fn scheme_line(&self) -> String {
        let q = &self.base;
        let auto = match (self.auto_bits, cpu_has_vnni()) {
            (false, _) => "",
            (true, true) => ", chosen for this CPU: it has VNNI",
            (true, false) => ", chosen for this CPU: it lacks VNNI",
        };
        format!(
            "weights int{} ({}{auto}), symmetric, {}; activations {} {} per tensor; observer {}; learned scales (LSQ) {}",
            q.weight.format.bits,
            if q.weight.format.bits == 7 { "the 8-bit type's 7-bit range [-64, 63]" } else { "full range" },
            match q.weight.granularity {
                Granularity::PerChannel(_) => "per output channel",
                Granularity::PerTensor => "per tensor",
            },
            if q.activation.format.signed { "int8" } else { "uint8" },
            if q.activation.symmetric { "symmetric" } else { "asymmetric" },
            q.observer.name(),
            q.learned_scales
        )
    }

    /// The input (smoothed first when `smooth` is set) with calibrated quantizers, the layers
    /// whose input saw no data, and what smoothing did.
    fn calibrated<M: Quantizable<Batch: Labeled>>(
        &self,
        input: &Path,
        cx: &StageContext,
    ) -> Result<Calibrated<M>, StageError> {
        let device = cx.device.device();
        let (model, config) = M::load(input, &device)?;
        let (model, config) = model.fold_for_quantization(&config);
        let q = self.config_for::<M>(&M::linear_paths(&config), &config);
        let train = cx.splits::<M::Batch>()?.train;
        let order = epoch_order(train.len(), cx.seed ^ 0x9a7, 0);
        let n = self.calibration_samples.min(order.len());
        eprintln!(
            "{}: calibrating {} layers on {n} training examples ({})",
            self.name(),
            q.layers.len(),
            q.observer.name()
        );
        let model = model.valid();
        let feed = |m: &M| {
            for chunk in order[..n].chunks(cx.entry.train.eval_batch_size) {
                let _ = m.logits(&train.batch(chunk, &device));
            }
        };
        let (model, smoothed) = match self.smooth {
            Some(alpha) => {
                eprintln!(
                    "{}: SmoothQuant (alpha {alpha}) on {n} training examples",
                    self.name()
                );
                let (m, r) = mopt_core::smooth::smooth(model, &q, alpha, &device, feed);
                (m, Some(r))
            }
            None => (model, None),
        };
        let (mut m, unseen) = calibrate(model, &q, &device, feed);
        m.snap_embeddings(&q);
        let qc = M::with_quantization(&config, Some(q));
        Ok((m, qc, unseen, smoothed))
    }

    /// Validation metrics and golden logits of `m` (the golden set is the validation split's
    /// first examples: one pass gives both).
    fn measure<M: Quantizable<Batch: Labeled>>(
        m: &M,
        c: &M::Config,
        cx: &StageContext,
    ) -> Result<(EvalMetrics, Vec<Vec<f32>>), StageError> {
        let device = cx.device.device();
        let bs = cx.entry.train.eval_batch_size;
        let out = evaluate_keeping(
            m,
            &cx.splits::<M::Batch>()?.valid,
            (bs, c.num_labels()),
            cx.golden_len(),
            &device,
        );
        Ok((out.metrics, out.logits))
    }

    /// Each quantized layer alone (the others float), ranked worst first.
    fn sensitivity<M: Quantizable<Batch: Labeled>>(
        &self,
        m: &M,
        c: &M::Config,
        cx: &StageContext,
        float_logits: &[Vec<f32>],
    ) -> Result<Vec<Sensitivity>, StageError> {
        let layers: Vec<String> = m
            .quant_slots_ref()
            .into_iter()
            .filter(|s| s.quant.is_some())
            .map(|s| s.path)
            .collect();
        let mut rows = Vec::new();
        for (i, layer) in layers.iter().enumerate() {
            eprintln!("ptq: sensitivity {}/{}: {layer}", i + 1, layers.len());
            for s in m.quant_slots_ref() {
                if let Some(q) = s.quant {
                    q.set_phase(if &s.path == layer {
                        Phase::Quantize
                    } else {
                        Phase::Off
                    });
                }
            }
            let (valid, golden) = Self::measure::<M>(m, c, cx)?;
            rows.push(Sensitivity {
                layer: layer.clone(),
                valid_accuracy: valid.accuracy,
                drop_points: (cx.input_valid.accuracy - valid.accuracy) * 100.0,
                max_logit_error: max_abs_diff(&golden, float_logits),
            });
        }
        m.set_quant_phase(Phase::Quantize);
        rows.sort_by(|a, b| {
            b.drop_points
                .total_cmp(&a.drop_points)
                .then(b.max_logit_error.total_cmp(&a.max_logit_error))
        });
        Ok(rows)
    }
}

/// The first path segment most layers share (a BERT's `bert`, a Llama's `model`): the chart
/// leaves it out of their labels.
fn shared_root<'a>(layers: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let mut counts = std::collections::BTreeMap::new();
    let mut total = 0;
    for l in layers {
        total += 1;
        if let Some((root, _)) = l.split_once('.') {
            *counts.entry(root).or_insert(0usize) += 1;
        }
    }
    let (root, n) = counts.into_iter().max_by_key(|(_, n)| *n)?;
    (2 * n > total).then_some(root)
}

/// `layer`'s chart label: without the `shared` root segment.
fn label<'a>(layer: &'a str, shared: Option<&str>) -> &'a str {
    match shared {
        Some(r) => layer
            .strip_prefix(r)
            .and_then(|l| l.strip_prefix('.'))
            .unwrap_or(layer),
        None => layer,
    }
}

/// A horizontal bar chart of the ranking (validation drop per layer), as SVG.
fn sensitivity_svg(rows: &[Sensitivity], fallback: &[String]) -> String {
    let (w, bar, left) = (760.0, 18.0, 330.0);
    let h = 40.0 + bar * rows.len() as f64;
    let max = rows
        .iter()
        .map(|r| r.drop_points.abs())
        .fold(0.1f64, f64::max);
    let x0 = left + 20.0;
    let scale = (w - x0 - 80.0) / (2.0 * max);
    let mid = x0 + max * scale;
    let shared = shared_root(rows.iter().map(|r| r.layer.as_str()));
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\n<text x=\"10\" y=\"16\" font-size=\"13\">Validation accuracy drop (points) with one layer quantized; red: fell back to float</text>\n<line x1=\"{mid}\" y1=\"24\" x2=\"{mid}\" y2=\"{h}\" stroke=\"#888\"/>\n"
    );
    for (i, r) in rows.iter().enumerate() {
        let y = 28.0 + bar * i as f64;
        let len = r.drop_points * scale;
        let (x, width) = if len >= 0.0 {
            (mid, len)
        } else {
            (mid + len, -len)
        };
        let color = if fallback.contains(&r.layer) {
            "#c0392b"
        } else {
            "#2e86c1"
        };
        s += &format!(
            "<text x=\"10\" y=\"{}\">{}</text>\n<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{}\" fill=\"{color}\"/>\n<text x=\"{:.1}\" y=\"{}\">{:+.2}</text>\n",
            y + 12.0,
            label(&r.layer, shared),
            width.max(0.5),
            bar - 4.0,
            mid + max * scale + 6.0,
            y + 12.0,
            r.drop_points
        );
    }
    s + "</svg>\n"
}

impl QuantStage {
    /// The plan of a `ptq` / `qat` stage on an `M` (what a family's
    /// [`crate::family::Family::plan_quantize`] calls).
    pub fn plan<M: Quantizable>(
        &self,
        entry: &StageEntry,
        shape: &Shape,
        cx: &PlanContext,
    ) -> Result<StagePlan, StageError> {
        let input: &M::Config = shape.get()?;
        // Listing the layers builds a model: once per plan.
        let paths = M::linear_paths(input);
        self.check_patterns(entry, &paths)?;
        crate::kinds::kd::check_kd_augment(entry, self.train && self.distill, cx.data)?;
        if M::quantization(input).is_some() {
            return Err(entry
                .scope
                .err(
                    "kind",
                    "the input of this stage is already quantized",
                    "quantize once: one `ptq` or `qat` stage per chain (a `qat` stage calibrates by itself)",
                )
                .into());
        }
        let q = self.config_for::<M>(&paths, input);
        if self.smooth.is_some() && M::smoothing_paths(input).is_empty() {
            return Err(entry
                .scope
                .err(
                    "smooth",
                    "this model family lists no place to fold SmoothQuant's scales",
                    "remove `smooth`, or list the family's groups in `Quantizable::smoothing_group`",
                )
                .into());
        }
        if self.embeddings && q.embeddings.is_empty() {
            return Err(entry
                .scope
                .err(
                    "embeddings",
                    "this model has no embedding table to store as int8",
                    "remove `embeddings`, or list the family's tables in `Quantizable::embedding_tables`",
                )
                .into());
        }
        if q.layers.is_empty() {
            return Err(entry
                .scope
                .err(
                    "include",
                    "no layer is left to quantize",
                    "widen `include` or narrow `exclude`",
                )
                .into());
        }
        let mut settings = vec![
            self.scheme_line(),
            format!(
                "{} of {} layers quantized (exclude = {:?}); every other op float; calibration on {} training examples",
                q.layers.len(),
                paths.len(),
                self.exclude,
                self.calibration_samples.min(cx.train_examples)
            ),
        ];
        if let Some(alpha) = self.smooth {
            settings.push(format!(
                "SmoothQuant before calibration: alpha = {alpha} (input channel ranges moved into the weights, folded into the norms and projections before them)"
            ));
        }
        if !q.embeddings.is_empty() {
            settings.push(format!(
                "embedding tables stored as int8, one scale per row: {}",
                q.embeddings.join(", ")
            ));
        }
        if self.train {
            settings.push(format!(
                "then QAT: straight-through estimator{}, distill = {} (alpha = {}, temperature = {}{})",
                if q.learned_scales { ", learned scales (LSQ)" } else { "" },
                self.distill,
                self.alpha,
                self.temperature,
                crate::kinds::kd::top_k_note(self.teacher_top_k)
            ));
            settings.extend(train_settings(&entry.train, entry.train_overridden));
        } else if self.sensitivity {
            settings.push(format!(
                "sensitivity: each layer quantized alone, ranked by validation drop; the worst fall back to float until the gate holds (max-fallback = {})",
                self.max_fallback
            ));
        }
        Ok(StagePlan {
            output: Shape::new(M::with_quantization(input, Some(q))),
            settings,
            memory: self
                .train
                .then(|| input.training_memory(entry.train.batch_size, cx.size())),
            extra_memory: Vec::new(),
        })
    }

    /// Run a `ptq` / `qat` stage on the `M` checkpoint at `input` (what a family's
    /// [`crate::family::Family::quantize`] calls).
    pub fn run<M: Quantizable<Batch: Labeled>>(
        &self,
        input: &Path,
        cx: &StageContext,
    ) -> Result<StageOutput, StageError> {
        // The float input's golden logits, as the runner measured them.
        let float_logits = cx.input_logits;
        let (mut m, mut qc, unseen, smoothed) = self.calibrated::<M>(input, cx)?;
        let mut notes = vec![format!(
            "{} layers quantized: {}.",
            M::quantization(&qc).map_or(0, |q| q.layers.len()),
            if unseen.is_empty() {
                "every input observed".to_string()
            } else {
                format!("no data reached {unseen:?}")
            }
        )];
        if let Some(r) = &smoothed {
            notes.push(format!(
                "SmoothQuant: {} producers smoothed, scales {:.3}..{:.3}; the loudest input channel over the median one {:.1} -> {:.1} (mean over the groups).",
                r.groups, r.scale_range.0, r.scale_range.1, r.outlier_ratio.0, r.outlier_ratio.1
            ));
        }
        let (valid, golden) = Self::measure::<M>(&m, &qc, cx)?;
        let ptq_err = max_abs_diff(&golden, float_logits);
        notes.push(format!(
            "After calibration: validation accuracy {:.4} (input {:.4}), max logit error vs the float input {:.3}.",
            valid.accuracy, cx.input_valid.accuracy, ptq_err
        ));
        let mut facts = json!({
            "quantization": M::quantization(&qc),
            "calibration_samples": self.calibration_samples.min(cx.data.len(crate::data::Split::Train)),
            "calibrated_valid_accuracy": valid.accuracy,
            "calibrated_max_logit_error": ptq_err,
        });
        if let Some(r) = &smoothed {
            facts["smoothing"] = json!({
                "alpha": self.smooth,
                "groups": r.groups,
                "scale_range": [r.scale_range.0, r.scale_range.1],
                "outlier_ratio": [r.outlier_ratio.0, r.outlier_ratio.1],
            });
        }
        let mut artifacts = Vec::new();
        if self.sensitivity {
            let calibrated = (valid, ptq_err);
            self.fall_back(&mut m, &mut qc, calibrated, cx, &mut notes, &mut facts)?;
            artifacts.push(cx.dir.join("sensitivity.svg"));
        }
        let out = cx.dir.join("model");
        save_checkpoint_dir(&m, &qc, cx.data, &out)?;
        if !self.train {
            return Ok(StageOutput {
                checkpoint: out,
                steps: 0,
                facts,
                notes,
                references: Vec::new(),
                logit_error_vs_input: None,
                artifacts,
            });
        }
        // QAT: train the calibrated model (fake-quant in the forward pass, STE in the backward).
        let mut report = self.qat::<M>(input, &out, &qc, cx)?;
        if M::quantization(&qc).is_some_and(|q| !q.embeddings.is_empty()) {
            report.checkpoint = Self::snapped::<M>(&report.checkpoint, cx)?;
        }
        notes.push(format!(
            "QAT: {} steps; best validation accuracy {:.4} (calibrated {:.4}).",
            report.steps, report.best_valid.accuracy, valid.accuracy
        ));
        facts["qat_valid_accuracy"] = json!(report.best_valid.accuracy);
        Ok(StageOutput {
            checkpoint: report.checkpoint,
            steps: report.steps,
            facts,
            notes,
            references: Vec::new(),
            logit_error_vs_input: None,
            artifacts,
        })
    }

    /// The trained checkpoint at `best` with its embedding tables put back on their int8 grid
    /// (training moved them off it), saved as `final/`: the stage's output.
    fn snapped<M: Quantizable<Batch: Labeled>>(
        best: &Path,
        cx: &StageContext,
    ) -> Result<PathBuf, StageError> {
        let (mut m, config) = M::load(best, &cx.device.device())?;
        if let Some(q) = M::quantization(&config) {
            m.snap_embeddings(q);
        }
        let out = cx.dir.join("final");
        save_checkpoint_dir(&m, &config, cx.data, &out)?;
        Ok(out)
    }

    /// Train the calibrated `M` saved at `calibrated` with fake-quant (STE), KD from the
    /// baseline unless switched off.
    fn qat<M: Quantizable<Batch: Labeled>>(
        &self,
        input: &Path,
        calibrated: &Path,
        qc: &M::Config,
        cx: &StageContext,
    ) -> Result<TrainReport, StageError> {
        let ad = cx.device.train_device(&cx.entry.train);
        let kd = (self.distill && input != cx.baseline).then_some((self.alpha, self.temperature));
        let mut task = kd_objective::<M>((kd, self.teacher_top_k), cx, &ad)?;
        let (student, _) = M::load(calibrated, &ad)?;
        eprintln!(
            "qat: training with fake-quant{}{}",
            if self.base.learned_scales {
                " and learned scales"
            } else {
                ""
            },
            if kd.is_some() {
                ", KD from the baseline"
            } else {
                ""
            }
        );
        Ok(fit(
            &cx.run_context::<M::Batch, _>(qc)?,
            &mut task,
            student,
        )?)
    }

    /// Sensitivity ranking, then the worst layers back to float (at most `max-fallback`) until
    /// the gate holds; `calibrated`: the fully quantized model's validation metrics and logit
    /// error. Writes `sensitivity.svg` and the facts `sensitivity`, `fallback`, `quantization`.
    fn fall_back<M: Quantizable<Batch: Labeled>>(
        &self,
        m: &mut M,
        qc: &mut M::Config,
        calibrated: (EvalMetrics, f64),
        cx: &StageContext,
        notes: &mut Vec<String>,
        facts: &mut serde_json::Value,
    ) -> Result<(), StageError> {
        let float_logits = cx.input_logits;
        let rows = self.sensitivity(&*m, qc, cx, float_logits)?;
        let mut fallback = Vec::new();
        let mut d = cx.judge(&calibrated.0, calibrated.1);
        for r in &rows {
            if d.passed || fallback.len() >= self.max_fallback {
                break;
            }
            for s in m.quant_slots() {
                if s.path == r.layer {
                    *s.quant = None;
                }
            }
            fallback.push(r.layer.clone());
            if let Some(mut q) = M::quantization(qc).cloned() {
                q.layers.retain(|l| l != &r.layer);
                q.outputs.retain(|l| l != &r.layer);
                *qc = M::with_quantization(qc, Some(q));
            }
            let (v, g) = Self::measure::<M>(m, qc, cx)?;
            let current = (v, max_abs_diff(&g, float_logits));
            d = cx.judge(&current.0, current.1);
            notes.push(format!(
                "Fallback {}: {} back to float: validation {:.4}, max logit error {:.3}; {}.",
                fallback.len(),
                r.layer,
                current.0.accuracy,
                current.1,
                d.reason
            ));
        }
        for (i, r) in rows.iter().enumerate() {
            notes.push(format!(
                "Sensitivity #{}: `{}` alone quantized: validation {:.4} (drop {:+.2} points), max logit error {:.3}{}.",
                i + 1,
                r.layer,
                r.valid_accuracy,
                r.drop_points,
                r.max_logit_error,
                if fallback.contains(&r.layer) { "; fell back to float" } else { "" }
            ));
        }
        let svg = cx.dir.join("sensitivity.svg");
        std::fs::write(&svg, sensitivity_svg(&rows, &fallback))
            .map_err(|e| StageError::io(&svg, e))?;
        let folder = cx
            .dir
            .file_name()
            .map(|f| f.to_string_lossy().to_string())
            .unwrap_or_default();
        notes.push(format!(
            "![per-layer sensitivity]({folder}/sensitivity.svg)"
        ));
        facts["sensitivity"] = json!(rows);
        facts["fallback"] = json!(fallback);
        facts["quantization"] = json!(M::quantization(qc));
        Ok(())
    }

    /// Every `include` / `exclude` pattern must match a quantizable layer of the input: a typo
    /// would otherwise quantize (or keep float) nothing it names.
    fn check_patterns(&self, entry: &StageEntry, paths: &[String]) -> Result<(), StageError> {
        for (key, patterns) in [("include", &self.include), ("exclude", &self.exclude)] {
            for p in patterns {
                if !paths.iter().any(|l| mopt_prune::glob(p, l)) {
                    let some: Vec<String> =
                        paths.iter().take(8).map(|l| format!("`{l}`")).collect();
                    return Err(entry
                        .scope
                        .err(
                            key,
                            format!("`{p}` matches no quantizable layer"),
                            format!(
                                "this model's quantizable layers are {}{} ({} in all); `*` matches anything",
                                some.join(", "),
                                if paths.len() > some.len() { ", …" } else { "" },
                                paths.len()
                            ),
                        )
                        .into());
                }
            }
        }
        Ok(())
    }
}

impl Stage for QuantStage {
    fn kind(&self) -> &str {
        self.name()
    }

    fn plan(
        &self,
        entry: &StageEntry,
        shape: &Shape,
        cx: &PlanContext,
    ) -> Result<StagePlan, StageError> {
        cx.family
            .require::<dyn CanQuantize>(self.name(), NEEDS.0, NEEDS.1)?
            .plan(self, entry, shape, cx)
    }

    fn run(&self, input: &Path, cx: &StageContext) -> Result<StageOutput, StageError> {
        cx.family
            .require::<dyn CanQuantize>(self.name(), NEEDS.0, NEEDS.1)?
            .run(self, input, cx)
    }

    fn reuse_key(&self) -> Option<String> {
        Some(format!("{self:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::{label, shared_root};

    #[test]
    fn chart_labels_leave_out_the_root_most_layers_share() {
        let bert = [
            "classifier",
            "bert.encoder.layer.0.output.dense",
            "bert.pooler.dense",
        ];
        let root = shared_root(bert.into_iter());
        assert_eq!(root, Some("bert"));
        assert_eq!(label(bert[1], root), "encoder.layer.0.output.dense");
        assert_eq!(label(bert[0], root), "classifier");
        // No root shared by most: every name whole.
        let cnn = ["stem.conv", "stages.0.conv", "fc"];
        assert_eq!(shared_root(cnn.into_iter()), None);
        assert_eq!(label(cnn[0], None), "stem.conv");
    }
}
