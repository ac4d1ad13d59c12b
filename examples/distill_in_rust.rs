//! A distillation set up entirely in Rust against the library crates, with a custom loss term.
//!
//! Data, tokenizer and optimiser settings come from the teacher's recipe; the teacher, the
//! student, the objective and the matches are declared here, and a custom term (a confidence
//! penalty on the student's predictions) is added by wrapping mopt's distillation task.
//!
//! ```sh
//! cargo run --example distill_in_rust -- 500     # keep 500 training examples for a quick run
//! ```

use std::path::PathBuf;

use burn::prelude::*;
use burn::tensor::activation::{log_softmax, softmax};
use mopt_data::TextBatch;
use mopt_distill::pipeline::{ensure_teacher, init_student, setup, teacher_source};
use mopt_distill::{DistillModel, DistillTask};
use mopt_models::bert::BertForSequenceClassification;
use mopt_recipe::{
    DistillSpec, Feature, HeadPolicy, LayerMap, MatchLoss, MatchSpec, Schedule, SoftLoss,
    TeacherSpec, Tokens,
};
use mopt_train::trainer::{fit, RunContext, Task, TrainOptions};
use mopt_train::{rundir, DeviceSpec};

/// mopt's distillation objective plus `β · (−entropy)` of the student's predictions, which
/// discourages over-confident students (Pereyra et al., 2017).
struct WithConfidencePenalty {
    inner: DistillTask,
    beta: f32,
}

impl Task for WithConfidencePenalty {
    type Model = DistillModel;

    fn loss(
        &mut self,
        model: &DistillModel,
        b: &TextBatch,
        idx: &[usize],
        progress: f64,
    ) -> (Tensor<1>, Vec<(&'static str, f64)>) {
        let (loss, mut parts) = self.inner.objective(model, b, idx, progress);
        let logits = model.student.forward(
            b.input_ids.clone(),
            b.attention_mask.clone(),
            b.token_type_ids.clone(),
        );
        let [batch, _] = logits.dims();
        let neg_entropy = (softmax(logits.clone(), 1) * log_softmax(logits, 1))
            .sum()
            .div_scalar(batch as f32);
        let v: f32 = neg_entropy.clone().into_scalar();
        parts.push(("confidence_penalty", v as f64));
        (loss + neg_entropy.mul_scalar(self.beta), parts)
    }

    fn classifier<'a>(&self, model: &'a DistillModel) -> &'a BertForSequenceClassification {
        &model.student
    }
}

fn main() -> anyhow::Result<()> {
    let keep: Option<usize> = std::env::args().nth(1).map(|s| s.parse()).transpose()?;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let teacher_recipe = root.join("recipes/finetune_teacher.toml");

    let mut recipe = mopt_recipe::load(&teacher_recipe)?;
    recipe.run.name = "distill-in-rust".into();
    recipe.teacher = Some(TeacherSpec {
        checkpoint: root.join("checkpoints/finetune-teacher/best"),
        recipe: Some(teacher_recipe),
    });
    // Student: 2 layers taken from teacher layers 1 and 4.
    recipe.model.weights = None;
    recipe.model.init_from_teacher_layers = Some(vec![1, 4]);
    recipe.model.overrides.num_hidden_layers = Some(2);
    recipe.data.max_train = keep;
    recipe.train.epochs = 1;
    recipe.train.lr = 1e-4;
    recipe.distill = Some(DistillSpec {
        enabled: true,
        alpha: Schedule::Linear { from: 0.7, to: 0.3 },
        temperature: Schedule::Constant(4.0),
        soft_loss: SoftLoss::Kl,
        teacher_cache: true,
        baseline: false,
        matches: vec![MatchSpec {
            feature: Feature::Hidden,
            loss: MatchLoss::Cosine,
            layers: LayerMap::Pairs(vec![(1, 2), (2, 5)]),
            weight: 0.5,
            projection: false,
            heads: HeadPolicy::Error,
            tokens: Tokens::All,
            until_epoch: None,
            rows: 0,
            index: 0,
        }],
    });

    let device_spec = DeviceSpec::Cpu;
    let device = device_spec.device();
    let ad = device.clone().autodiff();
    ensure_teacher(&recipe, &device_spec)?;
    let s = setup(&recipe, &device)?;
    let (source, cache) = teacher_source(&recipe, &s, &device)?;
    println!("teacher cache hit: {}", cache.hit);
    let dir = rundir::create_run_dir(&recipe, &recipe.run.run_dir(), true)?;
    let opts = TrainOptions::default();
    let ctx = RunContext {
        recipe: &recipe,
        device_spec: &device_spec,
        run_dir: &dir,
        opts: &opts,
        data: &s.prepared.data,
        tokenizer_file: &s.prepared.tokenizer.path,
        pad_id: s.prepared.tokenizer.pad_id,
        config: &s.student_config,
    };
    let model = DistillModel::new(init_student(&recipe, &s, &ad)?, &s.plan.projections, &ad);
    let task = WithConfidencePenalty {
        inner: DistillTask::new(s.spec.clone(), s.plan.clone(), source, &ad),
        beta: 0.1,
    };
    let report = fit(&ctx, task, model)?;
    println!(
        "2-layer student: test accuracy {:.4}, macro-F1 {:.4} ({} steps); run folder {}",
        report.test.accuracy,
        report.test.macro_f1,
        report.steps,
        dir.display()
    );
    Ok(())
}
