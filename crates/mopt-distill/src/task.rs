//! The distillation objective as a [`Task`] for mopt's trainer.
//!
//! `L = α·CE(student, labels) + (1−α)·soft(student, teacher; T) + Σ weightᵢ·matchᵢ`, with α and T
//! following their schedules over training. With `enabled = false` only the CE term remains (the
//! hard-label twin).

use burn::nn::loss::{CrossEntropyLoss, CrossEntropyLossConfig};
use burn::prelude::*;
use mopt_data::{Batcher, Encoded, TextBatch};
use mopt_models::bert::{BertForSequenceClassification, ForwardOptions};
use mopt_recipe::{DistillSpec, Feature};
use mopt_train::trainer::Task;

use crate::cache::{live_batch, TeacherCache};
use crate::loss::soft_loss;
use crate::matching::{match_loss, MatchPlan, TeacherBatch};
use crate::student::DistillModel;

/// Where teacher outputs come from.
pub enum TeacherSource {
    /// Precomputed for every training example.
    Cache(TeacherCache),
    /// The teacher runs on each batch (inference device, no gradients).
    Live {
        teacher: Box<BertForSequenceClassification>,
        examples: Vec<Encoded>,
        batcher: Batcher,
        device: Device,
    },
    /// Hard labels only: no teacher.
    None,
}

pub struct DistillTask {
    pub spec: DistillSpec,
    pub plan: MatchPlan,
    pub source: TeacherSource,
    ce: CrossEntropyLoss,
    opts: ForwardOptions,
}

impl DistillTask {
    pub fn new(spec: DistillSpec, plan: MatchPlan, source: TeacherSource, device: &Device) -> Self {
        let any =
            |f: &[Feature]| spec.enabled && plan.matches.iter().any(|m| f.contains(&m.feature));
        let opts = ForwardOptions {
            hidden_states: any(&[Feature::Hidden, Feature::Embeddings]),
            attentions: any(&[Feature::AttentionProbs]),
            attention_scores: any(&[Feature::AttentionScores]),
        };
        Self {
            spec,
            plan,
            source,
            ce: CrossEntropyLossConfig::new().init(device),
            opts,
        }
    }

    fn teacher_batch(
        &self,
        indices: &[usize],
        seq: usize,
        device: &Device,
    ) -> Option<TeacherBatch> {
        match &self.source {
            TeacherSource::Cache(c) => Some(c.batch(indices, seq, device)),
            TeacherSource::Live {
                teacher,
                examples,
                batcher,
                device: plain,
            } => {
                let items: Vec<&Encoded> = indices.iter().map(|&i| &examples[i]).collect();
                Some(live_batch(
                    teacher,
                    &items,
                    &self.plan.needs,
                    batcher,
                    plain,
                ))
            }
            TeacherSource::None => None,
        }
    }

    /// Loss and components for a batch (also used by tests to compare cached and live teachers).
    pub fn objective(
        &self,
        model: &DistillModel,
        b: &TextBatch,
        indices: &[usize],
        progress: f64,
    ) -> (Tensor<1>, Vec<(&'static str, f64)>) {
        let out = model.student.forward_with(
            b.input_ids.clone(),
            b.attention_mask.clone(),
            b.token_type_ids.clone(),
            self.opts,
        );
        let ce = self.ce.forward(out.logits.clone(), b.labels.clone());
        let ce_v: f32 = ce.clone().into_scalar();
        let seq = b.input_ids.dims()[1];
        let teacher = match (
            self.spec.enabled,
            self.teacher_batch(indices, seq, &b.input_ids.device()),
        ) {
            (true, Some(t)) => t,
            _ => return (ce, vec![("ce", ce_v as f64)]),
        };
        let alpha = self.spec.alpha.at(progress);
        let temperature = self.spec.temperature.at(progress);
        let soft = soft_loss(
            out.logits.clone(),
            teacher.logits.clone(),
            temperature,
            self.spec.soft_loss,
        );
        let soft_v: f32 = soft.clone().into_scalar();
        let mut loss = ce.mul_scalar(alpha as f32) + soft.mul_scalar((1.0 - alpha) as f32);
        let mut parts = vec![
            ("ce", ce_v as f64),
            ("soft", soft_v as f64),
            ("alpha", alpha),
            ("temperature", temperature),
        ];
        for m in &self.plan.matches {
            let l = match_loss(m, &out, &teacher, &model.projections, &b.attention_mask);
            let v: f32 = l.clone().into_scalar();
            parts.push((m.name, v as f64));
            loss = loss + l;
        }
        (loss, parts)
    }
}

impl Task for DistillTask {
    type Model = DistillModel;

    fn loss(
        &mut self,
        model: &DistillModel,
        batch: &TextBatch,
        indices: &[usize],
        progress: f64,
    ) -> (Tensor<1>, Vec<(&'static str, f64)>) {
        self.objective(model, batch, indices, progress)
    }

    fn classifier<'a>(&self, model: &'a DistillModel) -> &'a BertForSequenceClassification {
        &model.student
    }
}
