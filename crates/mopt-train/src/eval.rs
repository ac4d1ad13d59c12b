//! Evaluation of a classifier on a split: metrics and per-example logits.

use burn::nn::loss::CrossEntropyLossConfig;
use burn::prelude::*;
use mopt_core::{Classifier, Examples, Labeled};

use crate::metrics::{accuracy, macro_f1, EvalMetrics};

/// At most this many logit values of an example are kept (8 MiB): all of a classifier's row; of
/// a language model's positions, rows evenly spaced from the first (a 2,048-token window's rows
/// over a 49,152-token vocabulary would be 100M values, 42 of its rows are kept).
pub const KEPT_VALUES: usize = 1 << 21;

/// The rows kept of an example of `rows` logit rows of `width` values: every row while they fit
/// in [`KEPT_VALUES`], else every `s`-th from the first, `s` the least stride that fits.
pub fn kept_rows(rows: usize, width: usize) -> impl Iterator<Item = usize> {
    let fit = (KEPT_VALUES / width.max(1)).max(1);
    (0..rows).step_by(rows.div_ceil(fit).max(1))
}

/// Per-example logits and predictions of an evaluation.
pub struct EvalOutput {
    /// Loss, accuracy and macro-F1.
    pub metrics: EvalMetrics,
    /// The kept examples' logits, in split order: each example's rows (one for a classifier,
    /// one a position for a model of per-token outputs: those [`kept_rows`] picks), flattened.
    pub logits: Vec<Vec<f32>>,
}

/// Evaluate `model` (inference device) on `examples`; logits come back in input order.
///
/// A model's logits are rows of `num_labels`: one row an example for a classifier, or several
/// (a language model's positions, flattened as `[batch × positions, vocab]`, the batch's
/// `labels` one a row). Accuracy and macro-F1 are over rows, the loss is the mean
/// cross-entropy a row.
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
    evaluate_keeping(
        model,
        examples,
        (batch_size, num_labels),
        usize::MAX,
        device,
    )
}

/// [`evaluate`], keeping the logits of the first `keep` examples only (the rest are scored and
/// dropped: a language model's rows over a whole split would not fit); `keep = 0` for the
/// metrics alone.
pub fn evaluate_keeping<C, E>(
    model: &C,
    examples: &E,
    (batch_size, num_labels): (usize, usize),
    keep: usize,
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
    let mut logits = vec![Vec::new(); n.min(keep)];
    let (mut pred, mut truth) = (vec![Vec::new(); n], vec![Vec::new(); n]);
    let (mut loss_sum, mut rows_seen) = (0.0, 0usize);
    for chunk in order.chunks(batch_size) {
        crate::watch::beat();
        let b = examples.batch(chunk, device);
        let out = model.logits(&b);
        let labels = b.labels();
        let rows = out.dims()[0];
        let per = rows / chunk.len();
        assert_eq!(
            per * chunk.len(),
            rows,
            "logit rows are a whole number an example"
        );
        let loss: f32 = ce.forward(out.clone(), labels.clone()).into_scalar();
        loss_sum += loss as f64 * rows as f64;
        rows_seen += rows;
        let flat: Vec<f32> = out.into_data().try_to_vec().expect("f32 logits");
        let labels: Vec<i64> = labels
            .into_data()
            .convert::<i64>()
            .try_to_vec::<i64>()
            .expect("labels");
        let width = per * num_labels;
        for (k, &i) in chunk.iter().enumerate() {
            let mine = &flat[k * width..(k + 1) * width];
            pred[i] = mine.chunks(num_labels).map(argmax).collect();
            truth[i] = labels[k * per..(k + 1) * per]
                .iter()
                .map(|&l| l as usize)
                .collect();
            if i < logits.len() {
                logits[i] = kept_rows(per, num_labels)
                    .flat_map(|r| &mine[r * num_labels..(r + 1) * num_labels])
                    .copied()
                    .collect();
            }
        }
    }
    let (pred, truth) = (pred.concat(), truth.concat());
    EvalOutput {
        metrics: EvalMetrics {
            loss: loss_sum / rows_seen.max(1) as f64,
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

#[cfg(test)]
mod tests {
    use super::*;
    use burn::module::Param;
    use burn::tensor::TensorData;

    /// A bigram language model: the logits of the next token are the row of the current one.
    #[derive(Module, Debug)]
    struct Bigram {
        table: Param<Tensor<2>>,
    }

    /// Windows of token ids; the model predicts every next token.
    #[derive(Clone)]
    struct Windows {
        inputs: Tensor<2, Int>,
        targets: Tensor<1, Int>,
    }

    impl Labeled for Windows {
        fn labels(&self) -> Tensor<1, Int> {
            self.targets.clone()
        }
    }

    impl Classifier for Bigram {
        type Batch = Windows;
        fn logits(&self, b: &Windows) -> Tensor<2> {
            let [batch, len] = b.inputs.dims();
            let ids = b.inputs.clone().reshape([batch * len]);
            self.table.val().select(0, ids)
        }
    }

    struct Text(Vec<Vec<i64>>);

    impl Examples for Text {
        type Batch = Windows;
        fn len(&self) -> usize {
            self.0.len()
        }
        fn label(&self, i: usize) -> usize {
            self.0[i][1] as usize
        }
        fn batch(&self, indices: &[usize], device: &Device) -> Windows {
            let (mut inputs, mut targets) = (Vec::new(), Vec::new());
            for &i in indices {
                let w = &self.0[i];
                inputs.extend_from_slice(&w[..w.len() - 1]);
                targets.extend_from_slice(&w[1..]);
            }
            let len = self.0[0].len() - 1;
            let data = TensorData::new(inputs, [indices.len(), len]);
            let n = targets.len();
            Windows {
                inputs: Tensor::from_data(data, device),
                targets: Tensor::from_data(TensorData::new(targets, [n]), device),
            }
        }
        fn record(&self, i: usize) -> serde_json::Value {
            serde_json::json!(self.0[i])
        }
    }

    #[test]
    fn per_token_rows_are_scored_row_by_row() {
        let device = Device::flex();
        let vocab = 4;
        let table: Vec<f32> = (0..vocab * vocab)
            .map(|k| ((k * 7 % 5) as f32) * 0.5 - (k % 3) as f32)
            .collect();
        let model = Bigram {
            table: Param::from_tensor(Tensor::from_data(
                TensorData::new(table.clone(), [vocab, vocab]),
                &device,
            )),
        };
        let text = Text(vec![
            vec![0, 1, 2, 3, 0],
            vec![3, 3, 1, 0, 2],
            vec![2, 0, 1, 1, 3],
        ]);
        // By hand: every (token, next) pair's cross-entropy and whether the row's argmax is it.
        let (mut ce, mut hits, mut rows) = (0.0f64, 0usize, 0usize);
        for w in &text.0 {
            for p in w.windows(2) {
                let row = &table[p[0] as usize * vocab..(p[0] as usize + 1) * vocab];
                let max = row.iter().cloned().fold(f32::MIN, f32::max) as f64;
                let lse = max
                    + row
                        .iter()
                        .map(|&x| (x as f64 - max).exp())
                        .sum::<f64>()
                        .ln();
                ce += lse - row[p[1] as usize] as f64;
                hits += usize::from(argmax(row) == p[1] as usize);
                rows += 1;
            }
        }
        let out = evaluate_keeping(&model, &text, (2, vocab), 1, &device);
        let m = out.metrics;
        assert_eq!((m.examples, rows), (3, 12));
        assert!(
            (m.loss - ce / rows as f64).abs() < 1e-5,
            "{} vs {}",
            m.loss,
            ce / 12.0
        );
        assert!((m.accuracy - hits as f64 / rows as f64).abs() < 1e-12);
        // Perplexity reads the same mean cross-entropy.
        let ppl = m.value(mopt_recipe::Metric::Perplexity);
        assert!((ppl - (ce / rows as f64).exp()).abs() < 1e-4);
        // One example's logits kept: its 4 rows of 4, the table's rows of tokens 0, 1, 2, 3.
        assert_eq!(out.logits.len(), 1);
        assert_eq!(out.logits[0], table);
    }

    /// A classifier keeps its row, a 128-token window over 49,152 logits every 4th row, a
    /// 2,048-token one every 49th: at most 2^21 values an example.
    #[test]
    fn kept_rows_fit_the_budget_evenly_from_the_first() {
        assert_eq!(kept_rows(1, 2).collect::<Vec<_>>(), [0]);
        assert_eq!(kept_rows(16, 49152).count(), 16);
        let short: Vec<usize> = kept_rows(128, 49152).collect();
        assert_eq!((short.len(), short[1], short[31]), (32, 4, 124));
        let long: Vec<usize> = kept_rows(2048, 49152).collect();
        assert_eq!((long.len(), long[1], long[41]), (42, 49, 2009));
        assert!(long.len() * 49152 <= KEPT_VALUES && (long.len() + 1) * 49152 > KEPT_VALUES);
    }
}
