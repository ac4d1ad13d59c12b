//! Data-parallel training on Burn's multi-device engine.
//!
//! Each device gets a worker of Burn's [`MultiDevicesTrainStep`] (burn-train: one thread per
//! device, the model forked to it each step, [`TrainStep::step`] run there) and a replica of the
//! objective ([`crate::trainer::Task::replicate`]: a live teacher forked to the device, cached teacher outputs
//! shared). A micro-batch is split into one shard per device; each worker returns its shard's
//! gradients, which are moved to the main device and summed, as Burn's `MultiDeviceTrainEpoch`
//! does for its main-device optimizer strategy, before one optimizer step there.
//! mopt keeps its own loop around that step (burn-train's `Learner` would own the loop, the
//! data loaders and the logging, which mopt's stages drive themselves).
//!
//! On CUDA devices of one machine the gradients are all-reduced instead ([`Reduce::AllReduce`]):
//! every worker's copy of the model has its parameters marked distributed (burn-train's
//! [`ModuleSharder`], as its DDP strategy does), so Burn's autodiff sums each parameter's
//! gradient across the devices through the backend's collectives (NCCL) as soon as the backward
//! pass has it; the main device's gradients are then the sum and nothing is gathered. Burn
//! 0.22.1 has collectives on CUDA only (Flex, wgpu and the remote backend refuse them).

use std::sync::{Arc, Mutex};

use burn::data::dataloader::{DataLoaderIterator, Progress};
use burn::data::dataset::DatasetError;
use burn::module::{Module, ModuleDisplay};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::distributed::{DistributedConfig, DistributedContext, ReduceOperation};
use burn_train::train::{MultiDeviceStepError, MultiDevicesTrainStep};
use burn_train::{InferenceStep, ItemLazy, ModuleSharder, TrainOutput, TrainStep};
use mopt_core::{Checkpoint, Examples, Labeled};

use crate::backend::panic_text;
use crate::error::TrainError;
use crate::trainer::{MicroBatch, MicroOut, Replica, ShardOut};

/// The trained model as Burn's workers see it: a [`TrainStep`] whose input carries the shard and
/// the replica of the objective to run it with.
#[derive(Module, Debug)]
pub struct Replicated<M: Module + ModuleDisplay + 'static> {
    /// The model replicated on every device.
    pub model: M,
}

/// What a worker runs with its device's model.
pub type ShardJob<M> = Box<dyn FnOnce(&M) -> TrainOutput<ShardResult> + Send>;

/// One shard of a micro-batch, for one device: the work to run there with the device's copy of
/// the model (the shard's batch, already on the device, and the replica of the objective are
/// inside it, so that the model's batch type does not show here).
pub struct ShardItem<M: Module + ModuleDisplay + 'static> {
    /// The work, closing over the shard and the objective's replica.
    pub job: ShardJob<M>,
}

/// What every shard of a micro-batch shares.
#[derive(Debug, Clone, Copy)]
pub struct ShardSettings {
    /// Training progress, 0 to 1 (schedules).
    pub progress: f64,
    /// The matrix products' dtype under autocast, if any.
    pub compute: Option<burn::tensor::DType>,
    /// Loss multiplier (the loss scale, over the accumulation steps).
    pub multiplier: f32,
    /// Micro-batches a step accumulates.
    pub accum_steps: usize,
    /// The shard's dropout seed stream, when data parallel.
    pub stream: Option<u64>,
}

/// A worker's result: the shard's weighted loss and components, in shard order.
pub struct ShardResult {
    /// The shard's position.
    pub index: usize,
    /// Its weighted loss.
    pub loss: f32,
    /// Its logged components.
    pub parts: Vec<(&'static str, f64)>,
    /// Whether the loss is finite.
    pub finite: bool,
}

impl ItemLazy for ShardResult {
    fn sync(self) -> Result<Self, burn_std::ExecutionError> {
        Ok(self)
    }
}

impl<M: Module + ModuleDisplay + 'static> TrainStep for Replicated<M> {
    type Input = ShardItem<M>;
    type Output = ShardResult;

    fn step(&self, item: ShardItem<M>) -> TrainOutput<ShardResult> {
        (item.job)(&self.model)
    }
}

/// The job of shard `index` (weight: its share of the micro-batch): the objective's loss and
/// gradients with the device's model.
/// With `all_reduce`, the device's model has its parameters marked distributed first, so that
/// the backward pass sums their gradients across the devices.
fn shard_job<M: Module + ModuleDisplay + 'static, C: Checkpoint<Batch: Labeled>>(
    batch: C::Batch,
    indices: Vec<usize>,
    (index, weight): (usize, f32),
    task: Arc<Mutex<Replica<M, C>>>,
    (settings, all_reduce): (ShardSettings, bool),
) -> ShardItem<M> {
    ShardItem {
        job: Box::new(move |model: &M| {
            let mut task = task.lock().expect("replica task");
            let sharded;
            let model = if all_reduce {
                sharded = model.clone().map(&mut ModuleSharder);
                &sharded
            } else {
                model
            };
            let (loss, parts, grads) =
                settings.shard(&mut *task, model, &batch, (&indices, index), Some(weight));
            TrainOutput {
                grads: grads.unwrap_or_else(GradientsParams::new),
                item: ShardResult {
                    index,
                    loss,
                    parts,
                    finite: loss.is_finite(),
                },
            }
        }),
    }
}

impl<M: Module + ModuleDisplay + 'static> InferenceStep for Replicated<M> {
    type Input = ();
    type Output = ();

    fn step(&self, _item: ()) {}
}

/// A one-item data loader iterator: a shard handed to Burn's worker step.
struct OneShard<M: Module + ModuleDisplay + 'static>(Option<ShardItem<M>>);

impl<M: Module + ModuleDisplay + 'static> Iterator for OneShard<M> {
    type Item = Result<ShardItem<M>, DatasetError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.0.take().map(Ok)
    }
}

impl<M: Module + ModuleDisplay + 'static> DataLoaderIterator<ShardItem<M>> for OneShard<M> {
    fn progress(&self) -> Progress {
        Progress::new(usize::from(self.0.is_none()), 1, None)
    }
}

/// How the devices' gradients meet.
pub enum Reduce {
    /// Moved to the main device and summed there, in shard order (any devices; Burn's
    /// multi-device strategy).
    Gather,
    /// Summed across the devices by the backend's collectives during the backward pass (Burn's
    /// DDP machinery; CUDA's NCCL). The context keeps the collectives' server alive.
    AllReduce(DistributedContext),
}

impl Reduce {
    /// All-reduce where every device supports collectives (`collectives`: CUDA devices of this
    /// machine, two or more), with the reason for the choice; otherwise gathering.
    pub fn choose(devices: &[Device], collectives: bool) -> (Self, String) {
        let all_reduce = collectives && devices.len() > 1;
        let why = strategy(all_reduce, devices.len());
        if all_reduce {
            let context = DistributedContext::init(
                devices.to_vec(),
                DistributedConfig {
                    all_reduce_op: ReduceOperation::Sum,
                },
            );
            (Reduce::AllReduce(context), why)
        } else {
            (Reduce::Gather, why)
        }
    }
}

/// How the gradients of `devices` devices meet, in words (the run's line and `--check`'s).
pub fn strategy(all_reduce: bool, devices: usize) -> String {
    if all_reduce {
        format!("gradients all-reduced among the {devices} CUDA devices during the backward pass (Burn's collectives over NCCL)")
    } else {
        "gradients gathered and summed on the main device (Burn's multi-device strategy; all-reduce needs CUDA devices of one machine)".into()
    }
}

/// The devices of a data-parallel run, their workers and their replicas of the objective.
pub struct DataParallel<M: Module + ModuleDisplay + 'static, C: Checkpoint<Batch: Labeled>> {
    step: MultiDevicesTrainStep<Replicated<M>>,
    reduce: Reduce,
    /// Training devices, main first.
    devices: Vec<Device>,
    /// Their names, for errors (`ws://10.0.0.2:3000 (burn-remote)`).
    names: Vec<String>,
    tasks: Vec<Arc<Mutex<Replica<M, C>>>>,
}

impl<M: Module + ModuleDisplay + 'static, C: Checkpoint<Batch: Labeled>> DataParallel<M, C> {
    /// Workers on `devices` (training devices, main first, each with its name for errors), one
    /// replica of the objective each; their gradients meet by `reduce`.
    pub fn new(devices: Vec<(Device, String)>, tasks: Vec<Replica<M, C>>, reduce: Reduce) -> Self {
        assert_eq!(devices.len(), tasks.len());
        let (devices, names): (Vec<Device>, Vec<String>) = devices.into_iter().unzip();
        Self {
            step: MultiDevicesTrainStep::new(&devices),
            reduce,
            tasks: tasks.into_iter().map(|t| Arc::new(Mutex::new(t))).collect(),
            devices,
            names,
        }
    }

    /// Number of replicas.
    pub fn len(&self) -> usize {
        self.devices.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// Tell every replica that an epoch starts.
    pub fn begin_epoch(&self, epoch: usize) {
        for t in &self.tasks {
            t.lock().expect("replica task").begin_epoch(epoch);
        }
    }

    /// Forward and backward of one micro-batch over all devices; gradients on the main device.
    /// A device that fails (a remote server gone, a connection dropped: Burn's remote client
    /// panics, on a worker or on this thread while moving a shard or gradients) ends the step
    /// with an error naming it; the training state saved last stays for `--resume`.
    pub(crate) fn run<E: Examples<Batch = C::Batch>>(
        &self,
        micro: &MicroBatch<E>,
        model: &M,
    ) -> Result<MicroOut, TrainError> {
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.run_devices(micro, model)
        }));
        let failed = |what: String| {
            TrainError::Failed(format!(
                "data-parallel step: {what}; the run stopped at its last saved point: restart the server (or name a replacement with --devices) and rerun with --resume"
            ))
        };
        match out {
            Ok(Err(MultiStepError::Workers(list))) => Err(failed(list)),
            Ok(Err(MultiStepError::Other(e))) => Err(e),
            Ok(Ok(out)) => Ok(out),
            Err(payload) => Err(failed(format!(
                "on devices {}: {}",
                self.names.join(", "),
                panic_text(payload.as_ref())
            ))),
        }
    }

    fn run_devices<E: Examples<Batch = C::Batch>>(
        &self,
        micro: &MicroBatch<E>,
        model: &M,
    ) -> Result<MicroOut, MultiStepError> {
        let n = micro.chunk.len();
        let shards: Vec<&[usize]> = micro.chunk.chunks(n.div_ceil(self.len())).collect();
        // A collective needs every device: a micro-batch smaller than the device count (an
        // epoch's last) gathers instead.
        let all_reduce = matches!(self.reduce, Reduce::AllReduce(_)) && shards.len() == self.len();
        let mut loaders: Vec<Box<dyn DataLoaderIterator<ShardItem<M>>>> = (0..self.len())
            .map(|i| {
                let item = shards.get(i).map(|&shard| {
                    shard_job(
                        micro.examples.batch(shard, &self.devices[i]),
                        shard.to_vec(),
                        (i, shard.len() as f32 / n as f32),
                        self.tasks[i].clone(),
                        (micro.settings, all_reduce),
                    )
                });
                Box::new(OneShard(item)) as Box<dyn DataLoaderIterator<ShardItem<M>>>
            })
            .collect();
        let replicated = Replicated {
            model: model.clone(),
        };
        let (outputs, _) = self
            .step
            .step(&mut loaders, &replicated)
            .map_err(|e| match e {
                MultiDeviceStepError::Workers(failures) => MultiStepError::Workers(
                    failures
                        .iter()
                        .map(|f| {
                            let name = self.names.get(f.device_id).map_or("?", |n| n.as_str());
                            format!("device {name} failed: {}", f.message)
                        })
                        .collect::<Vec<_>>()
                        .join("; "),
                ),
                e => MultiStepError::Other(TrainError::Failed(format!("data-parallel step: {e}"))),
            })?;
        let mut outputs: Vec<TrainOutput<ShardResult>> =
            outputs.into_iter().map(|o| o.output).collect();
        // Arrival order is the workers'; sum in shard order (reproducible rounding).
        outputs.sort_by_key(|o| o.item.index);
        let main = &self.devices[0];
        let mut loss = 0.0f32;
        let mut components: Vec<(&'static str, f64)> = Vec::new();
        let mut grads = Some(Vec::new());
        for o in outputs {
            loss += o.item.loss;
            for (name, x) in o.item.parts {
                match components.iter_mut().find(|(k, _)| *k == name) {
                    Some((_, acc)) => *acc += x,
                    None => components.push((name, x)),
                }
            }
            // All-reduced: the main device's gradients are already the sum.
            if !o.item.finite {
                grads = None;
            } else if let Some(all) = grads.as_mut().filter(|_| !all_reduce || o.item.index == 0) {
                all.push(o.grads.to_device(main, model));
            }
        }
        Ok((loss, components, grads))
    }
}

/// Why a data-parallel step failed.
enum MultiStepError {
    /// Devices failed (their names and messages).
    Workers(String),
    /// Anything else.
    Other(TrainError),
}

/// A shard's output with its loss and components already weighted by its share.
pub(crate) fn weighted(out: ShardOut, weight: Option<f32>) -> ShardOut {
    let w = weight.unwrap_or(1.0);
    let (v, parts, g) = out;
    (
        w * v,
        parts.into_iter().map(|(k, x)| (k, w as f64 * x)).collect(),
        g,
    )
}
