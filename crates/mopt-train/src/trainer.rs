//! The training loop: AdamW (Burn), warmup + cosine (Burn's schedulers), global-norm clipping,
//! gradient accumulation (Burn's accumulator), seeded data order, per-epoch validation, best
//! checkpoint selection and a final test evaluation of the best checkpoint. Generic over the
//! model (a [`Task`] over a [`mopt_core::Checkpoint`] classifier) and the data
//! ([`mopt_core::Examples`]).

use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::optim::{GradientsAccumulator, GradientsParams, ModuleOptimizer};
use burn::prelude::*;
use mopt_core::{Checkpoint, Examples, ModelConfig};
use mopt_data::epoch_order;
use mopt_kernels::autocast;
use mopt_recipe::{BestMetric, TrainSpec};
use serde::Serialize;
use serde_json::json;

use crate::amp::{self, LossScaler};
use crate::backend::DeviceSpec;
use crate::error::TrainError;
use crate::logging::{Progress, RunLogger};
use crate::memory::peak_rss_bytes;
use crate::metrics::EvalMetrics;
use crate::parallel::{weighted, DataParallel, Reduce, ShardSettings};
use crate::state::{EpochSums, Fingerprint, Position, WindowSums};
use crate::step::Stepper;

pub use crate::checkpoint::{save_checkpoint_dir, CheckpointExtras, Golden, NoExtras, TextExtras};
pub use crate::eval::{argmax, evaluate, evaluate_keeping, EvalOutput};
pub use crate::task::{BatchOf, FinetuneTask, Parts, Replica, Task};

/// Options that do not belong in a recipe.
#[derive(Debug, Clone, Default)]
pub struct TrainOptions {
    /// Stop after this many optimizer steps (smoke runs); evaluation still runs.
    pub max_steps: Option<usize>,
    /// Data-parallel replicas beside the main device (`[run] devices` minus the first): each
    /// micro-batch of `batch-size × (1 + replicas)` examples is split across the devices.
    pub replicas: Vec<DeviceSpec>,
    /// Continue from the run folder's training state (`--resume`): a fit that finished returns
    /// its report, one interrupted goes on from its last saved state.
    pub resume: bool,
}

/// Per-epoch record in the report.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct EpochRecord {
    /// Epoch (1-based).
    pub epoch: usize,
    /// Optimizer steps in the epoch.
    pub steps: usize,
    /// Mean training loss.
    pub train_loss: f64,
    /// Validation metrics after the epoch.
    pub valid: EvalMetrics,
    /// Wall time of the epoch's training.
    pub epoch_time_s: f64,
    /// Training throughput.
    pub samples_per_s: f64,
}

/// `report.json` of a fine-tuning run.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct TrainReport {
    /// The run's name.
    pub run: String,
    /// The device trained on.
    pub device: String,
    /// mopt's version.
    pub mopt_version: String,
    /// Burn's version.
    pub burn_version: String,
    /// Parameters.
    pub params: usize,
    /// Training examples.
    pub train_examples: usize,
    /// Validation examples.
    pub valid_examples: usize,
    /// Test examples.
    pub test_examples: usize,
    /// Class names.
    pub labels: Vec<String>,
    /// Optimizer steps taken.
    pub steps: usize,
    /// Every epoch.
    pub epochs: Vec<EpochRecord>,
    /// The validation metric the best epoch is chosen by.
    pub best_metric: String,
    /// The best epoch (1-based).
    pub best_epoch: usize,
    /// Its validation metrics.
    pub best_valid: EvalMetrics,
    /// Test metrics of the best checkpoint.
    pub test: EvalMetrics,
    /// Wall time of the whole training.
    pub wall_time_s: f64,
    /// Training throughput over all epochs.
    pub train_samples_per_s: f64,
    /// Peak resident memory, where the OS reports it.
    pub peak_rss_bytes: Option<u64>,
    /// The best checkpoint's folder.
    pub checkpoint: PathBuf,
    /// Whether the tokenized data came from the cache.
    pub token_cache_hit: bool,
    /// `fp32`, `bf16` or `fp16` (matrix products; weights and optimizer state stay f32).
    pub precision: String,
    /// fp16 only: the loss scaler's final state (scale, skipped steps).
    pub loss_scale: Option<LossScaler>,
}

/// `train_state.json`, rewritten after every epoch: where training stands, with the loss
/// scaler's state (fp16).
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct TrainState {
    /// Epochs finished.
    pub epoch: usize,
    /// Optimizer steps taken.
    pub step: usize,
    /// The precision trained in.
    pub precision: String,
    /// The loss scaler's state (fp16).
    pub loss_scale: Option<LossScaler>,
}

impl TrainState {
    /// Its file name in the run folder.
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

fn better(metric: BestMetric, new: &EvalMetrics, old: &EvalMetrics) -> bool {
    metric.better(new.value(metric), old.value(metric))
}

/// The three splits a training run reads.
#[derive(Debug, Clone, Copy)]
pub struct Splits<E> {
    /// The training split.
    pub train: E,
    /// The validation split.
    pub valid: E,
    /// The test split.
    pub test: E,
}

/// Everything a training run reads besides the task and the model.
pub struct RunContext<'a, E, K> {
    /// Names the run in its report.
    pub name: &'a str,
    /// Training settings.
    pub train: &'a TrainSpec,
    /// Data order and dropout follow it.
    pub seed: u64,
    /// The device trained on.
    pub device_spec: &'a DeviceSpec,
    /// The run folder (checkpoints, logs).
    pub run_dir: &'a Path,
    /// Options of the invocation (`--max-steps`, replicas).
    pub opts: &'a TrainOptions,
    /// The three splits.
    pub data: Splits<E>,
    /// Class names, in label order (for the report).
    pub labels: &'a [String],
    /// Whether the data came from a cache (the report's `token_cache_hit`).
    pub cache_hit: bool,
    /// Written beside every checkpoint.
    pub extras: &'a dyn CheckpointExtras,
    /// The trained model's config (saved with it).
    pub config: &'a K,
}

impl<E: Copy, K> Clone for RunContext<'_, E, K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<E: Copy, K> Copy for RunContext<'_, E, K> {}

/// Running means of the logged quantities between two log points.
struct Window {
    sums: WindowSums,
    start: Instant,
}

impl Window {
    fn new(sums: WindowSums) -> Self {
        Self {
            sums,
            start: Instant::now(),
        }
    }

    fn add(&mut self, loss: f64, components: &[(&'static str, f64)], samples: usize) {
        let s = &mut self.sums;
        s.loss += loss;
        for (name, v) in components {
            match s.components.iter_mut().find(|(n, _)| n == name) {
                Some((_, acc)) => *acc += v,
                None => s.components.push((name.to_string(), *v)),
            }
        }
        s.n += 1;
        s.samples += samples;
    }

    fn mean_loss(&self) -> f64 {
        self.sums.loss / self.sums.n.max(1) as f64
    }

    fn samples_per_s(&self) -> f64 {
        self.sums.samples as f64 / self.start.elapsed().as_secs_f64().max(1e-9)
    }
}

/// The data-parallel workers of a task.
type Workers<T> = DataParallel<<T as Task>::Model, <T as Task>::Classifier>;

/// Burn's multi-device workers when `ctx.opts.replicas` is not empty: the main training device
/// first, then each replica's, with a replica of `task` each (dropout seeds differ per device).
fn data_parallel<T: Task, E: Copy, K>(
    task: &T,
    ctx: &RunContext<E, K>,
    main: &Device,
) -> Result<Option<Workers<T>>, TrainError> {
    // One remote device runs through the workers too: its failures then end the run with a
    // message, and a step that hangs meets the watchdog.
    if ctx.opts.replicas.is_empty() && !ctx.device_spec.is_remote() {
        return Ok(None);
    }
    let specs = std::iter::once(ctx.device_spec).chain(&ctx.opts.replicas);
    let mut devices = Vec::new();
    let mut tasks = Vec::new();
    for (i, spec) in specs.enumerate() {
        let replica = task.replicate(&spec.try_device()?).ok_or_else(|| {
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
        devices.push((ad, spec.name()));
        tasks.push(replica);
    }
    let collectives = std::iter::once(ctx.device_spec)
        .chain(&ctx.opts.replicas)
        .all(|d| matches!(d, DeviceSpec::Cuda(_)));
    let on: Vec<Device> = devices.iter().map(|(d, _)| d.clone()).collect();
    let (reduce, why) = Reduce::choose(&on, collectives);
    if devices.len() > 1 {
        eprintln!("data parallel over {} devices: {why}", devices.len());
    }
    Ok(Some(DataParallel::new(devices, tasks, reduce)))
}

/// One micro-batch of the training split: on the main device, or split into one shard per
/// device (see [`crate::parallel`]), each shard's loss weighted by its share so that the
/// gradients sum to the full micro-batch's mean gradient.
pub(crate) struct MicroBatch<'a, E> {
    pub chunk: &'a [usize],
    pub examples: &'a E,
    pub settings: ShardSettings,
}

/// A micro-batch's weighted loss, components and per-shard gradients (`None`: a loss overflowed).
pub(crate) type MicroOut = (f32, Parts, Option<Vec<GradientsParams>>);

/// A shard's loss value, logged components and (finite losses only) gradients.
pub(crate) type ShardOut = (f32, Parts, Option<GradientsParams>);

impl<E: Examples> MicroBatch<'_, E> {
    fn run<T: Task<Classifier: mopt_core::Classifier<Batch = E::Batch>>>(
        &self,
        task: &mut T,
        parallel: Option<&DataParallel<T::Model, T::Classifier>>,
        model: &T::Model,
        main: &Device,
    ) -> Result<MicroOut, TrainError> {
        if let Some(dp) = parallel {
            return dp.run(self, model);
        }
        let b = self.examples.batch(self.chunk, main);
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
        b: &BatchOf<T>,
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

/// What one training run carries from epoch to epoch.
struct Fit<'c, 'a, T: Task, E> {
    ctx: &'c RunContext<'a, E, <T::Classifier as Checkpoint>::Config>,
    task: T,
    parallel: Option<Workers<T>>,
    stepper: Stepper,
    logger: RunLogger,
    device: Device,
    ad_device: Device,
    compute: Option<burn::tensor::DType>,
    micro_per_epoch: usize,
    steps_per_epoch: usize,
    total_steps: usize,
    /// Optimizer steps applied so far.
    step: usize,
    train_time: f64,
    train_samples: usize,
    /// What a saved state must agree with.
    fingerprint: Fingerprint,
    /// Wall time of the fit before this process resumed it.
    wall_before: f64,
    /// When this process began (or resumed) it.
    started: Instant,
    best: Option<(usize, EvalMetrics)>,
    epochs: Vec<EpochRecord>,
}

/// What one epoch's training loop ends with.
struct EpochEnd {
    train_loss: f64,
    steps: usize,
    /// `--max-steps` reached.
    stopped: bool,
}

type FitConfig<T> = <<T as Task>::Classifier as Checkpoint>::Config;

/// Train `model` with `task` under the recipe's `[train]` settings. With `ctx.opts.resume` a
/// fit that finished in `ctx.run_dir` returns its report, and one that was interrupted goes on
/// from its last saved training state (see `state`), to the same final bytes.
pub fn fit<T, E>(
    ctx: &RunContext<E, FitConfig<T>>,
    task: T,
    model: T::Model,
) -> Result<TrainReport, TrainError>
where
    T: Task,
    E: Examples<Batch = BatchOf<T>> + Copy,
{
    if ctx.opts.resume {
        if let Some(report) = finished(ctx.run_dir) {
            eprintln!(
                "{}: training finished earlier ({} steps), best checkpoint verified",
                ctx.name, report.steps
            );
            return Ok(report);
        }
    }
    let wall = Instant::now();
    let _watch = remote_watch(ctx.device_spec, &ctx.opts.replicas);
    // Ids in traversal order: the optimizer's saved state is keyed by them.
    let model = mopt_core::renumber_params(model);
    let (mut fit, mut model, resumed) = Fit::start(ctx, task, model)?;
    let first = resumed.as_ref().map_or(0, |p| p.epoch);
    let mut sums = resumed.map(|p| p.sums);
    for epoch in first..ctx.train.epochs {
        if ctx.opts.max_steps.is_some_and(|m| fit.step >= m) {
            break;
        }
        let epoch_start = Instant::now();
        let (next, end) = fit.train_epoch(model, epoch, sums.take().unwrap_or_default())?;
        model = next;
        fit.end_epoch(&model, epoch, &end, epoch_start)?;
        if end.stopped {
            break;
        }
    }
    fit.finish(wall)
}

/// The watchdog of a fit on remote devices (see [`crate::watch`]); `None` on local ones.
fn remote_watch(main: &DeviceSpec, replicas: &[DeviceSpec]) -> Option<crate::watch::Watch> {
    let all: Vec<&DeviceSpec> = std::iter::once(main).chain(replicas).collect();
    all.iter().any(|d| d.is_remote()).then(|| {
        let names: Vec<String> = all.iter().map(|d| d.name()).collect();
        crate::watch::arm(crate::watch::remote_limit(), names.join(", "))
    })
}

/// The report of a fit that finished in `run_dir`, when its best checkpoint still verifies.
fn finished(run_dir: &Path) -> Option<TrainReport> {
    let text = std::fs::read_to_string(run_dir.join("report.json")).ok()?;
    let report: TrainReport = serde_json::from_str(&text).ok()?;
    let weights = report.checkpoint.join("model.bpk");
    (weights.is_file() && mopt_core::manifest::verify(&weights).is_ok()).then_some(report)
}

/// Micro-batches an epoch, optimizer steps an epoch, optimizer steps in all.
fn schedule<E: Examples, K>(ctx: &RunContext<E, K>) -> (usize, usize, usize) {
    let t = ctx.train;
    let micro_per_epoch = ctx
        .data
        .train
        .len()
        .div_ceil(t.batch_size * (1 + ctx.opts.replicas.len()));
    let steps_per_epoch = micro_per_epoch.div_ceil(t.grad_accum_steps);
    let mut total_steps = steps_per_epoch * t.epochs;
    if let Some(m) = ctx.opts.max_steps {
        total_steps = total_steps.min(m);
    }
    (micro_per_epoch, steps_per_epoch, total_steps)
}

impl<'c, 'a, T, E> Fit<'c, 'a, T, E>
where
    T: Task,
    E: Examples<Batch = BatchOf<T>> + Copy,
{
    /// The fit, its model and, when resuming from a saved state, the position it restored.
    fn start(
        ctx: &'c RunContext<'a, E, FitConfig<T>>,
        task: T,
        model: T::Model,
    ) -> Result<(Self, T::Model, Option<Position>), TrainError> {
        let (micro_per_epoch, steps_per_epoch, total_steps) = schedule(ctx);
        let stepper = Stepper::new(ctx.train, total_steps);
        let fingerprint = Fingerprint {
            seed: ctx.seed,
            train_examples: ctx.data.train.len(),
            micro_per_epoch,
            total_steps,
            params: ctx.config.num_params(),
        };
        let (model, stepper, position) = if ctx.opts.resume {
            match crate::state::load(ctx.run_dir, model, stepper, &fingerprint)? {
                Ok((m, s, p)) => (m, s, Some(p)),
                Err((m, s)) => (m, s, None),
            }
        } else {
            crate::state::clear(ctx.run_dir)?;
            (model, stepper, None)
        };
        let logs = position
            .as_ref()
            .map(|p| p.logs.clone())
            .unwrap_or_default();
        let ad_device = ctx.device_spec.train_device(ctx.train);
        if matches!(ctx.device_spec, DeviceSpec::Cpu) {
            amp::announce_cpu_path(ctx.train.precision);
        }
        // Dropout masks (and anything else random in training) follow the run's seed.
        ad_device.seed(ctx.seed);
        let mut fit = Self {
            ctx,
            parallel: data_parallel(&task, ctx, &ad_device)?,
            task,
            stepper,
            logger: RunLogger::reopen(ctx.run_dir, &logs)?,
            device: ctx.device_spec.device(),
            ad_device,
            compute: amp::compute_dtype(ctx.train.precision),
            micro_per_epoch,
            steps_per_epoch,
            total_steps,
            fingerprint,
            step: 0,
            train_time: 0.0,
            train_samples: 0,
            wall_before: 0.0,
            started: Instant::now(),
            best: None,
            epochs: Vec::new(),
        };
        if let Some(p) = &position {
            eprintln!(
                "{}: resuming from its training state at step {} (epoch {}, micro-batch {})",
                ctx.name,
                p.step,
                p.epoch + 1,
                p.sums.micro
            );
            fit.step = p.step;
            fit.train_time = p.train_time;
            fit.train_samples = p.train_samples;
            fit.wall_before = p.wall_s;
            fit.best = p.best;
            fit.epochs = p.epochs.clone();
        }
        Ok((fit, model, position))
    }

    /// Save the training state at an optimizer-step boundary: `epoch` in progress with `sums`
    /// (an epoch's end: the next epoch, nothing summed yet).
    fn save_state(
        &mut self,
        model: &T::Model,
        epoch: usize,
        sums: &EpochSums,
    ) -> Result<(), TrainError> {
        let run_dir = self.ctx.run_dir;
        let position = Position {
            fingerprint: self.fingerprint.clone(),
            epoch,
            sums: sums.clone(),
            step: self.step,
            stepper: self.stepper.state(self.step),
            train_time: self.train_time,
            train_samples: self.train_samples,
            wall_s: self.wall_before + self.started.elapsed().as_secs_f64(),
            best: self.best,
            epochs: self.epochs.clone(),
            logs: self.logger.position(run_dir)?,
        };
        crate::state::save(run_dir, model, &self.stepper, &position)
    }
    fn best_dir(&self) -> PathBuf {
        self.ctx.run_dir.join("best")
    }

    /// Examples per micro-batch (all devices together).
    fn micro_size(&self) -> usize {
        self.ctx.train.batch_size * (1 + self.ctx.opts.replicas.len())
    }

    /// The training split's epoch `epoch` in its seeded order, from where `sums` stands (a
    /// resumed epoch skips the micro-batches it had consumed).
    fn train_epoch(
        &mut self,
        mut model: T::Model,
        epoch: usize,
        mut sums: EpochSums,
    ) -> Result<(T::Model, EpochEnd), TrainError> {
        let (ctx, t) = (self.ctx, self.ctx.train);
        self.task.begin_epoch(epoch + 1);
        if let Some(dp) = &self.parallel {
            dp.begin_epoch(epoch + 1);
        }
        let epoch_start = Instant::now();
        let order = epoch_order(ctx.data.train.len(), ctx.seed, epoch);
        let mut accum = GradientsAccumulator::new();
        let mut pending = 0usize;
        let mut window = Window::new(std::mem::take(&mut sums.window));
        let label = format!("epoch {}/{}", epoch + 1, t.epochs);
        let mut progress = Progress::new(&label, self.steps_per_epoch);
        let mut stopped = false;
        // A non-finite fp16 loss skips its optimizer step instead of failing the run.
        let mut overflowed = false;
        let chunks = order.chunks(self.micro_size()).enumerate();
        for (mi, chunk) in chunks.skip(sums.micro) {
            let (loss_value, components, grads) = self.micro_step(&model, chunk, epoch, mi)?;
            crate::watch::beat();
            match grads {
                Some(grads) => {
                    for g in grads {
                        accum.accumulate(&model, g);
                    }
                    sums.loss_sum += loss_value as f64;
                    sums.loss_n += 1;
                    window.add(loss_value as f64, &components, chunk.len());
                }
                None => overflowed = true,
            }
            pending += 1;
            sums.micro = mi + 1;
            self.train_samples += chunk.len();
            if pending < t.grad_accum_steps && mi + 1 < self.micro_per_epoch {
                continue;
            }
            pending = 0;
            sums.boundaries += 1;
            let (next, result) = self
                .stepper
                .step(model, accum.grads(), std::mem::take(&mut overflowed))
                .map_err(TrainError::Failed)?;
            model = next;
            progress.update(sums.boundaries, &self.progress_line(&window));
            if !result.applied {
                if self.stepper.scaler.is_none() {
                    eprintln!(
                        "warning: step {} had a non-finite loss or gradient: skipped ({} so far)",
                        self.step + 1,
                        self.stepper.nonfinite_skipped
                    );
                }
                continue;
            }
            self.step += 1;
            sums.steps += 1;
            if self.step.is_multiple_of(t.log_every) || self.step == self.total_steps {
                self.log_window(&window, result.grad_norm, epoch);
                window = Window::new(WindowSums::default());
            }
            if ctx.opts.max_steps.is_some_and(|m| self.step >= m) {
                stopped = true;
                break;
            }
            // Mid-epoch states (an epoch's end saves its own after validation).
            if self.step.is_multiple_of(t.state_every) && mi + 1 < self.micro_per_epoch {
                sums.window = window.sums.clone();
                self.save_state(&model, epoch, &sums)?;
            }
        }
        let train_loss = sums.loss_sum / sums.loss_n.max(1) as f64;
        if stopped {
            progress.finish(&format!("stopped at --max-steps {}", self.step));
        } else {
            progress.finish(&format!("loss {train_loss:.4} lr {:.2e}", self.stepper.lr));
        }
        self.train_time += epoch_start.elapsed().as_secs_f64();
        let end = EpochEnd {
            train_loss,
            steps: sums.steps,
            stopped,
        };
        Ok((model, end))
    }

    /// Loss and gradients of micro-batch `mi` of `epoch` (a non-finite loss has no gradients:
    /// its optimizer step is skipped).
    fn micro_step(
        &mut self,
        model: &T::Model,
        chunk: &[usize],
        epoch: usize,
        mi: usize,
    ) -> Result<MicroOut, TrainError> {
        let ctx = self.ctx;
        // Every micro-batch's dropout masks follow its own seed stream (each shard's, data
        // parallel), a function of the seed and the position alone: a resumed run draws the
        // masks the uninterrupted one drew. Burn's own random ops read the device's RNG,
        // reseeded from the same stream.
        let stream = ctx.seed ^ ((epoch as u64) << 40) ^ ((mi as u64) << 8).wrapping_mul(0x9E37);
        if self.parallel.is_none() {
            self.ad_device.seed(stream);
        }
        let micro = MicroBatch {
            chunk,
            examples: &ctx.data.train,
            settings: ShardSettings {
                progress: self.step as f64 / self.total_steps as f64,
                compute: self.compute,
                // The loss scale (fp16) and the accumulation mean.
                multiplier: self.stepper.loss_multiplier(),
                accum_steps: ctx.train.grad_accum_steps,
                stream: Some(stream),
            },
        };
        let out = micro.run(
            &mut self.task,
            self.parallel.as_ref(),
            model,
            &self.ad_device,
        )?;
        if failpoint_nan() {
            return Ok((f32::NAN, Vec::new(), None));
        }
        Ok(out)
    }

    fn progress_line(&self, window: &Window) -> String {
        let scale_note = self
            .stepper
            .scaler
            .as_ref()
            .map_or(String::new(), |s| format!(" scale {}", s.scale));
        format!(
            "loss {:.4} lr {:.2e}{scale_note} {:.1} samples/s",
            window.mean_loss(),
            self.stepper.lr,
            window.samples_per_s()
        )
    }

    fn log_window(&mut self, window: &Window, grad_norm: Option<f32>, epoch: usize) {
        let mut scalars = vec![
            ("loss", window.mean_loss()),
            ("lr", self.stepper.lr),
            ("samples_per_s", window.samples_per_s()),
        ];
        if let Some(n) = grad_norm {
            scalars.push(("grad_norm", n as f64));
        }
        if let Some(s) = &self.stepper.scaler {
            scalars.push(("loss_scale", s.scale));
            scalars.push(("skipped_steps", s.skipped_steps as f64));
        }
        for (name, v) in &window.sums.components {
            scalars.push((name, v / window.sums.n.max(1) as f64));
        }
        self.logger
            .log("train", self.step, &scalars, json!({ "epoch": epoch + 1 }));
    }

    /// Validation, logs, the best checkpoint and `train_state.json` after an epoch.
    fn end_epoch(
        &mut self,
        model: &T::Model,
        epoch: usize,
        end: &EpochEnd,
        epoch_start: Instant,
    ) -> Result<(), TrainError> {
        let (ctx, t) = (self.ctx, self.ctx.train);
        let classifier = self.task.classifier(model).valid();
        let num_labels = ctx.config.num_labels();
        let valid = evaluate_keeping(
            &classifier,
            &ctx.data.valid,
            (t.eval_batch_size, num_labels),
            0,
            &self.device,
        )
        .metrics;
        let epoch_time = epoch_start.elapsed().as_secs_f64();
        let peak_mb = peak_rss_bytes().map_or(0.0, |b| b as f64 / 1048576.0);
        let sps = self.train_samples as f64 / self.train_time.max(1e-9);
        self.log_epoch(epoch, &valid, end.train_loss, epoch_time, peak_mb, sps);
        let improved = self
            .best
            .as_ref()
            .is_none_or(|(_, b)| better(t.best_metric, &valid, b));
        if improved {
            let best_dir = self.best_dir();
            save_checkpoint_dir(&classifier, ctx.config, ctx.extras, &best_dir)?;
            self.best = Some((epoch + 1, valid));
            eprintln!(
                "  new best (validation {}) saved to {}",
                t.best_metric.name(),
                best_dir.display()
            );
        }
        TrainState {
            epoch: epoch + 1,
            step: self.step,
            precision: t.precision.name().to_string(),
            loss_scale: self.stepper.scaler.clone(),
        }
        .save(ctx.run_dir)?;
        self.epochs.push(EpochRecord {
            epoch: epoch + 1,
            steps: end.steps,
            train_loss: end.train_loss,
            valid,
            epoch_time_s: epoch_time,
            samples_per_s: sps,
        });
        self.save_state(model, epoch + 1, &EpochSums::default())
    }

    fn log_epoch(
        &mut self,
        epoch: usize,
        valid: &EvalMetrics,
        train_loss: f64,
        epoch_time: f64,
        peak_mb: f64,
        sps: f64,
    ) {
        let e = json!({ "epoch": epoch + 1 });
        let valid_scalars = [
            ("loss", valid.loss),
            ("accuracy", valid.accuracy),
            ("macro_f1", valid.macro_f1),
        ];
        self.logger
            .log("valid", self.step, &valid_scalars, e.clone());
        let epoch_scalars = [
            ("time_s", epoch_time),
            ("train_loss", train_loss),
            ("peak_rss_mb", peak_mb),
            ("samples_per_s", sps),
        ];
        self.logger.log("epoch", self.step, &epoch_scalars, e);
        self.logger.flush();
        eprintln!(
            "epoch {}: train loss {train_loss:.4} | valid loss {:.4} acc {:.4} macro-F1 {:.4} | {epoch_time:.1}s, peak RSS {peak_mb:.0} MiB",
            epoch + 1,
            valid.loss,
            valid.accuracy,
            valid.macro_f1
        );
    }

    /// The final test evaluation of the best checkpoint, reloaded from disk; its golden
    /// reference; `report.json`.
    fn finish(mut self, wall: Instant) -> Result<TrainReport, TrainError> {
        let ctx = self.ctx;
        let t = ctx.train;
        let (best_epoch, best_valid) = self.best.take().expect("at least one epoch ran");
        let best_dir = self.best_dir();
        let (best_model, _) = T::Classifier::load(&best_dir, &self.device)?;
        let num_labels = ctx.config.num_labels();
        let test_split = &ctx.data.test;
        let golden_n = test_split.len().min(16);
        let test = evaluate_keeping(
            &best_model,
            test_split,
            (t.eval_batch_size, num_labels),
            golden_n,
            &self.device,
        );
        let test_scalars = [
            ("loss", test.metrics.loss),
            ("accuracy", test.metrics.accuracy),
            ("macro_f1", test.metrics.macro_f1),
        ];
        let extra = json!({ "best_epoch": best_epoch });
        self.logger.log("test", self.step, &test_scalars, extra);
        let golden = Golden {
            input_ids: (0..golden_n).map(|i| test_split.record(i)).collect(),
            logits: test.logits,
        };
        let golden_path = best_dir.join("golden.json");
        std::fs::write(&golden_path, serde_json::to_string(&golden).expect("json"))
            .map_err(|e| TrainError::io(&golden_path, e))?;
        self.logger.flush();
        let report = TrainReport {
            run: ctx.name.to_string(),
            device: ctx.device_spec.name().to_string(),
            mopt_version: env!("CARGO_PKG_VERSION").into(),
            burn_version: "0.22.1".into(),
            params: ctx.config.num_params(),
            train_examples: ctx.data.train.len(),
            valid_examples: ctx.data.valid.len(),
            test_examples: test_split.len(),
            labels: ctx.labels.to_vec(),
            steps: self.step,
            epochs: self.epochs,
            best_metric: t.best_metric.name().into(),
            best_epoch,
            best_valid,
            test: test.metrics,
            wall_time_s: self.wall_before + wall.elapsed().as_secs_f64(),
            train_samples_per_s: self.train_samples as f64 / self.train_time.max(1e-9),
            peak_rss_bytes: peak_rss_bytes(),
            checkpoint: best_dir,
            token_cache_hit: ctx.cache_hit,
            precision: t.precision.name().into(),
            loss_scale: self.stepper.scaler.clone(),
        };
        // Written whole or not at all: a resumed run takes a fit with a report as finished.
        let path = ctx.run_dir.join("report.json");
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_string_pretty(&report).expect("json"))
            .and_then(|()| std::fs::File::open(&tmp)?.sync_all())
            .map_err(|e| TrainError::io(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| TrainError::io(&path, e))?;
        crate::state::clear(ctx.run_dir)?;
        Ok(report)
    }
}

/// Failure injection for the tests of the non-finite guard: `MOPT_FAILPOINT=nan-loss@N` makes
/// the loss of the process's `N`-th micro-batch (1-based) NaN, `nan-loss@*` every one's. The
/// variable is read once; without it a micro-batch pays one load.
fn failpoint_nan() -> bool {
    use std::sync::atomic::{AtomicUsize, Ordering};
    // `Some(None)`: every micro-batch; `Some(Some(n))`: the n-th; `None`: no failpoint.
    static AT: std::sync::OnceLock<Option<Option<usize>>> = std::sync::OnceLock::new();
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let at = AT.get_or_init(|| {
        let v = std::env::var("MOPT_FAILPOINT").ok()?;
        match v.strip_prefix("nan-loss@")? {
            "*" => Some(None),
            n => n.parse().ok().map(Some),
        }
    });
    match at {
        None => false,
        Some(None) => true,
        Some(Some(n)) => CALLS.fetch_add(1, Ordering::Relaxed) + 1 == *n,
    }
}
