//! Data-parallel training (`[run] devices`) on two CPU replicas: the code path a multi-GPU run
//! takes (shards on worker threads, gradients merged on the main device, one optimizer step).

mod common;

use common::*;
use std::path::Path;

/// The tiny recipe's text without dropout, with `batch` examples per device and the `devices`
/// line (empty: one device); the recipe is written to `dir/tiny.toml`.
fn tiny_parallel(
    dir: &Path,
    name: &str,
    batch: usize,
    devices: &str,
) -> (std::path::PathBuf, String) {
    std::fs::create_dir_all(dir).unwrap();
    let recipe = write_tiny_recipe(dir, name, "");
    let text = std::fs::read_to_string(&recipe)
        .unwrap()
        .replace("seed = 7\n", &format!("seed = 7\n{devices}\n"))
        .replace("[model]\n", "[model]\ndropout = 0.0\n")
        .replace("batch-size = 16", &format!("batch-size = {batch}"));
    (recipe, text)
}

fn run(dir: &Path, name: &str, batch: usize, devices: &str) -> serde_json::Value {
    let (recipe, text) = tiny_parallel(dir, name, batch, devices);
    std::fs::write(&recipe, text).unwrap();
    let check = mopt(&[recipe.to_str().unwrap(), "--check"]);
    assert!(check.status.success(), "{}", stderr(&check));
    let plan = String::from_utf8_lossy(&check.stdout).into_owned();
    assert_eq!(
        plan.contains("data-parallel on devices [0, 1]: batch-size 8 per device, effective batch 8 x 2 x grad-accum 1 = 16"),
        !devices.is_empty(),
        "{plan}"
    );
    let out = mopt(&[recipe.to_str().unwrap(), "--max-steps", "4"]);
    assert!(out.status.success(), "{}", stderr(&out));
    read_json(&dir.join(format!("runs/{name}/01-finetune/report.json")))
}

#[test]
fn two_replicas_of_8_match_one_device_of_16() {
    let tmp = tempfile::tempdir().unwrap();
    let one = run(&tmp.path().join("one"), "one", 16, "");
    let two = run(&tmp.path().join("two"), "two", 8, "devices = [0, 1]");
    let half = run(&tmp.path().join("half"), "half", 8, "");
    assert_eq!(one["steps"], 4);
    assert_eq!(two["steps"], 4);
    let loss = |r: &serde_json::Value| r["test"]["loss"].as_f64().unwrap();
    let train = |r: &serde_json::Value| r["epochs"][0]["train_loss"].as_f64().unwrap();
    // Same 16 examples per step, split 8 + 8 over two replicas: the same updates.
    assert!(
        (loss(&one) - loss(&two)).abs() < 1e-4,
        "{} vs {}",
        loss(&one),
        loss(&two)
    );
    assert!((train(&one) - train(&two)).abs() < 1e-4);
    // One device with batch 8 takes different (smaller) steps.
    assert!(
        (loss(&one) - loss(&half)).abs() > 1e-5,
        "the replicas were not used"
    );
}

#[test]
fn duplicate_devices_are_refused_before_anything_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = write_tiny_recipe(tmp.path(), "dup", "");
    let text = std::fs::read_to_string(&recipe)
        .unwrap()
        .replace("seed = 7\n", "seed = 7\ndevices = [0, 0]\n");
    std::fs::write(&recipe, text).unwrap();
    let out = mopt(&[recipe.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("run.devices") && err.contains("listed twice"),
        "{err}"
    );
    assert!(!tmp.path().join("runs/dup").exists());
}

#[test]
fn device_entries_that_are_neither_index_nor_address_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    for (i, (entry, expect)) in [
        ("-1", "device index -1 is negative"),
        ("1.5", "a device index (0, 1, ...) or a server's address"),
        (
            "\"10.0.0.2:3000\"",
            "neither a device index nor a ws:// address",
        ),
        ("\"ws://10.0.0.2\"", "has no port"),
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("bad{i}");
        std::fs::create_dir_all(tmp.path().join(&name)).unwrap();
        let recipe = write_tiny_recipe(&tmp.path().join(&name), &name, "");
        let text = std::fs::read_to_string(&recipe)
            .unwrap()
            .replace("seed = 7\n", &format!("seed = 7\ndevices = [0, {entry}]\n"));
        std::fs::write(&recipe, text).unwrap();
        let out = mopt(&[recipe.to_str().unwrap()]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{entry}: {err}");
        assert!(
            err.contains("devices") && err.contains(expect),
            "{entry}: {err}"
        );
        assert!(!tmp.path().join(&name).join("runs").exists(), "{entry}");
    }
}

/// A finetune stage (the teacher) and two distillation stages (live teacher, then the first
/// student distilled into a second through the teacher cache), with
/// `batch` examples per device on `devices`. CE and KD are per-example means, so two shards of 8
/// weighted by their share equal one batch of 16; token-averaged matching terms (hidden MSE) are
/// averaged per shard, as under PyTorch's DDP, and only come close.
fn distill_pipeline(dir: &Path, name: &str, batch: usize, devices: &str) -> serde_json::Value {
    let (recipe, text) = tiny_parallel(dir, name, batch, devices);
    let cfg = dir.join("tiny-config.json");
    let distill = |stage: &str, cache: bool| {
        format!(
            "[[stage]]\nkind = \"distill\"\nname = \"{stage}\"\nalpha = 0.5\ntemperature = 2.0\nteacher-cache = {cache}\n\
             [stage.student]\nconfig = \"{}\"\ndropout = 0.0\ninit-from-teacher-layers = [0]\n[stage.student.overrides]\nnum-hidden-layers = 1\n\n",
            cfg.display()
        )
    };
    let text = text
        + "\n[evaluation]\nlatency-runs = 0\nanalysis = false\n\n[[stage]]\nkind = \"finetune\"\n\n"
        + &distill("live", false) + &distill("cached", true);
    std::fs::write(&recipe, text).unwrap();
    let out = mopt(&[recipe.to_str().unwrap(), "--max-steps", "3"]);
    assert!(out.status.success(), "{}", stderr(&out));
    read_json(&dir.join(format!("runs/{name}/report.json")))
}

#[test]
fn distillation_runs_data_parallel_with_shared_cache_and_forked_teacher() {
    let tmp = tempfile::tempdir().unwrap();
    let one = distill_pipeline(&tmp.path().join("one"), "one", 16, "");
    let two = distill_pipeline(&tmp.path().join("two"), "two", 8, "devices = [0, 1]");
    let stages = |r: &serde_json::Value| r["stages"].as_array().unwrap().clone();
    let (a, b) = (stages(&one), stages(&two));
    assert_eq!(a.len(), 4, "baseline, finetune, two distillations");
    for i in 1..4 {
        assert_eq!(a[i]["steps"], 3);
        assert_eq!(b[i]["steps"], 3);
        let loss = |s: &serde_json::Value| s["model"]["valid"]["loss"].as_f64().unwrap();
        assert!(
            (loss(&a[i]) - loss(&b[i])).abs() < 1e-4,
            "stage {i} ({}): {} on one device vs {} on two",
            a[i]["name"],
            loss(&a[i]),
            loss(&b[i])
        );
    }
    // The distillations really trained (their models differ from their teachers').
    assert_ne!(b[2]["model"]["sha256"], b[1]["model"]["sha256"]);
    assert_ne!(b[3]["model"]["sha256"], b[2]["model"]["sha256"]);
}

#[test]
fn data_parallel_runs_with_dropout_are_reproducible() {
    // Replicas sharing the CPU draw dropout masks from per-shard seed streams, not from the
    // device RNG the threads would race on.
    let tmp = tempfile::tempdir().unwrap();
    let recipe = write_tiny_recipe(tmp.path(), "drop", "");
    let text = std::fs::read_to_string(&recipe)
        .unwrap()
        .replace("seed = 7\n", "seed = 7\ndevices = [0, 1]\n")
        .replace("batch-size = 16", "batch-size = 8");
    std::fs::write(&recipe, text).unwrap();
    let mut losses = Vec::new();
    for _ in 0..2 {
        let out = mopt(&[recipe.to_str().unwrap(), "--max-steps", "4", "--force"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let r = read_json(&tmp.path().join("runs/drop/01-finetune/report.json"));
        losses.push((
            r["epochs"][0]["train_loss"].clone(),
            r["test"]["loss"].clone(),
        ));
    }
    assert_eq!(losses[0], losses[1]);
}
