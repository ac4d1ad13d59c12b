//! Int8 quantization of a decoder language model through the same `ptq` and `qat` stage kinds
//! as the classifiers: a tiny random Llama with SmolLM2's vocabulary, fine-tuned on excerpts of
//! Shakespeare's plays, then quantized (weights int8 per output channel, inputs uint8 per
//! tensor, on the 14 projections of its 2 layers; the tied embedding table and head float)
//! under a perplexity gate; `generate` serves the quantized model with its projections in
//! integers. `datasets/fetch.sh --small`.

mod common;

use std::path::{Path, PathBuf};

use common::{mopt, read_json, stderr, write_lm_recipe};

/// Fine-tune, then post-training quantization of every projection (SmoothQuant with α = 0.5,
/// then calibrated on 32 training windows), gated on the rise of validation perplexity over
/// the fine-tuned model's.
const FINETUNE_AND_PTQ: &str = r#"
[[stage]]
kind = "finetune"

[[stage]]
kind = "ptq"
weight-bits = 8
observer = "min-max"
calibration-samples = 32
smooth = 0.5
[stage.gate]
metric = "perplexity"
max-relative-rise = 0.25
against = "previous"

[[stage]]
kind = "export"
reference = "none"
"#;

/// Fine-tune, then one epoch of quantization-aware training (no KD: the baseline is the random
/// init), gated the same way.
const FINETUNE_AND_QAT: &str = r#"
[[stage]]
kind = "finetune"

[[stage]]
kind = "qat"
weight-bits = 8
observer = "min-max"
calibration-samples = 32
distill = false
[stage.train]
epochs = 1
lr = 1e-3
[stage.gate]
metric = "perplexity"
max-relative-rise = 0.25
against = "previous"
"#;

/// Runs `stages` (finetune, then a quantization stage) and checks the plan, the gate and the
/// quantized checkpoint; returns the (fine-tuned, quantized) validation perplexities and the
/// run folder.
fn run_quantized(dir: &Path, stages: &str, kind: &str) -> (f64, f64, PathBuf) {
    let recipe = write_lm_recipe(dir, stages);
    let r = recipe.to_str().unwrap();
    let check = mopt(&[r, "--check"]);
    assert!(check.status.success(), "{}", stderr(&check));
    let plan = String::from_utf8_lossy(&check.stdout);
    assert!(plan.contains("14 of 14 layers quantized"), "{plan}");
    let out = mopt(&[r]);
    assert!(out.status.success(), "{}", stderr(&out));
    let run = dir.join("runs/lm");
    let report = read_json(&run.join("report.json"));
    let stages = report["stages"].as_array().unwrap();
    let ppl = |i: usize| stages[i]["model"]["valid"]["loss"].as_f64().unwrap().exp();
    let q = &stages[2];
    assert_eq!(q["kind"], kind, "{q}");
    let layers = q["facts"]["quantization"]["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 14, "{q}");
    assert_eq!(layers[0], "model.layers.0.self_attn.q_proj");
    assert_eq!(q["decision"]["passed"], true, "{q}");
    let reason = q["decision"]["reason"].as_str().unwrap();
    assert!(reason.contains("validation perplexity"), "{reason}");
    assert!(reason.contains("max-relative-rise 25.00%"), "{reason}");
    // The quantized model's logits moved (on the golden window).
    let moved = q["max_logit_error_vs_input"].as_f64().unwrap();
    assert!(moved > 0.0, "{q}");
    // The stage's checkpoint, and the run's best, are the quantized model.
    let config = |dir: &Path| read_json(&dir.join("config.json"));
    let ckpt = PathBuf::from(q["model"]["checkpoint"].as_str().unwrap());
    for dir in [ckpt.as_path(), &run.join("best")] {
        let c = config(dir);
        assert_eq!(c["mopt_quant"]["layers"].as_array().map(Vec::len), Some(14));
    }
    (ppl(1), ppl(2), run)
}

/// `convert --to gguf` refuses the quantized model by name; `generate` serves it.
fn serves_but_does_not_convert(best: &Path) {
    let out_file = best.parent().unwrap().join("q.gguf");
    let b = best.to_str().unwrap();
    let out = mopt(&[
        "convert",
        b,
        "--to",
        "gguf",
        "--out",
        out_file.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("fake-quant scales have no place in this GGUF writer"),
        "{err}"
    );
    assert!(!out_file.exists());
    let args = [
        "generate",
        b,
        "--prompt",
        "To be, or not",
        "--max-new-tokens",
        "4",
    ];
    let out = mopt(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("To be, or not"));
    // The quantized model decodes in integers: all 14 projections packed as int8.
    let err = stderr(&out);
    assert!(
        err.contains("int8: 14 linear layers ran in integers"),
        "{err}"
    );
}

#[test]
fn a_fine_tuned_tiny_llama_is_quantized_by_ptq_under_a_perplexity_gate() {
    let dir = tempfile::tempdir().unwrap();
    let (float, int8, run) = run_quantized(dir.path(), FINETUNE_AND_PTQ, "ptq");
    eprintln!("validation perplexity: fine-tuned {float:.1}, ptq int8 {int8:.1}");
    // Quantization moves the perplexity, within the gate's 25 %.
    assert!(int8 != float && int8 <= float * 1.25, "{float} → {int8}");
    // SmoothQuant smoothed all four groups of both layers before calibrating, and the
    // exported graph below (the smoothed weights) still holds ONNX Runtime's parity.
    let report = read_json(&run.join("report.json"));
    let smoothing = &report["stages"][2]["facts"]["smoothing"];
    assert_eq!(smoothing["groups"], 8, "{smoothing}");
    assert_eq!(smoothing["alpha"], 0.5, "{smoothing}");
    let ratio = |i: usize| smoothing["outlier_ratio"][i].as_f64().unwrap();
    assert!(ratio(1) < ratio(0), "{smoothing}");
    serves_but_does_not_convert(&run.join("best"));
    exports_as_qdq(&run.join("03-export/onnx"));
}

/// The int8 model in ONNX as QDQ (int8 weights with per-channel scales, inputs through
/// Q/DQ): ONNX Runtime predicts mopt's next tokens on the golden window's 16 positions, its
/// optimised graph runs integer kernels, and the decode graph with past key/values is
/// written and greedy-decoded beside it.
fn exports_as_qdq(dir: &Path) {
    let card = read_json(&dir.join("model-card.json"));
    let q = &card["quantization"];
    assert_eq!(
        q["config"]["layers"].as_array().map(Vec::len),
        Some(14),
        "{q}"
    );
    let ops = q["onnxruntime_optimized_ops"].to_string();
    assert!(ops.contains("Integer"), "{ops}");
    assert_eq!(card["parity"]["samples"], 16, "{}", card["parity"]);
    assert!(card["parity"]["agreement"].as_f64().unwrap() >= 0.995);
    // A language model's QDQ graph is held to the mean KL of its next-token distributions.
    assert_eq!(q["parity_rule"]["max-mean-kl"], 0.1, "{q}");
    let kl = card["parity"]["mean_kl"].as_f64().unwrap();
    assert!((0.0..0.1).contains(&kl), "{kl}");
    let d = &card["extra"]["decoding"];
    assert_eq!(d["new_tokens"], 8, "{d}");
    eprintln!("int8 ONNX: parity {}, decoding {d}", card["parity"]);
    assert!(dir.join("decoder_with_past.onnx").is_file());
}

#[test]
fn a_fine_tuned_tiny_llama_is_quantized_by_qat_under_a_perplexity_gate() {
    let dir = tempfile::tempdir().unwrap();
    let (float, int8, _) = run_quantized(dir.path(), FINETUNE_AND_QAT, "qat");
    eprintln!("validation perplexity: fine-tuned {float:.1}, qat int8 {int8:.1}");
    assert!(int8 != float && int8 <= float * 1.25, "{float} → {int8}");
}
