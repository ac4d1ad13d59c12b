//! BatchNorm as mopt's models run it: the fused training kernel with Burn's running-statistics
//! update, Burn's inference path otherwise; and the pruning members a convolution with BatchNorm
//! contributes to a channel.

use burn::nn::BatchNorm;
use burn::prelude::*;
use mopt_core::prune::Member;

/// The pruning members of output channels `index` of the convolution with BatchNorm at `path`
/// (`{path}.conv`, `{path}.bn`): the weight rows, BatchNorm's scale (what `bn-scale` reads) and
/// shift, its running statistics carried.
pub fn conv_bn_members(path: &str, index: Vec<usize>) -> Vec<Member> {
    vec![
        Member::new(format!("{path}.conv.weight"), 0, index.clone()),
        Member::scale(format!("{path}.bn.gamma"), 0, index.clone()),
        Member::new(format!("{path}.bn.beta"), 0, index.clone()),
        Member::carried(format!("{path}.bn.running_mean"), 0, index.clone()),
        Member::carried(format!("{path}.bn.running_var"), 0, index),
    ]
}

/// `bn` on `x`: in training (an autodiff device, the layer not frozen) mopt's fused kernel
/// with the batch's statistics, which move the running statistics as Burn's `BatchNorm` does
/// (`running ← (1 − momentum)·running + momentum·batch`, biased variance); in inference
/// mopt's one-pass kernel on the running statistics (Burn's path for a frozen layer under
/// autodiff).
pub fn batch_norm(bn: &BatchNorm, x: Tensor<4>) -> Tensor<4> {
    batch_norm_act(bn, x, None, false)
}

/// [`batch_norm`] then `+ residual` (when given) and ReLU (when `relu`): one fused kernel in
/// training, forward and backward.
pub fn batch_norm_act(
    bn: &BatchNorm,
    x: Tensor<4>,
    residual: Option<Tensor<4>>,
    relu: bool,
) -> Tensor<4> {
    if !x.device().is_autodiff() {
        let params = eval_params(bn, &x.device());
        return mopt_kernels::batch_norm_eval_act(x, params, bn.epsilon, residual, relu);
    }
    if !bn.training.is_enabled() {
        let mut y = bn.forward(x);
        if let Some(r) = residual {
            y = y + r;
        }
        return if relu {
            burn::tensor::activation::relu(y)
        } else {
            y
        };
    }
    let (y, mean, var) = mopt_kernels::batch_norm_train_act(
        x,
        (bn.gamma.val(), bn.beta.val()),
        bn.epsilon,
        residual,
        relu,
    );
    let m = bn.momentum;
    let device = mean.device();
    let update = |state: &burn::module::RunningState<Tensor<1>>, batch: Tensor<1>| {
        let old = state.value_sync().to_device(&device);
        state.update(old.mul_scalar(1.0 - m).add(batch.mul_scalar(m)).detach());
    };
    update(&bn.running_mean, mean);
    update(&bn.running_var, var);
    y
}

/// `relu(bn(conv(x, w)) + residual)` (the residual and ReLU each when asked), a bias-free
/// convolution of `stride` and `pad` on mopt's kernel: in inference (no autodiff device) the
/// convolution applies the BatchNorm (running statistics), the residual and the ReLU as it
/// writes its output, the values of the unfused pair bit for bit; in training the convolution,
/// then [`batch_norm_act`].
pub fn conv_batch_norm_act(
    bn: &BatchNorm,
    (x, w): (Tensor<4>, Tensor<4>),
    (stride, pad): (usize, usize),
    residual: Option<Tensor<4>>,
    relu: bool,
) -> Tensor<4> {
    if !x.device().is_autodiff() {
        let params = eval_params(bn, &x.device());
        let (conv, eps) = ((stride, pad), bn.epsilon);
        return mopt_kernels::conv2d_bn_eval_act((x, w), conv, params, eps, (residual, relu));
    }
    let y = mopt_kernels::conv2d(x, w, stride, pad);
    batch_norm_act(bn, y, residual, relu)
}

/// `[gamma, beta, running mean, running variance]` of `bn` on `device`: an inference
/// BatchNorm's parameters as mopt's kernels take them.
fn eval_params(bn: &BatchNorm, device: &Device) -> [Tensor<1>; 4] {
    let stats = [bn.running_mean.value(), bn.running_var.value()];
    let [mean, var] = stats.map(|t| t.to_device(device));
    [bn.gamma.val(), bn.beta.val(), mean, var]
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::nn::BatchNormConfig;

    fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data().convert::<f32>().try_to_vec().unwrap()
    }

    /// The fused training BatchNorm gives Burn's output and moves the running statistics as
    /// Burn's does, over two training steps.
    #[test]
    fn fused_batch_norm_trains_like_burns() {
        let ad = Device::flex().autodiff();
        let x = Tensor::<4>::random(
            [4, 3, 5, 5],
            burn::tensor::Distribution::Normal(1.0, 2.0),
            &ad,
        );
        let (fused, burns) = (
            BatchNormConfig::new(3).init(&ad),
            BatchNormConfig::new(3).init(&ad),
        );
        for _ in 0..2 {
            let (a, b) = (
                values(batch_norm(&fused, x.clone()).inner()),
                values(burns.forward(x.clone()).inner()),
            );
            let err = a
                .iter()
                .zip(&b)
                .map(|(p, q)| (p - q).abs())
                .fold(0.0, f32::max);
            assert!(err < 1e-5, "output {err}");
        }
        for (f, b) in [
            (&fused.running_mean, &burns.running_mean),
            (&fused.running_var, &burns.running_var),
        ] {
            let (f, b) = (values(f.value_sync()), values(b.value_sync()));
            assert!(
                f.iter().zip(&b).all(|(p, q)| (p - q).abs() < 1e-5),
                "{f:?} vs {b:?}"
            );
            assert!(
                f.iter()
                    .any(|v| (v - 0.0).abs() > 0.05 && (v - 1.0).abs() > 0.05),
                "moved: {f:?}"
            );
        }
    }

    /// `relu(bn(x) + r)` and `relu(bn(x))` fused give Burn's composition's output and
    /// gradients (x, the residual, γ, β) through autodiff (the second masks by the input's
    /// recomputed pre-activation, the first by the output).
    #[test]
    fn fused_relu_with_and_without_residual_has_burns_gradients() {
        let ad = Device::flex().autodiff();
        let normal = burn::tensor::Distribution::Normal(0.5, 1.5);
        let x0 = Tensor::<4>::random([3, 4, 5, 6], normal, &ad);
        let r0 = Tensor::<4>::random([3, 4, 5, 6], normal, &ad);
        let w = Tensor::<4>::random([3, 4, 5, 6], normal, &ad);
        let bn = BatchNormConfig::new(4).init(&ad);
        for with_residual in [true, false] {
            let run = |fused: bool| {
                let (x, r) = (x0.clone().require_grad(), r0.clone().require_grad());
                let res = with_residual.then(|| r.clone());
                let y = match (fused, res) {
                    (true, res) => batch_norm_act(&bn, x.clone(), res, true),
                    (false, Some(r)) => burn::tensor::activation::relu(bn.forward(x.clone()) + r),
                    (false, None) => burn::tensor::activation::relu(bn.forward(x.clone())),
                };
                let grads = (y.clone() * w.clone()).sum().backward();
                let g = |t: &Tensor<4>| values(t.grad(&grads).expect("grad"));
                let p = |t: &Tensor<1>| values(t.grad(&grads).expect("grad"));
                let mut out = vec![g(&x), p(&bn.gamma.val()), p(&bn.beta.val())];
                if with_residual {
                    out.push(g(&r));
                }
                (values(y.inner()), out)
            };
            let ((y1, g1), (y2, g2)) = (run(true), run(false));
            let max = |a: &[f32], b: &[f32]| {
                a.iter()
                    .zip(b)
                    .map(|(p, q)| (p - q).abs())
                    .fold(0.0, f32::max)
            };
            assert!(max(&y1, &y2) < 1e-5, "output (residual {with_residual})");
            assert!(
                y1.iter().filter(|&&v| v == 0.0).count() > 10,
                "ReLU clips some"
            );
            for (i, (a, b)) in g1.iter().zip(&g2).enumerate() {
                let err = max(a, b);
                assert!(err < 1e-4, "gradient {i} (residual {with_residual}): {err}");
            }
        }
    }

    /// In inference the one-pass kernel gives Burn's `relu(bn(x) + r)` on the running
    /// statistics (moved away from 0 and 1 by a training step first).
    #[test]
    fn inference_kernel_matches_burns_composition() {
        let ad = Device::flex().autodiff();
        let normal = burn::tensor::Distribution::Normal(0.5, 1.5);
        let bn = BatchNormConfig::new(4).init(&ad);
        let _ = batch_norm(&bn, Tensor::<4>::random([3, 4, 5, 6], normal, &ad));
        let bn = bn.valid();
        let device = Device::flex();
        let x = Tensor::<4>::random([2, 4, 5, 6], normal, &device);
        let r = Tensor::<4>::random([2, 4, 5, 6], normal, &device);
        let fused = values(batch_norm_act(&bn, x.clone(), Some(r.clone()), true));
        let burns = values(burn::tensor::activation::relu(bn.forward(x) + r));
        let err = fused
            .iter()
            .zip(&burns)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(err < 1e-5, "{err}");
        assert!(fused.contains(&0.0) && fused.iter().any(|&v| v > 0.0));
    }
}
