//! A run declared in Rust, without TOML: the shared sections of `recipes/distill_bert.toml` set
//! with `Recipe::builder` (typed settings with the recipe's defaults, validated as a recipe file
//! is), then the stages pushed in Rust: a 2-layer distilled student with a custom loss term (a
//! confidence penalty), gated against the teacher with rollback, then the ONNX export. The run
//! folder is `checkpoints/distill-in-rust/`.
//!
//! ```sh
//! cargo run --example distill_in_rust -- 500     # keep 500 training examples for a quick run
//! ```

use burn::tensor::activation::log_softmax;
use mopt_data::TextRecipe;
use mopt_distill::spec::*;
use mopt_models::bert::BertModelKeys;
use mopt_recipe::{GateReference, GateSpec, ModelSpec, Recipe};
use mopt_stages::kinds::{distill::DistillStage, distill::ExtraTerm, export::ExportStage};
use mopt_stages::Pipeline;

const MINILM: &str = "datasets/data/models/all-MiniLM-L6-v2";
const CORPUS: &str = "datasets/data/rotten_tomatoes/rotten_tomatoes_corpus_full.csv.bz2";

fn main() -> anyhow::Result<()> {
    // As mopt-train starts: the allocator keeps freed memory, this thread is the kernels'
    // worker 0 (see mopt_kernels::init_pool).
    mopt_kernels::tune_allocator();
    mopt_kernels::init_pool(None)?;
    // The settings of recipes/distill_bert.toml; every key not set keeps the default it shares
    // with the file (batch 32, AdamW with weight decay 0.01, 10% warmup, 10%/10% validation and
    // test splits with split seed 42, 30 timed latency runs, …). Paths start at the repository;
    // the first argument, if any, keeps that many training examples.
    let keep: Option<usize> = std::env::args().nth(1).map(|s| s.parse()).transpose()?;
    let recipe = Recipe::builder("distill-in-rust")
        .base_dir(env!("CARGO_MANIFEST_DIR"))
        .output_dir("checkpoints")
        .seed(42)
        .teacher("checkpoints/finetune-teacher/best")
        .teacher_recipe("recipes/finetune_teacher.toml")
        .tokenizer(format!("{MINILM}/tokenizer.json"))
        .max_len(64)
        .data("rotten-tomatoes", CORPUS)
        .max_train(keep)
        .epochs(2)
        .lr(8e-5)
        .build()?;

    // The student: the teacher's width, 2 layers initialised from teacher layers 1 and 4, its
    // hidden states matched to teacher layers 2 and 5, α going from 0.7 to 0.3.
    let student = ModelSpec::builder(format!("{MINILM}/config.json"))
        .init_from_teacher_layers(&[1, 4])
        .num_hidden_layers(2)
        .build(&recipe.scope.stage(1).nested("student"))?;
    let pairs = LayerMap::Pairs(vec![(1, 2), (2, 5)]);
    let hidden = MatchSpec::new(Feature::Hidden, MatchLoss::Cosine, pairs).weight(0.5);
    let mut objective = DistillSpec::default().with_match(hidden);
    objective.alpha = Schedule::Linear { from: 0.7, to: 0.3 };
    // A custom loss term: β · (−entropy) of the student's predictions, which discourages
    // over-confident students (Pereyra et al., 2017). It reads the logits the objective has
    // already computed.
    let penalty: ExtraTerm = std::sync::Arc::new(|out, _batch| {
        let log_p = log_softmax(out.logits.clone(), 1);
        let neg_entropy = (log_p.clone().exp() * log_p).sum() / out.logits.dims()[0] as f32;
        let v: f32 = neg_entropy.clone().into_scalar();
        (neg_entropy * 0.1, vec![("confidence_penalty", v as f64)])
    });
    let distill = DistillStage::new(student, objective, recipe.scope.stage(1)).with_term(penalty);
    let export = ExportStage {
        samples: 200,
        tolerance: 1e-4,
        latency_runs: Some(10),
        reference: vec!["baseline".into()],
        convert: Vec::new(),
    };
    // At most 5 points of validation accuracy below the teacher, else rolled back.
    let gate = GateSpec::max_drop(0.05, GateReference::Baseline);
    let train = recipe.train.clone();
    let pipeline = Pipeline::shared(recipe, &mopt_families::builtin())
        .push("distill-2l", train.clone(), Some(gate), distill)
        .push("export", train, None, export);
    // `[run] device` and `devices` of the recipe, as the binary reads them.
    let mut options = pipeline.options()?;
    options.force = true; // replace an earlier run's folder
    let report = pipeline.run(&options)?;
    for st in &report.stages {
        let action = st.decision.action.label();
        println!("{} {}: {action}, {}", st.index, st.name, st.model.describe);
    }
    println!("report: {}/report.md", report.run_dir);
    Ok(())
}
