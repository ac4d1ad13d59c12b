//! The exportable contract: a model that writes itself as an ONNX graph and says how a batch is
//! fed to it, so that the parity check (and anything else that runs the graph in ONNX Runtime)
//! reads an input spec instead of assuming one model's inputs.

use std::path::Path;

use burn::prelude::*;
use mopt_core::{Checkpoint, Examples, ModelConfig};
use mopt_quant::node::QuantConfig;
use serde_json::{Map, Value};

use crate::error::ExportError;
use crate::onnx::{Dim, ModelProto};
use crate::python;

/// The element type of a graph input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputType {
    /// `float32` values (images).
    Float,
    /// `int64` values (token ids, masks).
    Int64,
}

/// One graph input: its name, element type and dimensions (the batch named `batch`).
#[derive(Debug, Clone)]
pub struct InputSpec {
    /// The input's name in the graph.
    pub name: String,
    /// Its element type.
    pub dtype: InputType,
    /// Its dimensions.
    pub dims: Vec<Dim>,
}

/// ONNX Runtime's transformer optimizer settings for a float model (`model_type`, heads,
/// hidden size), which fuses attention, LayerNorm and GELU subgraphs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrtFusion {
    /// The optimizer's model type (`bert`).
    pub model_type: &'static str,
    /// Attention heads.
    pub heads: usize,
    /// Hidden size.
    pub hidden: usize,
}

/// A model that exports itself to ONNX. [`export_checkpoint`](crate::export_checkpoint) needs
/// the first three methods; the provided ones add to the model card and the benchmark.
pub trait Exportable: Checkpoint {
    /// The graph inputs, in order.
    fn inputs(config: &Self::Config) -> Vec<InputSpec>;

    /// The ONNX model: the inputs of [`inputs`](Exportable::inputs), its first output named
    /// `logits` with the dimensions of [`outputs`](Exportable::outputs).
    fn onnx(&self, config: &Self::Config) -> Result<ModelProto, ExportError>;

    /// The dimensions of the `logits` output: `[batch, num_labels]` by default; a model of
    /// per-position outputs adds its positions (`[batch, sequence, vocab]`), the rows of
    /// [`Classifier::logits`](mopt_core::Classifier::logits) in order.
    fn outputs(config: &Self::Config) -> Vec<Dim> {
        vec![Dim::Named("batch"), Dim::Fixed(config.num_labels() as i64)]
    }

    /// Further graphs a deployment needs beside `model.onnx` (a decoder's step with past
    /// keys and values), written into `dir` and checked there on `batch` (the parity check's
    /// first batch); what they are and how they were checked goes into the model card under
    /// `extra`. None by default.
    fn write_extra(
        &self,
        _config: &Self::Config,
        _dir: &Path,
        _batch: &Self::Batch,
    ) -> Result<Option<Value>, ExportError> {
        Ok(None)
    }

    /// `batch` as ONNX Runtime is fed it: input name → nested array, for every input.
    fn feed(batch: &Self::Batch) -> Map<String, Value>;

    /// Facts about the architecture for the model card (e.g. layers and heads per layer).
    fn card_facts(_config: &Self::Config) -> Map<String, Value> {
        Map::new()
    }

    /// The quantization a quantized model was trained or calibrated with: the export is QDQ,
    /// judged by [`qdq_parity`](Exportable::qdq_parity) rather than logit tolerance. `None`: a
    /// float model.
    fn quantization(_config: &Self::Config) -> Option<QuantConfig> {
        None
    }

    /// What a quantized export's parity check holds it to: prediction agreement by default
    /// ([`QDQ_MIN_AGREEMENT`](crate::export::QDQ_MIN_AGREEMENT)).
    fn qdq_parity() -> QdqParity {
        QdqParity::MinAgreement(crate::export::QDQ_MIN_AGREEMENT)
    }

    /// Settings for ONNX Runtime's transformer optimizer (float models); `None`: ONNX
    /// Runtime's generic graph optimisation reports the fused op types.
    fn ort_fusion(_config: &Self::Config) -> Option<OrtFusion> {
        None
    }

    /// The batch sizes ONNX Runtime latency is measured at: a single request and a server
    /// batch (1 and 32 by default).
    fn bench_batches() -> Vec<usize> {
        vec![1, 32]
    }

    /// A synthetic input of `batch` examples of size `size` (tokens, pixels…) for the ONNX
    /// Runtime latency benchmark: by default the model's own
    /// [`Checkpoint::bench_batch`], fed as [`feed`](Exportable::feed) says; `None`: the model is
    /// not benchmarked.
    fn bench_feed(config: &Self::Config, batch: usize, size: usize) -> Option<Map<String, Value>> {
        Self::bench_batch(config, batch, size, &Device::flex()).map(|b| Self::feed(&b))
    }
}

/// A tensor's data (`tensor.into_data()`) as a nested JSON array: a feed value.
pub fn tensor_json(data: TensorData) -> Value {
    let dims = data.shape().to_vec();
    let flat: Vec<f64> = data
        .convert::<f64>()
        .try_to_vec::<f64>()
        .expect("numeric tensor");
    nest(&flat, &dims)
}

fn nest(v: &[f64], dims: &[usize]) -> Value {
    match dims {
        [] => Value::from(v[0]),
        [_] => Value::from(v.to_vec()),
        [n, rest @ ..] => {
            let per = v.len() / n.max(&1);
            Value::Array(
                (0..*n)
                    .map(|i| nest(&v[i * per..(i + 1) * per], rest))
                    .collect(),
            )
        }
    }
}

/// Write `model` to `path` and check it with `onnx.checker` (full check).
pub fn write_checked(model: &ModelProto, path: &Path) -> Result<(), ExportError> {
    std::fs::write(path, model.to_bytes())
        .map_err(|e| ExportError::Io(path.display().to_string(), e))?;
    python::tool(&["check", &path.display().to_string()])?;
    Ok(())
}

/// Index of the largest value (the first on ties): a prediction.
pub fn argmax(v: impl Iterator<Item = f64>) -> usize {
    v.enumerate()
        .fold(
            (0, f64::NEG_INFINITY),
            |b, (i, x)| if x > b.1 { (i, x) } else { b },
        )
        .0
}

/// How ONNX Runtime's outputs compare with mopt's: the parity check's outcome, as [`parity`]
/// measures it and the model card (`model-card.json`, under `parity`) records it.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Parity {
    /// Examples compared.
    pub samples: usize,
    /// The largest |ONNX Runtime − mopt| logit difference, over every logit.
    pub max_abs_err: f64,
    /// The float tolerance `max_abs_err` is held to (a quantized export is held to its
    /// [`QdqParity`] instead).
    pub tolerance: f64,
    /// Share of examples where ONNX Runtime and mopt predict the same class.
    pub agreement: f64,
    /// Mean KL divergence of ONNX Runtime's softmax from mopt's over the rows (every row of the
    /// last dimension: an example's classes, a position's next tokens), in nats.
    pub mean_kl: f64,
}

/// How a quantized (QDQ) export is held to mopt's fake-quantized forward. Logits are not held
/// to the float tolerance: ONNX Runtime accumulates in int32 and mopt in f32, and where the two
/// land on different sides of a rounding boundary one activation moves by a quantization step.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum QdqParity {
    /// The same predicted class on at least this share of the examples (a classifier: its
    /// margins outlast a step here and there).
    MinAgreement(f64),
    /// Mean KL divergence of ONNX Runtime's distributions from mopt's at most this many nats a
    /// row (a language model: many of its next tokens are near ties, and the steps a different
    /// rounding moves cascade through its layers, so two exact runs of one integer model pick
    /// different tokens at a tenth of the positions while their distributions and perplexity
    /// stay together).
    MaxMeanKl(f64),
}

/// KL(p || q) of the softmaxes of logit rows `a` (p) and `b` (q), in nats.
pub fn kl_of_logits(a: &[f32], b: &[f32]) -> f64 {
    let log_softmax = |r: &[f32]| -> Vec<f64> {
        let max = r.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x as f64));
        let lse = max + r.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln();
        r.iter().map(|&x| x as f64 - lse).collect()
    };
    assert_eq!(a.len(), b.len(), "rows of one width");
    let (p, q) = (log_softmax(a), log_softmax(b));
    // A token p gives no mass (a -inf logit) adds nothing.
    p.iter()
        .zip(&q)
        .filter(|(lp, _)| lp.is_finite())
        .map(|(lp, lq)| lp.exp() * (lp - lq))
        .sum()
}

/// Run the exported graph at `onnx` in ONNX Runtime on `examples` (in batches of `batch_size`)
/// and compare with `model`'s logits (inference device `device`), recording the float
/// `tolerance` the result is held to. `work` holds the feeds.
pub fn parity<M, E>(
    model: &M,
    onnx: &Path,
    examples: &E,
    batch_size: usize,
    tolerance: f64,
    device: &Device,
    work: &Path,
) -> Result<Parity, ExportError>
where
    M: Exportable,
    E: Examples<Batch = M::Batch>,
{
    let order: Vec<usize> = (0..examples.len()).collect();
    let batches: Vec<M::Batch> = order
        .chunks(batch_size.max(1))
        .map(|c| examples.batch(c, device))
        .collect();
    let feeds: Vec<Value> = batches.iter().map(|b| Value::Object(M::feed(b))).collect();
    let outs = python::run(onnx, &Value::Array(feeds), work)?;
    let (mut max, mut same, mut n, mut kl) = (0f64, 0usize, 0usize, 0f64);
    for (b, out) in batches.iter().zip(outs) {
        let ours: Vec<f32> = model.logits(b).into_data().try_to_vec().expect("f32");
        // Rows of the last dimension (`[batch, labels]`, `[batch, sequence, vocab]`).
        let c = out.shape.last().copied().unwrap_or(1).max(1);
        if out.values.len() != ours.len() {
            return Err(ExportError::Python(format!(
                "ONNX Runtime gave {} logits ({:?}), mopt {}",
                out.values.len(),
                out.shape,
                ours.len()
            )));
        }
        for (a, t) in ours.chunks(c).zip(out.values.chunks(c)) {
            for (x, y) in a.iter().zip(t) {
                max = max.max((*x as f64 - *y as f64).abs());
            }
            let best = |r: &[f32]| argmax(r.iter().map(|&x| x as f64));
            same += usize::from(best(a) == best(t));
            kl += kl_of_logits(a, t);
            n += 1;
        }
    }
    Ok(Parity {
        samples: n,
        max_abs_err: max,
        tolerance,
        agreement: same as f64 / n.max(1) as f64,
        mean_kl: kl / n.max(1) as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kl_of_logits_is_that_of_their_softmaxes() {
        assert!(kl_of_logits(&[1.0, 2.0, 3.0], &[1.0, 2.0, 3.0]).abs() < 1e-12);
        // p = softmax(0, ln 3) = (1/4, 3/4), q uniform: KL = 1/4 ln(1/2) + 3/4 ln(3/2).
        let want = 0.25 * 0.5f64.ln() + 0.75 * 1.5f64.ln();
        assert!((kl_of_logits(&[0.0, 3f32.ln()], &[0.0, 0.0]) - want).abs() < 1e-6);
        // Logits, not probabilities: a constant added to a row changes nothing.
        assert!((kl_of_logits(&[10.0, 10.0 + 3f32.ln()], &[-5.0, -5.0]) - want).abs() < 1e-5);
    }

    #[test]
    fn tensors_nest_by_their_dimensions() {
        let d = Device::flex();
        let t = Tensor::<2>::from_data(TensorData::new(vec![1f32, 2., 3., 4., 5., 6.], [2, 3]), &d);
        assert_eq!(
            tensor_json(t.into_data()),
            serde_json::json!([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
        );
        let i = Tensor::<1, Int>::from_data(TensorData::new(vec![7i64, 8], [2]), &d);
        assert_eq!(tensor_json(i.into_data()), serde_json::json!([7.0, 8.0]));
    }
}
