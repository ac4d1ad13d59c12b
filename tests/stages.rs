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
    // Wall times count every invocation: as if the killed run had spent an hour in stage 2
    // and 1.5 hours in all (the clocks it keeps current while running).
    assert!(
        !run.join("clocks/01-finetune.json").exists(),
        "a finished stage's clock is gone (its time is in its record)"
    );
    std::fs::write(
        run.join("clocks/02-long.json"),
        r#"{"wall_time_s": 3600.0}"#,
    )
    .unwrap();
    std::fs::write(run.join("clocks/run.json"), r#"{"wall_time_s": 5400.0}"#).unwrap();

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
    let wall = |v: &serde_json::Value| v["wall_time_s"].as_f64().unwrap();
    let (first, second) = (wall(&r["stages"][1]), wall(&r["stages"][2]));
    assert!(
        first < 300.0,
        "stage 1 keeps its own record's time: {first}"
    );
    assert!((3600.0..3900.0).contains(&second), "stage 2: {second}");
    assert!(
        (5400.0..5700.0).contains(&wall(&r)),
        "the run: {}",
        wall(&r)
    );

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

const PRUNE: &str = "[[stage]]\nkind = \"prune\"\ncriterion = \"l1\"\ntarget = 0.5\nstep = 0.25\nffn-multiple = 4\n[stage.train]\nepochs = 1\n";

#[test]
fn prune_stage_removes_units_physically_and_retry_stops_at_the_knee() {
    let tmp = tempfile::tempdir().unwrap();
    let with_control = PRUNE.replace(
        "ffn-multiple = 4\n",
        "ffn-multiple = 4\ncompare = [\"random\"]\n",
    );
    let recipe = write_pipeline(tmp.path(), "prune", &with_control);
    // The plan shows each round's shape.
    let check = mopt(&[recipe.to_str().unwrap(), "--check"]);
    assert!(check.status.success(), "{}", stderr(&check));
    let plan = String::from_utf8_lossy(&check.stdout);
    assert!(
        plan.contains("round 1: 25% removed -> 2 layers x 32, heads [3, 3], FFN [48, 48]"),
        "{plan}"
    );
    assert!(
        plan.contains("round 2: 50% removed -> 2 layers x 32, heads [2, 2], FFN [32, 32]"),
        "{plan}"
    );
    // A scope of its own: layer 1's FFN stops at a quarter while the rest goes to half.
    let scoped_dir = tmp.path().join("scoped");
    std::fs::create_dir_all(&scoped_dir).unwrap();
    let scoped = write_pipeline(
        &scoped_dir,
        "scoped",
        &format!("{PRUNE}[stage.ratios]\n\"encoder.layer.1.ffn\" = 0.25\n"),
    );
    let check = mopt(&[scoped.to_str().unwrap(), "--check"]);
    assert!(check.status.success(), "{}", stderr(&check));
    let plan = String::from_utf8_lossy(&check.stdout);
    assert!(
        plan.contains("round 2: 50% removed -> 2 layers x 32, heads [2, 2], FFN [32, 48]"),
        "{plan}"
    );
    let out = mopt(&[recipe.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let run = tmp.path().join("runs/prune");
    let r = read_json(&run.join("report.json"));
    let (before, after) = (&r["stages"][1]["model"], &r["stages"][2]["model"]);
    assert_eq!(after["heads"], serde_json::json!([2, 2]));
    assert_eq!(after["ffn"], serde_json::json!([32, 32]));
    assert!(after["params"].as_u64() < before["params"].as_u64());
    assert!(
        after["flops_per_example"].as_u64().unwrap() * 10
            < before["flops_per_example"].as_u64().unwrap() * 6
    );
    // The random control ran the same schedule and is reported beside the chain.
    let control = &r["stages"][2]["references"][0];
    assert_eq!(control["name"], "prune (random importance)");
    assert_eq!(control["model"]["heads"], serde_json::json!([2, 2]));
    assert_eq!(
        r["stages"][2]["facts"]["compare"][0]["rounds"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert!(run
        .join("02-prune/compare-random/round-2/best/model.bpk")
        .is_file());
    // The pruned checkpoint reloads from its own config, without knowing its history.
    let d = burn::prelude::Device::flex();
    let (m, c) = mopt_models::bert::weights::load_checkpoint(&run.join("best"), &d).unwrap();
    assert_eq!((c.heads(0), c.ffn(1)), (2, 32));
    assert_eq!(
        m.bert.encoder.layer[0]
            .attention
            .self_attn
            .query
            .weight
            .val()
            .dims(),
        [32, 16]
    );
    // export-hf refuses a shape transformers cannot load, and writes nothing.
    let hf = tmp.path().join("hf");
    let refused = mopt(&[
        "export-hf",
        run.join("best").to_str().unwrap(),
        hf.to_str().unwrap(),
    ]);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("transformers cannot load") && stderr(&refused).contains("ONNX")
    );
    assert!(!hf.exists());

    // Retry: a logit-error tolerance between round 1's and round 2's errors passes round 1 and
    // fails round 2, so the stage stops there and hands on round 1's model.
    let rounds = r["stages"][2]["facts"]["rounds"]
        .as_array()
        .unwrap()
        .clone();
    let (e1, e2) = (
        rounds[0]["max_logit_error_vs_input"].as_f64().unwrap(),
        rounds[1]["max_logit_error_vs_input"].as_f64().unwrap(),
    );
    assert!(
        e1 < e2,
        "removing more should move the logits more: {e1} vs {e2}"
    );
    let gate = format!(
        "[stage.gate]\nmax-logit-error = {}\non-fail = \"retry\"\n",
        (e1 + e2) / 2.0
    );
    let dir = tmp.path().join("retry");
    std::fs::create_dir_all(&dir).unwrap();
    let recipe = write_pipeline(&dir, "retry", &format!("{PRUNE}{gate}"));
    let out = mopt(&[recipe.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let run = dir.join("runs/retry");
    let r = read_json(&run.join("report.json"));
    let st = &r["stages"][2];
    let rounds = st["facts"]["rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 2);
    assert_eq!(
        (rounds[0]["passed"].as_bool(), rounds[1]["passed"].as_bool()),
        (Some(true), Some(false))
    );
    assert_eq!(
        st["model"]["heads"],
        serde_json::json!([3, 3]),
        "round 1's model"
    );
    assert_eq!(
        st["model"]["sha256"],
        checkpoint_sha(&run.join("02-prune/round-1/best")).as_str()
    );
    assert_eq!(st["decision"]["action"], "kept");
    assert!(
        st["notes"].to_string().contains("stops at the knee"),
        "{}",
        st["notes"]
    );
}

#[test]
fn prune_stage_removes_hidden_channels_and_whole_layers() {
    // Taylor over the residual stream and the layers: 2 layers x 32 -> 1 layer x 16 in one round.
    let tmp = tempfile::tempdir().unwrap();
    let stage = "[[stage]]\nkind = \"prune\"\ntargets = [\"hidden\", \"layers\"]\ncriterion = \"taylor\"\ntaylor-batches = 2\ntarget = 0.5\nstep = 0.5\nhidden-multiple = 8\n[stage.train]\nepochs = 1\n";
    let recipe = write_pipeline(tmp.path(), "hidden", stage);
    let check = mopt(&[recipe.to_str().unwrap(), "--check"]);
    assert!(check.status.success(), "{}", stderr(&check));
    let plan = String::from_utf8_lossy(&check.stdout);
    assert!(
        plan.contains("round 1: 50% removed -> 1 layers x 16, heads [4], FFN [64]"),
        "{plan}"
    );
    let out = mopt(&[recipe.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let run = tmp.path().join("runs/hidden");
    let r = read_json(&run.join("report.json"));
    let after = &r["stages"][2]["model"];
    assert_eq!(
        (after["layers"].as_u64(), after["hidden"].as_u64()),
        (Some(1), Some(16))
    );
    let round = &r["stages"][2]["facts"]["rounds"][0];
    assert_eq!(
        (round["hidden"].as_u64(), round["layers"].as_u64()),
        (Some(16), Some(1))
    );
    assert!(round["latency_b32_ms"].as_f64().unwrap() > 0.0);
    let d = burn::prelude::Device::flex();
    let (m, c) = mopt_models::bert::weights::load_checkpoint(&run.join("best"), &d).unwrap();
    assert_eq!(
        (c.hidden_size, c.num_hidden_layers, c.head_size()),
        (16, 1, 8)
    );
    assert_eq!(m.bert.embeddings.word_embeddings.weight.val().dims()[1], 16);
    assert_eq!(
        m.bert.encoder.layer[0]
            .attention
            .self_attn
            .query
            .weight
            .val()
            .dims(),
        [16, 32]
    );
    // A recipe naming an unknown target is refused before anything runs.
    std::fs::create_dir_all(tmp.path().join("bad")).unwrap();
    let bad = write_pipeline(
        &tmp.path().join("bad"),
        "bad",
        &stage.replace("\"layers\"]", "\"channels\"]"),
    );
    let out = mopt(&[bad.to_str().unwrap(), "--check"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("unknown pruning target `channels`"),
        "{}",
        stderr(&out)
    );
    // BatchNorm-scale importance on groups without a BatchNorm (heads) is refused at --check.
    let bad = write_pipeline(
        &tmp.path().join("bad"),
        "bad-bn",
        &stage.replace("[stage.train]", "compare = [\"bn-scale\"]\n[stage.train]"),
    );
    let out = mopt(&[bad.to_str().unwrap(), "--check"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("].compare`") && stderr(&out).contains("`hidden` groups have none"),
        "{}",
        stderr(&out)
    );
    // Activation-based importance needs a family whose model reports activations (the llama
    // family's does; BERT's does not): refused at --check, naming the key.
    let bad = write_pipeline(
        &tmp.path().join("bad"),
        "bad-act",
        &stage.replace("\"taylor\"", "\"activation-l2\""),
    );
    let out = mopt(&[bad.to_str().unwrap(), "--check"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("].criterion`")
            && stderr(&out).contains("`activation-l2` measures activations"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn ptq_stage_calibrates_ranks_layers_and_falls_back_to_float() {
    let tmp = tempfile::tempdir().unwrap();
    // A gate no quantized model passes: every fallback is tried, up to max-fallback, then the
    // stage rolls back.
    let stage = "[[stage]]\nkind = \"ptq\"\nobserver = \"percentile\"\npercentile = 99.9\ncalibration-samples = 32\nmax-fallback = 2\n[stage.gate]\nmax-logit-error = 0.0\non-fail = \"retry\"\n";
    let recipe = write_pipeline(tmp.path(), "ptq", stage);
    let check = mopt(&[recipe.to_str().unwrap(), "--check"]);
    assert!(check.status.success(), "{}", stderr(&check));
    let plan = String::from_utf8_lossy(&check.stdout);
    assert!(plan.contains("12 of 14 layers quantized"), "{plan}");
    assert!(plan.contains("the worst fall back to float"), "{plan}");
    let out = mopt(&[recipe.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let run = tmp.path().join("runs/ptq");
    let r = read_json(&run.join("report.json"));
    let ptq = &r["stages"][2];
    let rows = ptq["facts"]["sensitivity"].as_array().unwrap();
    assert_eq!(rows.len(), 12);
    // Ranked worst first; the two worst fell back.
    let drops: Vec<f64> = rows
        .iter()
        .map(|r| r["drop_points"].as_f64().unwrap())
        .collect();
    assert!(drops.windows(2).all(|w| w[0] >= w[1]), "{drops:?}");
    let fallback = ptq["facts"]["fallback"].as_array().unwrap();
    assert_eq!(fallback.len(), 2);
    assert_eq!(fallback[0], rows[0]["layer"]);
    assert_eq!(
        ptq["facts"]["quantization"]["layers"]
            .as_array()
            .unwrap()
            .len(),
        10
    );
    assert_eq!(ptq["decision"]["passed"], false);
    assert!(run.join("02-ptq/sensitivity.svg").is_file());
    assert!(std::fs::read_to_string(run.join("report.md"))
        .unwrap()
        .contains("02-ptq/sensitivity.svg"));
    // Without a gate, every layer (exclude = []) with the MSE observer: the checkpoint reloads
    // quantized.
    let all = "[[stage]]\nkind = \"ptq\"\nobserver = \"mse\"\nweight-bits = 8\ncalibration-samples = 32\nexclude = []\n";
    std::fs::create_dir_all(tmp.path().join("all")).unwrap();
    let recipe = write_pipeline(&tmp.path().join("all"), "all", all);
    let out = mopt(&[recipe.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let run = tmp.path().join("all/runs/all");
    let r = read_json(&run.join("report.json"));
    assert_eq!(
        r["stages"][2]["facts"]["quantization"]["layers"]
            .as_array()
            .unwrap()
            .len(),
        14
    );
    let d = burn::prelude::Device::flex();
    let (m, c) = mopt_models::bert::weights::load_checkpoint(&run.join("best"), &d).unwrap();
    assert!(mopt_core::Quantizable::is_quantized(&m) && c.mopt_quant.is_some());
    // Pruning after quantization, or quantizing twice, is refused at --check.
    for (name, more) in [("late", PRUNE), ("twice", all)] {
        std::fs::create_dir_all(tmp.path().join(name)).unwrap();
        let late = write_pipeline(&tmp.path().join(name), name, &format!("{all}\n{more}"));
        let out = mopt(&[late.to_str().unwrap(), "--check"]);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(stderr(&out).contains("quantized"), "{}", stderr(&out));
    }
}

#[test]
fn qat_trains_through_fake_quant_and_exports_as_qdq() {
    let tmp = tempfile::tempdir().unwrap();
    let stage = "[[stage]]\nkind = \"qat\"\ncalibration-samples = 32\nlearned-scales = true\nembeddings = true\n[stage.train]\nepochs = 1\nlr = 1e-4\n\n[[stage]]\nkind = \"export\"\nsamples = 40\nreference = \"finetune\"\n";
    let recipe = write_pipeline(tmp.path(), "qat", stage);
    let out = mopt(&[recipe.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let run = tmp.path().join("runs/qat");
    let r = read_json(&run.join("report.json"));
    let qat = &r["stages"][2];
    assert!(qat["steps"].as_u64().unwrap() > 0, "{qat}");
    assert!(qat["facts"]["qat_valid_accuracy"].as_f64().is_some());
    // The tables trained off their int8 grid and were put back on it: the output is `final/`.
    assert!(run.join("02-qat/final/model.bpk").is_file());
    let card = read_json(&run.join("03-export/onnx/model-card.json"));
    let tables = &card["quantization"]["config"]["embeddings"];
    assert_eq!(tables.as_array().map(Vec::len), Some(2), "{tables}");
    // Float tables would be 4 bytes a value: the INT8 file is far below the float reference.
    let size = |d: &str| {
        std::fs::metadata(run.join(d).join("model.onnx"))
            .unwrap()
            .len()
    };
    let (int8, float) = (size("03-export/onnx"), size("03-export/finetune-onnx"));
    assert!(int8 * 3 < float, "{int8} vs {float}");
    assert!(
        card["parity"]["agreement"].as_f64().unwrap() >= 0.995,
        "{}",
        card["parity"]
    );
    let ops = &card["quantization"]["onnxruntime_optimized_ops"];
    assert_eq!(ops["MatMulIntegerToFloat"].as_u64(), Some(12), "{ops}");
    // The float reference exported beside it has no quantization section.
    let reference = read_json(&run.join("03-export/finetune-onnx/model-card.json"));
    assert!(reference.get("quantization").is_none());
    // A fair baseline: the float reference is timed on the graph a deployment runs, ONNX
    // Runtime's transformer optimizer applied (fused Attention), interleaved with the INT8 model.
    let fused = run.join("03-export/finetune-onnx/model.fused.onnx");
    assert!(fused.is_file(), "the fused float graph is kept");
    let r = read_json(&run.join("report.json"));
    let rows = r["stages"][3]["facts"]["ort_latency"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0]["model"], "model");
    assert!(rows[0]["graph"]
        .as_str()
        .unwrap()
        .contains("MatMulIntegerToFloat"));
    // The INT8 model is timed on mopt's fusion of its QDQ graph into ORT's integer kernels.
    assert!(run.join("03-export/onnx/model.fused.onnx").is_file());
    assert_eq!(rows[1]["model"], "finetune");
    assert!(rows[1]["graph"]
        .as_str()
        .unwrap()
        .contains("transformer optimizer"));
    assert_eq!(rows[1]["file"], fused.display().to_string());
    for row in &rows {
        let l = row["latency"].as_array().unwrap();
        assert_eq!(l.len(), 2, "batch 1 and 32: {row}");
        assert!(l.iter().all(|b| b["p50_ms"].as_f64().unwrap() > 0.0));
        // Each batch is timed in every layout the machine allows, and the row is the fastest.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        for b in l {
            let layouts = b["layouts"].as_array().unwrap();
            let names: Vec<&str> = layouts
                .iter()
                .map(|x| x["layout"].as_str().unwrap())
                .collect();
            assert!(names[0].starts_with("one session, intra-op"), "{b}");
            // Single-thread sessions beside it on a multi-core machine: one a core with the
            // batch split at batch 32, one at batch 1.
            match (cores > 1, b["batch"].as_u64()) {
                (false, _) => assert_eq!(names.len(), 1, "{b}"),
                (true, Some(1)) => assert_eq!(names[1..], ["one single-thread session"], "{b}"),
                (true, _) => {
                    assert_eq!(names.len(), 2, "{b}");
                    assert!(names[1].starts_with("data-parallel, "), "{b}");
                }
            }
            let fastest = layouts
                .iter()
                .min_by(|x, y| {
                    x["p50_ms"]
                        .as_f64()
                        .partial_cmp(&y["p50_ms"].as_f64())
                        .unwrap()
                })
                .unwrap();
            assert_eq!(b["layout"], fastest["layout"], "{b}");
            assert_eq!(b["p50_ms"], fastest["p50_ms"], "{b}");
        }
    }
    let md = std::fs::read_to_string(run.join("report.md")).unwrap();
    assert!(md.contains("interleaved in the same run"), "{md}");
}

/// The tiny pipeline run as `teacher` in `dir` (its best model in `dir/runs/teacher/best`): the
/// recipe's text and its `[model]` table's first two lines (what a recipe on the teacher
/// replaces with `[teacher]`).
fn trained_teacher(dir: &Path) -> (String, String) {
    let teacher = write_pipeline(dir, "teacher", "");
    assert!(mopt(&[teacher.to_str().unwrap()]).status.success());
    let text = std::fs::read_to_string(&teacher).unwrap();
    let model = text[text.find("[model]").unwrap()..]
        .lines()
        .take(2)
        .collect::<Vec<_>>()
        .join("\n");
    (text, model)
}

#[test]
fn a_stage_finished_by_another_run_is_reused_when_its_inputs_match() {
    // A teacher, then two recipes in one output folder on it with the same finetune stage: the
    // second run reuses the first's (same settings, same input by sha256) and only runs what is
    // new. (A `[model]` baseline is built afresh by each run, so runs on it never match.)
    let tmp = tempfile::tempdir().unwrap();
    let (text, model) = trained_teacher(tmp.path());
    let on_teacher = |name: &str, extra: &str| {
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("r.toml");
        let t = text
            .replace(
                &model,
                &format!(
                    "[teacher]\ncheckpoint = \"{}\"",
                    tmp.path().join("runs/teacher/best").display()
                ),
            )
            .replace("name = \"teacher\"", &format!("name = \"{name}\""))
            + extra;
        std::fs::write(&p, t).unwrap();
        p
    };
    let first = on_teacher("first", "");
    let out = mopt(&[first.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("the same stage finished in"));
    let second = on_teacher("second", PRUNE);
    let out = mopt(&[second.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("the same stage finished in"),
        "{}",
        stderr(&out)
    );
    let r = read_json(&tmp.path().join("runs/second/report.json"));
    let ft = &r["stages"][1];
    assert!(
        ft["facts"]["reused_from"]
            .as_str()
            .unwrap()
            .ends_with("01-finetune"),
        "{ft}"
    );
    assert_eq!(ft["steps"], 0);
    let a = read_json(&tmp.path().join("runs/first/report.json"));
    assert_eq!(ft["model"]["sha256"], a["stages"][1]["model"]["sha256"]);
    assert!(r["stages"][2]["steps"].as_u64().unwrap() > 0);
    // Another learning rate is another stage: it runs. So does everything with --no-reuse.
    let third = on_teacher("third", "");
    let t = std::fs::read_to_string(&third)
        .unwrap()
        .replace("lr = 1e-3", "lr = 2e-3");
    std::fs::write(&third, t).unwrap();
    let out = mopt(&[third.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("the same stage finished in"));
    let fourth = on_teacher("fourth", "");
    let out = mopt(&[fourth.to_str().unwrap(), "--no-reuse"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("the same stage finished in"));
}

#[test]
fn reuse_follows_the_stages_as_declared_in_rust_not_the_recipe_text() {
    // One recipe file on a trained teacher, run from TOML and as a pipeline whose finetune
    // stage is edited in Rust (another learning rate; the file's text is unchanged). A stage
    // is reused only from a run that used the same settings, whichever way it was declared.
    // (Keys were once taken from the recipe text: `a-toml` then reused `b-rust`'s model and
    // `c-rust` reused `a-toml`'s.)
    use mopt_stages::{Pipeline, RunOptions};
    let tmp = tempfile::tempdir().unwrap();
    let (text, model) = trained_teacher(tmp.path());
    let recipe = tmp.path().join("on-teacher.toml");
    let on_teacher = text.replace(
        &model,
        &format!(
            "[teacher]\ncheckpoint = \"{}\"",
            tmp.path().join("runs/teacher/best").display()
        ),
    );
    std::fs::write(&recipe, on_teacher).unwrap();
    let reused_from = |run: &str| -> Option<String> {
        let r = read_json(&tmp.path().join(format!("runs/{run}/report.json")));
        r["stages"][1]["facts"]["reused_from"]
            .as_str()
            .map(str::to_string)
    };
    let toml_run = |name: &str| {
        // The same file but for `[run] name`.
        let p = tmp.path().join(format!("{name}.toml"));
        let t = std::fs::read_to_string(&recipe)
            .unwrap()
            .replace("name = \"teacher\"", &format!("name = \"{name}\""));
        std::fs::write(&p, t).unwrap();
        let out = mopt(&[p.to_str().unwrap()]);
        assert!(out.status.success(), "{}", stderr(&out));
    };
    let rust_run = |name: &str| {
        let mut p = Pipeline::load(&recipe, &mopt_families::builtin())
            .unwrap()
            .named(name);
        p.stages[0].0.train.lr = 2e-3;
        p.run(&RunOptions::new(mopt_train::DeviceSpec::Cpu))
            .unwrap();
    };
    rust_run("b-rust");
    assert_eq!(reused_from("b-rust"), None);
    toml_run("a-toml");
    assert_eq!(
        reused_from("a-toml"),
        None,
        "the TOML run took the Rust run's model"
    );
    rust_run("c-rust");
    let from = reused_from("c-rust").expect("the same Rust-declared stage is reused");
    assert!(from.ends_with("b-rust/01-finetune"), "{from}");
    toml_run("d-toml");
    let from = reused_from("d-toml").expect("the same TOML stage is reused");
    assert!(from.ends_with("a-toml/01-finetune"), "{from}");
}

#[test]
fn an_error_inside_a_stage_pushed_in_rust_names_that_stage() {
    use mopt_recipe::StageEntry;
    use mopt_stages::stage::PlanContext;
    use mopt_stages::{
        Pipeline, RunOptions, Stage, StageContext, StageError, StageOutput, StagePlan,
    };

    /// A stage of the caller's that fails while running.
    struct Fails;

    impl Stage for Fails {
        fn kind(&self) -> &str {
            "always-fails"
        }

        fn plan(
            &self,
            _: &StageEntry,
            input: &mopt_stages::shape::Shape,
            _: &PlanContext,
        ) -> Result<StagePlan, StageError> {
            Ok(StagePlan {
                output: input.clone(),
                settings: Vec::new(),
                memory: None,
                extra_memory: Vec::new(),
            })
        }

        fn run(&self, _: &Path, _: &StageContext) -> Result<StageOutput, StageError> {
            Err(mopt_train::TrainError::Failed("the sky fell".into()).into())
        }
    }

    let tmp = tempfile::tempdir().unwrap();
    let recipe = write_pipeline(tmp.path(), "pushed", "");
    let p = Pipeline::load(&recipe, &mopt_families::builtin()).unwrap();
    let train = p.recipe.train.clone();
    let err = p
        .push("my-step", train, None, Fails)
        .run(&RunOptions::new(mopt_train::DeviceSpec::Cpu))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "stage 2 `my-step` (kind always-fails): training failed: the sky fell"
    );
    assert!(!err.is_input_error());
}

#[test]
fn a_trained_checkpoint_classifies_new_text_through_the_predict_api() {
    let tmp = tempfile::tempdir().unwrap();
    trained_teacher(tmp.path());
    let recipe = mopt_recipe::load(tmp.path().join("tiny.toml")).unwrap();
    let run = recipe.run.run_dir();
    let report = read_json(&run.join("report.json"));
    let model = mopt_stages::Predictor::load(&mopt_families::builtin(), &recipe, &run.join("best"))
        .unwrap();
    assert_eq!(model.labels(), ["fresh", "rotten"]);
    // The run's own validation texts, classified from their raw text: the accuracy is the one
    // the run recorded for its final model (same tokenizer settings, same label order).
    let valid = read_splits(&recipe).valid;
    let texts: Vec<&str> = valid.iter().map(|e| e.text.as_str()).collect();
    let preds = model.predict(&texts).unwrap();
    assert_eq!(preds.len(), 40);
    let right = preds
        .iter()
        .zip(&valid)
        .filter(|(p, e)| p.label == e.label)
        .count();
    let recorded = report["final_model"]["valid"]["accuracy"].as_f64().unwrap();
    assert!(
        (right as f64 / 40.0 - recorded).abs() < 1e-9,
        "{right}/40 vs {recorded}"
    );
    for p in &preds {
        let sum: f32 = p.probabilities.iter().sum();
        assert!((sum - 1.0).abs() < 1e-5 && p.probability >= 0.5, "{p:?}");
    }
    assert!(model.predict(&[]).unwrap().is_empty());
}

#[test]
fn vocab_stage_keeps_the_training_tokens_and_any_text_still_classifies() {
    let tmp = tempfile::tempdir().unwrap();
    let stage = "[[stage]]\nkind = \"vocab\"\n\n[[stage]]\nkind = \"export\"\nsamples = 40\nreference = \"finetune\"\n";
    let recipe = write_pipeline(tmp.path(), "vocab", stage);
    let out = mopt(&[recipe.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let run = tmp.path().join("runs/vocab");
    let r = read_json(&run.join("report.json"));
    let facts = &r["stages"][2]["facts"];
    let (before, kept) = (
        facts["rows_before"].as_u64().unwrap(),
        facts["rows_kept"].as_u64().unwrap(),
    );
    // 96 short training sentences use a few hundred of the 30522 WordPiece tokens.
    assert_eq!(before, 30522, "{facts}");
    assert!((100..3000).contains(&kept), "{facts}");
    let to_unk = facts["valid_tokens_to_unk"].as_u64().unwrap();
    assert!(
        to_unk > 0 && to_unk < facts["valid_tokens"].as_u64().unwrap(),
        "{facts}"
    );
    // The float export maps ids in the graph: ONNX Runtime matches mopt to float precision, and
    // the file lost the dropped rows (4 bytes x 32 a row) less the map (4 bytes an id).
    let card = read_json(&run.join("03-export/onnx/model-card.json"));
    assert!(
        card["parity"]["max_abs_err"].as_f64().unwrap() < 1e-4,
        "{}",
        card["parity"]
    );
    // The card says how the vocabulary was pruned.
    assert_eq!(card["vocabulary"]["token_ids"], 30522);
    assert_eq!(card["vocabulary"]["rows_kept"].as_u64(), Some(kept));
    let size = |d: &str| {
        std::fs::metadata(run.join(d).join("model.onnx"))
            .unwrap()
            .len() as i64
    };
    let saved = size("03-export/finetune-onnx") - size("03-export/onnx");
    let expected = (before - kept) as i64 * 32 * 4 - 30522 * 4;
    assert!(
        (expected - 4096..=expected).contains(&saved),
        "{saved} vs {expected}"
    );
    // A training sentence reads the same rows as before; words the training split never used
    // read [UNK] and the text still classifies.
    let recipe = mopt_recipe::load(&recipe).unwrap();
    let pruned = mopt_stages::Predictor::load(
        &mopt_families::builtin(),
        &recipe,
        &run.join("02-vocab/model"),
    )
    .unwrap();
    let full = mopt_stages::Predictor::load(
        &mopt_families::builtin(),
        &recipe,
        &run.join("01-finetune/best"),
    )
    .unwrap();
    let seen = read_splits(&recipe).train[0].text.clone();
    let p = |m: &mopt_stages::Predictor, t: &str| m.predict(&[t]).unwrap()[0].probabilities.clone();
    assert_eq!(p(&pruned, &seen), p(&full, &seen));
    let odd = "a quixotic zeppelin of xylophones";
    let (a, b) = (p(&pruned, odd), p(&full, odd));
    assert!((a.iter().sum::<f32>() - 1.0).abs() < 1e-5);
    assert_ne!(a, b, "the unseen words read [UNK]'s row");
}

#[test]
fn model_arch_names_a_registered_family() {
    let tmp = tempfile::tempdir().unwrap();
    let p = write_tiny_recipe(tmp.path(), "arch", "");
    let text = std::fs::read_to_string(&p).unwrap();
    // The alias of the BERT family is accepted.
    std::fs::write(
        &p,
        text.replace("[model]\n", "[model]\narch = \"bert-classifier\"\n"),
    )
    .unwrap();
    let out = mopt(&[p.to_str().unwrap(), "--check"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // An unknown one is refused before anything runs, naming the key and the families.
    std::fs::write(&p, text.replace("[model]\n", "[model]\narch = \"vit\"\n")).unwrap();
    let out = mopt(&[p.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    for needle in [
        "`model.arch`",
        "unknown architecture `vit`",
        "`bert`",
        "`resnet`",
    ] {
        assert!(err.contains(needle), "{needle} in: {err}");
    }
    assert!(!tmp.path().join("runs").exists(), "no run folder");
}

/// The recipe's labelled texts, split, read by its shipped data format.
fn read_splits(recipe: &mopt_recipe::Recipe) -> mopt_data::Splits {
    let registry = mopt_families::builtin();
    let format = registry.data_format(recipe).unwrap();
    mopt_stages::data::text::read_splits(format, recipe).unwrap()
}
