//! Mixed precision end to end: tiny fine-tuning runs in fp32, bf16 and fp16 on real data.

mod common;

use common::*;
use std::path::Path;

/// Train losses logged at each step of a finished tiny run (dropout off, so precision is the
/// only difference), and its report.
fn run(dir: &Path, name: &str, extra: &str) -> (Vec<f64>, serde_json::Value) {
    std::fs::create_dir_all(dir).unwrap();
    let recipe = write_tiny_recipe(dir, name, &format!("log-every = 1\n{extra}"));
    let text = std::fs::read_to_string(&recipe)
        .unwrap()
        .replace("log-every = 2\n", "")
        .replace("epochs = 2", "epochs = 10")
        .replace("max-train = 96", "max-train = 32")
        .replace("batch-size = 16", "batch-size = 8")
        .replace("lr = 1e-3", "lr = 1e-2")
        .replace("[model]\n", "[model]\ndropout = 0.0\n");
    std::fs::write(&recipe, text).unwrap();
    let out = mopt(&[recipe.to_str().unwrap()]);
    assert!(out.status.success(), "{name}: {}", stderr(&out));
    let stage = dir.join(format!("runs/{name}/01-finetune"));
    let metrics = std::fs::read_to_string(stage.join("metrics.jsonl")).unwrap();
    let losses = metrics
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["split"] == "train")
        .map(|v| v["loss"].as_f64().unwrap())
        .collect();
    (losses, read_json(&stage.join("report.json")))
}

fn max_gap(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// The largest gap between `b` and `a` where each epoch of `b` may also match `a`'s epoch
/// before it (`b` at most one epoch behind).
fn max_gap_lagging(a: &[f64], b: &[f64]) -> f64 {
    b.iter()
        .enumerate()
        .map(|(i, y)| {
            let now = (a[i] - y).abs();
            if i == 0 {
                now
            } else {
                now.min((a[i - 1] - y).abs())
            }
        })
        .fold(0.0, f64::max)
}

/// Mean train loss of each epoch (4 steps each).
fn epoch_means(report: &serde_json::Value) -> Vec<f64> {
    report["epochs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["train_loss"].as_f64().unwrap())
        .collect()
}

#[test]
fn bf16_and_fp16_runs_track_fp32() {
    // 32 examples memorised in 10 epochs of 4 steps: the loss falls from ln 2 to ~0.005.
    let tmp = tempfile::tempdir().unwrap();
    let (f32_curve, f32_report) = run(&tmp.path().join("a"), "fp32", "");
    let (bf_curve, bf_report) = run(&tmp.path().join("b"), "bf16", "precision = \"bf16\"");
    let (h_curve, h_report) = run(&tmp.path().join("c"), "fp16", "precision = \"fp16\"");
    assert_eq!(f32_curve.len(), 40);
    assert_eq!(bf_curve.len(), 40);
    // At PyTorch's default initial scale (2^16) a scaled f16 gradient of this tiny model can
    // land past 65504 once: at most one step is skipped, and the scale halves for it.
    let skipped = h_report["loss_scale"]["skipped_steps"].as_u64().unwrap() as usize;
    assert!(
        skipped <= 1,
        "{skipped} fp16 steps skipped at the default scale"
    );
    assert_eq!(h_curve.len(), 40 - skipped);
    // Stated tolerance: every epoch's mean train loss within 0.1 of fp32's (single fp16 steps
    // can spike), the last epoch below 0.02 in all three, and the curves not identical to
    // fp32's (the products really ran in low precision). Where the CPU multiplies bf16
    // natively, the backward products round the output gradient to bf16 too (as PyTorch's
    // autocast does): on this toy's steep part that costs up to one epoch (measured on AMX and
    // on the emulated kernel with the same rounding alike: epoch 5 at 0.557 against fp32's
    // 0.306 and 0.647 the epoch before), so there bf16 may match fp32 one epoch behind.
    let base = epoch_means(&f32_report);
    assert!(base[0] > 0.68 && base[9] < 0.02, "fp32 learns: {base:?}");
    for (name, report, curve) in [
        ("bf16", &bf_report, &bf_curve),
        ("fp16", &h_report, &h_curve),
    ] {
        let means = epoch_means(report);
        let lagging = name == "bf16" && mopt_kernels::bf16::native();
        let gap = match lagging {
            true => max_gap_lagging(&base, &means),
            false => max_gap(&base, &means),
        };
        assert!(gap < 0.1, "{name} epoch losses {means:?} vs fp32 {base:?}");
        assert!(means[9] < 0.02, "{name} converges: {means:?}");
        assert!(max_gap(&f32_curve, curve) > 1e-4, "{name} changed nothing");
    }
    assert_eq!(f32_report["precision"], "fp32");
    assert_eq!(bf_report["precision"], "bf16");
    assert!(bf_report["loss_scale"].is_null());
    assert_eq!(
        h_report["loss_scale"]["scale"],
        65536.0 / 2f64.powi(skipped as i32)
    );
    let state = read_json(&tmp.path().join("c/runs/fp16/01-finetune/train_state.json"));
    assert_eq!(state["epoch"], 10);
    assert_eq!(state["step"], 40 - skipped);
    assert_eq!(state["loss_scale"], h_report["loss_scale"]);
}

#[test]
fn fp16_overflow_skips_steps_and_backs_off_the_scale() {
    // Starting at 2^26, the scaled logit gradients overflow f16 (max 65504): steps are skipped
    // and the scale halves until the gradients fit, then training proceeds.
    let tmp = tempfile::tempdir().unwrap();
    let extra =
        "precision = \"fp16\"\nloss-scale-init = 67108864.0\nloss-scale-growth-interval = 1000";
    let (curve, report) = run(tmp.path(), "overflow", extra);
    let skipped = report["loss_scale"]["skipped_steps"].as_u64().unwrap() as usize;
    let scale = report["loss_scale"]["scale"].as_f64().unwrap();
    assert!(skipped >= 3, "{skipped} skipped");
    assert_eq!(
        scale,
        2f64.powi(26 - skipped as i32),
        "one halving per skip"
    );
    assert_eq!(report["steps"].as_u64().unwrap() as usize, 40 - skipped);
    assert_eq!(
        curve.len(),
        40 - skipped,
        "skipped steps are not logged as steps"
    );
    let last = *epoch_means(&report).last().unwrap();
    assert!(last < 0.1, "learned after the back-off: {curve:?}");
}

#[test]
fn loss_scale_keys_need_fp16() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = write_tiny_recipe(
        tmp.path(),
        "bad",
        "precision = \"bf16\"\nloss-scale-init = 1024.0",
    );
    let out = mopt(&[recipe.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("train.loss-scale-init") && err.contains("fp16"),
        "{err}"
    );
    assert!(
        !tmp.path().join("runs/bad").exists(),
        "nothing written on bad input"
    );
    let recipe = write_tiny_recipe(tmp.path(), "bad", "precision = \"fp8\"");
    let out = mopt(&[recipe.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("unknown precision `fp8`"),
        "{}",
        stderr(&out)
    );
}
