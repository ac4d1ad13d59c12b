//! The fused kernels against Burn's plain ops: values and gradients, on the plain and the
//! autodiff Flex device.

use burn::prelude::*;
use burn::tensor::{Distribution, TensorData};
use mopt_kernels::reference;

fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec().unwrap()
}

/// Largest |a − b| / max(1, |b|).
fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / y.abs().max(1.0))
        .fold(0.0, f32::max)
}

fn assert_close(what: &str, a: Vec<f32>, b: Vec<f32>, tol: f32) {
    let e = max_rel(&a, &b);
    assert!(e <= tol, "{what}: max relative difference {e} > {tol}");
    // The comparison is not vacuous: the values are not all zero.
    assert!(
        b.iter().any(|v| v.abs() > 1e-3),
        "{what}: reference is all zeros"
    );
}

fn ad() -> Device {
    Device::flex().autodiff()
}

/// `L = Σ w ⊙ f(x)` with a fixed random `w`, so every output element gets its own upstream
/// gradient; returns (f(x), dL/dx).
fn value_and_grad<const D: usize>(
    x: &Tensor<D>,
    w: &Tensor<D>,
    f: impl Fn(Tensor<D>) -> Tensor<D>,
) -> (Vec<f32>, Vec<f32>) {
    let x = Tensor::<D>::from_data(x.to_data(), &ad()).require_grad();
    assert!(
        mopt_kernels::is_fused(&x),
        "the autodiff Flex path is fused"
    );
    let w = Tensor::<D>::from_data(w.to_data(), &ad());
    let y = f(x.clone());
    let g = (y.clone() * w).sum().backward();
    (values(y.inner()), values(x.grad(&g).expect("grad")))
}

fn random<const D: usize>(shape: [usize; D], std: f64) -> Tensor<D> {
    Tensor::random(shape, Distribution::Normal(0.0, std), &Device::flex())
}

#[test]
fn gelu_matches_burn_values_and_gradients() {
    let x = random([4, 7, 37], 3.0);
    let w = random([4, 7, 37], 1.0);
    let (y1, g1) = value_and_grad(&x, &w, mopt_kernels::gelu);
    let (y2, g2) = value_and_grad(&x, &w, reference::gelu);
    assert_close("gelu", y1, y2, 1e-5);
    assert_close("gelu grad", g1, g2, 1e-5);
    // Plain device too.
    assert!(mopt_kernels::is_fused(&x));
    assert_close(
        "gelu (plain device)",
        values(mopt_kernels::gelu(x.clone())),
        values(reference::gelu(x)),
        1e-5,
    );
}

#[test]
fn tanh_gelu_matches_burn_values_and_gradients() {
    use mopt_kernels::GeluKind;
    let x = random([4, 7, 37], 3.0);
    let w = random([4, 7, 37], 1.0);
    let (y1, g1) = value_and_grad(&x, &w, |x| mopt_kernels::gelu_as(GeluKind::Tanh, x));
    let (y2, g2) = value_and_grad(&x, &w, reference::gelu_tanh);
    assert_close("gelu tanh", y1.clone(), y2, 1e-5);
    assert_close("gelu tanh grad", g1, g2, 1e-5);
    // It is the approximation, not the exact GELU again: the two differ by up to ~5e-4.
    let (exact, _) = value_and_grad(&x, &w, mopt_kernels::gelu);
    let gap = y1
        .iter()
        .zip(&exact)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(gap > 1e-4 && gap < 1e-3, "tanh vs erf GELU gap {gap}");
    assert_close(
        "gelu tanh (plain device)",
        values(mopt_kernels::gelu_as(GeluKind::Tanh, x.clone())),
        values(reference::gelu_tanh(x)),
        1e-5,
    );
}

#[test]
fn softmax_matches_burn_with_padding_bias() {
    // Rows of 13 (not a multiple of the 8 lanes) and a -10000 bias on some keys, as attention.
    let mut x = random([3, 2, 5, 13], 2.0);
    let bias: Vec<f32> = (0..13)
        .map(|j| if j > 9 { -10000.0 } else { 0.0 })
        .collect();
    x = x + Tensor::<1>::from_floats(bias.as_slice(), &Device::flex()).reshape([1, 1, 1, 13]);
    let w = random([3, 2, 5, 13], 1.0);
    let (y1, g1) = value_and_grad(&x, &w, |t| mopt_kernels::softmax(t, 3));
    let (y2, g2) = value_and_grad(&x, &w, |t| reference::softmax(t, 3));
    assert_close("softmax", y1.clone(), y2, 1e-5);
    assert_close("softmax grad", g1, g2, 1e-5);
    assert!(y1.iter().all(|&p| (0.0..=1.0).contains(&p)));
}

#[test]
fn layer_norm_matches_burn_for_input_gamma_and_beta() {
    let n = 45;
    let x = random([6, 11, n], 2.0).add_scalar(3.0);
    let w = random([6, 11, n], 1.0);
    let gamma = random([n], 1.0).add_scalar(1.0);
    let beta = random([n], 1.0);
    let run = |fused: bool| {
        let d = ad();
        let xa = Tensor::<3>::from_data(x.to_data(), &d).require_grad();
        let ga = Tensor::<1>::from_data(gamma.to_data(), &d).require_grad();
        let ba = Tensor::<1>::from_data(beta.to_data(), &d).require_grad();
        let wa = Tensor::<3>::from_data(w.to_data(), &d);
        let y = if fused {
            mopt_kernels::layer_norm(xa.clone(), ga.clone(), ba.clone(), 1e-12)
        } else {
            reference::layer_norm(xa.clone(), ga.clone(), ba.clone(), 1e-12)
        };
        let g = (y.clone() * wa).sum().backward();
        (
            values(y.inner()),
            values(xa.grad(&g).unwrap()),
            values(ga.grad(&g).unwrap()),
            values(ba.grad(&g).unwrap()),
        )
    };
    let (a, b) = (run(true), run(false));
    assert_close("layer_norm", a.0, b.0, 1e-5);
    assert_close("layer_norm dx", a.1, b.1, 2e-5);
    assert_close("layer_norm dgamma", a.2, b.2, 2e-5);
    assert_close("layer_norm dbeta", a.3, b.3, 1e-5);
}

#[test]
fn embedding_gradient_is_a_scatter_add_of_repeated_ids() {
    let d = ad();
    let table = random([50, 9], 1.0);
    // Id 3 appears three times: its gradient row is the sum of three output rows.
    let ids = Tensor::<2, Int>::from_data([[3, 7, 3], [0, 3, 49]], &Device::flex());
    let w = random([2, 3, 9], 1.0);
    let run = |fused: bool| {
        let t = Tensor::<2>::from_data(table.to_data(), &d).require_grad();
        let i = Tensor::<2, Int>::from_data(ids.to_data(), &d);
        let y = if fused {
            mopt_kernels::embedding(t.clone(), i)
        } else {
            reference::embedding(t.clone(), i)
        };
        let g = (y.clone() * Tensor::from_data(w.to_data(), &d))
            .sum()
            .backward();
        (values(y.inner()), values(t.grad(&g).unwrap()))
    };
    let (a, b) = (run(true), run(false));
    assert_close("embedding", a.0, b.0, 0.0);
    assert_close("embedding grad", a.1.clone(), b.1, 1e-6);
    let wv = values(w);
    for c in 0..9 {
        let want = wv[c] + wv[2 * 9 + c] + wv[4 * 9 + c];
        assert!((a.1[3 * 9 + c] - want).abs() < 1e-6);
        assert_eq!(a.1[10 * 9 + c], 0.0, "untouched rows get zero gradient");
    }
}

#[test]
fn fused_ops_compose_under_gradient_checkpointing() {
    let d = Device::flex().autodiff().gradient_checkpointing();
    let x = random([4, 8, 16], 1.0);
    let gamma = Tensor::<1>::ones([16], &d).require_grad();
    let beta = Tensor::<1>::zeros([16], &d).require_grad();
    let run = |fused: bool| {
        let xa = Tensor::<3>::from_data(x.to_data(), &d).require_grad();
        assert!(
            mopt_kernels::is_fused(&xa),
            "checkpointed autodiff tensors are fused too"
        );
        let y = if fused {
            let h = mopt_kernels::layer_norm(xa.clone(), gamma.clone(), beta.clone(), 1e-12);
            mopt_kernels::softmax(mopt_kernels::gelu(h), 2)
        } else {
            let h = reference::layer_norm(xa.clone(), gamma.clone(), beta.clone(), 1e-12);
            reference::softmax(reference::gelu(h), 2)
        };
        let g = (y.clone() * y).sum().backward();
        values(xa.grad(&g).unwrap())
    };
    assert_close("checkpointed chain grad", run(true), run(false), 2e-5);
}

#[test]
fn fused_adamw_follows_burns_adamw_step_for_step() {
    use burn::nn::{Linear, LinearConfig};
    use burn::optim::{AdamWConfig, GradientsParams};
    let d = ad();
    let start: Linear = LinearConfig::new(37, 19).init(&d);
    let run = |fused: bool| {
        let mut optim = if fused {
            mopt_kernels::FusedAdamW::new(0.9, 0.98, 1e-6, 0.05).init()
        } else {
            AdamWConfig::new()
                .with_beta_1(0.9)
                .with_beta_2(0.98)
                .with_epsilon(1e-6)
                .with_weight_decay(0.05)
                .init()
        };
        let mut m = start.clone();
        for step in 0..6 {
            // Deterministic inputs (the device RNG is shared with tests running in parallel).
            let v: Vec<f32> = (0..8 * 37)
                .map(|i| ((i * 31 + step * 7) % 17) as f32 / 8.0 - 1.0)
                .collect();
            let x = Tensor::<2>::from_data(TensorData::new(v, [8, 37]), &d);
            let loss = m.forward(x).square().mean();
            let grads = GradientsParams::from_grads(loss.backward(), &m);
            m = optim.step(1e-2, m, grads);
        }
        (
            values(m.weight.val().inner()),
            values(m.bias.unwrap().val().inner()),
        )
    };
    let before = mopt_kernels::adamw::fused_steps();
    let a = run(true);
    // 6 steps × (weight, bias), at least (other tests may run fused steps concurrently).
    assert!(mopt_kernels::adamw::fused_steps() - before >= 12);
    let b = run(false);
    assert_close("adamw weight", a.0.clone(), b.0, 1e-6);
    assert_close("adamw bias", a.1, b.1, 1e-6);
    let moved = max_rel(&a.0, &values(start.weight.val().inner()));
    assert!(moved > 1e-3, "the steps changed the weights ({moved})");
}

#[test]
fn conv2d_matches_burn_for_input_and_weight() {
    // A 3×3 "same" convolution, a strided one and a strided 1×1 projection (a ResNet's three);
    // two "same" ones whose channels fill whole vectors (Winograd F(2×2, 3×3) on AVX2 and
    // AVX-512, forward, input and weight gradients).
    for (c, o, k, stride, pad) in [
        (5, 7, 3, 1, 1),
        (4, 6, 3, 2, 1),
        (6, 8, 1, 2, 0),
        (32, 16, 3, 1, 1),
        (16, 32, 3, 1, 1),
    ] {
        let x = random([3, c, 9, 10], 1.0);
        let w = random([o, c, k, k], 0.3);
        let run = |fused: bool| {
            let d = ad();
            let xa = Tensor::<4>::from_data(x.to_data(), &d).require_grad();
            let wa = Tensor::<4>::from_data(w.to_data(), &d).require_grad();
            let y = if fused {
                mopt_kernels::conv2d(xa.clone(), wa.clone(), stride, pad)
            } else {
                reference::conv2d(xa.clone(), wa.clone(), stride, pad)
            };
            let up = random::<4>(y.dims(), 1.0);
            let g = (y.clone() * Tensor::from_data(up.to_data(), &d))
                .sum()
                .backward();
            (
                values(y.inner()),
                values(xa.grad(&g).unwrap()),
                values(wa.grad(&g).unwrap()),
                up,
            )
        };
        let a = run(true);
        // The same upstream gradient for the reference.
        let d = ad();
        let xa = Tensor::<4>::from_data(x.to_data(), &d).require_grad();
        let wa = Tensor::<4>::from_data(w.to_data(), &d).require_grad();
        let y = reference::conv2d(xa.clone(), wa.clone(), stride, pad);
        let g = (y.clone() * Tensor::from_data(a.3.to_data(), &d))
            .sum()
            .backward();
        let what = format!("conv {c}->{o} k{k} s{stride}");
        assert_close(&what, a.0, values(y.inner()), 1e-5);
        // The gradients sum batch × pixels (270) products, in another order than Burn's.
        assert_close(
            &format!("{what} dx"),
            a.1,
            values(xa.grad(&g).unwrap()),
            1e-4,
        );
        assert_close(
            &format!("{what} dw"),
            a.2,
            values(wa.grad(&g).unwrap()),
            1e-4,
        );
        // Plain device.
        assert_close(
            &format!("{what} (plain)"),
            values(mopt_kernels::conv2d(x.clone(), w.clone(), stride, pad)),
            values(reference::conv2d(x.clone(), w.clone(), stride, pad)),
            1e-5,
        );
    }
}

#[test]
fn linear_matches_burn_for_input_weight_and_bias() {
    let (m, k, n) = (70, 45, 37);
    let x = random([m, k], 1.0);
    let w = random([k, n], 0.3);
    let b = random([n], 1.0);
    let up = random([m, n], 1.0);
    let run = |fused: bool| {
        let d = ad();
        let xa = Tensor::<2>::from_data(x.to_data(), &d).require_grad();
        let wa = Tensor::<2>::from_data(w.to_data(), &d).require_grad();
        let ba = Tensor::<1>::from_data(b.to_data(), &d).require_grad();
        assert!(mopt_kernels::is_fused(&xa));
        let y = if fused {
            mopt_kernels::linear(xa.clone(), wa.clone(), ba.clone())
        } else {
            reference::linear(xa.clone(), wa.clone(), ba.clone())
        };
        let g = (y.clone() * Tensor::from_data(up.to_data(), &d))
            .sum()
            .backward();
        (
            values(y.inner()),
            values(xa.grad(&g).unwrap()),
            values(wa.grad(&g).unwrap()),
            values(ba.grad(&g).unwrap()),
        )
    };
    let (a, r) = (run(true), run(false));
    assert_close("linear", a.0, r.0, 1e-5);
    assert_close("linear dx", a.1, r.1, 1e-5);
    assert_close("linear dw", a.2, r.2, 1e-5);
    assert_close("linear db", a.3, r.3, 1e-5);
    // Plain device.
    let y = mopt_kernels::linear(x.clone(), w.clone(), b.clone());
    assert_close(
        "linear (plain)",
        values(y),
        values(reference::linear(x, w, b)),
        1e-5,
    );
}

#[test]
fn attention_matches_the_composed_core_with_mask_and_dropout() {
    let (b, s, heads, d) = (3, 11, 4, 8);
    let w = heads * d;
    let q = random([b, s, w], 1.0);
    let k = random([b, s, w], 1.0);
    let v = random([b, s, w], 1.0);
    let up = random([b, s, w], 1.0);
    // The last three keys of the second sequence are padding.
    let mut m = vec![0.0f32; b * s];
    for j in s - 3..s {
        m[s + j] = -10000.0;
    }
    let mask = Tensor::<2>::from_data(TensorData::new(m, [b, s]), &Device::flex());
    for seed in [None, Some(99u64)] {
        let run = |fused: bool| {
            let dv = ad();
            let leaf = |t: &Tensor<3>| Tensor::<3>::from_data(t.to_data(), &dv).require_grad();
            let (qa, ka, va) = (leaf(&q), leaf(&k), leaf(&v));
            let ma = Tensor::<2>::from_data(mask.to_data(), &dv);
            let y = if fused {
                mopt_kernels::attention_seeded(
                    qa.clone(),
                    ka.clone(),
                    va.clone(),
                    ma,
                    heads,
                    0.25,
                    seed,
                )
            } else {
                reference::attention(qa.clone(), ka.clone(), va.clone(), ma, heads, 0.25, seed)
            };
            let g = (y.clone() * Tensor::from_data(up.to_data(), &dv))
                .sum()
                .backward();
            (
                values(y.inner()),
                values(qa.grad(&g).unwrap()),
                values(ka.grad(&g).unwrap()),
                values(va.grad(&g).unwrap()),
            )
        };
        let before = mopt_kernels::fused_attention_calls();
        let (a, r) = (run(true), run(false));
        assert!(
            mopt_kernels::fused_attention_calls() > before,
            "the fused kernel ran"
        );
        let tag = if seed.is_some() { " (dropout)" } else { "" };
        assert_close(&format!("attention{tag}"), a.0, r.0, 1e-5);
        assert_close(&format!("attention dq{tag}"), a.1, r.1, 1e-5);
        assert_close(&format!("attention dk{tag}"), a.2, r.2, 1e-5);
        assert_close(&format!("attention dv{tag}"), a.3, r.3, 1e-5);
    }
    // Plain device (inference, no dropout).
    let y = mopt_kernels::attention(q.clone(), k.clone(), v.clone(), mask.clone(), heads, 0.1);
    let r = reference::attention(q, k, v, mask, heads, 0.0, None);
    assert_close("attention (plain)", values(y), values(r), 1e-5);
}

#[test]
fn batch_norm_train_matches_burn_for_input_gamma_and_beta_and_statistics() {
    let x = random([5, 6, 7, 9], 2.0).add_scalar(1.5);
    let w = random([5, 6, 7, 9], 1.0);
    let gamma = random([6], 1.0).add_scalar(1.0);
    let beta = random([6], 1.0);
    let run = |fused: bool| {
        let d = ad();
        let xa = Tensor::<4>::from_data(x.to_data(), &d).require_grad();
        let ga = Tensor::<1>::from_data(gamma.to_data(), &d).require_grad();
        let ba = Tensor::<1>::from_data(beta.to_data(), &d).require_grad();
        let wa = Tensor::<4>::from_data(w.to_data(), &d);
        let (y, mean, var) = if fused {
            mopt_kernels::batch_norm_train(xa.clone(), ga.clone(), ba.clone(), 1e-5)
        } else {
            let r =
                burn::tensor::module::batch_norm_train(xa.clone(), ga.clone(), ba.clone(), 1e-5);
            (r.output, r.mean, r.variance)
        };
        let g = (y.clone() * wa).sum().backward();
        (
            values(y.inner()),
            values(xa.grad(&g).unwrap()),
            values(ga.grad(&g).unwrap()),
            values(ba.grad(&g).unwrap()),
            values(mean.inner()),
            values(var.inner()),
        )
    };
    let (a, b) = (run(true), run(false));
    assert_close("batch_norm", a.0, b.0.clone(), 1e-5);
    assert_close("batch_norm dx", a.1, b.1, 5e-5);
    assert_close("batch_norm dgamma", a.2, b.2, 5e-5);
    assert_close("batch_norm dbeta", a.3, b.3, 1e-5);
    assert_close("batch_norm mean", a.4, b.4, 1e-5);
    assert_close("batch_norm variance", a.5, b.5, 1e-5);
    // On the plain device too (no autodiff).
    let (y, _, _) = mopt_kernels::batch_norm_train(x.clone(), gamma.clone(), beta.clone(), 1e-5);
    assert_close("batch_norm (plain)", values(y), b.0, 1e-5);
}

#[test]
fn rounding_to_bf16_and_f16_is_a_cast_there_and_back_in_values_and_gradients() {
    use burn::tensor::DType;
    let dev = ad();
    dev.seed(21);
    // Spread wide enough for f16's overflow and subnormals.
    let x = Tensor::<2>::random([64, 97], Distribution::Normal(0.0, 3.0), &dev)
        * Tensor::<2>::random([64, 97], Distribution::Uniform(-12.0, 12.0), &dev).exp();
    let w = Tensor::<2>::random([64, 97], Distribution::Normal(0.0, 1.0), &dev);
    for low in [DType::BF16, DType::F16] {
        let (y, g) = value_and_grad(&x, &w, |t| mopt_kernels::round_half(t, low));
        let (y_ref, g_ref) = value_and_grad(&x, &w, |t| t.cast(low).cast(DType::F32));
        // Bit for bit: the same rounding, forward and backward (NaN-free inputs).
        assert_eq!(y, y_ref, "{low:?}");
        assert_eq!(g, g_ref, "{low:?}");
        assert_ne!(y, values(x.clone()), "{low:?}: values were rounded");
        // On the plain device too.
        let p = Tensor::<2>::from_data(x.to_data(), &Device::flex());
        assert_eq!(values(mopt_kernels::round_half(p, low)), y_ref);
    }
    assert!(
        values(x.clone()).iter().any(|v| v.abs() > 65520.0),
        "overflow covered"
    );
}

/// A unary op on 3-D tensors.
type Op<'a> = dyn Fn(Tensor<3>) -> Tensor<3> + 'a;

/// On the plain device an input that nothing else holds (an inference pass's intermediate) is
/// overwritten in place; one still held elsewhere goes to a new buffer and stays as it was.
/// Both give the same values, and the reference composition's.
#[test]
fn unshared_inputs_are_mapped_in_place_to_the_same_values() {
    let x = random([3, 5, 40], 2.0);
    let (gamma, beta) = (random([40], 1.0), random([40], 1.0));
    let before = values(x.clone());
    let unshared = || Tensor::<3>::from_data(x.to_data(), &Device::flex());
    let ops: [(&str, &Op, &Op); 3] = [
        ("gelu", &mopt_kernels::gelu, &reference::gelu),
        ("softmax", &|t| mopt_kernels::softmax(t, 2), &|t| {
            reference::softmax(t, 2)
        }),
        (
            "layer norm",
            &|t| mopt_kernels::layer_norm(t, gamma.clone(), beta.clone(), 1e-12),
            &|t| reference::layer_norm(t, gamma.clone(), beta.clone(), 1e-12),
        ),
    ];
    for (what, fused, reference) in ops {
        let shared = values(fused(x.clone()));
        assert_eq!(
            values(x.clone()),
            before,
            "{what}: a shared input is left alone"
        );
        assert_eq!(
            values(fused(unshared())),
            shared,
            "{what}: in place, same bits"
        );
        assert_close(what, shared, values(reference(x.clone())), 1e-5);
    }
}

/// `softmax(scale·x + mask)` in one pass against Burn's composition: values and gradients on
/// the autodiff device (padding masked by -10000 in some rows of the batch), values on the
/// plain one, in place or not.
#[test]
fn softmax_biased_matches_the_scaled_masked_composition() {
    let (b, h, r, n) = (3, 4, 5, 9);
    let x = random([b, h, r, n], 3.0);
    let w = random([b, h, r, n], 1.0);
    // Sequence i has its last i positions padded.
    let mask: Vec<f32> = (0..b)
        .flat_map(|i| (0..n).map(move |j| if j + i >= n { -10000.0 } else { 0.0 }))
        .collect();
    let bias =
        |device: &Device| Tensor::<1>::from_floats(mask.as_slice(), device).reshape([b, 1, 1, n]);
    let scale = 1.0 / 8f32.sqrt();
    let fused = |t: Tensor<4>| {
        let d = t.device();
        mopt_kernels::softmax_biased(t, bias(&d), scale)
    };
    let composed = |t: Tensor<4>| {
        let d = t.device();
        reference::softmax_biased(t, bias(&d), scale)
    };
    let (y1, g1) = value_and_grad(&x, &w, fused);
    let (y2, g2) = value_and_grad(&x, &w, composed);
    assert_close("softmax_biased", y1.clone(), y2, 1e-5);
    assert_close("softmax_biased grad", g1, g2, 1e-5);
    // Masked positions get nothing.
    assert_eq!(y1[(2 * h * r + 1) * n + n - 1], 0.0);
    let shared = values(fused(x.clone()));
    assert_eq!(
        values(fused(Tensor::from_data(x.to_data(), &Device::flex()))),
        shared
    );
    assert_close("softmax_biased (plain)", shared, values(composed(x)), 1e-5);
}

/// `layer_norm(x + r)` in one pass on the plain device (in place or not) against the
/// composition; under autodiff it is the composition itself (values and gradients).
#[test]
fn add_layer_norm_matches_the_sum_then_the_norm() {
    let (x, r) = (random([3, 5, 40], 2.0), random([3, 5, 40], 1.0));
    let (gamma, beta) = (random([40], 1.0), random([40], 1.0));
    let fused =
        |x: Tensor<3>, r| mopt_kernels::add_layer_norm(x, r, gamma.clone(), beta.clone(), 1e-12);
    let composed = |x: Tensor<3>, r: Tensor<3>| {
        reference::layer_norm(x + r, gamma.clone(), beta.clone(), 1e-12)
    };
    let shared = values(fused(x.clone(), r.clone()));
    let unshared = Tensor::<3>::from_data(x.to_data(), &Device::flex());
    assert_eq!(
        values(fused(unshared, r.clone())),
        shared,
        "in place, same bits"
    );
    assert_close(
        "add_layer_norm",
        shared,
        values(composed(x.clone(), r.clone())),
        1e-5,
    );
    let w = random([3, 5, 40], 1.0);
    let rd = Tensor::<3>::from_data(r.to_data(), &ad());
    let (y1, g1) = value_and_grad(&x, &w, |t| {
        let (g, b) = (gamma.clone(), beta.clone());
        let (g, b) = (
            Tensor::from_data(g.to_data(), &ad()),
            Tensor::from_data(b.to_data(), &ad()),
        );
        mopt_kernels::add_layer_norm(t, rd.clone(), g, b, 1e-12)
    });
    let (y2, g2) = value_and_grad(&x, &w, |t| {
        let (g, b) = (gamma.clone(), beta.clone());
        let (g, b) = (
            Tensor::from_data(g.to_data(), &ad()),
            Tensor::from_data(b.to_data(), &ad()),
        );
        reference::layer_norm(t + rd.clone(), g, b, 1e-12)
    });
    assert_close("add_layer_norm (autodiff)", y1, y2, 1e-5);
    assert_close("add_layer_norm grad", g1, g2, 1e-5);
}
