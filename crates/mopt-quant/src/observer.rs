//! Observers: the range a quantizer covers, from calibration data.
//!
//! - min-max: the extremes seen;
//! - moving average: extremes per batch, averaged with a momentum (PyTorch's
//!   `MovingAverageMinMaxObserver`);
//! - percentile: the `p`-th percentile of the values (and the `100 − p`-th), ignoring outliers;
//! - MSE: the symmetric clipping threshold (a grid of fractions of max |x|) whose quantization
//!   error on the observed values is smallest.
//!
//! Percentile and MSE keep a bounded, evenly strided sample of the values (at most
//! [`SAMPLE_CAP`] per observer) so calibration memory stays flat.

use serde::{Deserialize, Serialize};

use crate::fake::fake_quant_value;
use crate::scheme::QuantScheme;

/// Values a percentile or MSE observer keeps.
pub const SAMPLE_CAP: usize = 1 << 20;

/// Which observer.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ObserverKind {
    /// The smallest and largest value seen.
    MinMax,
    /// An exponential moving average of each batch's minimum and maximum.
    MovingAverage {
        /// Weight of the newest batch.
        momentum: f32,
    },
    /// The range holding `percentile` percent of the values seen (outliers clipped).
    Percentile {
        /// Percent of the values inside the range (99.99, say).
        percentile: f64,
    },
    /// The range that minimises the quantization's mean squared error on the values seen.
    Mse,
}

impl ObserverKind {
    /// The observer as a recipe would write it (`percentile (99.99)`).
    pub fn name(&self) -> String {
        match self {
            ObserverKind::MinMax => "min-max".into(),
            ObserverKind::MovingAverage { momentum } => format!("moving-average ({momentum})"),
            ObserverKind::Percentile { percentile } => format!("percentile ({percentile})"),
            ObserverKind::Mse => "mse".into(),
        }
    }
}

/// One quantizer's observer (per tensor).
#[derive(Debug, Clone)]
pub struct Observer {
    kind: ObserverKind,
    lo: f32,
    hi: f32,
    batches: usize,
    sample: Vec<f32>,
    seen: usize,
    channel_absmax: Vec<f32>,
}

impl Observer {
    /// An observer of `kind` that has seen nothing.
    pub fn new(kind: ObserverKind) -> Self {
        Self {
            kind,
            lo: f32::INFINITY,
            hi: f32::NEG_INFINITY,
            batches: 0,
            sample: Vec::new(),
            seen: 0,
            channel_absmax: Vec::new(),
        }
    }

    /// Which observer this is.
    pub fn kind(&self) -> ObserverKind {
        self.kind
    }

    /// Batches observed.
    pub fn batches(&self) -> usize {
        self.batches
    }

    /// Observe one batch of values (non-finite values are ignored).
    pub fn observe(&mut self, values: &[f32]) {
        let finite = values.iter().copied().filter(|v| v.is_finite());
        let (lo, hi) = finite
            .clone()
            .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), v| {
                (a.min(v), b.max(v))
            });
        if lo > hi {
            return;
        }
        match self.kind {
            ObserverKind::MovingAverage { momentum } if self.batches > 0 => {
                self.lo += momentum * (lo - self.lo);
                self.hi += momentum * (hi - self.hi);
            }
            _ => {
                self.lo = self.lo.min(lo);
                self.hi = self.hi.max(hi);
            }
        }
        if matches!(
            self.kind,
            ObserverKind::Percentile { .. } | ObserverKind::Mse
        ) {
            // Keep every k-th value so that the total stays under the cap (k doubles as needed).
            let n = values.len();
            self.seen += n;
            let stride = self.seen.div_ceil(SAMPLE_CAP).max(1);
            if self.sample.len() + n / stride > SAMPLE_CAP {
                self.sample = self.sample.iter().step_by(2).copied().collect();
            }
            self.sample.extend(finite.step_by(stride));
        }
        self.batches += 1;
    }

    /// Observe one batch of values laid out with `channels` channels on the last axis (a
    /// linear layer's input `[.., d_in]`): the largest magnitude each channel has seen, which
    /// SmoothQuant's scales read ([`Observer::channel_absmax`]). Non-finite values are ignored;
    /// a batch of another channel count restarts the maxima.
    pub fn observe_channels(&mut self, values: &[f32], channels: usize) {
        if channels == 0 {
            return;
        }
        if self.channel_absmax.len() != channels {
            self.channel_absmax = vec![0.0; channels];
        }
        for row in values.chunks_exact(channels) {
            for (m, v) in self.channel_absmax.iter_mut().zip(row) {
                if v.is_finite() {
                    *m = m.max(v.abs());
                }
            }
        }
    }

    /// Each channel's largest magnitude so far ([`Observer::observe_channels`]); empty before
    /// any data.
    pub fn channel_absmax(&self) -> &[f32] {
        &self.channel_absmax
    }

    /// The range to quantize, for `scheme` (MSE searches with it). `None` before any data.
    pub fn range(&self, scheme: &QuantScheme) -> Option<(f32, f32)> {
        if self.batches == 0 {
            return None;
        }
        match self.kind {
            ObserverKind::MinMax | ObserverKind::MovingAverage { .. } => Some((self.lo, self.hi)),
            ObserverKind::Percentile { percentile } => {
                let mut s = self.sample.clone();
                s.sort_by(f32::total_cmp);
                let at = |p: f64| {
                    let i = ((p / 100.0) * (s.len() - 1) as f64).round() as usize;
                    s[i.min(s.len() - 1)]
                };
                Some((at(100.0 - percentile), at(percentile)))
            }
            ObserverKind::Mse => Some(mse_range(&self.sample, self.lo, self.hi, scheme)),
        }
    }
}

/// The clipping of `[lo, hi]` (shrunk by the same fraction on both sides, 100 candidates from
/// 1% to 100%) whose quantize → dequantize error on `sample` is smallest.
fn mse_range(sample: &[f32], lo: f32, hi: f32, scheme: &QuantScheme) -> (f32, f32) {
    let (qmin, qmax) = scheme.format.range();
    let mut best = (f64::INFINITY, lo, hi);
    for k in 1..=100 {
        let f = k as f32 / 100.0;
        let (l, h) = (lo * f, hi * f);
        let p = scheme.qparams(&[l], &[h]);
        let (s, z) = (p.scale[0], p.zero_point[0]);
        let err: f64 = sample
            .iter()
            .map(|&x| {
                let d = (fake_quant_value(x, s, z, qmin, qmax) - x) as f64;
                d * d
            })
            .sum();
        if err < best.0 {
            best = (err, l, h);
        }
    }
    (best.1, best.2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheme::{Granularity, IntFormat};

    const SYM: QuantScheme = QuantScheme {
        format: IntFormat::INT8,
        symmetric: true,
        granularity: Granularity::PerTensor,
    };

    /// -1..1 in a million even steps, plus one outlier at 100.
    fn data() -> Vec<f32> {
        let n = 1_000_000;
        let mut v: Vec<f32> = (0..n)
            .map(|i| -1.0 + 2.0 * i as f32 / (n - 1) as f32)
            .collect();
        v.push(100.0);
        v
    }

    #[test]
    fn min_max_and_moving_average_on_known_data() {
        let mut o = Observer::new(ObserverKind::MinMax);
        o.observe(&[1.0, -2.0]);
        o.observe(&[3.0, f32::NAN]);
        assert_eq!(o.range(&SYM), Some((-2.0, 3.0)));
        let mut m = Observer::new(ObserverKind::MovingAverage { momentum: 0.5 });
        m.observe(&[-2.0, 2.0]);
        m.observe(&[-4.0, 6.0]);
        // -2 + 0.5·(-4 − -2) = -3; 2 + 0.5·(6 − 2) = 4.
        assert_eq!(m.range(&SYM), Some((-3.0, 4.0)));
        assert_eq!(Observer::new(ObserverKind::Mse).range(&SYM), None);
    }

    #[test]
    fn percentile_ignores_a_planted_outlier() {
        let mut p = Observer::new(ObserverKind::Percentile { percentile: 99.9 });
        p.observe(&data());
        let (lo, hi) = p.range(&SYM).unwrap();
        assert!(
            (lo + 0.998).abs() < 2e-3 && (hi - 0.998).abs() < 2e-3,
            "{lo} {hi}"
        );
        let mut m = Observer::new(ObserverKind::MinMax);
        m.observe(&data());
        assert_eq!(m.range(&SYM).unwrap().1, 100.0);
    }

    #[test]
    fn mse_clips_below_a_planted_outlier_and_beats_min_max() {
        let mut o = Observer::new(ObserverKind::Mse);
        o.observe(&data());
        let (lo, hi) = o.range(&SYM).unwrap();
        // Covering 100 costs a million small values their resolution (step 0.78); clipping at h
        // costs the outlier (100 − h)²: the optimum, (100 − h)² + 10⁶·h²/(12·127.5²), is near 16.
        assert!((10.0..25.0).contains(&hi), "{lo} {hi}");
        let err = |l: f32, h: f32| {
            let p = SYM.qparams(&[l], &[h]);
            data()
                .iter()
                .map(|&x| ((fake_quant_value(x, p.scale[0], 0, -128, 127) - x) as f64).powi(2))
                .sum::<f64>()
        };
        assert!(err(lo, hi) < err(-1.0, 100.0) / 5.0);
    }

    #[test]
    fn channel_maxima_are_per_last_axis_channel_magnitudes() {
        let mut o = Observer::new(ObserverKind::MinMax);
        assert!(o.channel_absmax().is_empty());
        // Two rows of three channels, then one more row: channel 1 holds the largest magnitude.
        o.observe_channels(&[1.0, -7.0, 0.5, -2.0, 3.0, f32::NAN], 3);
        o.observe_channels(&[0.25, 6.0, -4.0], 3);
        assert_eq!(o.channel_absmax(), &[2.0, 7.0, 4.0]);
    }

    #[test]
    fn the_sample_stays_under_its_cap() {
        let mut o = Observer::new(ObserverKind::Percentile { percentile: 99.0 });
        let batch: Vec<f32> = (0..300_000).map(|i| i as f32).collect();
        for _ in 0..10 {
            o.observe(&batch);
        }
        assert!(o.sample.len() <= SAMPLE_CAP, "{}", o.sample.len());
        let (_, hi) = o.range(&SYM).unwrap();
        assert!((hi - 297_000.0).abs() < 3_000.0, "{hi}");
    }
}
