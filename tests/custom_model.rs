//! Bring your own model: the MLP family of `examples/custom_model.rs` (defined and registered
//! there, outside the mopt crates) runs `examples/recipes/custom_mlp.toml` through the same
//! runner and command line as `mopt-train`: `--check` plans it, the five stages run and gate,
//! the report and the ONNX file are written, what it writes reloads, and `--resume` finishes an
//! interrupted run with the same results.

#[path = "../examples/custom_model.rs"]
#[allow(dead_code)]
mod custom_model;

use std::path::{Path, PathBuf};

use burn::prelude::*;
use custom_model::Mlp;
use mopt::Registry;
use mopt_core::{Checkpoint, Quantizable};
use mopt_families::image::ImageFamily;

fn registry() -> Registry {
    mopt_families::builtin().with_family(ImageFamily::<Mlp>::new())
}

/// The shipped recipe and its shape files copied into `dir`, its data path made absolute and
/// its output folder `dir/runs`.
fn recipe_in(dir: &Path) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let data = root.join("datasets/data/mnist-5k/mnist_5k.csv.gz");
    assert!(
        data.is_file(),
        "{} missing: run `datasets/fetch.sh --small` first",
        data.display()
    );
    let src = root.join("examples/recipes");
    for f in ["mlp-teacher.json", "mlp-student.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let text = std::fs::read_to_string(src.join("custom_mlp.toml"))
        .unwrap()
        .replace("\"../../checkpoints\"", &format!("{:?}", dir.join("runs")))
        .replace(
            "\"../../datasets/",
            &format!("\"{}/datasets/", root.display()),
        );
    let path = dir.join("custom_mlp.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn run(args: &[&str]) -> u8 {
    let argv = std::iter::once("custom_model").chain(args.iter().copied());
    mopt::cli::run_from(registry(), argv)
}

fn report(run: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(run.join("report.json")).unwrap()).unwrap()
}

#[test]
fn a_family_of_its_own_runs_a_five_stage_recipe_through_the_runner() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = recipe_in(tmp.path());
    let r = recipe.to_str().unwrap();

    // The plan, without running: every stage sees the MLP's shapes.
    let pipeline = mopt_stages::Pipeline::load(&recipe, &registry()).unwrap();
    let plan = pipeline.check(&mopt_train::DeviceSpec::Cpu).unwrap();
    for needle in [
        "[784, 256, 10]",
        "[784, 64, 10]",
        "finetune",
        "prune",
        "ptq",
        "export",
    ] {
        assert!(plan.contains(needle), "{needle} not in the plan:\n{plan}");
    }
    assert_eq!(run(&[r, "--check"]), 0);
    assert!(!tmp.path().join("runs").exists(), "--check wrote nothing");
    // mopt-train's own registry does not know the family: a clear error naming the key.
    let err = mopt_stages::Pipeline::load(&recipe, &mopt_families::builtin())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("unknown architecture `mlp`"), "{err}");

    assert_eq!(run(&[r]), 0);
    let dir = tmp.path().join("runs/custom-mlp");
    let rep = report(&dir);
    let stages = rep["stages"].as_array().unwrap();
    let names: Vec<&str> = stages.iter().map(|s| s["kind"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["baseline", "finetune", "distill", "prune", "ptq", "export"]
    );
    let acc = |i: usize| stages[i]["model"]["valid"]["accuracy"].as_f64().unwrap();
    // Ten classes: random init is near chance; the fine-tuned teacher learns the digits.
    assert!(acc(0) < 0.3 && acc(1) > 0.85, "{} {}", acc(0), acc(1));
    for (i, st) in stages.iter().enumerate().take(5).skip(2) {
        let action = st["decision"]["action"].as_str().unwrap();
        assert_eq!(action, "kept", "stage {i}: {}", st["decision"]);
    }
    // The student (64 neurons) lost a quarter or half of its neurons to pruning.
    let ckpt = PathBuf::from(stages[3]["model"]["checkpoint"].as_str().unwrap());
    let (pruned, _) = Mlp::load(&ckpt, &Device::flex()).unwrap();
    let width = pruned.layers[0].weight.val().dims()[1];
    assert!(width == 48 || width == 32, "{width}");
    let params = stages[3]["model"]["params"].as_u64().unwrap() as usize;
    assert_eq!(params, 784 * width + width + width * 10 + 10);
    // The final model is the quantized one, and reloads quantized.
    let (q, _) = Mlp::load(&dir.join("best"), &Device::flex()).unwrap();
    assert!(q.is_quantized());
    assert!(dir.join("05-export/onnx/model.onnx").is_file());
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.contains("mlp"), "{md}");

    // Interrupted after the fourth stage: --resume reuses the finished stages and ends with the
    // same models and metrics.
    std::fs::remove_dir_all(dir.join("05-export")).unwrap();
    std::fs::remove_file(dir.join("report.json")).unwrap();
    assert_eq!(run(&[r, "--resume"]), 0);
    let again = report(&dir);
    for (a, b) in stages.iter().zip(again["stages"].as_array().unwrap()) {
        assert_eq!(a["model"]["sha256"], b["model"]["sha256"], "{}", a["name"]);
        assert_eq!(a["model"]["test"], b["model"]["test"], "{}", a["name"]);
    }
}
