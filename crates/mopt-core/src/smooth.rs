//! SmoothQuant (Xiao et al., 2023, "SmoothQuant: Accurate and Efficient Post-Training
//! Quantization for Large Language Models"): a language model's activations carry a few
//! outlier channels, which one scale per tensor cannot cover without flattening every other
//! channel to a handful of levels, while its weights are easy to quantize. Dividing input
//! channel `j` by `s_j` and multiplying the weight's row `j` by `s_j` leaves the product
//! unchanged and moves part of the difficulty from the activation to the weight:
//!
//! `s_j = max|X_j|^α / max|W_j|^(1-α)`
//!
//! with `max|X_j|` over calibration data and `max|W_j|` over the consumers' row `j`; `α = 0.5`
//! balances the two. The division is folded into whatever produced the channel — a
//! normalisation's gain (RMSNorm), or the output columns of a bias-free linear layer (V into
//! the attention's output projection, `up` into `down` through SwiGLU's product) — so the
//! smoothed float model computes the same function and the deployed graph gains no op.
//!
//! A family lists where a scale can move ([`crate::Quantizable::smoothing_group`]); [`smooth`]
//! measures, computes and applies, generic over families.

use burn::module::Param;
use burn::prelude::*;
use mopt_quant::node::QuantConfig;

use crate::quant::Quantizable;

/// What produces the consumers' input channels, where `1 / s` is folded.
pub enum SmoothProducer<'a> {
    /// A normalisation's per-channel gain `[channels]` with no bias (RMSNorm's weight).
    Gain(&'a mut Param<Tensor<1>>),
    /// A bias-free linear layer's weight `[d_in, channels]`: its output columns, through ops
    /// that commute with a per-channel scale (attention's weighted sum of values; SwiGLU's
    /// product `silu(gate) · up`).
    Columns(&'a mut Param<Tensor<2>>),
}

/// One place a smoothing scale moves through: a producer and the linear layers that read its
/// channels.
pub struct SmoothGroup<'a> {
    /// The producer's module path (`model.layers.3.input_layernorm`).
    pub producer_path: String,
    /// The producer.
    pub producer: SmoothProducer<'a>,
    /// The consumers, by quantization slot path, and their weights `[d_in, d_out]`; they
    /// read one input.
    pub consumers: Vec<(String, &'a mut Param<Tensor<2>>)>,
    /// The producer channel of each consumer input channel (grouped-query attention: the
    /// output projection's input channels of query head `h` read value head `h / group`);
    /// `None`: channel `j` is channel `j`.
    pub channel_map: Option<Vec<usize>>,
}

/// What [`smooth`] did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SmoothReport {
    /// Producers smoothed (those with a quantized consumer that saw data).
    pub groups: usize,
    /// The smallest and largest scale applied.
    pub scale_range: (f32, f32),
    /// Over the smoothed groups, the mean of (largest channel maximum / median channel
    /// maximum) of the consumers' input, before and after: how far the outliers stand out.
    pub outlier_ratio: (f32, f32),
}

/// The smoothing scales of producer channels whose consumers' input reached `act[p]` at most
/// and whose consumers' rows reached `weight[p]`: `act^α / weight^(1-α)`, 1 where either is
/// zero (a channel that never fires, or a pruned-away row) or where the ratio is not a finite
/// number, clamped to [1e-5, 1e5].
pub fn smoothing_scales(act: &[f32], weight: &[f32], alpha: f64) -> Vec<f32> {
    act.iter()
        .zip(weight)
        .map(|(&a, &w)| {
            if a <= 0.0 || w <= 0.0 || !a.is_finite() || !w.is_finite() {
                return 1.0;
            }
            let s = (a as f64).powf(alpha) / (w as f64).powf(1.0 - alpha);
            if s.is_finite() {
                s.clamp(1e-5, 1e5) as f32
            } else {
                1.0
            }
        })
        .collect()
}

/// Each row's largest magnitude of a `[rows, cols]` weight.
fn row_absmax(w: &Param<Tensor<2>>) -> Vec<f32> {
    let t = w.val();
    let rows = t.dims()[0];
    t.abs()
        .max_dim(1)
        .reshape([rows])
        .into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .expect("f32 data")
}

/// `p` times `factors` laid out as `shape` (broadcast over the axes of length 1).
fn scale<const D: usize>(p: &mut Param<Tensor<D>>, factors: Vec<f32>, shape: [usize; D]) {
    let t = p.val();
    let f = Tensor::<D>::from_data(
        TensorData::new(factors, shape).convert_dtype(t.dtype()),
        &t.device(),
    );
    *p = Param::from_tensor(t * f);
}

/// The per-channel maxima of the input of each quantized layer that saw calibration data,
/// by slot path, after `feed` ran on `model` with observing quantizers on `q.layers` (min-max:
/// the maxima are all this pass keeps); the quantizers are removed again.
fn input_maxima<M: Quantizable>(
    model: &mut M,
    q: &QuantConfig,
    device: &Device,
    feed: impl FnOnce(&M),
) -> std::collections::HashMap<String, Vec<f32>> {
    let q = QuantConfig {
        observer: mopt_quant::ObserverKind::MinMax,
        ..q.clone()
    };
    for input in crate::quant::observe_inputs(model, &q, device) {
        input.track_channels();
    }
    feed(model);
    let mut out = std::collections::HashMap::new();
    for s in model.quant_slots() {
        if let Some(lq) = s.quant.take() {
            let m = lq.input.channel_absmax();
            if !m.is_empty() {
                out.insert(s.path, m);
            }
        }
    }
    out
}

/// `max / median` of channel maxima (1 for an empty or all-zero list).
fn outlier_ratio(m: &[f32]) -> f32 {
    let mut s: Vec<f32> = m.to_vec();
    s.sort_by(f32::total_cmp);
    match (s.get(s.len() / 2), s.last()) {
        (Some(&med), Some(&max)) if med > 0.0 => max / med,
        _ => 1.0,
    }
}

/// SmoothQuant on `model` before calibration: the input channel maxima of the layers
/// `q.layers` lists, measured over the forward passes `feed` runs (float, no quantization),
/// then every group of [`Quantizable::smoothing_group`] with a quantized consumer that saw
/// data smoothed with strength `alpha` in (0, 1] (1 moves all of the activations' range into
/// the weights; 0.5 balances the two). The model's function is unchanged up to float rounding.
/// The calibration data passes once here and once more in the calibration that follows.
pub fn smooth<M: Quantizable>(
    mut model: M,
    q: &QuantConfig,
    alpha: f64,
    device: &Device,
    feed: impl FnOnce(&M),
) -> (M, SmoothReport) {
    let maxima = input_maxima(&mut model, q, device, feed);
    let mut report = SmoothReport {
        scale_range: (f32::INFINITY, f32::NEG_INFINITY),
        ..SmoothReport::default()
    };
    let (mut before, mut after) = (0.0f32, 0.0f32);
    let mut k = 0;
    while let Some(g) = model.smoothing_group(k) {
        k += 1;
        let Some(act) = g.consumers.iter().find_map(|(p, _)| maxima.get(p)) else {
            continue;
        };
        let Some(scales) = apply_group(g, act, alpha) else {
            continue;
        };
        report.groups += 1;
        for &s in &scales.0 {
            report.scale_range.0 = report.scale_range.0.min(s);
            report.scale_range.1 = report.scale_range.1.max(s);
        }
        before += outlier_ratio(act);
        after += outlier_ratio(&scales.1);
    }
    if report.groups == 0 {
        report.scale_range = (1.0, 1.0);
        report.outlier_ratio = (1.0, 1.0);
    } else {
        let n = report.groups as f32;
        report.outlier_ratio = (before / n, after / n);
    }
    (model, report)
}

/// Smooth one group whose consumers' input reached `act` (per consumer channel): returns the
/// producer channels' scales and the consumers' smoothed channel maxima, or `None` where the
/// shapes disagree (nothing changed).
fn apply_group(g: SmoothGroup<'_>, act: &[f32], alpha: f64) -> Option<(Vec<f32>, Vec<f32>)> {
    let n_in = act.len();
    let map: Vec<usize> = g.channel_map.unwrap_or_else(|| (0..n_in).collect());
    let channels = match &g.producer {
        SmoothProducer::Gain(w) => w.val().dims()[0],
        SmoothProducer::Columns(w) => w.val().dims()[1],
    };
    if map.len() != n_in || map.iter().any(|&p| p >= channels) {
        return None;
    }
    let (mut a, mut w) = (vec![0.0f32; channels], vec![0.0f32; channels]);
    for (c, &p) in map.iter().enumerate() {
        a[p] = a[p].max(act[c]);
    }
    for (_, weight) in &g.consumers {
        let rows = row_absmax(weight);
        if rows.len() != n_in {
            return None;
        }
        for (c, &p) in map.iter().enumerate() {
            w[p] = w[p].max(rows[c]);
        }
    }
    let s = smoothing_scales(&a, &w, alpha);
    let inv: Vec<f32> = s.iter().map(|v| 1.0 / v).collect();
    match g.producer {
        SmoothProducer::Gain(p) => scale(p, inv, [channels]),
        SmoothProducer::Columns(p) => scale(p, inv, [1, channels]),
    }
    let rows: Vec<f32> = map.iter().map(|&p| s[p]).collect();
    for (_, weight) in g.consumers {
        scale(weight, rows.clone(), [n_in, 1]);
    }
    let smoothed = act.iter().zip(&map).map(|(x, &p)| x / s[p]).collect();
    Some((s, smoothed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_balance_activation_and_weight_maxima() {
        // alpha = 0.5: s = sqrt(a / w), so a / s = w * s = sqrt(a * w).
        let s = smoothing_scales(&[16.0, 1.0, 0.0, 4.0], &[1.0, 4.0, 2.0, 0.0], 0.5);
        assert_eq!(s, vec![4.0, 0.5, 1.0, 1.0]);
        // alpha = 1: every activation range moves into the weight (a / s = 1).
        let s = smoothing_scales(&[8.0, 0.25], &[3.0, 5.0], 1.0);
        assert_eq!(s, vec![8.0, 0.25]);
        // alpha = 0: s = 1 / w (the weight's rows normalised, activations take the rest).
        let s = smoothing_scales(&[8.0], &[4.0], 0.0);
        assert_eq!(s, vec![0.25]);
        // A ratio past f32's range is left at 1; extreme ones are clamped.
        let s = smoothing_scales(&[1e30, 1e-30], &[1e-38, 1e30], 0.9);
        assert_eq!(s, vec![1e5, 1e-5]);
        assert_eq!(smoothing_scales(&[f32::INFINITY], &[1.0], 0.5), vec![1.0]);
    }

    #[test]
    fn outliers_measured_against_the_median_channel() {
        assert_eq!(outlier_ratio(&[1.0, 2.0, 40.0]), 20.0);
        assert_eq!(outlier_ratio(&[]), 1.0);
        assert_eq!(outlier_ratio(&[0.0, 0.0, 3.0]), 1.0);
    }
}
