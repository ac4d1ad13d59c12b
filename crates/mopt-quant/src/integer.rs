//! [`IntegerLinear`]: a quantized linear layer run in integers, as a deployment runs it.
//!
//! The fake-quantized layer computes `fq(x) · fq(W)` in f32, with the quantized weight
//! rebuilt (quantize → dequantize) at every call. Its integer form quantizes the input once,
//! multiplies `u8 · s8` into exact i32 sums over a weight packed once
//! ([`mopt_kernels::int8`]), and scales the sums back:
//!
//! `y[j] = s_x · s_w[j] · (Σ_i u[i]·W_q[i, j] + (qmin − z) · Σ_i W_q[i, j])`, where
//! `u = x_q − qmin ∈ [0, 255]` is the input's integer shifted to unsigned bytes.
//!
//! The same numbers as the fake-quantized layer up to the float product's rounding (the integer
//! sum is exact), read at a byte a weight: the faster model at batch 1, where a product's time
//! is its weight's reading.

use burn::prelude::*;
use mopt_kernels::int8::{matmul_u8s8, PackedS8};

use crate::fake::quantize;
use crate::node::{LinearQuant, Phase};

/// A quantized linear layer's integer form (see the module docs).
#[derive(Debug, Clone)]
pub struct IntegerLinear {
    weight: PackedS8,
    /// `s_x · s_w[j]` for every output column.
    scales: Vec<f32>,
    input_scale: f32,
    input_zero: i32,
    input_range: (i32, i32),
}

impl IntegerLinear {
    /// The integer form of the layer with quantizers `q` and `[d_in, d_out]` weight `w`, or
    /// `None` where the integer kernel cannot run it exactly: a quantizer not frozen
    /// (`Quantize` phase), an input wider than 8 bits, a weight outside int8 or with zero points
    /// (asymmetric), per-channel scales on an axis other than the output's.
    pub fn new(q: &LinearQuant, w: &Tensor<2>) -> Option<Self> {
        let (input, weight) = (&q.input, &q.weight);
        if input.phase() != Phase::Quantize || weight.phase() != Phase::Quantize {
            return None;
        }
        let (ip, wp) = (input.qparams(), weight.qparams());
        let per_tensor_input = ip.scale.len() == 1 && input.axis.is_none();
        let fits = input.qmax - input.qmin <= 255 && weight.qmin >= -128 && weight.qmax <= 127;
        let weight_axis_ok = matches!(weight.axis, None | Some(1));
        if !per_tensor_input || !fits || !weight_axis_ok || wp.zero_point.iter().any(|&z| z != 0) {
            return None;
        }
        let [k, n] = w.dims();
        let values = w
            .clone()
            .into_data()
            .convert::<f32>()
            .try_into_vec::<f32>()
            .ok()?;
        let scale_of = |j: usize| wp.scale[if wp.scale.len() == 1 { 0 } else { j }];
        if wp.scale.len() != 1 && wp.scale.len() != n {
            return None;
        }
        let wq: Vec<i8> = values
            .iter()
            .enumerate()
            .map(|(i, &v)| quantize(v, scale_of(i % n), 0, weight.qmin, weight.qmax) as i8)
            .collect();
        Some(Self {
            weight: PackedS8::pack(&wq, k, n),
            scales: (0..n).map(|j| ip.scale[0] * scale_of(j)).collect(),
            input_scale: ip.scale[0],
            input_zero: ip.zero_point[0],
            input_range: (input.qmin, input.qmax),
        })
    }

    /// `x · W` in integers (the output quantizer, where the layer has one, is the caller's).
    ///
    /// # Shapes
    /// - x: `[rows, d_in]`; output: `[rows, d_out]`
    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        let [rows, k] = x.dims();
        assert_eq!(k, self.weight.k(), "input width");
        let device = x.device();
        let values = x
            .into_data()
            .convert::<f32>()
            .try_into_vec::<f32>()
            .expect("f32 values");
        let (qmin, qmax) = self.input_range;
        let u: Vec<u8> = values
            .iter()
            .map(|&v| (quantize(v, self.input_scale, self.input_zero, qmin, qmax) - qmin) as u8)
            .collect();
        let sums = matmul_u8s8(&u, rows, &self.weight);
        let shift = qmin - self.input_zero;
        let n = self.weight.n();
        let cols = self.weight.col_sums();
        let y: Vec<f32> = sums
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                let j = i % n;
                self.scales[j] * (s as i64 + shift as i64 * cols[j] as i64) as f32
            })
            .collect();
        Tensor::from_data(TensorData::new(y, [rows, n]), &device)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::QuantConfig;

    fn vals(t: Tensor<2>) -> Vec<f32> {
        t.into_data()
            .convert::<f32>()
            .try_into_vec::<f32>()
            .unwrap()
    }

    /// A calibrated layer with `bits`-bit weights: its input observed on `x`, its weight frozen.
    fn calibrated(bits: u32, x: &Tensor<2>, w: &Tensor<2>) -> LinearQuant {
        let c = QuantConfig::int8(bits, vec!["l".into()]);
        let dev = x.device();
        let q = c.linear("l", w.dims()[1], Phase::Observe, &dev).unwrap();
        q.input.forward(x.clone());
        let (input, _) = q.input.freeze(&c.activation);
        let weight = q.weight.calibrate_weight(w, &c.weight);
        LinearQuant {
            input,
            weight,
            output: None,
            integer: None,
        }
    }

    #[test]
    fn integers_give_the_fake_quantized_product() {
        let dev = Device::flex();
        // Inputs with an offset (a nonzero zero point), 7- and 8-bit weights, odd widths.
        for bits in [7, 8] {
            let x =
                Tensor::<2>::random([3, 37], burn::tensor::Distribution::Normal(0.3, 1.0), &dev);
            let w =
                Tensor::<2>::random([37, 21], burn::tensor::Distribution::Normal(0.0, 0.2), &dev);
            let q = calibrated(bits, &x, &w);
            let fake = vals(
                q.input
                    .forward(x.clone())
                    .matmul(q.weight.forward(w.clone())),
            );
            let int = IntegerLinear::new(&q, &w).expect("an int8 scheme");
            let got = vals(int.forward(x.clone()));
            let scale = fake.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (a, b) in got.iter().zip(&fake) {
                assert!((a - b).abs() <= 1e-5 * scale, "{bits} bits: {a} vs {b}");
            }
            // And not the float product: the rounding is there.
            let float = vals(x.matmul(w.clone()));
            assert!(got
                .iter()
                .zip(&float)
                .any(|(a, b)| (a - b).abs() > 1e-4 * scale));
        }
    }

    #[test]
    fn a_quantizer_not_frozen_has_no_integer_form() {
        let dev = Device::flex();
        let c = QuantConfig::int8(8, vec!["l".into()]);
        let q = c.linear("l", 4, Phase::Observe, &dev).unwrap();
        assert!(IntegerLinear::new(&q, &Tensor::<2>::ones([3, 4], &dev)).is_none());
    }
}
