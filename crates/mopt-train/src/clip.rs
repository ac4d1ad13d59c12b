//! Gradient clipping by global norm (Burn's own clipping works per tensor).

use burn::module::{ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::prelude::*;

struct Ids(Vec<(ParamId, usize)>);

impl ModuleVisitor for Ids {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        self.0.push((param.id, D));
    }
}

fn sum_sq<const D: usize>(grads: &GradientsParams, id: ParamId) -> Option<f64> {
    grads.get::<D>(id).map(|g| mopt_kernels::sum_squares(&g))
}

fn scale<const D: usize>(grads: &mut GradientsParams, id: ParamId, factor: f32) {
    if let Some(g) = grads.remove::<D>(id) {
        grads.register(id, mopt_kernels::scale(g, factor));
    }
}

/// Scale all gradients so that their global L2 norm is at most `max_norm`; returns the norm
/// before clipping.
pub fn clip_global_norm<M: Module>(model: &M, grads: &mut GradientsParams, max_norm: f32) -> f32 {
    unscale_and_clip(model, grads, 1.0, Some(max_norm)).unwrap_or(f32::INFINITY)
}

/// Multiply all gradients by `inv_scale` (undoing a loss scale) and clip their global L2 norm
/// to `max_norm`, in one pass over the gradients. Returns the unscaled norm before clipping, or
/// `None` (gradients untouched) when a gradient holds an inf or NaN.
pub fn unscale_and_clip<M: Module>(
    model: &M,
    grads: &mut GradientsParams,
    inv_scale: f32,
    max_norm: Option<f32>,
) -> Option<f32> {
    let mut ids = Ids(Vec::new());
    model.visit(&mut ids);
    let mut total = 0.0f64;
    for &(id, d) in &ids.0 {
        total += match d {
            1 => sum_sq::<1>(grads, id),
            2 => sum_sq::<2>(grads, id),
            3 => sum_sq::<3>(grads, id),
            4 => sum_sq::<4>(grads, id),
            _ => None,
        }
        .unwrap_or(0.0);
    }
    // Σg² in f64 is finite exactly when every gradient is (f32's largest square fits).
    if !total.is_finite() {
        return None;
    }
    let norm = (total.sqrt() * inv_scale as f64) as f32;
    let clip = match max_norm {
        Some(max) if norm > max => max / (norm + 1e-6),
        _ => 1.0,
    };
    let factor = inv_scale * clip;
    if factor != 1.0 {
        for &(id, d) in &ids.0 {
            match d {
                1 => scale::<1>(grads, id, factor),
                2 => scale::<2>(grads, id, factor),
                3 => scale::<3>(grads, id, factor),
                4 => scale::<4>(grads, id, factor),
                _ => {}
            }
        }
    }
    Some(norm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::nn::{Linear, LinearConfig};

    #[test]
    fn clips_to_global_norm_and_keeps_direction() {
        let device = Device::flex().autodiff();
        let model: Linear = LinearConfig::new(3, 2).init(&device);
        let x = Tensor::<2>::from_floats([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], &device);
        let loss = model.forward(x).sum().mul_scalar(10.0);
        let mut grads = GradientsParams::from_grads(loss.backward(), &model);
        let before_w: Vec<f32> = grads
            .get::<2>(model.weight.id)
            .unwrap()
            .into_data()
            .try_to_vec()
            .unwrap();
        let norm = clip_global_norm(&model, &mut grads, 1.0);
        // d/dW = 10 * column sums of x = [50, 70, 90] per output; d/db = 10 * batch = 20 per output.
        let expect = (2.0f32
            * (50.0f32.powi(2) + 70.0f32.powi(2) + 90.0f32.powi(2) + 20.0f32.powi(2)))
        .sqrt();
        assert!((norm - expect).abs() / expect < 1e-5, "{norm} vs {expect}");
        let after_w: Vec<f32> = grads
            .get::<2>(model.weight.id)
            .unwrap()
            .into_data()
            .try_to_vec()
            .unwrap();
        let after_b: Vec<f32> = grads
            .get::<1>(model.bias.as_ref().unwrap().id)
            .unwrap()
            .into_data()
            .try_to_vec()
            .unwrap();
        let new_norm: f32 = after_w
            .iter()
            .chain(&after_b)
            .map(|v| v * v)
            .sum::<f32>()
            .sqrt();
        assert!((new_norm - 1.0).abs() < 1e-4, "clipped norm {new_norm}");
        assert!((after_w[0] / after_w[1] - before_w[0] / before_w[1]).abs() < 1e-5);
    }
}
