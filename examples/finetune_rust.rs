//! A recipe written in Rust: start from a TOML recipe, change it in code, train it with the library
//! crates, then classify new sentences with the best checkpoint.
//!
//! ```sh
//! cargo run --example finetune_rust -- recipes/finetune_teacher.toml 200
//! ```
//! (the second argument keeps that many training examples, for a quick run).

use std::path::PathBuf;

use mopt_stages::{Pipeline, RunOptions};
use mopt_train::DeviceSpec;

fn main() -> anyhow::Result<()> {
    // As mopt-train starts: the allocator keeps freed memory, this thread is the kernels'
    // worker 0 (see mopt_kernels::init_pool).
    mopt_kernels::tune_allocator();
    mopt_kernels::init_pool(None)?;
    let mut args = std::env::args().skip(1);
    let recipe_path = PathBuf::from(
        args.next()
            .unwrap_or_else(|| "recipes/finetune_teacher.toml".into()),
    );
    let keep: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(200);

    // Any field of the validated recipe can be changed in code.
    let mut recipe = mopt_recipe::load(&recipe_path)?;
    recipe.run.name = format!("{}-rust-example", recipe.run.name);
    recipe.data.max_train = Some(keep);
    recipe.data.max_eval = Some(keep / 2);
    // Each stage carries its own training settings ([train] with its [stage.train] overrides).
    for stage in &mut recipe.stages {
        stage.train.epochs = 1;
    }

    let (device, registry) = (DeviceSpec::Cpu, mopt_families::builtin());
    let dir = recipe.run.run_dir();
    let report = Pipeline::from_recipe(recipe.clone(), &registry)?.run(&RunOptions {
        force: true,
        ..RunOptions::new(device.clone())
    })?;
    println!(
        "test accuracy {:.3} on {} examples",
        report.final_model.test.accuracy, report.final_model.test.examples
    );

    // Classify new text with the saved checkpoint.
    let model = mopt_stages::Predictor::load(&registry, &recipe, &dir.join("best"))?;
    let sentences = [
        "a warm, funny and beautifully acted film",
        "a tedious, lifeless mess",
    ];
    for (s, p) in sentences.iter().zip(model.predict(&sentences)?) {
        println!("{s:?} -> {} ({:.2})", p.label, p.probability);
    }
    Ok(())
}
