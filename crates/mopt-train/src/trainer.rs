//! The fine-tuning loop: AdamW (Burn), warmup + cosine (Burn's schedulers), global-norm clipping,
//! gradient accumulation (Burn's accumulator), seeded data order, per-epoch validation, best
//! checkpoint selection and a final test evaluation of the best checkpoint.

use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{GradientsAccumulator, GradientsParams, ModuleOptimizer};
use burn::prelude::*;
use mopt_data::{epoch_order, Batcher, Encoded, EncodedSplits, TextBatch};
use mopt_kernels::autocast;
use mopt_models::bert::{weights, BertConfig, BertForSequenceClassification};
use mopt_recipe::{BestMetric, TrainSpec};
use serde::Serialize;
use serde_json::json;

use crate::amp::{self, LossScaler};
use crate::backend::DeviceSpec;
use crate::error::TrainError;
use crate::logging::{Progress, RunLogger};
use crate::memory::peak_rss_bytes;
use crate::metrics::{accuracy, macro_f1, EvalMetrics};
use crate::parallel::{weighted, DataParallel, ShardSettings};
use crate::step::Stepper;

/// Options that do not belong in a recipe.
#[derive(Debug, Clone, Default)]
pub struct TrainOptions {
    /// Stop after this many optimizer steps (smoke runs); evaluation still runs.
    pub max_steps: Option<usize>,
    /// Data-parallel replicas beside the main device (`[run] devices` minus the first): each
    /// micro-batch of `batch-size × (1 + replicas)` examples is split across the devices.
    pub replicas: Vec<DeviceSpec>,
}

/// Per-epoch record in the report.
#[derive(Debug, Clone, Serialize)]
pub struct EpochRecord {
    pub epoch: usize,
    pub steps: usize,
    pub train_loss: f64,
    pub valid: EvalMetrics,
    pub epoch_time_s: f64,
    pub samples_per_s: f64,
}

/// `report.json` of a fine-tuning run.
#[derive(Debug, Clone, Serialize)]
pub struct TrainReport {
    pub run: String,
    pub device: String,
    pub mopt_version: &'static str,
    pub burn_version: &'static str,
    pub params: usize,
    pub train_examples: usize,
    pub valid_examples: usize,
    pub test_examples: usize,
    pub labels: Vec<String>,
    pub steps: usize,
    pub epochs: Vec<EpochRecord>,
    pub best_metric: &'static str,
    pub best_epoch: usize,
    pub best_valid: EvalMetrics,
    pub test: EvalMetrics,
    pub wall_time_s: f64,
    pub train_samples_per_s: f64,
    pub peak_rss_bytes: Option<u64>,
    pub checkpoint: PathBuf,
    pub token_cache_hit: bool,
    /// `fp32`, `bf16` or `fp16` (matrix products; weights and optimizer state stay f32).
    pub precision: &'static str,
    /// fp16 only: the loss scaler's final state (scale, skipped steps).
    pub loss_scale: Option<LossScaler>,
}

/// `train_state.json`, rewritten after every epoch: where training stands, with the loss
/// scaler's state (fp16).
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct TrainState {
    pub epoch: usize,
    pub step: usize,
    pub precision: String,
    pub loss_scale: Option<LossScaler>,
}

impl TrainState {
    pub const FILE: &'static str = "train_state.json";

    /// Write atomically (temporary file, then rename).
    pub fn save(&self, run_dir: &Path) -> Result<(), TrainError> {
        let path = run_dir.join(Self::FILE);
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_string_pretty(self).expect("json"))
            .map_err(|e| TrainError::io(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| TrainError::io(&path, e))
    }
}

/// Per-example logits and predictions of an evaluation.
pub struct EvalOutput {
    pub metrics: EvalMetrics,
    pub logits: Vec<Vec<f32>>,
}

/// Evaluate `model` (inference device) on `examples`; logits come back in input order.
pub fn evaluate(
    model: &BertForSequenceClassification,
    examples: &[Encoded],
    batcher: &Batcher,
    batch_size: usize,
    num_labels: usize,
    device: &Device,
) -> EvalOutput {
    // Length-sorted batches pad less; results are put back in input order.
    let mut order: Vec<usize> = (0..examples.len()).collect();
    order.sort_by_key(|&i| examples[i].ids.len());
    let ce = CrossEntropyLossConfig::new().init(device);
    let mut logits = vec![Vec::new(); examples.len()];
    let mut loss_sum = 0.0;
    for chunk in order.chunks(batch_size) {
        let items: Vec<&Encoded> = chunk.iter().map(|&i| &examples[i]).collect();
        let b = batcher.batch(&items, device);
        let out = model.forward(b.input_ids, b.attention_mask, b.token_type_ids);
        let loss: f32 = ce.forward(out.clone(), b.labels).into_scalar();
        loss_sum += loss as f64 * chunk.len() as f64;
        let flat: Vec<f32> = out.into_data().try_to_vec().expect("f32 logits");
        for (row, &i) in chunk.iter().enumerate() {
            logits[i] = flat[row * num_labels..(row + 1) * num_labels].to_vec();
        }
    }
    let pred: Vec<usize> = logits.iter().map(|l| argmax(l)).collect();
    let truth: Vec<usize> = examples.iter().map(|e| e.label).collect();
    EvalOutput {
        metrics: EvalMetrics {
            loss: loss_sum / examples.len().max(1) as f64,
            accuracy: accuracy(&pred, &truth),
            macro_f1: macro_f1(&pred, &truth, num_labels),
            examples: examples.len(),
        },
        logits,
    }
}

fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &x)| {
            if x > bv {
                (i, x)
            } else {
                (bi, bv)
            }
        })
        .0
}

fn better(metric: BestMetric, new: &EvalMetrics, old: &EvalMetrics) -> bool {
    match metric {
        BestMetric::Accuracy => new.accuracy > old.accuracy,
        BestMetric::MacroF1 => new.macro_f1 > old.macro_f1,
        BestMetric::Loss => new.loss < old.loss,
    }
}

/// Save a complete checkpoint folder atomically: write `<dir>.tmp`, then swap it in.
pub fn save_checkpoint_dir(
    model: &BertForSequenceClassification,
    config: &BertConfig,
    data: &EncodedSplits,
    tokenizer_file: &Path,
    dir: &Path,
) -> Result<(), TrainError> {
    let tmp = dir.with_extension("tmp");
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| TrainError::io(&tmp, e))?;
    }
    weights::save_checkpoint(model, config, &tmp)?;
    data.labels.save(&tmp.join("labels.json"))?;
    if let Some(name) = tokenizer_file.file_name() {
        std::fs::copy(tokenizer_file, tmp.join(name))
            .map_err(|e| TrainError::io(tokenizer_file, e))?;
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| TrainError::io(dir, e))?;
    }
    std::fs::rename(&tmp, dir).map_err(|e| TrainError::io(dir, e))
}

/// Golden reference written with the best checkpoint: the first test examples' ids and logits,
/// so that a reload (or an export) can be checked against what training saw.
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct Golden {
    pub input_ids: Vec<Vec<u32>>,
    pub logits: Vec<Vec<f32>>,
}

/// A training objective over a trainable module that contains a classifier.
///
/// Fine-tuning is cross-entropy on the classifier; distillation (in `mopt-distill`) adds teacher
/// terms and trainable projections. The trainer owns the loop, the optimizer and the logging.
pub trait Task: Send {
    /// What the optimizer updates (the classifier plus anything the objective trains).
    type Model: Module + burn::module::ModuleDisplay + 'static;

    /// Loss of one micro-batch. `indices` are the batch's positions in the training split;
    /// `progress` runs from 0 to 1 over training (for schedules). Returns the loss to minimise
    /// and its named components for logging.
    fn loss(
        &mut self,
        model: &Self::Model,
        batch: &TextBatch,
        indices: &[usize],
        progress: f64,
    ) -> (Tensor<1>, Vec<(&'static str, f64)>);

    /// The classifier that is evaluated and checkpointed.
    fn classifier<'a>(&self, model: &'a Self::Model) -> &'a BertForSequenceClassification;

    /// Called before each training epoch (`epoch` is 1-based), for objectives that change by phase.
    fn begin_epoch(&mut self, _epoch: usize) {}

    /// A copy of this objective for a data-parallel replica on `device` (inference device; a
    /// teacher is forked there, cached teacher outputs are shared). `None`: it cannot be
    /// replicated, and data-parallel training refuses it.
    fn replicate(&self, _device: &Device) -> Option<Replica<Self::Model>> {
        None
    }
}

/// A data-parallel replica of a [`Task`].
pub type Replica<M> = Box<dyn Task<Model = M>>;

impl<M: Module + burn::module::ModuleDisplay + 'static> Task for Replica<M> {
    type Model = M;

    fn loss(
        &mut self,
        model: &M,
        batch: &TextBatch,
        indices: &[usize],
        progress: f64,
    ) -> (Tensor<1>, Vec<(&'static str, f64)>) {
        (**self).loss(model, batch, indices, progress)
    }

    fn classifier<'a>(&self, model: &'a M) -> &'a BertForSequenceClassification {
        (**self).classifier(model)
    }

    fn begin_epoch(&mut self, epoch: usize) {
        (**self).begin_epoch(epoch)
    }

    fn replicate(&self, device: &Device) -> Option<Replica<M>> {
        (**self).replicate(device)
    }
}

/// A borrowed task trains too: one objective (and the teacher outputs it holds) can serve several
/// runs, e.g. every round of a pruning schedule.
impl<T: Task> Task for &mut T {
    type Model = T::Model;

    fn loss(
        &mut self,
        model: &Self::Model,
        batch: &TextBatch,
        indices: &[usize],
        progress: f64,
    ) -> (Tensor<1>, Vec<(&'static str, f64)>) {
        (**self).loss(model, batch, indices, progress)
    }

    fn classifier<'a>(&self, model: &'a Self::Model) -> &'a BertForSequenceClassification {
        (**self).classifier(model)
    }

    fn begin_epoch(&mut self, epoch: usize) {
        (**self).begin_epoch(epoch)
    }

    fn replicate(&self, device: &Device) -> Option<Replica<T::Model>> {
        (**self).replicate(device)
    }
}

/// Plain fine-tuning: cross-entropy against the labels.
pub struct FinetuneTask {
    ce: burn::nn::loss::CrossEntropyLoss,
}

impl FinetuneTask {
    pub fn new(device: &Device) -> Self {
        Self {
            ce: CrossEntropyLossConfig::new().init(device),
        }
    }
}

impl Task for FinetuneTask {
    type Model = BertForSequenceClassification;

    fn loss(
        &mut self,
        model: &Self::Model,
        b: &TextBatch,
        _indices: &[usize],
        _progress: f64,
    ) -> (Tensor<1>, Vec<(&'static str, f64)>) {
        let logits = model.forward(
            b.input_ids.clone(),
            b.attention_mask.clone(),
            b.token_type_ids.clone(),
        );
        let loss = self.ce.forward(logits, b.labels.clone());
        (loss, Vec::new())
    }

    fn classifier<'a>(&self, model: &'a Self::Model) -> &'a BertForSequenceClassification {
        model
    }

    fn replicate(&self, device: &Device) -> Option<Replica<Self::Model>> {
        Some(Box::new(FinetuneTask::new(device)))
    }
}

/// Everything a training run reads besides the task and the model.
#[derive(Clone, Copy)]
pub struct RunContext<'a> {
    /// Names the run in its report.
    pub name: &'a str,
    pub train: &'a TrainSpec,
    /// Data order and dropout follow it.
    pub seed: u64,
    pub device_spec: &'a DeviceSpec,
    pub run_dir: &'a Path,
    pub opts: &'a TrainOptions,
    pub data: &'a EncodedSplits,
    pub tokenizer_file: &'a Path,
    pub pad_id: u32,
    pub config: &'a BertConfig,
}

/// Check that every split has examples and print their sizes.
pub fn describe_data(source: &str, data: &EncodedSplits) -> Result<(), TrainError> {
    if data.train.is_empty() || data.valid.is_empty() || data.test.is_empty() {
        return Err(TrainError::Input(format!(
            "{source}: a split is empty (train {}, valid {}, test {}); use more data or other [data] fractions",
            data.train.len(),
            data.valid.len(),
            data.test.len()
        )));
    }
    eprintln!(
        "data: {} train / {} valid / {} test, {} labels {:?}, tokens {}",
        data.train.len(),
        data.valid.len(),
        data.test.len(),
        data.labels.len(),
        data.labels.labels,
        if data.from_cache {
            "from cache"
        } else {
            "encoded"
        }
    );
    Ok(())
}

/// Running means of the logged quantities between two log points.
#[derive(Default)]
struct Window {
    loss: f64,
    components: Vec<(&'static str, f64)>,
    n: usize,
    samples: usize,
}

impl Window {
    fn add(&mut self, loss: f64, components: &[(&'static str, f64)], samples: usize) {
        self.loss += loss;
        for (name, v) in components {
            match self.components.iter_mut().find(|(n, _)| n == name) {
                Some((_, acc)) => *acc += v,
                None => self.components.push((name, *v)),
            }
        }
        self.n += 1;
        self.samples += samples;
    }
}

/// Burn's multi-device workers when `ctx.opts.replicas` is not empty: the main training device
/// first, then each replica's, with a replica of `task` each (dropout seeds differ per device).
fn data_parallel<T: Task>(
    task: &T,
    ctx: &RunContext,
    main: &Device,
) -> Result<Option<DataParallel<T::Model>>, TrainError> {
    if ctx.opts.replicas.is_empty() {
        return Ok(None);
    }
    let specs = std::iter::once(ctx.device_spec).chain(&ctx.opts.replicas);
    let mut devices = Vec::new();
    let mut tasks = Vec::new();
    for (i, spec) in specs.enumerate() {
        let replica = task.replicate(&spec.device()).ok_or_else(|| {
            TrainError::Input(format!(
                "{}: this objective cannot run data-parallel; remove [run] devices",
                ctx.name
            ))
        })?;
        let ad = if i == 0 {
            main.clone()
        } else {
            let ad = spec.train_device(ctx.train);
            ad.seed(ctx.seed.wrapping_add(i as u64));
            ad
        };
        devices.push(ad);
        tasks.push(replica);
    }
    Ok(Some(DataParallel::new(devices, tasks)))
}

/// One micro-batch of the training split: on the main device, or split into one shard per
/// device (see [`crate::parallel`]), each shard's loss weighted by its share so that the
/// gradients sum to the full micro-batch's mean gradient.
pub(crate) struct MicroBatch<'a> {
    pub chunk: &'a [usize],
    pub examples: &'a [Encoded],
    pub batcher: &'a Batcher,
    pub settings: ShardSettings,
}

/// A micro-batch's weighted loss, components and per-shard gradients (`None`: a loss overflowed).
pub(crate) type MicroOut = (f32, Vec<(&'static str, f64)>, Option<Vec<GradientsParams>>);

/// A shard's loss value, logged components and (finite losses only) gradients.
pub(crate) type ShardOut = (f32, Vec<(&'static str, f64)>, Option<GradientsParams>);

impl MicroBatch<'_> {
    fn run<T: Task>(
        &self,
        task: &mut T,
        parallel: Option<&DataParallel<T::Model>>,
        model: &T::Model,
        main: &Device,
    ) -> Result<MicroOut, TrainError> {
        if let Some(dp) = parallel {
            return dp.run(self, model);
        }
        let items: Vec<&Encoded> = self.chunk.iter().map(|&i| &self.examples[i]).collect();
        let b = self.batcher.batch(&items, main);
        let (v, parts, g) = self.settings.shard(task, model, &b, (self.chunk, 0), None);
        Ok((v, parts, g.map(|g| vec![g])))
    }
}

impl ShardSettings {
    /// Loss and gradients of one shard (`weight`: its share of a split micro-batch; loss and
    /// components come back weighted by it).
    pub(crate) fn shard<T: Task + ?Sized>(
        &self,
        task: &mut T,
        model: &T::Model,
        b: &TextBatch,
        (shard, index): (&[usize], usize),
        weight: Option<f32>,
    ) -> ShardOut {
        let mut forward =
            || autocast::scope(self.compute, || task.loss(model, b, shard, self.progress));
        let (loss, parts) = match self.stream {
            Some(s) => mopt_kernels::with_seed_stream(s.wrapping_add(index as u64), forward),
            None => forward(),
        };
        let v: f32 = loss.clone().into_scalar();
        if !v.is_finite() {
            return weighted((v, parts, None), weight);
        }
        let loss = match weight {
            Some(w) => loss.mul_scalar(w),
            None => loss,
        };
        // Without loss scaling exactly the single-device expression (`loss / accum`).
        let loss = if self.multiplier == 1.0 {
            loss.div_scalar(self.accum_steps as f32)
        } else {
            loss.mul_scalar(self.multiplier / self.accum_steps as f32)
        };
        let grads = GradientsParams::from_grads(loss.backward(), model);
        weighted((v, parts, Some(grads)), weight)
    }
}

/// AdamW with the recipe's settings: Burn's formula and state, computed in one fused pass per
/// parameter (`mopt_kernels::FusedAdamW`).
pub fn adamw(t: &mopt_recipe::TrainSpec) -> ModuleOptimizer {
    mopt_kernels::FusedAdamW::new(
        t.adam_beta1,
        t.adam_beta2,
        t.adam_epsilon,
        t.weight_decay as f32,
    )
    .init()
}

/// Train `model` with `task` under the recipe's `[train]` settings.
pub fn fit<T: Task>(
    ctx: &RunContext,
    mut task: T,
    mut model: T::Model,
) -> Result<TrainReport, TrainError> {
    let wall = Instant::now();
    let data = ctx.data;
    let t = ctx.train;
    let device = ctx.device_spec.device();
    let ad_device = ctx.device_spec.train_device(t);
    // Dropout masks (and anything else random in training) follow the run's seed.
    ad_device.seed(ctx.seed);
    let batcher = Batcher::new(ctx.pad_id);

    let micro_per_epoch = data
        .train
        .len()
        .div_ceil(t.batch_size * (1 + ctx.opts.replicas.len()));
    let steps_per_epoch = micro_per_epoch.div_ceil(t.grad_accum_steps);
    let mut total_steps = steps_per_epoch * t.epochs;
    if let Some(m) = ctx.opts.max_steps {
        total_steps = total_steps.min(m);
    }
    let mut stepper = Stepper::new(t, total_steps);
    let parallel = data_parallel(&task, ctx, &ad_device)?;
    let compute = amp::compute_dtype(t.precision);

    let mut logger = RunLogger::create(ctx.run_dir)?;
    let best_dir = ctx.run_dir.join("best");
    let mut best: Option<(usize, EvalMetrics)> = None;
    let mut epochs = Vec::new();
    let mut step = 0usize;
    let mut train_time = 0.0f64;
    let mut train_samples = 0usize;
    let mut stopped = false;

    for epoch in 0..t.epochs {
        task.begin_epoch(epoch + 1);
        if let Some(dp) = &parallel {
            dp.begin_epoch(epoch + 1);
        }
        let epoch_start = Instant::now();
        let order = epoch_order(data.train.len(), ctx.seed, epoch);
        let mut accum = GradientsAccumulator::new();
        let mut pending = 0usize;
        let (mut loss_sum, mut loss_n) = (0.0f64, 0usize);
        let mut window = Window::default();
        let mut window_start = Instant::now();
        let mut progress = Progress::new(
            &format!("epoch {}/{}", epoch + 1, t.epochs),
            steps_per_epoch,
        );
        let (mut epoch_steps, mut boundaries) = (0usize, 0usize);
        // A non-finite fp16 loss skips its optimizer step instead of failing the run.
        let mut overflowed = false;
        for (mi, chunk) in order
            .chunks(t.batch_size * (1 + ctx.opts.replicas.len()))
            .enumerate()
        {
            let progress_frac = step as f64 / total_steps as f64;
            let micro = MicroBatch {
                chunk,
                examples: &data.train,
                batcher: &batcher,
                settings: ShardSettings {
                    progress: progress_frac,
                    compute,
                    // The loss scale (fp16) and the accumulation mean.
                    multiplier: stepper.loss_multiplier(),
                    accum_steps: t.grad_accum_steps,
                    // Data parallel: each shard's dropout masks follow its own seed stream.
                    stream: parallel.is_some().then(|| {
                        ctx.seed ^ ((epoch as u64) << 40) ^ ((mi as u64) << 8).wrapping_mul(0x9E37)
                    }),
                },
            };
            let (loss_value, components, grads) =
                micro.run(&mut task, parallel.as_ref(), &model, &ad_device)?;
            if !loss_value.is_finite() && stepper.scaler.is_none() {
                return Err(TrainError::Failed(format!(
                    "loss became {loss_value} at step {step} (epoch {}); lower train.lr or enable train.grad-clip-norm",
                    epoch + 1
                )));
            }
            match grads {
                Some(grads) => {
                    for g in grads {
                        accum.accumulate(&model, g);
                    }
                    loss_sum += loss_value as f64;
                    loss_n += 1;
                    window.add(loss_value as f64, &components, chunk.len());
                }
                None => overflowed = true,
            }
            pending += 1;
            train_samples += chunk.len();
            if pending < t.grad_accum_steps && mi + 1 < micro_per_epoch {
                continue;
            }
            pending = 0;
            boundaries += 1;
            let (next, result) = stepper
                .step(model, accum.grads(), std::mem::take(&mut overflowed))
                .map_err(TrainError::Failed)?;
            model = next;
            let lr = stepper.lr;
            let sps = window.samples as f64 / window_start.elapsed().as_secs_f64().max(1e-9);
            let mean_loss = window.loss / window.n.max(1) as f64;
            let scale_note = stepper
                .scaler
                .as_ref()
                .map_or(String::new(), |s| format!(" scale {}", s.scale));
            progress.update(
                boundaries,
                &format!("loss {mean_loss:.4} lr {lr:.2e}{scale_note} {sps:.1} samples/s"),
            );
            if !result.applied {
                continue;
            }
            step += 1;
            epoch_steps += 1;
            if step % t.log_every == 0 || step == total_steps {
                let mut scalars = vec![("loss", mean_loss), ("lr", lr), ("samples_per_s", sps)];
                if let Some(n) = result.grad_norm {
                    scalars.push(("grad_norm", n as f64));
                }
                if let Some(s) = &stepper.scaler {
                    scalars.push(("loss_scale", s.scale));
                    scalars.push(("skipped_steps", s.skipped_steps as f64));
                }
                for (name, v) in &window.components {
                    scalars.push((name, v / window.n.max(1) as f64));
                }
                logger.log("train", step, &scalars, json!({ "epoch": epoch + 1 }));
                window = Window::default();
                window_start = Instant::now();
            }
            if ctx.opts.max_steps.is_some_and(|m| step >= m) {
                stopped = true;
                break;
            }
        }
        let train_loss = loss_sum / loss_n.max(1) as f64;
        if stopped {
            progress.finish(&format!("stopped at --max-steps {step}"));
        } else {
            progress.finish(&format!("loss {train_loss:.4} lr {:.2e}", stepper.lr));
        }
        train_time += epoch_start.elapsed().as_secs_f64();
        let classifier = task.classifier(&model).valid();
        let valid = evaluate(
            &classifier,
            &data.valid,
            &batcher,
            t.eval_batch_size,
            ctx.config.num_labels,
            &device,
        )
        .metrics;
        let epoch_time = epoch_start.elapsed().as_secs_f64();
        let peak_mb = peak_rss_bytes().map_or(0.0, |b| b as f64 / 1048576.0);
        let sps = train_samples as f64 / train_time.max(1e-9);
        logger.log(
            "valid",
            step,
            &[
                ("loss", valid.loss),
                ("accuracy", valid.accuracy),
                ("macro_f1", valid.macro_f1),
            ],
            json!({ "epoch": epoch + 1 }),
        );
        logger.log(
            "epoch",
            step,
            &[
                ("time_s", epoch_time),
                ("train_loss", train_loss),
                ("peak_rss_mb", peak_mb),
                ("samples_per_s", sps),
            ],
            json!({ "epoch": epoch + 1 }),
        );
        logger.flush();
        eprintln!(
            "epoch {}: train loss {train_loss:.4} | valid loss {:.4} acc {:.4} macro-F1 {:.4} | {epoch_time:.1}s, peak RSS {peak_mb:.0} MiB",
            epoch + 1,
            valid.loss,
            valid.accuracy,
            valid.macro_f1
        );
        let improved = best
            .as_ref()
            .is_none_or(|(_, b)| better(t.best_metric, &valid, b));
        if improved {
            save_checkpoint_dir(&classifier, ctx.config, data, ctx.tokenizer_file, &best_dir)?;
            best = Some((epoch + 1, valid));
            eprintln!(
                "  new best (validation {}) saved to {}",
                t.best_metric.name(),
                best_dir.display()
            );
        }
        TrainState {
            epoch: epoch + 1,
            step,
            precision: t.precision.name().to_string(),
            loss_scale: stepper.scaler.clone(),
        }
        .save(ctx.run_dir)?;
        epochs.push(EpochRecord {
            epoch: epoch + 1,
            steps: epoch_steps,
            train_loss,
            valid,
            epoch_time_s: epoch_time,
            samples_per_s: sps,
        });
        if stopped {
            break;
        }
    }

    // Final test evaluation of the best checkpoint, reloaded from disk.
    let (best_epoch, best_valid) = best.expect("at least one epoch ran");
    let (best_model, _) = weights::load_checkpoint(&best_dir, &device)?;
    let test = evaluate(
        &best_model,
        &data.test,
        &batcher,
        t.eval_batch_size,
        ctx.config.num_labels,
        &device,
    );
    logger.log(
        "test",
        step,
        &[
            ("loss", test.metrics.loss),
            ("accuracy", test.metrics.accuracy),
            ("macro_f1", test.metrics.macro_f1),
        ],
        json!({ "best_epoch": best_epoch }),
    );
    let golden_n = data.test.len().min(16);
    let golden = Golden {
        input_ids: data.test[..golden_n]
            .iter()
            .map(|e| e.ids.clone())
            .collect(),
        logits: test.logits[..golden_n].to_vec(),
    };
    let golden_path = best_dir.join("golden.json");
    std::fs::write(&golden_path, serde_json::to_string(&golden).expect("json"))
        .map_err(|e| TrainError::io(&golden_path, e))?;
    logger.flush();

    let report = TrainReport {
        run: ctx.name.to_string(),
        device: ctx.device_spec.name().to_string(),
        mopt_version: env!("CARGO_PKG_VERSION"),
        burn_version: "0.22.1",
        params: ctx.config.num_params(),
        train_examples: data.train.len(),
        valid_examples: data.valid.len(),
        test_examples: data.test.len(),
        labels: data.labels.labels.clone(),
        steps: step,
        epochs,
        best_metric: t.best_metric.name(),
        best_epoch,
        best_valid,
        test: test.metrics,
        wall_time_s: wall.elapsed().as_secs_f64(),
        train_samples_per_s: train_samples as f64 / train_time.max(1e-9),
        peak_rss_bytes: peak_rss_bytes(),
        checkpoint: best_dir,
        token_cache_hit: data.from_cache,
        precision: t.precision.name(),
        loss_scale: stepper.scaler.clone(),
    };
    let path = ctx.run_dir.join("report.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report).expect("json"))
        .map_err(|e| TrainError::io(&path, e))?;
    Ok(report)
}
