//! Integer formats and quantization parameters.
//!
//! ONNX: `q = saturate(round_half_even(x / scale) + zero_point)`, `x̂ = (q − zero_point) · scale`.
//! A range `[lo, hi]` becomes parameters the way ONNX Runtime's quantization tools derive them:
//! the range is widened to contain 0 (so 0 is exact); symmetric: `scale = max(|lo|, |hi|) /
//! ((qmax − qmin) / 2)` with the zero point at the middle of the integer range (0 for signed
//! formats); asymmetric: `scale = (hi − lo) / (qmax − qmin)`, `zero_point = round(qmin − lo /
//! scale)` clamped to the integer range.

use serde::{Deserialize, Serialize};

/// An integer format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IntFormat {
    /// Bits: 8 or 4 (7 for the reduced weight range that u8·s8 kernels without VNNI need).
    pub bits: u32,
    /// Signed (`qmin < 0`) or unsigned.
    pub signed: bool,
}

impl IntFormat {
    /// Signed 8-bit: [-128, 127].
    pub const INT8: Self = Self {
        bits: 8,
        signed: true,
    };
    /// Unsigned 8-bit: [0, 255].
    pub const UINT8: Self = Self {
        bits: 8,
        signed: false,
    };
    /// Signed 4-bit: [-8, 7].
    pub const INT4: Self = Self {
        bits: 4,
        signed: true,
    };

    /// `(qmin, qmax)`. Signed formats are symmetric around 0 minus one (`[-128, 127]`); the
    /// reduced ranges of 7 bits live inside an 8-bit type (`[-64, 63]`).
    pub fn range(self) -> (i32, i32) {
        let n = 1i32 << self.bits;
        if self.signed {
            (-n / 2, n / 2 - 1)
        } else {
            (0, n - 1)
        }
    }

    /// Bits of the storage type (what ONNX holds it in: 8 for 4-to-8-bit formats).
    pub fn storage_bits(self) -> u32 {
        if self.bits <= 4 {
            4
        } else {
            8
        }
    }
}

/// Per tensor, or per channel along an axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Granularity {
    /// One scale and zero point for the whole tensor.
    PerTensor,
    /// One scale per index of this axis (Burn's `Linear.weight` is `[d_in, d_out]`: output
    /// channels are axis 1).
    PerChannel(usize),
}

/// How one quantizer quantizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuantScheme {
    /// The integer format.
    pub format: IntFormat,
    /// Symmetric (zero point 0) or asymmetric.
    pub symmetric: bool,
    /// Per tensor or per channel.
    pub granularity: Granularity,
}

/// Scales and zero points (one each, or one per channel).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QParams {
    /// Scales, one per channel (one per tensor).
    pub scale: Vec<f32>,
    /// Zero points, likewise.
    pub zero_point: Vec<i32>,
}

/// The smallest scale used (a constant tensor would otherwise divide by zero).
pub const MIN_SCALE: f32 = 1e-8;

impl QuantScheme {
    /// Parameters for the range `[lo, hi]` (one per channel: equal lengths).
    pub fn qparams(&self, lo: &[f32], hi: &[f32]) -> QParams {
        let (qmin, qmax) = self.format.range();
        let (mut scale, mut zero_point) = (Vec::new(), Vec::new());
        for (&l, &h) in lo.iter().zip(hi) {
            let (l, h) = (l.min(0.0), h.max(0.0));
            if self.symmetric {
                let s = (l.abs().max(h) / ((qmax - qmin) as f32 / 2.0)).max(MIN_SCALE);
                scale.push(s);
                zero_point.push(if self.format.signed {
                    0
                } else {
                    (qmin + qmax + 1) / 2
                });
            } else {
                let s = ((h - l) / (qmax - qmin) as f32).max(MIN_SCALE);
                let z = (qmin as f32 - l / s).round_ties_even() as i32;
                scale.push(s);
                zero_point.push(z.clamp(qmin, qmax));
            }
        }
        QParams { scale, zero_point }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_and_parameters() {
        assert_eq!(IntFormat::INT8.range(), (-128, 127));
        assert_eq!(IntFormat::UINT8.range(), (0, 255));
        assert_eq!(IntFormat::INT4.range(), (-8, 7));
        let seven = IntFormat {
            bits: 7,
            signed: true,
        };
        assert_eq!(seven.range(), (-64, 63));
        let sym = QuantScheme {
            format: IntFormat::INT8,
            symmetric: true,
            granularity: Granularity::PerTensor,
        };
        // max |x| = 2.55 over 127.5 steps.
        let p = sym.qparams(&[-1.0], &[2.55]);
        assert!((p.scale[0] - 0.02).abs() < 1e-7 && p.zero_point[0] == 0);
        let asym = QuantScheme {
            format: IntFormat::UINT8,
            symmetric: false,
            ..sym
        };
        // [-1, 2.55] over 255 steps: scale 3.55/255, zero point round(1/scale) = round(71.83) = 72.
        let p = asym.qparams(&[-1.0], &[2.55]);
        assert!((p.scale[0] - 3.55 / 255.0).abs() < 1e-7);
        assert_eq!(p.zero_point[0], 72);
        // A positive-only range still contains 0 (zero point at qmin).
        let p = asym.qparams(&[0.5], &[2.0]);
        assert_eq!(p.zero_point[0], 0);
        // A constant zero tensor gets the minimum scale, not a division by zero.
        assert_eq!(sym.qparams(&[0.0], &[0.0]).scale[0], MIN_SCALE);
    }
}
