//! The objective the trainer minimises: a [`Task`] over a trainable module that contains a
//! classifier. Fine-tuning is [`FinetuneTask`]; distillation (in `mopt-distill`) adds teacher
//! terms and trainable projections.

use std::marker::PhantomData;

use burn::module::{Module, ModuleDisplay};
use burn::nn::loss::{CrossEntropyLoss, CrossEntropyLossConfig};
use burn::prelude::*;
use mopt_core::{Checkpoint, Classifier, Labeled};

/// The batch type a task trains on: its classifier's.
pub type BatchOf<T> = <<T as Task>::Classifier as Classifier>::Batch;

/// Named loss components for logging.
pub type Parts = Vec<(&'static str, f64)>;

/// A training objective over a trainable module that contains a classifier.
///
/// The trainer owns the loop, the optimizer and the logging; the task owns the loss.
pub trait Task: Send {
    /// What the optimizer updates (the classifier plus anything the objective trains).
    type Model: Module + ModuleDisplay + 'static;
    /// The model that is evaluated and checkpointed.
    type Classifier: Checkpoint<Batch: Labeled>;

    /// Loss of one micro-batch. `indices` are the batch's positions in the training split;
    /// `progress` runs from 0 to 1 over training (for schedules). Returns the loss to minimise
    /// and its named components for logging.
    fn loss(
        &mut self,
        model: &Self::Model,
        batch: &BatchOf<Self>,
        indices: &[usize],
        progress: f64,
    ) -> (Tensor<1>, Parts);

    /// The classifier inside `model`.
    fn classifier<'a>(&self, model: &'a Self::Model) -> &'a Self::Classifier;

    /// Called before each training epoch (`epoch` is 1-based), for objectives that change by phase.
    fn begin_epoch(&mut self, _epoch: usize) {}

    /// A copy of this objective for a data-parallel replica on `device` (inference device; a
    /// teacher is forked there, cached teacher outputs are shared). `None`: it cannot be
    /// replicated, and data-parallel training refuses it.
    fn replicate(&self, _device: &Device) -> Option<Replica<Self::Model, Self::Classifier>> {
        None
    }
}

/// A data-parallel replica of a [`Task`].
pub type Replica<M, C> = Box<dyn Task<Model = M, Classifier = C>>;

impl<M: Module + ModuleDisplay + 'static, C: Checkpoint<Batch: Labeled>> Task for Replica<M, C> {
    type Model = M;
    type Classifier = C;

    fn loss(
        &mut self,
        model: &M,
        batch: &C::Batch,
        indices: &[usize],
        progress: f64,
    ) -> (Tensor<1>, Parts) {
        (**self).loss(model, batch, indices, progress)
    }

    fn classifier<'a>(&self, model: &'a M) -> &'a C {
        (**self).classifier(model)
    }

    fn begin_epoch(&mut self, epoch: usize) {
        (**self).begin_epoch(epoch)
    }

    fn replicate(&self, device: &Device) -> Option<Replica<M, C>> {
        (**self).replicate(device)
    }
}

/// A borrowed task trains too: one objective (and the teacher outputs it holds) can serve several
/// runs, e.g. every round of a pruning schedule.
impl<T: Task> Task for &mut T {
    type Model = T::Model;
    type Classifier = T::Classifier;

    fn loss(
        &mut self,
        model: &Self::Model,
        batch: &BatchOf<T>,
        indices: &[usize],
        progress: f64,
    ) -> (Tensor<1>, Parts) {
        (**self).loss(model, batch, indices, progress)
    }

    fn classifier<'a>(&self, model: &'a Self::Model) -> &'a Self::Classifier {
        (**self).classifier(model)
    }

    fn begin_epoch(&mut self, epoch: usize) {
        (**self).begin_epoch(epoch)
    }

    fn replicate(&self, device: &Device) -> Option<Replica<T::Model, T::Classifier>> {
        (**self).replicate(device)
    }
}

/// Plain fine-tuning of any classifier: cross-entropy against the labels.
pub struct FinetuneTask<C> {
    ce: CrossEntropyLoss,
    model: PhantomData<fn() -> C>,
}

impl<C> FinetuneTask<C> {
    /// Cross-entropy on `device`.
    pub fn new(device: &Device) -> Self {
        Self {
            ce: CrossEntropyLossConfig::new().init(device),
            model: PhantomData,
        }
    }
}

impl<C: Checkpoint<Batch: Labeled>> Task for FinetuneTask<C> {
    type Model = C;
    type Classifier = C;

    fn loss(
        &mut self,
        model: &C,
        b: &C::Batch,
        _indices: &[usize],
        _progress: f64,
    ) -> (Tensor<1>, Parts) {
        let loss = self.ce.forward(model.logits(b), b.labels());
        (loss, Vec::new())
    }

    fn classifier<'a>(&self, model: &'a C) -> &'a C {
        model
    }

    fn replicate(&self, device: &Device) -> Option<Replica<C, C>> {
        Some(Box::new(FinetuneTask::<C>::new(device)))
    }
}
