//! Quantize → dequantize, on host values (the reference ONNX defines) and on Burn tensors with
//! a straight-through estimator.
//!
//! The tensor form is `x̂ = (clamp(round_ste(x / s) + z, qmin, qmax) − z) · s`, where
//! `round_ste(v) = v + detach(round(v) − v)` rounds half to even forward and passes the gradient
//! unchanged. Its gradient with respect to `x` is 1 where `x` is representable and 0 where it is
//! clamped (the straight-through estimator); with respect to a learned `s` it is
//! `round(x/s) − x/s` inside the range and `qmin − z` or `qmax − z` outside: exactly LSQ's
//! (Esser et al., 2020), so learned scales need no other code.

use burn::prelude::*;

/// ONNX `QuantizeLinear` of one value: `saturate(round_half_even(x / scale) + zero_point)`.
pub fn quantize(x: f32, scale: f32, zero_point: i32, qmin: i32, qmax: i32) -> i32 {
    ((x / scale).round_ties_even() as i64 + zero_point as i64).clamp(qmin as i64, qmax as i64)
        as i32
}

/// ONNX `DequantizeLinear` of one value: `(q − zero_point) · scale`.
pub fn dequantize(q: i32, scale: f32, zero_point: i32) -> f32 {
    (q - zero_point) as f32 * scale
}

/// Quantize → dequantize of one value.
pub fn fake_quant_value(x: f32, scale: f32, zero_point: i32, qmin: i32, qmax: i32) -> f32 {
    dequantize(
        quantize(x, scale, zero_point, qmin, qmax),
        scale,
        zero_point,
    )
}

/// An embedding table's rows as int8, one symmetric scale per row (`max |row| / 127`, zero
/// point 0; an all-zero row gets scale 1): what a deployment stores and gathers. Returns the
/// int8 values (row-major, like `values`) and the `rows` scales.
///
/// # Shapes
/// - values: `[rows, cols]` row-major; output: `[rows, cols]` int8 and `[rows]` scales
pub fn quantize_rows(values: &[f32], cols: usize) -> (Vec<i8>, Vec<f32>) {
    assert!(
        cols > 0 && values.len().is_multiple_of(cols),
        "rows of {cols} values"
    );
    let mut q = Vec::with_capacity(values.len());
    let mut scales = Vec::with_capacity(values.len() / cols);
    for row in values.chunks(cols) {
        let max = row.iter().fold(0f32, |m, v| m.max(v.abs()));
        let s = if max > 0.0 { max / 127.0 } else { 1.0 };
        q.extend(row.iter().map(|&v| quantize(v, s, 0, -127, 127) as i8));
        scales.push(s);
    }
    (q, scales)
}

/// [`quantize_rows`] then back to float: the values a deployment's int8 table gives.
pub fn fake_quant_rows(values: &[f32], cols: usize) -> Vec<f32> {
    let (q, scales) = quantize_rows(values, cols);
    q.chunks(cols)
        .zip(&scales)
        .flat_map(|(row, &s)| row.iter().map(move |&v| dequantize(v as i32, s, 0)))
        .collect()
}

/// Quantize → dequantize of a tensor with the straight-through estimator (see the module docs).
///
/// # Shapes
/// - x: any `[..]`; scale, zero_point: broadcastable to it (all ones for per-tensor, the
///   channel count on the channel axis for per-channel); output: like x
pub fn fake_quant<const D: usize>(
    x: Tensor<D>,
    scale: Tensor<D>,
    zero_point: Tensor<D>,
    qmin: i32,
    qmax: i32,
) -> Tensor<D> {
    let v = x / scale.clone();
    let r = v.clone() + (v.clone().round() - v).detach();
    let zp = zero_point.detach();
    let q = (r + zp.clone()).clamp(qmin as f32, qmax as f32);
    (q - zp) * scale
}

/// `s` in the forward pass, `g · ∂L/∂s` in the backward: LSQ's gradient scale
/// `g = 1 / √(elements · qmax)` keeps the scale's updates in step with the weights'.
pub fn scale_gradient<const D: usize>(s: Tensor<D>, g: f32) -> Tensor<D> {
    let scaled = s.clone().mul_scalar(g);
    scaled.clone() + (s - scaled).detach()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vals<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
    }

    #[test]
    fn rows_get_their_own_scale_and_round_half_to_even() {
        // Row 0: max 1.27 → scale 0.01; 0.005 / 0.01 = 0.5 rounds to 0, 0.015 to 2. Row 1:
        // all zero → scale 1, zeros. Row 2: max 2.54 → scale 0.02, -2.54 → -127.
        let v = [
            1.27, 0.005, 0.015, -0.5, 0.0, 0.0, 0.0, 0.0, 0.3, -2.54, 0.01, 1.0,
        ];
        let (q, s) = quantize_rows(&v, 4);
        assert_eq!(q, [127, 0, 2, -50, 0, 0, 0, 0, 15, -127, 0, 50]);
        assert_eq!(s.len(), 3);
        assert!((s[0] - 0.01).abs() < 1e-8 && s[1] == 1.0 && (s[2] - 0.02).abs() < 1e-8);
        let back = fake_quant_rows(&v, 4);
        assert!((back[2] - 0.02).abs() < 1e-7 && back[1] == 0.0 && back[4] == 0.0);
        // Snapped values are a fixed point: quantizing them again changes nothing.
        assert_eq!(fake_quant_rows(&back, 4), back);
    }

    #[test]
    fn quantize_matches_the_onnx_formula_on_hand_picked_values() {
        // Ties go to the even integer: 0.5 → 0, 1.5 → 2, 2.5 → 2, -0.5 → 0, -1.5 → -2.
        let q = |x| quantize(x, 1.0, 0, -128, 127);
        assert_eq!([q(0.5), q(1.5), q(2.5), q(-0.5), q(-1.5)], [0, 2, 2, 0, -2]);
        // Scale and zero point: 0.3 / 0.1 = 3 (+ 10) → 13; saturation at both ends.
        assert_eq!(quantize(0.3, 0.1, 10, 0, 255), 13);
        assert_eq!(quantize(1000.0, 0.1, 10, 0, 255), 255);
        assert_eq!(quantize(-1000.0, 0.1, 10, 0, 255), 0);
        assert_eq!(quantize(0.75, 0.5, 0, -8, 7), 2); // 1.5 → 2
        assert_eq!(dequantize(13, 0.1, 10), 0.3);
        assert_eq!(fake_quant_value(0.26, 0.1, 0, -128, 127), 0.3);
    }

    #[test]
    fn the_tensor_form_equals_the_reference_and_its_gradient_is_straight_through() {
        let dev = Device::flex().autodiff();
        let xs = vec![-3.0f32, -1.25, -0.5, 0.25, 0.75, 1.5, 2.0, 9.0];
        let x = Tensor::<1>::from_data(TensorData::new(xs.clone(), [8]), &dev).require_grad();
        let s = Tensor::<1>::from_data(TensorData::new(vec![0.5f32], [1]), &dev).require_grad();
        let z = Tensor::<1>::from_data(TensorData::new(vec![0.0f32], [1]), &dev);
        // INT4: [-8, 7] · 0.5 represents [-4, 3.5].
        let y = fake_quant(x.clone(), s.clone(), z, -8, 7);
        let want: Vec<f32> = xs
            .iter()
            .map(|&v| fake_quant_value(v, 0.5, 0, -8, 7))
            .collect();
        assert_eq!(vals(y.clone().inner()), want);
        assert_eq!(want, vec![-3.0, -1.0, -0.5, 0.0, 1.0, 1.5, 2.0, 3.5]);
        let grads = y.sum().backward();
        // ∂/∂x: 1 inside the range, 0 for 9.0 (clamped).
        assert_eq!(
            vals(x.grad(&grads).unwrap()),
            vec![1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0]
        );
        // ∂/∂s (LSQ): Σ (round(x/s) − x/s) inside + (qmax − z) for the clamped one.
        let inside: f32 = xs[..7]
            .iter()
            .map(|&v| (v / 0.5).round_ties_even() - v / 0.5)
            .sum();
        let gs = vals(s.grad(&grads).unwrap())[0];
        assert!(
            (gs - (inside + 7.0)).abs() < 1e-6,
            "{gs} vs {}",
            inside + 7.0
        );
    }

    #[test]
    fn per_channel_scales_broadcast_along_their_axis() {
        let dev = Device::flex();
        // [d_in = 2, d_out = 3] with one scale per output column (axis 1).
        let w = Tensor::<2>::from_data([[0.3f32, 0.3, 0.3], [-0.7, -0.7, -0.7]], &dev);
        let s = Tensor::<1>::from_data([0.1f32, 0.2, 0.4], &dev).reshape([1, 3]);
        let z = Tensor::<2>::zeros([1, 3], &dev);
        let y = vals(fake_quant(w, s, z, -128, 127));
        let want: Vec<f32> = [0.3f32, -0.7]
            .iter()
            .flat_map(|&v| [0.1f32, 0.2, 0.4].map(|sc| fake_quant_value(v, sc, 0, -128, 127)))
            .collect();
        assert_eq!(y, want);
        // 0.3/0.4 = 0.75 → 1 step of 0.4; -0.7/0.2 = -3.5 → -4 (half to even) steps of 0.2.
        assert_eq!((y[2], y[4]), (0.4, -0.8));
    }
}
