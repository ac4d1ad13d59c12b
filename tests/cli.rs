//! The real `mopt-train` binary on tiny recipes over real Rotten Tomatoes data.

mod common;

use std::path::Path;
use std::process::Command;

use burn::prelude::*;
use common::{mopt, read_json, stderr, write_tiny_recipe};
use mopt_models::bert::weights;

/// Scalars per tag as TensorBoard itself reads them.
fn tensorboard_scalars(events: &Path) -> serde_json::Value {
    let script = r#"
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1]); acc.Reload()
print(json.dumps({t: [[e.step, e.value] for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}))
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script, events.to_str().unwrap()])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "TensorBoard could not read the events (is `tensorboard` installed? pip install -r requirements-test.txt): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn tiny_run_writes_a_complete_run_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = write_tiny_recipe(tmp.path(), "tiny", "");
    let out = mopt(&[recipe.to_str().unwrap()]);
    assert!(out.status.success(), "mopt-train failed: {}", stderr(&out));
    let run = tmp.path().join("runs/tiny");
    for f in [
        "recipe.toml",
        "01-finetune/metrics.jsonl",
        "01-finetune/report.json",
        "report.json",
        "report.md",
        "chart.svg",
        "golden.json",
        "00-baseline/stage.json",
        "01-finetune/stage.json",
        "best/model.bpk",
        "best/config.json",
        "best/labels.json",
        "best/vocab.txt",
        "best/golden.json",
    ] {
        assert!(run.join(f).is_file(), "missing {f}");
    }
    assert_eq!(
        std::fs::read_to_string(run.join("recipe.toml")).unwrap(),
        std::fs::read_to_string(&recipe).unwrap()
    );

    // The stage's training report: 96 train examples, 40 valid/test, 2 epochs of 6 steps.
    let report = read_json(&run.join("01-finetune/report.json"));
    assert_eq!(report["train_examples"], 96);
    assert_eq!(report["test_examples"], 40);
    assert_eq!(report["steps"], 12);
    assert_eq!(report["epochs"].as_array().unwrap().len(), 2);
    assert_eq!(report["labels"], serde_json::json!(["fresh", "rotten"]));
    let acc = report["test"]["accuracy"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&acc));

    // metrics.jsonl: train points every 2 steps, 2 valid, 1 test.
    let lines: Vec<serde_json::Value> =
        std::fs::read_to_string(run.join("01-finetune/metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
    let count = |s: &str| lines.iter().filter(|l| l["split"] == s).count();
    assert_eq!(count("train"), 6);
    assert_eq!(count("valid"), 2);
    assert_eq!(count("test"), 1);
    let first_lr = lines.iter().find(|l| l["split"] == "train").unwrap()["lr"]
        .as_f64()
        .unwrap();
    assert!(first_lr > 0.0 && first_lr <= 1e-3);

    // TensorBoard reads the event files.
    let tb = tensorboard_scalars(&run.join("01-finetune/events"));
    assert_eq!(tb["train/loss"].as_array().unwrap().len(), 6, "{tb}");
    assert_eq!(tb["valid/accuracy"].as_array().unwrap().len(), 2);
    assert!(
        tb["train/lr"].is_array()
            && tb["epoch/time_s"].is_array()
            && tb["epoch/peak_rss_mb"].is_array()
    );
    let tb_test = tb["test/accuracy"][0][1].as_f64().unwrap();
    assert!((tb_test - acc).abs() < 1e-6);

    // The run's report: the baseline and the one finetune stage, whose test accuracy is the
    // training report's (the same checkpoint, evaluated again by the runner).
    let run_report = read_json(&run.join("report.json"));
    let stages = run_report["stages"].as_array().unwrap();
    assert_eq!(stages.len(), 2);
    assert_eq!(stages[0]["kind"], "baseline");
    assert_eq!(stages[1]["kind"], "finetune");
    assert_eq!(stages[1]["decision"]["action"], "kept");
    assert!((stages[1]["model"]["test"]["accuracy"].as_f64().unwrap() - acc).abs() < 1e-9);
    assert_eq!(
        run_report["final_model"]["sha256"],
        stages[1]["model"]["sha256"]
    );

    // The reloaded best checkpoint reproduces the logits recorded at training time.
    let golden = read_json(&run.join("best/golden.json"));
    let input_ids: Vec<Vec<u32>> = serde_json::from_value(golden["input_ids"].clone()).unwrap();
    let logits: Vec<Vec<f32>> = serde_json::from_value(golden["logits"].clone()).unwrap();
    let d = Device::flex();
    let (model, config) = weights::load_checkpoint(&run.join("best"), &d).unwrap();
    assert_eq!(config.num_labels, 2);
    for (ids, want) in input_ids.iter().zip(&logits) {
        let n = ids.len();
        let input = Tensor::<2, Int>::from_data(
            TensorData::new(ids.iter().map(|&i| i as i64).collect::<Vec<_>>(), [1, n]),
            &d,
        );
        let got: Vec<f32> = model
            .valid()
            .forward(input, Tensor::ones([1, n], &d), Tensor::zeros([1, n], &d))
            .into_data()
            .try_to_vec()
            .unwrap();
        for (g, w) in got.iter().zip(want) {
            assert!(
                (g - w).abs() < 1e-4,
                "reloaded logits {got:?} vs recorded {want:?}"
            );
        }
    }

    // A second run of the same recipe is refused and leaves the run untouched.
    let before = std::fs::read(run.join("report.json")).unwrap();
    let again = mopt(&[recipe.to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(2), "{}", stderr(&again));
    assert!(stderr(&again).contains("already exists") && stderr(&again).contains("--force"));
    assert_eq!(std::fs::read(run.join("report.json")).unwrap(), before);

    // --force replaces it; --max-steps stops early (same seed, same first steps).
    let forced = mopt(&[recipe.to_str().unwrap(), "--force", "--max-steps", "3"]);
    assert!(forced.status.success(), "{}", stderr(&forced));
    let report = read_json(&run.join("01-finetune/report.json"));
    assert_eq!(report["steps"], 3);

    // export-hf writes an HF folder.
    let hf = tmp.path().join("hf");
    let exp = mopt(&[
        "export-hf",
        run.join("best").to_str().unwrap(),
        hf.to_str().unwrap(),
    ]);
    assert!(exp.status.success(), "{}", stderr(&exp));
    assert!(hf.join("model.safetensors").is_file() && hf.join("config.json").is_file());
}

#[test]
fn seeded_runs_are_reproducible() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = write_tiny_recipe(tmp.path(), "repro", "");
    let weights = tmp.path().join("runs/repro/best/model.bpk");
    let a = mopt(&[recipe.to_str().unwrap(), "--max-steps", "4"]);
    assert!(a.status.success(), "{}", stderr(&a));
    let first = read_json(&tmp.path().join("runs/repro/01-finetune/report.json"));
    let first_bytes = std::fs::read(&weights).unwrap();
    let b = mopt(&[recipe.to_str().unwrap(), "--max-steps", "4", "--force"]);
    assert!(b.status.success(), "{}", stderr(&b));
    let second = read_json(&tmp.path().join("runs/repro/01-finetune/report.json"));
    // The same seed gives the same checkpoint, byte for byte (parameter ids included).
    assert!(
        first_bytes == std::fs::read(&weights).unwrap(),
        "model.bpk differs"
    );
    assert_eq!(
        first["epochs"][0]["train_loss"],
        second["epochs"][0]["train_loss"]
    );
    assert_eq!(first["test"], second["test"]);
}

#[test]
fn check_prints_the_plan_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = write_tiny_recipe(tmp.path(), "plan", "");
    let out = mopt(&[recipe.to_str().unwrap(), "--check"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    // Tiny config: embeddings (30522+128+2)*32+64, 2 layers, pooler, 2-class head.
    let c = mopt_models::bert::BertConfig {
        num_labels: 2,
        ..mopt_models::bert::BertConfig::tiny(30522, 2)
    };
    let params = format!("{:.2}M params", c.num_params() as f64 / 1e6);
    assert!(
        text.contains("baseline   [model]") && text.contains(&params),
        "{text}"
    );
    assert!(
        text.contains("stage 1    finetune (kind finetune)"),
        "{text}"
    );
    // Settings print the way a recipe writes them.
    assert!(
        text.contains("lr = 1e-3") && text.contains("best-metric = \"accuracy\""),
        "{text}"
    );
    let mem = mopt_core::ModelConfig::training_memory(&c, 16, 32);
    assert!(
        text.contains(&format!(
            "memory   ~{}",
            mopt_train::memory::human_bytes(mem.total())
        )) && text.contains("AdamW moments")
            && text.contains("recipe OK"),
        "{text}"
    );
    assert!(
        !tmp.path().join("runs").exists(),
        "--check must not write the run folder"
    );
    // A dry run: an existing run folder does not stop it (it says so).
    std::fs::create_dir_all(tmp.path().join("runs/plan")).unwrap();
    let again = mopt(&[recipe.to_str().unwrap(), "--check"]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(
        String::from_utf8_lossy(&again.stdout).contains("exists: a run needs --resume or --force")
    );
}

#[test]
fn bad_recipes_exit_2_with_file_line_key_and_fix() {
    let tmp = tempfile::tempdir().unwrap();
    let good = std::fs::read_to_string(write_tiny_recipe(tmp.path(), "bad", "")).unwrap();
    let cases: [(&str, &str, &[&str]); 5] = [
        (
            "lr = 1e-3",
            "lr = -1.0",
            &["train.lr", "not in (0, 1]", "tiny.toml:"],
        ),
        (
            "log-every = 2",
            "log-every = 2\nlearning-rate = 3",
            &["unknown field `learning-rate`", "tiny.toml:", "fix:"],
        ),
        (
            "format = \"rotten-tomatoes\"",
            "format = \"parquet\"",
            &["data.format", "unknown data format", "rotten-tomatoes"],
        ),
        (
            "max-len = 32",
            "max-len = 1000",
            &["tokenizer.max-len", "1000 exceeds", "128 positions"],
        ),
        (
            "rotten_tomatoes_corpus_full.csv.bz2",
            "nope.csv.bz2",
            &["data.path", "does not exist", "datasets/fetch.sh"],
        ),
    ];
    for (from, to, needles) in cases {
        assert!(good.contains(from), "fixture lacks {from}");
        let p = tmp.path().join("tiny.toml");
        std::fs::write(&p, good.replacen(from, to, 1)).unwrap();
        let out = mopt(&[p.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{to}: {}", stderr(&out));
        let err = stderr(&out);
        for n in needles {
            assert!(err.contains(n), "error for `{to}` lacks `{n}`:\n{err}");
        }
        assert!(
            !tmp.path().join("runs").exists(),
            "nothing may be written for a bad recipe"
        );
    }
    let out = mopt(&[tmp.path().join("absent.toml").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("absent.toml"));
    std::fs::write(tmp.path().join("tiny.toml"), &good).unwrap();
    let out = mopt(&[
        tmp.path().join("tiny.toml").to_str().unwrap(),
        "--device",
        "tpu",
    ]);
    assert!(
        stderr(&out).contains("unknown device `tpu`"),
        "{}",
        stderr(&out)
    );
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn gradient_accumulation_matches_the_larger_batch() {
    // Without dropout, 2 micro-batches of 8 accumulated equal one batch of 16 (padding is masked).
    let tmp = tempfile::tempdir().unwrap();
    let run = |name: &str, batch: usize, accum: usize| {
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let recipe = write_tiny_recipe(&dir, name, &format!("grad-accum-steps = {accum}"));
        let text = std::fs::read_to_string(&recipe)
            .unwrap()
            .replace("[model]\n", "[model]\ndropout = 0.0\n")
            .replace("batch-size = 16", &format!("batch-size = {batch}"));
        std::fs::write(&recipe, text).unwrap();
        let out = mopt(&[recipe.to_str().unwrap(), "--max-steps", "4"]);
        assert!(out.status.success(), "{}", stderr(&out));
        read_json(&dir.join(format!("runs/{name}/01-finetune/report.json")))
    };
    let big = run("big", 16, 1);
    let acc = run("acc", 16, 2);
    let small = run("small", 8, 2);
    assert_eq!(big["steps"], 4);
    assert_eq!(small["steps"], 4);
    let (a, b) = (
        big["test"]["loss"].as_f64().unwrap(),
        small["test"]["loss"].as_f64().unwrap(),
    );
    assert!((a - b).abs() < 1e-4, "accumulated {b} vs large batch {a}");
    // Accumulating 2 batches of 16 is a different (larger-batch) run.
    let c = acc["test"]["loss"].as_f64().unwrap();
    assert!(
        (a - c).abs() > 1e-6,
        "accumulation must change the update: {a} vs {c}"
    );
}

#[test]
fn lr_find_sweeps_and_suggests() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = write_tiny_recipe(tmp.path(), "sweep", "");
    let text = std::fs::read_to_string(&recipe).unwrap()
        + "\n[lr-find]\nstart-lr = 1e-6\nend-lr = 1.0\nsteps = 40\n";
    std::fs::write(&recipe, text).unwrap();
    let out = mopt(&["lr-find", recipe.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lr: f64 = stdout
        .split("suggested lr: ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no suggestion in {stdout}"));
    assert!((1e-6..=1.0).contains(&lr), "{lr}");
    let csv = std::fs::read_to_string(tmp.path().join("runs/sweep-lr-find/lr-find.csv")).unwrap();
    let rows: Vec<&str> = csv.lines().skip(1).collect();
    assert!(rows.len() >= 5 && rows.len() <= 40, "{} rows", rows.len());
    let lrs: Vec<f64> = rows
        .iter()
        .map(|r| r.split(',').nth(1).unwrap().parse().unwrap())
        .collect();
    assert!(
        lrs.windows(2).all(|w| w[1] > w[0]),
        "lr rises monotonically"
    );
    assert!((lrs[0] - 1e-6).abs() < 1e-12);
}

/// A panic (a bug) ends the binary with exit code 1 and a message that says it is a bug, never
/// Rust's 101 alone.
#[test]
fn a_panic_exits_1_and_says_it_is_a_bug() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = write_tiny_recipe(tmp.path(), "panic", "");
    let out = Command::new(env!("CARGO_BIN_EXE_mopt-train"))
        .arg(recipe.to_str().unwrap())
        .arg("--check")
        .env("MOPT_FAILPOINT", "panic")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("this is a bug in mopt") && err.contains("failpoint"),
        "{err}"
    );
}

/// A NaN loss skips its optimizer step and the run goes on (the weights stay finite); NaN at
/// every step stops the run after `max-nonfinite-steps` in a row with exit code 1 and a message.
#[test]
fn non_finite_steps_are_skipped_then_stop_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = write_tiny_recipe(tmp.path(), "nan", "max-nonfinite-steps = 3\n");
    let run = |failpoint: &str| {
        Command::new(env!("CARGO_BIN_EXE_mopt-train"))
            .args([recipe.to_str().unwrap(), "--max-steps", "5", "--force"])
            .env("MOPT_FAILPOINT", failpoint)
            .output()
            .unwrap()
    };
    let once = run("nan-loss@2");
    assert!(once.status.success(), "{}", stderr(&once));
    assert!(
        stderr(&once).contains("step 2 had a non-finite loss or gradient: skipped (1 so far)"),
        "{}",
        stderr(&once)
    );
    let report = read_json(&tmp.path().join("runs/nan/01-finetune/report.json"));
    assert!(
        report["test"]["loss"].as_f64().is_some_and(f64::is_finite),
        "{report}"
    );
    assert_eq!(
        report["steps"].as_u64(),
        Some(5),
        "five applied steps: the skipped one is not counted"
    );
    let always = run("nan-loss@*");
    assert_eq!(always.status.code(), Some(1), "{}", stderr(&always));
    assert!(
        stderr(&always).contains("3 optimizer steps in a row had a non-finite loss or gradient"),
        "{}",
        stderr(&always)
    );
}
