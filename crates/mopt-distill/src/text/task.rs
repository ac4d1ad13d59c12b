//! The distillation objective as a [`Task`] for mopt's trainer.
//!
//! `L = α·CE(student, labels) + (1−α)·soft(student, teacher; T) + Σ weightᵢ·matchᵢ`, with α and T
//! following their schedules over training. With `enabled = false` only the CE term remains (the
//! hard-label twin).

use crate::spec::{DistillSpec, Feature};
use burn::nn::loss::{CrossEntropyLoss, CrossEntropyLossConfig};
use burn::prelude::*;
use mopt_core::{TapRequest, Tapped, Taps};
use mopt_data::{Batcher, Encoded, TextBatch};
use mopt_train::trainer::{Parts, Replica, Task};

use crate::kd::kd_loss;
use crate::matching::{match_loss, MatchPlan, TeacherBatch, TeacherNeeds, WordRows};
use crate::student::DistillModel;
use crate::text::cache::{live_batch, TeacherCache};

/// Where the outputs of a teacher `M` come from.
pub enum TeacherSource<M> {
    /// Precomputed for every training example.
    Cache(TeacherCache),
    /// The teacher runs on each batch (inference device, no gradients).
    Live {
        /// The teacher.
        teacher: Box<M>,
        /// The training split, encoded.
        examples: Vec<Encoded>,
        /// Pads the teacher's batches.
        batcher: Batcher,
        /// The teacher's device.
        device: Device,
    },
    /// Hard labels only: no teacher.
    None,
}

pub use crate::kd::ExtraTerm;

/// Distillation of a student `M` (any [`Tapped`] model on text batches) from a teacher of the
/// same family.
pub struct DistillTask<M> {
    /// The objective's settings.
    pub spec: DistillSpec,
    /// The matches, resolved against both models.
    pub plan: MatchPlan,
    /// Where the teacher's outputs come from.
    pub source: TeacherSource<M>,
    ce: CrossEntropyLoss,
    opts: TapRequest,
    /// Current epoch (1-based); matches with `until_epoch < epoch` are off.
    epoch: usize,
    /// The teacher's word-embedding table `[vocab, hidden_t]` (word-embedding matches).
    teacher_words: Option<Tensor<2>>,
    /// A term of the caller's, added to the student's loss (not the twin's).
    extra: Option<ExtraTerm>,
}

impl<M: Tapped<Batch = TextBatch>> DistillTask<M> {
    /// The objective `spec` with the matches `plan`, the teacher's outputs from `source`, on the training `device`.
    pub fn new(
        spec: DistillSpec,
        plan: MatchPlan,
        source: TeacherSource<M>,
        device: &Device,
    ) -> Self {
        let mut task = Self {
            spec,
            plan,
            source,
            ce: CrossEntropyLossConfig::new().init(device),
            opts: TapRequest::default(),
            epoch: 1,
            teacher_words: None,
            extra: None,
        };
        task.begin_epoch(1);
        task
    }

    /// Add a loss term of the caller's (see [`ExtraTerm`]).
    pub fn with_extra(mut self, term: Option<ExtraTerm>) -> Self {
        self.extra = term;
        self
    }

    /// Give the task the teacher's word-embedding table (`[vocab, hidden_t]`, on the training
    /// device), which `feature = "word-embeddings"` matches compare the student's table with.
    pub fn with_teacher_word_embeddings(mut self, table: Tensor<2>) -> Self {
        self.teacher_words = Some(table);
        self
    }

    /// Sample vocabulary rows for the active word-embedding matches of this batch (as many as
    /// the largest `rows`; each match reads its own leading `rows`): the seed comes from the
    /// batch's example indices and the epoch, so a batch's rows are reproducible.
    fn word_rows(&self, indices: &[usize]) -> Option<WordRows> {
        let rows = self
            .active_matches()
            .filter(|m| m.feature == Feature::WordEmbeddings)
            .map(|m| m.rows)
            .max()?;
        let table = self.teacher_words.as_ref().expect(
            "a word-embedding match needs DistillTask::with_teacher_word_embeddings(teacher table)",
        );
        let mut seed = mopt_data::SplitMix64::new(self.epoch as u64).next_u64();
        for &i in indices {
            seed = mopt_data::SplitMix64::new(seed ^ i as u64).next_u64();
        }
        Some(WordRows::sample(table, rows, seed))
    }

    /// The student forward outputs the active matches read.
    fn forward_options(&self) -> TapRequest {
        let active: Vec<Feature> = self.active_matches().map(|m| m.feature).collect();
        let any = |f: &[Feature]| active.iter().any(|a| f.contains(a));
        TapRequest {
            hidden_states: any(&[Feature::Hidden, Feature::Embeddings]),
            attentions: any(&[Feature::AttentionProbs]),
            attention_scores: any(&[Feature::AttentionScores]),
        }
    }

    /// The matches on in the current epoch (none for the hard-label twin).
    fn active_matches(&self) -> impl Iterator<Item = &crate::matching::ResolvedMatch> {
        let epoch = self.epoch;
        self.plan
            .matches
            .iter()
            .filter(move |m| self.spec.enabled && m.active(epoch))
    }

    fn teacher_batch(
        &self,
        indices: &[usize],
        seq: usize,
        device: &Device,
    ) -> Option<TeacherBatch> {
        let features = self.active_matches().next().is_some();
        match &self.source {
            TeacherSource::Cache(c) => Some(c.batch_with(indices, seq, device, features)),
            TeacherSource::Live {
                teacher,
                examples,
                batcher,
                device: plain,
            } => {
                let items: Vec<&Encoded> = indices.iter().map(|&i| &examples[i]).collect();
                let none = TeacherNeeds::default();
                Some(live_batch(
                    &**teacher,
                    &items,
                    if features { &self.plan.needs } else { &none },
                    batcher,
                    plain,
                ))
            }
            TeacherSource::None => None,
        }
    }

    /// Loss and components for a batch (also used by tests to compare cached and live teachers),
    /// the caller's extra term included.
    pub fn objective(
        &self,
        model: &DistillModel<M>,
        b: &TextBatch,
        indices: &[usize],
        progress: f64,
    ) -> (Tensor<1>, Parts) {
        let out = model.student.forward_taps(b, self.opts);
        let (loss, mut parts) = self.terms(model, &out, b, indices, progress);
        match &self.extra {
            None => (loss, parts),
            Some(term) => {
                let (extra, more) = term(&out, b);
                parts.extend(more);
                (loss + extra, parts)
            }
        }
    }

    /// mopt's own terms on the student's outputs `out`.
    fn terms(
        &self,
        model: &DistillModel<M>,
        out: &Taps,
        b: &TextBatch,
        indices: &[usize],
        progress: f64,
    ) -> (Tensor<1>, Parts) {
        let ce = self.ce.forward(out.logits.clone(), b.labels.clone());
        let seq = b.input_ids.dims()[1];
        let teacher = match (
            self.spec.enabled,
            self.teacher_batch(indices, seq, &b.input_ids.device()),
        ) {
            (true, Some(mut t)) => {
                t.word_rows = self.word_rows(indices);
                t
            }
            _ => {
                let ce_v: f32 = ce.clone().into_scalar();
                return (ce, vec![("ce", ce_v as f64)]);
            }
        };
        let (mut loss, mut parts) = kd_loss(
            ce,
            out.logits.clone(),
            teacher.logits.clone(),
            &self.spec.kd(),
            progress,
        );
        let words = model.student.word_embeddings();
        let mask = M::token_mask(b);
        for m in self.active_matches() {
            let l = match_loss(m, out, &teacher, &model.projections, &mask, words.as_ref());
            let v: f32 = l.clone().into_scalar();
            parts.push((m.name, v as f64));
            loss = loss + l;
        }
        (loss, parts)
    }
}

impl<M: Tapped<Batch = TextBatch>> Task for DistillTask<M> {
    type Model = DistillModel<M>;
    type Classifier = M;

    fn loss(
        &mut self,
        model: &DistillModel<M>,
        batch: &TextBatch,
        indices: &[usize],
        progress: f64,
    ) -> (Tensor<1>, Vec<(&'static str, f64)>) {
        self.objective(model, batch, indices, progress)
    }

    fn classifier<'a>(&self, model: &'a DistillModel<M>) -> &'a M {
        &model.student
    }

    /// Matches past their `until-epoch` switch off; the student then skips what they read.
    fn begin_epoch(&mut self, epoch: usize) {
        self.epoch = epoch;
        self.opts = self.forward_options();
    }

    fn replicate(&self, device: &Device) -> Option<Replica<DistillModel<M>, M>> {
        Some(Box::new(self.replica(device)))
    }
}

impl<M: Tapped<Batch = TextBatch>> DistillTask<M> {
    /// This objective for a data-parallel replica on `device`: a live teacher is forked there,
    /// cached teacher outputs are shared.
    pub fn replica(&self, device: &Device) -> Self {
        let source = match &self.source {
            TeacherSource::Cache(c) => TeacherSource::Cache(c.clone()),
            TeacherSource::Live {
                teacher,
                examples,
                batcher,
                device: _,
            } => TeacherSource::Live {
                teacher: Box::new((**teacher).clone().fork(device)),
                examples: examples.clone(),
                batcher: batcher.clone(),
                device: device.clone(),
            },
            TeacherSource::None => TeacherSource::None,
        };
        Self {
            spec: self.spec.clone(),
            plan: self.plan.clone(),
            source,
            ce: CrossEntropyLossConfig::new().init(device),
            opts: self.opts,
            epoch: self.epoch,
            teacher_words: self.teacher_words.clone().map(|t| t.to_device(device)),
            extra: self.extra.clone(),
        }
    }
}
