//! The stage pipeline through the real binary: gates with rollback and abort, resume after a
//! SIGKILL, the report and its chart.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{mopt, read_json, stderr, write_tiny_recipe};
use sha2::{Digest, Sha256};

/// The tiny recipe (finetune stage 1) plus `stages` appended.
fn write_pipeline(dir: &Path, name: &str, stages: &str) -> PathBuf {
    let p = write_tiny_recipe(dir, name, "");
    let text = std::fs::read_to_string(&p).unwrap()
        + "\n[evaluation]\nlatency-warmup = 1\nlatency-runs = 2\nlatency-seq-len = 16\nanalysis = false\n\n[[stage]]\nkind = \"finetune\"\n\n"
        + stages;
    std::fs::write(&p, text).unwrap();
    p
}

fn checkpoint_sha(dir: &Path) -> String {
    let mut h = Sha256::new();
    for f in ["model.bpk", "config.json"] {
        h.update(std::fs::read(dir.join(f)).unwrap());
    }
    format!("{:x}", h.finalize())
}

/// Points of the chart as an XML parser sees them.
fn chart_points(svg: &Path) -> usize {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import sys, xml.dom.minidom as m; d = m.parse(sys.argv[1]); print(len(d.getElementsByTagName('circle')))",
            svg.to_str().unwrap(),
        ])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "chart.svg is not XML: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

const FAILING: &str = "[[stage]]\nkind = \"finetune\"\nname = \"too-strict\"\n[stage.train]\nlr = 1e-4\nepochs = 1\n[stage.gate]\nmax-logit-error = 0.0\non-fail = \"rollback\"\n\n";

#[test]
fn a_failed_gate_rolls_back_to_the_last_passing_model() {
    let tmp = tempfile::tempdir().unwrap();
    let third = "[[stage]]\nkind = \"finetune\"\nname = \"after\"\n[stage.train]\nepochs = 1\n";
    let recipe = write_pipeline(tmp.path(), "gate", &format!("{FAILING}{third}"));
    let out = mopt(&[recipe.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let run = tmp.path().join("runs/gate");
    let r = read_json(&run.join("report.json"));
    let st = r["stages"].as_array().unwrap();
    assert_eq!(st.len(), 4, "baseline + 3 stages");
    let actions: Vec<&str> = st
        .iter()
        .map(|s| s["decision"]["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["baseline", "kept", "rolled-back", "kept"]);
    // Training moved the logits, so a zero logit-error tolerance cannot hold.
    assert!(st[2]["max_logit_error_vs_input"].as_f64().unwrap() > 0.0);
    let reason = st[2]["decision"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("max-logit-error") && reason.contains("last passing model"),
        "{reason}"
    );
    // Stage 3 was given stage 1's model: the hash of the checkpoint on disk, not stage 2's.
    let first = checkpoint_sha(&run.join("01-finetune/best"));
    let second = checkpoint_sha(&run.join("02-too-strict/best"));
    assert_ne!(first, second);
    assert_eq!(st[1]["model"]["sha256"], first.as_str());
    assert_eq!(st[3]["input"]["sha256"], first.as_str());
    assert_eq!(
        st[3]["input"]["path"],
        run.join("01-finetune/best").display().to_string()
    );
    // The final model is stage 3's output.
    assert_eq!(
        checkpoint_sha(&run.join("best")),
        checkpoint_sha(&run.join("03-after/best"))
    );
    assert_eq!(r["final_stage"], "3 after");
    let md = std::fs::read_to_string(run.join("report.md")).unwrap();
    assert!(
        md.contains("| 2 | too-strict | finetune | rolled back |") && md.contains(reason),
        "{md}"
    );
    // One point per stage (the baseline included).
    assert_eq!(chart_points(&run.join("chart.svg")), 4);
    assert!(md.contains("chart.svg"));
    // The golden reference holds the baseline's validation logits (40 examples here).
    let golden = read_json(&run.join("golden.json"));
    assert_eq!(golden["examples"], 40);
    assert_eq!(golden["logits"].as_array().unwrap().len(), 40);
}

#[test]
fn a_failed_gate_with_abort_stops_the_run_and_keeps_the_report() {
    let tmp = tempfile::tempdir().unwrap();
    let stages = FAILING.replace("on-fail = \"rollback\"", "on-fail = \"abort\"")
        + "[[stage]]\nkind = \"finetune\"\nname = \"never\"\n";
    let recipe = write_pipeline(tmp.path(), "abort", &stages);
    let out = mopt(&[recipe.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("on-fail = \"abort\" stopped the run"),
        "{}",
        stderr(&out)
    );
    let run = tmp.path().join("runs/abort");
    let r = read_json(&run.join("report.json"));
    assert_eq!(r["stages"].as_array().unwrap().len(), 3);
    assert_eq!(r["stages"][2]["decision"]["action"], "aborted");
    assert!(
        !run.join("03-never").exists(),
        "no stage runs after an abort"
    );
    // The run ends with the last passing model.
    assert_eq!(
        checkpoint_sha(&run.join("best")),
        checkpoint_sha(&run.join("01-finetune/best"))
    );
}

#[test]
fn resume_after_sigkill_reuses_finished_stages() {
    let tmp = tempfile::tempdir().unwrap();
    // Stage 2 is long enough (60 epochs) for the kill to land inside it.
    let stages =
        "[[stage]]\nkind = \"finetune\"\nname = \"long\"\n[stage.train]\nepochs = 60\nlr = 1e-4\n";
    let recipe = write_pipeline(tmp.path(), "kill", stages);
    let run = tmp.path().join("runs/kill");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_mopt-train"))
        .arg(&recipe)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !run.join("02-long/metrics.jsonl").exists() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before stage 2 started"
        );
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "stage 2 never started"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(run.join("01-finetune/stage.json").is_file());
    assert!(
        !run.join("02-long/stage.json").exists(),
        "stage 2 was killed unfinished"
    );
    let weights = std::fs::read(run.join("01-finetune/best/model.bpk")).unwrap();
    let metrics = std::fs::read(run.join("01-finetune/metrics.jsonl")).unwrap();

    // Without --resume the folder is refused; with it, stage 1 is reused and stage 2 completes.
    let refused = mopt(&[recipe.to_str().unwrap()]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        stderr(&refused).contains("--resume"),
        "{}",
        stderr(&refused)
    );
    let resumed = mopt(&[recipe.to_str().unwrap(), "--resume"]);
    assert!(resumed.status.success(), "{}", stderr(&resumed));
    let err = stderr(&resumed);
    assert!(
        err.contains("stage 1 (finetune): finished earlier, outputs verified (sha256), reused"),
        "{err}"
    );
    assert!(
        err.contains("stage 2 (finetune): long"),
        "stage 2 runs again: {err}"
    );
    assert_eq!(
        std::fs::read(run.join("01-finetune/best/model.bpk")).unwrap(),
        weights,
        "stage 1's checkpoint is byte-identical"
    );
    assert_eq!(
        std::fs::read(run.join("01-finetune/metrics.jsonl")).unwrap(),
        metrics,
        "no training step of stage 1 ran again"
    );
    let r = read_json(&run.join("report.json"));
    assert_eq!(r["stages"].as_array().unwrap().len(), 3);
    assert_eq!(r["stages"][2]["steps"], 360);

    // A finished stage whose output no longer verifies is run again (same seed: same bytes);
    // the stage after it, whose input hash is unchanged, is reused.
    let mut tampered = weights.clone();
    tampered[100] ^= 0xff;
    std::fs::write(run.join("01-finetune/best/model.bpk"), tampered).unwrap();
    let again = mopt(&[recipe.to_str().unwrap(), "--resume"]);
    assert!(again.status.success(), "{}", stderr(&again));
    let err = stderr(&again);
    assert!(
        err.contains("stage 1 (finetune): its earlier outputs do not verify"),
        "{err}"
    );
    assert!(err.contains("stage 2 (long): finished earlier"), "{err}");
    assert_eq!(
        std::fs::read(run.join("01-finetune/best/model.bpk")).unwrap(),
        weights
    );
}
