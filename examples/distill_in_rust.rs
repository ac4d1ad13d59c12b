//! A pipeline declared in Rust: the shared sections (teacher, data, tokenizer, evaluation) come
//! from `recipes/distill_bert.toml`; the stages are declared here — a 2-layer distillation with a
//! custom loss term, a custom stage (drop the student's last layer), each gated against the
//! teacher with rollback, then the ONNX export.
//!
//! ```sh
//! cargo run --example distill_in_rust -- 500     # keep 500 training examples for a quick run
//! ```

use std::path::Path;
use std::sync::Arc;

use burn::tensor::activation::{log_softmax, softmax};
use mopt_distill::spec::*;
use mopt_models::bert::student::from_teacher_layers;
use mopt_models::bert::{weights, BertConfig};
use mopt_recipe::{GateReference, GateSpec, StageEntry};
use mopt_stages::kinds::distill::{DistillStage, ExtraTerm};
use mopt_stages::kinds::export::ExportStage;
use mopt_stages::shape::Shape;
use mopt_stages::{Pipeline, RunOptions, Stage, StageContext, StageError, StageOutput, StagePlan};
use mopt_train::trainer::save_checkpoint_dir;

/// A custom stage: remove the input's last encoder layer (embeddings, pooler and head kept).
struct DropLastLayer;

fn shallower(c: &BertConfig) -> BertConfig {
    let n = c.num_hidden_layers - 1;
    let mut out = c.clone();
    out.num_hidden_layers = n;
    out.mopt_layer_heads = c.mopt_layer_heads.as_ref().map(|h| h[..n].to_vec());
    out.mopt_layer_intermediate_sizes = c
        .mopt_layer_intermediate_sizes
        .as_ref()
        .map(|f| f[..n].to_vec());
    out
}

impl Stage for DropLastLayer {
    fn kind(&self) -> &str {
        "drop-last-layer"
    }

    fn plan(
        &self,
        _: &StageEntry,
        input: &Shape,
        _: &mopt_stages::stage::PlanContext,
    ) -> Result<StagePlan, StageError> {
        Ok(StagePlan {
            output: Shape::new(shallower(input.get::<BertConfig>()?)),
            settings: vec!["remove the last encoder layer".into()],
            memory: None,
            extra_memory: Vec::new(),
        })
    }

    fn run(&self, input: &Path, cx: &StageContext) -> Result<StageOutput, StageError> {
        let (model, config) = weights::load_checkpoint(input, &cx.device.device())?;
        let keep: Vec<usize> = (0..config.num_hidden_layers - 1).collect();
        let out = cx.dir.join("model");
        save_checkpoint_dir(
            &from_teacher_layers(&model, &keep),
            &shallower(&config),
            cx.data,
            &out,
        )?;
        Ok(StageOutput {
            checkpoint: out,
            steps: 0,
            facts: serde_json::json!({ "layers_kept": keep }),
            notes: vec![format!(
                "kept layers {keep:?} of {}",
                config.num_hidden_layers
            )],
            references: Vec::new(),
            logit_error_vs_input: None,
            artifacts: Vec::new(),
        })
    }
}

fn main() -> anyhow::Result<()> {
    // As mopt-train starts: the allocator keeps freed memory, this thread is the kernels'
    // worker 0 (see mopt_kernels::init_pool).
    mopt_kernels::tune_allocator();
    mopt_kernels::init_pool(None)?;
    let keep: Option<usize> = std::env::args().nth(1).map(|s| s.parse()).transpose()?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut recipe = mopt_recipe::load(root.join("recipes/distill_bert.toml"))?;
    recipe.data.max_train = keep;

    // The student: the recipe's student table, 2 layers taken from teacher layers 1 and 4.
    let mut student = DistillStage::from_entry(&recipe.stages[0])?.student;
    student.init_from_teacher_layers = Some(vec![1, 4]);
    student.overrides.num_hidden_layers = Some(2);
    let objective = DistillSpec {
        alpha: Schedule::Linear { from: 0.7, to: 0.3 },
        ..DistillSpec::default()
    }
    .with_match(
        MatchSpec::new(
            Feature::Hidden,
            MatchLoss::Cosine,
            LayerMap::Pairs(vec![(1, 2), (2, 5)]),
        )
        .weight(0.5),
    );
    // A custom loss term: β · (−entropy) of the student's predictions, which discourages
    // over-confident students (Pereyra et al., 2017). It reads the logits the objective has
    // already computed.
    let confidence_penalty: ExtraTerm = Arc::new(|out, _batch| {
        let batch = out.logits.dims()[0] as f32;
        let neg_entropy = (softmax(out.logits.clone(), 1) * log_softmax(out.logits.clone(), 1))
            .sum()
            .div_scalar(batch);
        let v: f32 = neg_entropy.clone().into_scalar();
        (
            neg_entropy.mul_scalar(0.1),
            vec![("confidence_penalty", v as f64)],
        )
    });
    let distill =
        DistillStage::new(student, objective, recipe.scope.stage(1)).with_term(confidence_penalty);

    let mut train = recipe.train.clone();
    train.epochs = 1;
    train.lr = 1e-4;
    let gate = GateSpec::max_drop(0.05, GateReference::Baseline);
    let export = ExportStage {
        samples: 200,
        tolerance: 1e-4,
        latency_runs: Some(10),
        reference: vec!["baseline".into()],
    };
    let pipeline = Pipeline::shared(recipe)
        .named("distill-in-rust")
        .push("distill-2l", train.clone(), Some(gate.clone()), distill)
        .push("drop-last-layer", train.clone(), Some(gate), DropLastLayer)
        .push("export", train, None, export);
    // `[run] device` and `devices` of the recipe, as the binary reads them.
    let report = pipeline.run(&RunOptions {
        force: true,
        ..pipeline.options()?
    })?;
    for st in &report.stages {
        println!(
            "{} {}: {} — validation accuracy {:.4}, test {:.4}, {}",
            st.index,
            st.name,
            st.decision.action.label(),
            st.model.valid.accuracy,
            st.model.test.accuracy,
            st.model.describe
        );
    }
    println!("report: {}/report.md", report.run_dir);
    Ok(())
}
