//! Validation metrics: accuracy and macro-F1 of the predicted rows, the mean cross-entropy, and
//! its `exp`, the perplexity; [`EvalMetrics::value`] reads any [`Metric`] a recipe names.

use mopt_recipe::Metric;
use serde::Serialize;

/// Accuracy, macro-F1 and mean loss over a data split.
#[derive(Debug, Clone, Copy, Serialize, serde::Deserialize, PartialEq)]
pub struct EvalMetrics {
    /// Mean cross-entropy.
    pub loss: f64,
    /// Share of correct predictions.
    pub accuracy: f64,
    /// Mean F1 over the classes.
    pub macro_f1: f64,
    /// Examples evaluated.
    pub examples: usize,
}

impl EvalMetrics {
    /// The value of `metric` (perplexity: `exp` of the mean cross-entropy).
    pub fn value(&self, metric: Metric) -> f64 {
        match metric {
            Metric::Accuracy => self.accuracy,
            Metric::MacroF1 => self.macro_f1,
            Metric::Loss => self.loss,
            Metric::Perplexity => self.loss.exp(),
        }
    }
}

/// Fraction of `pred` equal to `truth`.
pub fn accuracy(pred: &[usize], truth: &[usize]) -> f64 {
    if truth.is_empty() {
        return 0.0;
    }
    pred.iter().zip(truth).filter(|(p, t)| p == t).count() as f64 / truth.len() as f64
}

/// Unweighted mean of per-class F1 over the classes that occur in `truth` or `pred`
/// (scikit-learn's `f1_score(average="macro")`).
pub fn macro_f1(pred: &[usize], truth: &[usize], num_classes: usize) -> f64 {
    let mut tp = vec![0usize; num_classes];
    let mut fp = vec![0usize; num_classes];
    let mut fn_ = vec![0usize; num_classes];
    for (&p, &t) in pred.iter().zip(truth) {
        if p == t {
            tp[p] += 1;
        } else {
            fp[p] += 1;
            fn_[t] += 1;
        }
    }
    let mut sum = 0.0;
    let mut n = 0;
    for c in 0..num_classes {
        if tp[c] + fp[c] + fn_[c] == 0 {
            continue;
        }
        let denom = 2 * tp[c] + fp[c] + fn_[c];
        sum += 2.0 * tp[c] as f64 / denom as f64;
        n += 1;
    }
    if n == 0 {
        0.0
    } else {
        sum / n as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f1_matches_hand_computation() {
        // class 0: tp=2 fp=1 fn=0 -> f1 = 4/5; class 1: tp=1 fp=0 fn=1 -> 2/3
        let truth = [0, 0, 1, 1];
        let pred = [0, 0, 1, 0];
        assert!((accuracy(&pred, &truth) - 0.75).abs() < 1e-12);
        let f1 = macro_f1(&pred, &truth, 3);
        assert!((f1 - (0.8 + 2.0 / 3.0) / 2.0).abs() < 1e-12);
    }
}
