//! Autocast: matrix products in a low-precision float type, everything else in f32.
//!
//! The policy is PyTorch's `torch.autocast` for transformers, reduced to what decides accuracy:
//! inside [`scope`], [`crate::linear`] and [`matmul`] round their operands to the compute type
//! (bf16 or f16), multiply with f32 accumulation and round the product to the compute type.
//! Softmax, LayerNorm, GELU, dropout, embeddings, the losses and the distillation terms see f32
//! tensors, and the parameters stay f32 (master weights): the rounding is a cast to the compute
//! type and back, part of the autodiff graph, so a weight's gradient comes back as f32.
//!
//! The product of two bf16 (or f16) values is exact in f32 (8 × 8 or 11 × 11 significant bits
//! fit in 24), so an f32 GEMM on rounded operands computes exactly what a bf16 kernel with f32
//! accumulation (`vdpbf16ps`, AMX, oneDNN) computes, up to the order of the sums. Where the CPU
//! multiplies bf16 natively ([`crate::bf16`]: AMX tiles; AVX512_BF16 on AMD), the linear
//! layers' and [`matmul`]'s (the attention core's) bf16 products run there, the operands
//! rounded while they are packed, and the backward products round their operands too, the
//! output gradient included (PyTorch's autocast backward does the same). Elsewhere, and for
//! f16, the operands are rounded in the graph and multiplied on f32 kernels, at f32 speed.
//! (Burn's bf16 matmul, the first path, was 2-3x slower than f32 on the CPU.)
//!
//! The compute type is per thread (a data-parallel worker enters its own scope) and restored
//! when the scope ends, also on a panic.

use std::cell::Cell;

use burn::prelude::*;
use burn::tensor::DType;

thread_local! {
    static COMPUTE: Cell<Option<DType>> = const { Cell::new(None) };
}

/// Restores the previous compute type when dropped.
struct Restore(Option<DType>);

impl Drop for Restore {
    fn drop(&mut self) {
        COMPUTE.with(|c| c.set(self.0));
    }
}

/// Run `f` with matrix products in `dtype` (`None`, or `Some(F32)`: plain f32).
///
/// # Panics
/// On a `dtype` that is not a float type.
pub fn scope<R>(dtype: Option<DType>, f: impl FnOnce() -> R) -> R {
    let dtype = dtype.filter(|d| *d != DType::F32);
    if let Some(d) = dtype {
        assert!(d.is_float(), "autocast needs a float type, not {d:?}");
    }
    let _restore = Restore(COMPUTE.with(|c| c.replace(dtype)));
    f()
}

/// The compute type of matrix products in the current scope (`None`: f32).
pub fn compute_dtype() -> Option<DType> {
    COMPUTE.with(|c| c.get())
}

/// `t` rounded to `low` (to nearest, ties to even), in its own dtype.
fn round_to<const D: usize>(t: Tensor<D>, low: DType) -> Tensor<D> {
    match low {
        DType::BF16 | DType::F16 => crate::round_half(t, low),
        _ => {
            let out = t.dtype();
            t.cast(low).cast(out)
        }
    }
}

/// `a · b` (batched over leading dimensions), in the compute type inside a [`scope`]: operands
/// and product rounded to it, f32 accumulation (see the module docs).
///
/// # Shapes
/// - a: `[.., m, k]`, b: `[.., k, n]` → `[.., m, n]` (dtype of `a`)
pub fn matmul<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> Tensor<D> {
    match compute_dtype() {
        Some(DType::BF16) if crate::bf16::native() => {
            round_to(crate::matmul_bf16(a, b), DType::BF16)
        }
        Some(low) => round_to(round_to(a, low).matmul(round_to(b, low)), low),
        None => crate::matmul_f32(a, b),
    }
}

/// `x · w + b` in `low`: operands and output rounded to it, f32 accumulation, the bias added
/// in f32 as oneDNN's bf16 kernels add it. In bf16 where the CPU multiplies bf16 natively
/// ([`crate::bf16::native`]), the linear kernel rounds x and w while packing them, and its
/// backward products round their operands, the output gradient included, as PyTorch's
/// autocast backward does; elsewhere x and w are rounded in the graph and the product runs on
/// mopt's f32 kernel (the output gradient stays f32).
pub(crate) fn linear(x: Tensor<2>, w: Tensor<2>, b: Tensor<1>, low: DType) -> Tensor<2> {
    let y = if low == DType::BF16 && crate::bf16::native() {
        crate::linear_on(x, w, round_to(b, low), true)
    } else {
        crate::linear_f32(round_to(x, low), round_to(w, low), round_to(b, low))
    };
    round_to(y, low)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data().convert::<f32>().try_to_vec().unwrap()
    }

    #[test]
    fn scope_sets_and_restores_the_compute_type() {
        assert_eq!(compute_dtype(), None);
        scope(Some(DType::BF16), || {
            assert_eq!(compute_dtype(), Some(DType::BF16));
            scope(Some(DType::F16), || {
                assert_eq!(compute_dtype(), Some(DType::F16))
            });
            assert_eq!(compute_dtype(), Some(DType::BF16));
            scope(Some(DType::F32), || assert_eq!(compute_dtype(), None));
        });
        assert_eq!(compute_dtype(), None);
        let r = std::panic::catch_unwind(|| scope(Some(DType::F16), || panic!("boom")));
        assert!(r.is_err());
        assert_eq!(compute_dtype(), None, "restored after a panic");
    }

    #[test]
    fn products_round_to_the_compute_type_and_come_back_f32() {
        let dev = Device::flex();
        // 1 + 2^-10 is exact in f16 (10 mantissa bits) and rounds to 1 in bf16 (7 bits).
        let a = Tensor::<2>::from_floats([[1.0 + 1.0 / 1024.0, 0.0]], &dev);
        let eye = Tensor::<2>::from_floats([[1.0, 0.0], [0.0, 1.0]], &dev);
        let f32_out = matmul(a.clone(), eye.clone());
        let bf = scope(Some(DType::BF16), || matmul(a.clone(), eye.clone()));
        let h = scope(Some(DType::F16), || matmul(a.clone(), eye.clone()));
        assert_eq!(bf.dtype(), DType::F32);
        assert_eq!(h.dtype(), DType::F32);
        assert_eq!(values(f32_out)[0], 1.0 + 1.0 / 1024.0);
        assert_eq!(values(bf)[0], 1.0);
        assert_eq!(values(h)[0], 1.0 + 1.0 / 1024.0);
        // f16 overflows past 65504; bf16 keeps f32's range.
        let big = Tensor::<2>::from_floats([[70000.0, 0.0]], &dev);
        let h = scope(Some(DType::F16), || matmul(big.clone(), eye.clone()));
        assert!(values(h)[0].is_infinite());
        let bf = scope(Some(DType::BF16), || matmul(big, eye));
        assert!((values(bf)[0] - 70000.0).abs() < 300.0);
    }

    #[test]
    fn the_f32_kernel_on_rounded_operands_matches_a_bf16_product_with_f32_sums() {
        let dev = Device::flex().autodiff();
        dev.seed(11);
        let dist = burn::tensor::Distribution::Normal(0.0, 1.0);
        let x = Tensor::<2>::random([37, 70], dist, &dev).require_grad();
        let w = Tensor::<2>::random([70, 29], dist, &dev).require_grad();
        let b = Tensor::<1>::random([29], dist, &dev).require_grad();
        for low in [DType::BF16, DType::F16] {
            let y = scope(Some(low), || crate::linear(x.clone(), w.clone(), b.clone()));
            // The reference: operands rounded, products and sums in f64, the result rounded.
            let r = |t: Tensor<2>| values(t.cast(low).cast(DType::F32));
            let (xs, ws) = (r(x.clone()), r(w.clone()));
            let bs = values(b.clone().cast(low).cast(DType::F32));
            let got = values(y.clone());
            for i in 0..37 {
                for j in 0..29 {
                    let mut acc = bs[j] as f64;
                    for k in 0..70 {
                        acc += xs[i * 70 + k] as f64 * ws[k * 29 + j] as f64;
                    }
                    let want = values(
                        Tensor::<1>::from_floats([acc as f32], &dev)
                            .cast(low)
                            .cast(DType::F32),
                    )[0];
                    // Sums in f32 in another order may land one low-precision step away.
                    let ulp = want.abs().max(1e-3)
                        * if low == DType::BF16 {
                            1.0 / 128.0
                        } else {
                            1.0 / 1024.0
                        };
                    assert!(
                        (got[i * 29 + j] - want).abs() <= ulp,
                        "{low:?} ({i},{j}): {} vs {want}",
                        got[i * 29 + j]
                    );
                }
            }
            // Gradients flow to the f32 master weights: d(sum)/dw[k][j] = Σ_i x[i][k], here over
            // the rounded x, so within Σ_i |x[i][k]| · 2^-8 (bf16; 2^-11 for f16) of f32's.
            let g = y.sum().backward();
            let g32 = crate::linear(x.clone(), w.clone(), b.clone())
                .sum()
                .backward();
            let (gw, gw32) = (values(w.grad(&g).unwrap()), values(w.grad(&g32).unwrap()));
            let step = if low == DType::BF16 {
                1.0 / 256.0
            } else {
                1.0 / 2048.0
            };
            let x32 = values(x.clone());
            for k in 0..70 {
                let bound = step * (0..37).map(|i| x32[i * 70 + k].abs()).sum::<f32>();
                for j in 0..29 {
                    let (a, e) = (gw[k * 29 + j], gw32[k * 29 + j]);
                    assert!((a - e).abs() <= bound, "{low:?} dw[{k}][{j}]: {a} vs {e}");
                    assert_ne!(a, e, "{low:?}: the backward saw the rounded x");
                }
            }
        }
    }

    #[test]
    fn gradients_reach_f32_weights_through_low_precision_products() {
        let dev = Device::flex().autodiff();
        let w = Tensor::<2>::from_floats([[0.5, -1.0], [2.0, 0.25]], &dev).require_grad();
        let b = Tensor::<1>::from_floats([0.1, 0.2], &dev).require_grad();
        let x = Tensor::<2>::from_floats([[1.0, 2.0], [3.0, -1.0]], &dev);
        let loss = |dtype| {
            scope(dtype, || crate::linear(x.clone(), w.clone(), b.clone()))
                .sum()
                .backward()
        };
        let g32 = loss(None);
        let g16 = loss(Some(DType::BF16));
        let (gw32, gw16) = (w.grad(&g32).unwrap(), w.grad(&g16).unwrap());
        assert_eq!(gw16.dtype(), DType::F32, "master-weight gradients stay f32");
        assert_eq!(b.grad(&g16).unwrap().dtype(), DType::F32);
        // d(sum)/dw = xᵀ·1: small integers, exact in bf16.
        assert_eq!(values(gw32), vec![4.0, 4.0, 1.0, 1.0]);
        assert_eq!(values(gw16), values(w.grad(&g32).unwrap()));
    }
}
