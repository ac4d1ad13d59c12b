//! Evaluation of a classifier on a split: metrics and per-example logits.

use burn::nn::loss::CrossEntropyLossConfig;
use burn::prelude::*;
use mopt_core::{Classifier, Examples, Labeled};

use crate::metrics::{accuracy, macro_f1, EvalMetrics};

/// Per-example logits and predictions of an evaluation.
pub struct EvalOutput {
    /// Loss, accuracy and macro-F1.
    pub metrics: EvalMetrics,
    /// Every example's logits, in split order.
    pub logits: Vec<Vec<f32>>,
}

/// Evaluate `model` (inference device) on `examples`; logits come back in input order.
pub fn evaluate<C, E>(
    model: &C,
    examples: &E,
    batch_size: usize,
    num_labels: usize,
    device: &Device,
) -> EvalOutput
where
    C: Classifier<Batch: Labeled>,
    E: Examples<Batch = C::Batch> + ?Sized,
{
    // Size-sorted batches pad less; results are put back in input order.
    let n = examples.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| examples.size(i));
    let ce = CrossEntropyLossConfig::new().init(device);
    let mut logits = vec![Vec::new(); n];
    let mut loss_sum = 0.0;
    for chunk in order.chunks(batch_size) {
        let b = examples.batch(chunk, device);
        let out = model.logits(&b);
        let loss: f32 = ce.forward(out.clone(), b.labels()).into_scalar();
        loss_sum += loss as f64 * chunk.len() as f64;
        let flat: Vec<f32> = out.into_data().try_to_vec().expect("f32 logits");
        for (row, &i) in chunk.iter().enumerate() {
            logits[i] = flat[row * num_labels..(row + 1) * num_labels].to_vec();
        }
    }
    let pred: Vec<usize> = logits.iter().map(|l| argmax(l)).collect();
    let truth: Vec<usize> = (0..n).map(|i| examples.label(i)).collect();
    EvalOutput {
        metrics: EvalMetrics {
            loss: loss_sum / n.max(1) as f64,
            accuracy: accuracy(&pred, &truth),
            macro_f1: macro_f1(&pred, &truth, num_labels),
            examples: n,
        },
        logits,
    }
}

/// Index of the largest value (the first on ties).
pub fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &x)| {
            if x > bv {
                (i, x)
            } else {
                (bi, bv)
            }
        })
        .0
}
