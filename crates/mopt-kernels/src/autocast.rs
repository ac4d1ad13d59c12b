//! Autocast: matrix products in a low-precision float type, everything else in f32.
//!
//! The policy is PyTorch's `torch.autocast` for transformers, reduced to what decides accuracy:
//! inside [`scope`], [`crate::linear`] and [`matmul`] cast their operands to the compute type
//! (bf16 or f16), multiply there and cast the product back to f32. Softmax, LayerNorm, GELU,
//! dropout, embeddings, the losses and the distillation terms see f32 tensors, and the
//! parameters stay f32 (master weights): the cast is part of the autodiff graph, so a weight's
//! gradient comes back as f32 after flowing through the low-precision product.
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

/// `a · b` (batched over leading dimensions), in the compute type inside a [`scope`].
///
/// # Shapes
/// - a: `[.., m, k]`, b: `[.., k, n]` → `[.., m, n]` (dtype of `a`)
pub fn matmul<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> Tensor<D> {
    match compute_dtype() {
        Some(low) => {
            let out = a.dtype();
            a.cast(low).matmul(b.cast(low)).cast(out)
        }
        None => a.matmul(b),
    }
}

/// `x · w + b` in `low`, the product cast back to the dtype of `x`.
pub(crate) fn linear(x: Tensor<2>, w: Tensor<2>, b: Tensor<1>, low: DType) -> Tensor<2> {
    let out = x.dtype();
    crate::reference::linear(x.cast(low), w.cast(low), b.cast(low)).cast(out)
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
