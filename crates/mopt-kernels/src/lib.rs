//! # mopt-kernels
//!
//! Fused CPU kernels with their backward passes, for the ops where Burn Flex training spends
//! its time outside matrix multiplies (measured by `benches/speed.rs -- --ops`):
//!
//! | op | Burn 0.22 under autodiff | here |
//! |---|---|---|
//! | [`gelu`] | scalar `erf` per element, forward and backward | vectorised rational `erf`, one pass each way |
//! | [`softmax`] (last dim) | decomposed into exp/sum/div, each with its own backward | one pass forward, one backward (`y ⊙ (g − Σg⊙y)`) |
//! | [`layer_norm`] | decomposed (mean, var, sub, div, mul, add) | one pass forward; one backward giving dx, dγ, dβ |
//! | [`embedding`] | dense zeros + generic scatter | gather; scatter-add of touched rows into zeroed pages |
//!
//! Each function takes and returns ordinary Burn tensors. On Flex (plain or autodiff) f32
//! tensors it runs the fused kernel; on any other backend or dtype, or when fused kernels are
//! off ([`set_enabled`], or `MOPT_KERNELS=plain` in the environment), it runs the plain Burn
//! composition in [`mod@reference`]. The tests check the two against each other (values and
//! gradients).
//!
//! The products: an f32 GEMM ([`gemm`], AVX-512 / AVX2 / portable tiles), native bf16 products
//! ([`bf16`], AMX tiles or AVX512_BF16, for [`autocast`]), convolutions on the GEMM's tiles
//! ([`conv`]), exact `u8 · s8` products for int8 inference ([`int8`], AVX-512 VNNI). The CPU
//! instructions stable Rust reaches only through `unsafe` (AMX, the
//! AVX512_BF16 dot product) live in one private module, `native`, the only `unsafe` code in
//! mopt, each block with its safety argument.
//!
//! A binary calls [`tune_allocator`] and [`init_pool`] first (`mopt-train` and the benches do):
//! the calling thread becomes the kernels' worker 0, as OpenMP's main thread is PyTorch's, and
//! the other workers stay awake between a pass's products instead of sleeping after each.

#![deny(missing_docs)]
use std::sync::atomic::{AtomicU8, Ordering};

use burn::backend::autodiff::checkpoint::strategy::{BalancedCheckpointing, NoCheckpointing};
use burn::backend::autodiff::Autodiff;
use burn::backend::Flex;
use burn::prelude::*;
use burn::tensor::DType;

pub mod adamw;
pub mod autocast;
mod autodiff;
pub mod batchnorm;
pub mod bf16;
pub mod conv;
pub mod cpu;
mod flex;
pub mod gemm;
mod gemv;
pub mod int8;
#[cfg(target_arch = "x86_64")]
mod native;
pub mod reference;
mod threads;
pub mod transpose;
mod winograd;

pub use adamw::FusedAdamW;
pub use cpu::GeluKind;
pub use threads::init_pool;

/// Tune the process's allocator for tensor work (call once, early, from a binary): on Linux
/// with glibc, tensors up to 32 MiB come from the heap and freed memory stays with the process
/// up to 1 GiB, instead of a fresh `mmap` per large tensor whose pages fault in one by one
/// (a batch-32 BERT forward pass: 125 → 85-92 ms on the Xeon VM). Resident memory stays at
/// its peak afterwards. Elsewhere nothing.
pub fn tune_allocator() {
    #[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
    native::keep_freed_memory();
}

/// 0 = not read yet, 1 = fused, 2 = plain.
static MODE: AtomicU8 = AtomicU8::new(0);

/// Whether the fused kernels are used (default: yes, unless `MOPT_KERNELS=plain`).
pub fn enabled() -> bool {
    match MODE.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => {
            let plain = std::env::var("MOPT_KERNELS").is_ok_and(|v| v == "plain");
            MODE.store(if plain { 2 } else { 1 }, Ordering::Relaxed);
            !plain
        }
    }
}

/// Turn the fused kernels on or off for the whole process (benchmarks and tests compare both).
pub fn set_enabled(on: bool) {
    MODE.store(if on { 1 } else { 2 }, Ordering::Relaxed);
}

type Ad = Autodiff<Flex, NoCheckpointing>;
/// The autodiff device with gradient checkpointing (`device.autodiff().gradient_checkpointing()`).
type AdCk = Autodiff<Flex, BalancedCheckpointing>;

/// Where a float tensor lives, for routing. Built and taken apart at once, never stored: the
/// size difference between its variants (a remote build's dispatch tensor is large) costs a
/// stack copy, less than boxing would.
#[allow(clippy::large_enum_variant)]
enum Route<const D: usize> {
    Flex(burn::backend::flex::FlexTensor),
    Autodiff(burn::backend::tensor::FloatTensor<Ad>),
    Checkpointed(burn::backend::tensor::FloatTensor<AdCk>),
    Other(Tensor<D>),
}

fn route<const D: usize>(x: Tensor<D>) -> Route<D> {
    if !enabled() || x.dtype() != DType::F32 {
        return Route::Other(x);
    }
    if let Ok(p) = x.clone().try_into_primitive::<Ad>() {
        return Route::Autodiff(p);
    }
    if let Ok(p) = x.clone().try_into_primitive::<AdCk>() {
        return Route::Checkpointed(p);
    }
    match x.clone().try_into_primitive::<Flex>() {
        Ok(p) => Route::Flex(p),
        Err(_) => Route::Other(x),
    }
}

/// Whether an op on `x` runs a fused kernel (Flex f32, plain or autodiff, kernels enabled).
pub fn is_fused<const D: usize>(x: &Tensor<D>) -> bool {
    !matches!(route(x.clone()), Route::Other(_))
}

/// Whether `x` is a tracked (autodiff) tensor.
pub fn is_autodiff<const D: usize>(x: &Tensor<D>) -> bool {
    matches!(
        route(x.clone()),
        Route::Autodiff(_) | Route::Checkpointed(_)
    )
}

/// `Σ x²` over all elements, in f64 (one pass; gradient clipping).
pub fn sum_squares<const D: usize>(x: &Tensor<D>) -> f64 {
    match route(x.clone()) {
        Route::Flex(p) => cpu::sum_squares(flex::f32s_contiguous(&p).as_ref()),
        _ => x.clone().square().sum().into_scalar::<f32>() as f64,
    }
}

/// `x · factor` (in place when `x` owns its buffer; gradient clipping).
pub fn scale<const D: usize>(x: Tensor<D>, factor: f32) -> Tensor<D> {
    match route(x) {
        Route::Flex(p) => Tensor::from_primitive::<Flex>(flex::scale(p, factor)),
        Route::Autodiff(p) => Tensor::from_primitive::<Ad>(p).mul_scalar(factor),
        Route::Checkpointed(p) => Tensor::from_primitive::<AdCk>(p).mul_scalar(factor),
        Route::Other(x) => x.mul_scalar(factor),
    }
}

/// Exact (erf) GELU, as BERT's `hidden_act = "gelu"`.
///
/// # Shapes
/// any → same
pub fn gelu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    gelu_as(GeluKind::Erf, x)
}

/// GELU of either kind: the exact one or the tanh approximation ([`GeluKind`]), fused forward
/// and backward.
///
/// # Shapes
/// any → same
pub fn gelu_as<const D: usize>(kind: GeluKind, x: Tensor<D>) -> Tensor<D> {
    match route(x) {
        Route::Flex(p) => Tensor::from_primitive::<Flex>(flex::gelu(p, kind)),
        Route::Autodiff(p) => {
            Tensor::from_primitive::<Ad>(autodiff::gelu::<NoCheckpointing>(p, kind))
        }
        Route::Checkpointed(p) => {
            Tensor::from_primitive::<AdCk>(autodiff::gelu::<BalancedCheckpointing>(p, kind))
        }
        Route::Other(x) => match kind {
            GeluKind::Erf => reference::gelu(x),
            GeluKind::Tanh => reference::gelu_tanh(x),
        },
    }
}

/// Softmax over `dim`; fused when `dim` is the last dimension.
///
/// # Shapes
/// any → same
pub fn softmax<const D: usize>(x: Tensor<D>, dim: usize) -> Tensor<D> {
    if dim + 1 != D {
        return reference::softmax(x, dim);
    }
    match route(x) {
        Route::Flex(p) => Tensor::from_primitive::<Flex>(flex::softmax(p)),
        Route::Autodiff(p) => Tensor::from_primitive::<Ad>(autodiff::softmax::<NoCheckpointing>(p)),
        Route::Checkpointed(p) => {
            Tensor::from_primitive::<AdCk>(autodiff::softmax::<BalancedCheckpointing>(p))
        }
        Route::Other(x) => reference::softmax(x, dim),
    }
}

/// `softmax(scale·x + bias)` over the last dimension in one parallel pass (in place when `x`
/// is held nowhere else): the attention probabilities from raw scores `Q·Kᵀ`, the scale
/// `1/√d` and an additive mask, without the two element-wise passes (single-threaded in Burn
/// Flex) of `softmax(x / √d + mask)`. The bias carries no gradient (a mask).
///
/// # Shapes
/// - x: `[batch, heads, rows, n]`; bias: `[batch, 1, 1, n]` → `[batch, heads, rows, n]`
///
/// # Panics
/// When the bias is not `[batch, 1, 1, n]` for x's batch and n.
pub fn softmax_biased(x: Tensor<4>, bias: Tensor<4>, scale: f32) -> Tensor<4> {
    let ([b, _, _, n], bd) = (x.dims(), bias.dims());
    assert_eq!(bd, [b, 1, 1, n], "bias shape for scores {:?}", x.dims());
    let bias_plain = if bias.device().is_autodiff() {
        bias.clone().inner()
    } else {
        bias.clone()
    };
    let Ok(bp) = bias_plain.try_into_primitive::<Flex>() else {
        return reference::softmax_biased(x, bias, scale);
    };
    let bp = flex::contiguous(bp);
    match route(x) {
        Route::Flex(p) => Tensor::from_primitive::<Flex>(flex::softmax_biased(p, &bp, scale)),
        Route::Autodiff(p) => {
            Tensor::from_primitive::<Ad>(autodiff::softmax_biased::<NoCheckpointing>(p, &bp, scale))
        }
        Route::Checkpointed(p) => Tensor::from_primitive::<AdCk>(autodiff::softmax_biased::<
            BalancedCheckpointing,
        >(p, &bp, scale)),
        Route::Other(x) => reference::softmax_biased(x, bias, scale),
    }
}

/// `layer_norm(x + residual)` (a transformer block's residual output): on plain Flex tensors
/// (inference) the sum and the norm in one parallel pass, in place when `x` is held nowhere
/// else, where Burn Flex adds on one thread; under autodiff the composition with [`layer_norm`].
///
/// # Shapes
/// - x, residual: `[.., n]`, the same; gamma, beta: `[n]` → `[.., n]`
pub fn add_layer_norm<const D: usize>(
    x: Tensor<D>,
    residual: Tensor<D>,
    gamma: Tensor<1>,
    beta: Tensor<1>,
    eps: f64,
) -> Tensor<D> {
    let composed = |x: Tensor<D>, r, g, b| layer_norm(x + r, g, b, eps);
    if x.dims() != residual.dims() || gamma.dtype() != DType::F32 || beta.dtype() != DType::F32 {
        return composed(x, residual, gamma, beta);
    }
    let Route::Flex(p) = route(x.clone()) else {
        return composed(x, residual, gamma, beta);
    };
    drop(x);
    let parts = (
        residual.clone().try_into_primitive::<Flex>(),
        gamma.clone().try_into_primitive::<Flex>(),
        beta.clone().try_into_primitive::<Flex>(),
    );
    match parts {
        (Ok(r), Ok(g), Ok(b)) => {
            Tensor::from_primitive::<Flex>(flex::add_layer_norm(p, &r, (&g, &b), eps))
        }
        _ => composed(Tensor::from_primitive::<Flex>(p), residual, gamma, beta),
    }
}

/// LayerNorm over the last dimension: `(x − mean) / √(var + eps) · gamma + beta` (biased
/// variance).
///
/// # Shapes
/// - x: `[.., n]`; gamma, beta: `[n]` → `[.., n]`
pub fn layer_norm<const D: usize>(
    x: Tensor<D>,
    gamma: Tensor<1>,
    beta: Tensor<1>,
    eps: f64,
) -> Tensor<D> {
    let fallback = |x, g, b| reference::layer_norm(x, g, b, eps);
    if gamma.dtype() != DType::F32 || beta.dtype() != DType::F32 {
        return fallback(x, gamma, beta);
    }
    match route(x) {
        Route::Flex(p) => match (
            gamma.clone().try_into_primitive::<Flex>(),
            beta.clone().try_into_primitive::<Flex>(),
        ) {
            (Ok(g), Ok(b)) => Tensor::from_primitive::<Flex>(flex::layer_norm(p, &g, &b, eps)),
            _ => fallback(Tensor::from_primitive::<Flex>(p), gamma, beta),
        },
        Route::Autodiff(p) => match (
            gamma.clone().try_into_primitive::<Ad>(),
            beta.clone().try_into_primitive::<Ad>(),
        ) {
            (Ok(g), Ok(b)) => {
                Tensor::from_primitive::<Ad>(autodiff::layer_norm::<NoCheckpointing>(p, g, b, eps))
            }
            _ => fallback(Tensor::from_primitive::<Ad>(p), gamma, beta),
        },
        Route::Checkpointed(p) => match (
            gamma.clone().try_into_primitive::<AdCk>(),
            beta.clone().try_into_primitive::<AdCk>(),
        ) {
            (Ok(g), Ok(b)) => Tensor::from_primitive::<AdCk>(autodiff::layer_norm::<
                BalancedCheckpointing,
            >(p, g, b, eps)),
            _ => fallback(Tensor::from_primitive::<AdCk>(p), gamma, beta),
        },
        Route::Other(x) => fallback(x, gamma, beta),
    }
}

/// A linear layer `x · w + b` on the GEMM of [`gemm`] (forward and both backward products).
///
/// # Shapes
/// - x: `[m, k]`; w: `[k, n]` (Burn's `Linear.weight` layout); b: `[n]` → `[m, n]`
///
/// Inside an [`autocast::scope`] operands and product are rounded to the scope's compute type
/// around the same f32 kernel ([`autocast`]).
pub fn linear(x: Tensor<2>, w: Tensor<2>, b: Tensor<1>) -> Tensor<2> {
    if let Some(low) = autocast::compute_dtype() {
        return autocast::linear(x, w, b, low);
    }
    linear_f32(x, w, b)
}

/// [`linear`] outside autocast: the fused f32 kernel where the tensors allow it.
pub(crate) fn linear_f32(x: Tensor<2>, w: Tensor<2>, b: Tensor<1>) -> Tensor<2> {
    linear_on(x, w, b, false)
}

/// `a · b` in f32: a product with one row (batch-1 decoding) of plain Flex tensors on mopt's
/// GEMV ([`flex::matvec`]: a stream through `b` read in place, where Burn's GEMM took the
/// `gemm` crate's one-row path), everything else Burn's matmul.
///
/// # Shapes
/// - a: `[.., m, k]`, b: `[.., k, n]` → `[.., m, n]`
pub(crate) fn matmul_f32<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> Tensor<D> {
    if D == 2 && a.dims()[0] == 1 && b.dtype() == DType::F32 {
        if let (Route::Flex(ap), Ok(bp)) =
            (route(a.clone()), b.clone().try_into_primitive::<Flex>())
        {
            if let Some(y) = flex::matvec(ap, &bp) {
                return Tensor::from_primitive::<Flex>(y);
            }
        }
    }
    a.matmul(b)
}

/// The fused linear kernel, its products (forward and backward) on bf16-rounded operands with
/// `bf16` ([`bf16::gemm`]); Burn's composition where the tensors do not allow it (then in f32:
/// callers with `bf16` round the operands first only where [`bf16::native`] is off).
pub(crate) fn linear_on(x: Tensor<2>, w: Tensor<2>, b: Tensor<1>, bf16: bool) -> Tensor<2> {
    let fallback = |x: Tensor<2>, w: Tensor<2>, b: Tensor<1>| match bf16 {
        true => reference::linear(round_half(x, DType::BF16), round_half(w, DType::BF16), b),
        false => reference::linear(x, w, b),
    };
    if w.dtype() != DType::F32 || b.dtype() != DType::F32 {
        return fallback(x, w, b);
    }
    match route(x) {
        Route::Flex(p) => match (
            w.clone().try_into_primitive::<Flex>(),
            b.clone().try_into_primitive::<Flex>(),
        ) {
            (Ok(wp), Ok(bp)) => Tensor::from_primitive::<Flex>(flex::linear(p, &wp, &bp, bf16)),
            _ => fallback(Tensor::from_primitive::<Flex>(p), w, b),
        },
        Route::Autodiff(p) => match (
            w.clone().try_into_primitive::<Ad>(),
            b.clone().try_into_primitive::<Ad>(),
        ) {
            (Ok(wp), Ok(bp)) => {
                Tensor::from_primitive::<Ad>(autodiff::linear::<NoCheckpointing>(p, wp, bp, bf16))
            }
            _ => fallback(Tensor::from_primitive::<Ad>(p), w, b),
        },
        Route::Checkpointed(p) => match (
            w.clone().try_into_primitive::<AdCk>(),
            b.clone().try_into_primitive::<AdCk>(),
        ) {
            (Ok(wp), Ok(bp)) => Tensor::from_primitive::<AdCk>(autodiff::linear::<
                BalancedCheckpointing,
            >(p, wp, bp, bf16)),
            _ => fallback(Tensor::from_primitive::<AdCk>(p), w, b),
        },
        Route::Other(x) => fallback(x, w, b),
    }
}

/// A 2-D convolution without bias (square kernel, symmetric padding `pad`, groups 1) on the
/// GEMM of [`gemm`], without a patch matrix: the padded (phase-split for strides) image's
/// shifted rows feed the product directly, the weights packed once a call ([`conv`]). Burn's
/// `conv2d` elsewhere.
///
/// # Shapes
/// - x: `[batch, C, H, W]`; w: `[O, C, k, k]` (Burn's `Conv2d.weight`) → `[batch, O, OH, OW]`
pub fn conv2d(x: Tensor<4>, w: Tensor<4>, stride: usize, pad: usize) -> Tensor<4> {
    let fallback = |x: Tensor<4>, w: Tensor<4>| reference::conv2d(x, w, stride, pad);
    if w.dtype() != DType::F32 || autocast::compute_dtype().is_some() {
        return fallback(x, w);
    }
    match route(x) {
        Route::Flex(p) => match w.clone().try_into_primitive::<Flex>() {
            Ok(wp) => Tensor::from_primitive::<Flex>(flex::conv2d(p, &wp, stride, pad)),
            _ => fallback(Tensor::from_primitive::<Flex>(p), w),
        },
        Route::Autodiff(p) => match w.clone().try_into_primitive::<Ad>() {
            Ok(wp) => Tensor::from_primitive::<Ad>(autodiff::conv2d::<NoCheckpointing>(
                p, wp, stride, pad,
            )),
            _ => fallback(Tensor::from_primitive::<Ad>(p), w),
        },
        Route::Checkpointed(p) => match w.clone().try_into_primitive::<AdCk>() {
            Ok(wp) => Tensor::from_primitive::<AdCk>(autodiff::conv2d::<BalancedCheckpointing>(
                p, wp, stride, pad,
            )),
            _ => fallback(Tensor::from_primitive::<AdCk>(p), w),
        },
        Route::Other(x) => fallback(x, w),
    }
}

/// BatchNorm with the batch's own statistics (a training forward pass), fused (one pass for
/// the statistics and one for the output; two backward): the output, and the batch's mean and
/// biased variance (constants, for the running statistics). Elsewhere (other dtypes, backends,
/// `MOPT_KERNELS=plain`) Burn's `batch_norm_train`.
///
/// # Shapes
/// - x: `[batch, channels, height, width]`; gamma, beta: `[channels]`
/// - output: like x; mean, variance: `[channels]`
pub fn batch_norm_train(
    x: Tensor<4>,
    gamma: Tensor<1>,
    beta: Tensor<1>,
    eps: f64,
) -> (Tensor<4>, Tensor<1>, Tensor<1>) {
    batch_norm_train_act(x, (gamma, beta), eps, None, false)
}

/// [`batch_norm_train`] followed by `+ residual` (when given) and ReLU (when `relu`) in the
/// same passes, forward and backward: a ResNet block's `relu(bn(conv(x)) + shortcut)` without
/// the add's and the activation's passes and temporaries.
///
/// # Shapes
/// - x, residual: `[batch, channels, height, width]`; gamma, beta: `[channels]`
/// - output: like x; mean, variance: `[channels]`
pub fn batch_norm_train_act(
    x: Tensor<4>,
    (gamma, beta): (Tensor<1>, Tensor<1>),
    eps: f64,
    residual: Option<Tensor<4>>,
    relu: bool,
) -> (Tensor<4>, Tensor<1>, Tensor<1>) {
    let device = x.device();
    let fallback = |x, g, b, residual: Option<Tensor<4>>| {
        let r = burn::tensor::module::batch_norm_train(x, g, b, eps);
        let mut y = r.output;
        if let Some(res) = residual {
            y = y + res;
        }
        if relu {
            y = burn::tensor::activation::relu(y);
        }
        (y, r.mean.detach(), r.variance.detach())
    };
    if gamma.dtype() != DType::F32
        || beta.dtype() != DType::F32
        || residual.as_ref().is_some_and(|r| r.dtype() != DType::F32)
        || autocast::compute_dtype().is_some()
    {
        return fallback(x, gamma, beta, residual);
    }
    let stats = |v: Vec<f32>| {
        let n = v.len();
        Tensor::<1>::from_data(TensorData::new(v, [n]), &device)
    };
    macro_rules! fused {
        ($p:expr, $B:ty, $call:expr) => {{
            let res = match residual.clone().map(|r| r.try_into_primitive::<$B>()) {
                None => Ok(None),
                Some(Ok(r)) => Ok(Some(r)),
                Some(Err(_)) => Err(()),
            };
            match (
                gamma.clone().try_into_primitive::<$B>(),
                beta.clone().try_into_primitive::<$B>(),
                res,
            ) {
                (Ok(g), Ok(b), Ok(r)) => {
                    let (y, m, v) = $call($p, (g, b), r);
                    (Tensor::from_primitive::<$B>(y), stats(m), stats(v))
                }
                _ => fallback(Tensor::from_primitive::<$B>($p), gamma, beta, residual),
            }
        }};
    }
    match route(x) {
        Route::Flex(p) => fused!(
            p,
            Flex,
            |p,
             (g, b): (
                burn::backend::flex::FlexTensor,
                burn::backend::flex::FlexTensor
            ),
             r: Option<burn::backend::flex::FlexTensor>| {
                flex::batch_norm_train(p, (&g, &b), eps, r.as_ref(), relu)
            }
        ),
        Route::Autodiff(p) => fused!(p, Ad, |p, gb, r| {
            autodiff::batch_norm_train::<NoCheckpointing>(p, gb, eps, r, relu)
        }),
        Route::Checkpointed(p) => fused!(p, AdCk, |p, gb, r| {
            autodiff::batch_norm_train::<BalancedCheckpointing>(p, gb, eps, r, relu)
        }),
        Route::Other(x) => fallback(x, gamma, beta, residual),
    }
}

/// BatchNorm in inference (the running statistics), then `+ residual` (when given) and ReLU
/// (when `relu`), in one pass on Burn Flex tensors; elsewhere (autodiff, other dtypes and
/// backends, `MOPT_KERNELS=plain`) Burn's composition.
///
/// # Shapes
/// - x, residual: `[batch, channels, height, width]`; gamma, beta, mean, var: `[channels]`
/// - output: like x
pub fn batch_norm_eval_act(
    x: Tensor<4>,
    [gamma, beta, mean, var]: [Tensor<1>; 4],
    eps: f64,
    residual: Option<Tensor<4>>,
    relu: bool,
) -> Tensor<4> {
    let fallback = |x: Tensor<4>, residual: Option<Tensor<4>>| {
        let c = gamma.dims()[0];
        let shape = [1, c, 1, 1];
        let scale = gamma.clone().div(var.clone().add_scalar(eps).sqrt());
        let shift = beta.clone().sub(mean.clone().mul(scale.clone()));
        let mut y = x * scale.reshape(shape) + shift.reshape(shape);
        if let Some(r) = residual {
            y = y + r;
        }
        if relu {
            burn::tensor::activation::relu(y)
        } else {
            y
        }
    };
    let params = [&gamma, &beta, &mean, &var];
    if params.iter().any(|p| p.dtype() != DType::F32)
        || residual.as_ref().is_some_and(|r| r.dtype() != DType::F32)
        || autocast::compute_dtype().is_some()
    {
        return fallback(x, residual);
    }
    let flex = |t: &Tensor<1>| t.clone().try_into_primitive::<Flex>().ok();
    match route(x) {
        Route::Flex(p) => {
            let ps: Option<Vec<_>> = params.iter().map(|t| flex(t)).collect();
            let res = match residual.clone().map(|r| r.try_into_primitive::<Flex>()) {
                None => Some(None),
                Some(Ok(r)) => Some(Some(r)),
                Some(Err(_)) => None,
            };
            match (ps, res) {
                (Some(ps), Some(r)) => Tensor::from_primitive::<Flex>(flex::batch_norm_eval(
                    p,
                    [&ps[0], &ps[1], &ps[2], &ps[3]],
                    eps,
                    r.as_ref(),
                    relu,
                )),
                _ => fallback(Tensor::from_primitive::<Flex>(p), residual),
            }
        }
        Route::Autodiff(p) => fallback(Tensor::from_primitive::<Ad>(p), residual),
        Route::Checkpointed(p) => fallback(Tensor::from_primitive::<AdCk>(p), residual),
        Route::Other(x) => fallback(x, residual),
    }
}

/// Inference `relu(bn(conv(x, w)) + residual)` (the residual and ReLU each when asked), the
/// BatchNorm with its running statistics `[gamma, beta, mean, var]`: on Burn Flex tensors the
/// convolution applies the BatchNorm, the residual and the ReLU as it writes its output (one
/// pass over the activations fewer, the same values bit for bit); elsewhere [`conv2d`] then
/// [`batch_norm_eval_act`].
///
/// # Shapes
/// - x: `[batch, C, H, W]`; w: `[O, C, k, k]`; gamma, beta, mean, var: `[O]`
/// - residual, output: `[batch, O, OH, OW]`
pub fn conv2d_bn_eval_act(
    (x, w): (Tensor<4>, Tensor<4>),
    (stride, pad): (usize, usize),
    params: [Tensor<1>; 4],
    eps: f64,
    (residual, relu): (Option<Tensor<4>>, bool),
) -> Tensor<4> {
    let unfused = |x: Tensor<4>, w: Tensor<4>, params, residual| {
        batch_norm_eval_act(conv2d(x, w, stride, pad), params, eps, residual, relu)
    };
    let f32s = w.dtype() == DType::F32
        && params.iter().all(|p| p.dtype() == DType::F32)
        && residual.as_ref().is_none_or(|r| r.dtype() == DType::F32)
        && autocast::compute_dtype().is_none();
    if !f32s {
        return unfused(x, w, params, residual);
    }
    let flex = |t: &Tensor<1>| t.clone().try_into_primitive::<Flex>().ok();
    let ps: Option<Vec<_>> = params.iter().map(flex).collect();
    let wp = w.clone().try_into_primitive::<Flex>().ok();
    let res = match residual.clone().map(|r| r.try_into_primitive::<Flex>()) {
        None => Some(None),
        Some(Ok(r)) => Some(Some(r)),
        Some(Err(_)) => None,
    };
    if let (Route::Flex(p), Some(ps), Some(wp), Some(r)) = (route(x.clone()), ps, wp, res) {
        return Tensor::from_primitive::<Flex>(flex::conv2d_bn_eval(
            (p, &wp),
            (stride, pad),
            [&ps[0], &ps[1], &ps[2], &ps[3]],
            eps,
            (r.as_ref(), relu),
        ));
    }
    unfused(x, w, params, residual)
}

/// Dropout of a training forward pass: zero each element with probability `prob` and scale the
/// rest by `1/(1−prob)`. Like Burn's `Dropout`, it only acts on autodiff (training) tensors and
/// its masks follow the device's seed (one draw from the device RNG per call seeds a
/// counter-based mask, which the backward pass regenerates instead of storing).
///
/// # Shapes
/// any → same
pub fn dropout<const D: usize>(x: Tensor<D>, prob: f64) -> Tensor<D> {
    if prob <= 0.0 || !x.device().is_autodiff() {
        return x;
    }
    if is_autodiff(&x) {
        let seed = draw_seed(&x.device());
        dropout_seeded(x, prob, seed)
    } else {
        reference::dropout(x, prob)
    }
}

/// The attention core of a BERT layer: `softmax(Q·Kᵀ/√d + mask) → dropout → ·V` per head, read
/// straight out of the `[batch, seq, heads·d]` projections and written back in that layout (no
/// head split or merge copies), with one fused backward pass. Dropout (probability `dropout`)
/// applies on autodiff tensors only, like [`dropout`].
///
/// # Shapes
/// - q, k, v: `[batch, seq, heads·d]`; mask_bias: `[batch, seq]` (added to every query's scores)
/// - output: `[batch, seq, heads·d]`
pub fn attention(
    q: Tensor<3>,
    k: Tensor<3>,
    v: Tensor<3>,
    mask_bias: Tensor<2>,
    heads: usize,
    dropout: f64,
) -> Tensor<3> {
    let seed = if dropout > 0.0 && q.device().is_autodiff() {
        Some(draw_seed(&q.device()))
    } else {
        None
    };
    attention_seeded(q, k, v, mask_bias, heads, dropout, seed)
}

/// [`attention`] with an explicit dropout seed (`None`: no dropout). The mask of element
/// `(b, h, i, j)` is the one [`dropout_seeded`] gives a flat `[batch, heads, seq, seq]` tensor
/// with the same seed (the tests rely on it).
pub fn attention_seeded(
    q: Tensor<3>,
    k: Tensor<3>,
    v: Tensor<3>,
    mask_bias: Tensor<2>,
    heads: usize,
    dropout: f64,
    seed: Option<u64>,
) -> Tensor<3> {
    let [batch, seq, width] = q.dims();
    let d = width / heads.max(1);
    let shape = cpu::Attn {
        batch,
        seq,
        heads,
        head_size: d,
        scale: 1.0 / (d as f32).sqrt(),
        keep: if seed.is_some() {
            (1.0 - dropout) as f32
        } else {
            1.0
        },
        seed: seed.unwrap_or(0),
    };
    let reference = |q, k, v, m| reference::attention(q, k, v, m, heads, dropout, seed);
    let mask = if mask_bias.device().is_autodiff() {
        mask_bias.clone().inner()
    } else {
        mask_bias.clone()
    };
    let Ok(mask_p) = mask.try_into_primitive::<Flex>() else {
        return reference(q, k, v, mask_bias);
    };
    if width % heads.max(1) != 0 || k.dims() != q.dims() || v.dims() != q.dims() {
        return reference(q, k, v, mask_bias);
    }
    let flat = |t: Tensor<3>| t.reshape([batch * seq, width]);
    let (qf, kf, vf) = (flat(q.clone()), flat(k.clone()), flat(v.clone()));
    let routes = (route(qf), route(kf), route(vf));
    if !matches!(routes.0, Route::Other(_)) {
        FUSED_ATTENTION.fetch_add(1, Ordering::Relaxed);
    }
    match routes {
        (Route::Flex(a), Route::Flex(b), Route::Flex(c)) => {
            let (ctx, _) = flex::attention(&a, &b, &c, &mask_p, shape);
            Tensor::<2>::from_primitive::<Flex>(ctx).reshape([batch, seq, width])
        }
        (Route::Autodiff(a), Route::Autodiff(b), Route::Autodiff(c)) => {
            let ctx = autodiff::attention::<NoCheckpointing>(a, b, c, &mask_p, shape);
            Tensor::<2>::from_primitive::<Ad>(ctx).reshape([batch, seq, width])
        }
        (Route::Checkpointed(a), Route::Checkpointed(b), Route::Checkpointed(c)) => {
            let ctx = autodiff::attention::<BalancedCheckpointing>(a, b, c, &mask_p, shape);
            Tensor::<2>::from_primitive::<AdCk>(ctx).reshape([batch, seq, width])
        }
        _ => reference(q, k, v, mask_bias),
    }
}

static FUSED_ATTENTION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Attention calls that ran the fused kernel so far in this process.
pub fn fused_attention_calls() -> u64 {
    FUSED_ATTENTION.load(Ordering::Relaxed)
}

thread_local! {
    /// A per-thread seed stream that replaces the device RNG inside [`with_seed_stream`].
    static SEED_STREAM: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// Run `f` with dropout seeds drawn from a stream seeded by `seed` on this thread instead of
/// from the device's RNG. Data-parallel replicas that share one device (the CPU) stay
/// reproducible this way: each shard's masks follow its own stream, whatever the threads'
/// interleaving.
pub fn with_seed_stream<R>(seed: u64, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<u64>);
    impl Drop for Restore {
        fn drop(&mut self) {
            SEED_STREAM.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(SEED_STREAM.with(|c| c.replace(Some(seed))));
    f()
}

/// SplitMix64: the next value of a seed stream.
fn splitmix64(state: u64) -> u64 {
    let mut z = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A dropout seed drawn from the device's RNG (so masks follow the run's seed), or from the
/// thread's seed stream inside [`with_seed_stream`].
fn draw_seed(device: &Device) -> u64 {
    if let Some(state) = SEED_STREAM.with(|c| c.get()) {
        let next = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        SEED_STREAM.with(|c| c.set(Some(next)));
        return splitmix64(state);
    }
    let r: Tensor<1> = Tensor::random(
        [2],
        burn::tensor::Distribution::Uniform(0.0, 4_294_967_296.0),
        device,
    );
    let v: Vec<f32> = r.into_data().convert::<f32>().try_to_vec().expect("f32");
    ((v[0] as u64) << 32) ^ (v[1] as u64)
}

/// [`dropout`] with an explicit seed: element `i` (row-major) is kept when the counter-based
/// hash of `(seed, i)` says so. Autodiff Flex tensors only; others pass through unchanged.
pub fn dropout_seeded<const D: usize>(x: Tensor<D>, prob: f64, seed: u64) -> Tensor<D> {
    let keep = (1.0 - prob) as f32;
    match route(x.clone()) {
        Route::Autodiff(p) => {
            Tensor::from_primitive::<Ad>(autodiff::dropout::<NoCheckpointing>(p, seed, keep))
        }
        Route::Checkpointed(p) => Tensor::from_primitive::<AdCk>(autodiff::dropout::<
            BalancedCheckpointing,
        >(p, seed, keep)),
        _ => x,
    }
}

/// `x` rounded to `low` (bf16 or f16) and kept in its dtype: `x.cast(low).cast(dtype)` in one
/// vectorised pass (the gradient rounded likewise), on mopt's kernel where the tensor allows it.
///
/// # Panics
/// On a `low` other than bf16 or f16.
pub fn round_half<const D: usize>(x: Tensor<D>, low: DType) -> Tensor<D> {
    let f16 = match low {
        DType::BF16 => false,
        DType::F16 => true,
        other => panic!("round_half rounds to bf16 or f16, not {other:?}"),
    };
    match route(x) {
        Route::Flex(p) => Tensor::from_primitive::<Flex>(flex::round_half(p, f16)),
        Route::Autodiff(p) => {
            Tensor::from_primitive::<Ad>(autodiff::round_half::<NoCheckpointing>(p, f16))
        }
        Route::Checkpointed(p) => {
            Tensor::from_primitive::<AdCk>(autodiff::round_half::<BalancedCheckpointing>(p, f16))
        }
        Route::Other(x) => {
            let out = x.dtype();
            x.cast(low).cast(out)
        }
    }
}

/// Batched `a · b` on bf16-rounded operands with f32 sums ([`bf16::gemm_batched`]; its
/// backward rounds the output gradient too). Burn's matmul on rounded operands where the
/// tensors are not Flex f32 or the leading dimensions differ (broadcasting).
///
/// # Shapes
/// - a: `[.., m, k]`, b: `[.., k, n]` (the same leading dimensions) → `[.., m, n]`
pub(crate) fn matmul_bf16<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> Tensor<D> {
    let fallback =
        |a: Tensor<D>, b: Tensor<D>| round_half(a, DType::BF16).matmul(round_half(b, DType::BF16));
    let (da, db) = (a.dims(), b.dims());
    if D < 2 || da[..D - 2] != db[..D - 2] || b.dtype() != DType::F32 {
        return fallback(a, b);
    }
    match route(a) {
        Route::Flex(p) => match b.clone().try_into_primitive::<Flex>() {
            Ok(bp) => Tensor::from_primitive::<Flex>(flex::bmm_bf16(p, bp)),
            Err(_) => fallback(Tensor::from_primitive::<Flex>(p), b),
        },
        Route::Autodiff(p) => match b.clone().try_into_primitive::<Ad>() {
            Ok(bp) => Tensor::from_primitive::<Ad>(autodiff::bmm_bf16::<NoCheckpointing>(p, bp)),
            Err(_) => fallback(Tensor::from_primitive::<Ad>(p), b),
        },
        Route::Checkpointed(p) => match b.clone().try_into_primitive::<AdCk>() {
            Ok(bp) => {
                Tensor::from_primitive::<AdCk>(autodiff::bmm_bf16::<BalancedCheckpointing>(p, bp))
            }
            Err(_) => fallback(Tensor::from_primitive::<AdCk>(p), b),
        },
        Route::Other(a) => fallback(a, b),
    }
}

/// Embedding lookup: rows `ids` of `table`. Its gradient is a scatter-add of the output
/// gradient into the touched rows of a zeroed table.
///
/// # Shapes
/// - table: `[vocab, n]`; ids: `[batch, seq]` → `[batch, seq, n]`
pub fn embedding(table: Tensor<2>, ids: Tensor<2, Int>) -> Tensor<3> {
    let [batch, seq] = ids.dims();
    // Int primitives are Flex tensors on both the plain and the autodiff device.
    let index = |ids: Tensor<2, Int>| -> Option<Vec<usize>> {
        let p = ids
            .clone()
            .try_into_primitive::<Flex>()
            .or_else(|_| ids.clone().try_into_primitive::<Ad>())
            .or_else(|_| ids.try_into_primitive::<AdCk>())
            .ok()?;
        Some(flex::indices(&p))
    };
    match route(table) {
        Route::Flex(p) => match index(ids.clone()) {
            Some(i) => Tensor::from_primitive::<Flex>(flex::embedding(&p, &i, batch, seq)),
            None => reference::embedding(Tensor::from_primitive::<Flex>(p), ids),
        },
        Route::Autodiff(p) => match index(ids.clone()) {
            Some(i) => Tensor::from_primitive::<Ad>(autodiff::embedding::<NoCheckpointing>(
                p, i, batch, seq,
            )),
            None => reference::embedding(Tensor::from_primitive::<Ad>(p), ids),
        },
        Route::Checkpointed(p) => match index(ids.clone()) {
            Some(i) => Tensor::from_primitive::<AdCk>(
                autodiff::embedding::<BalancedCheckpointing>(p, i, batch, seq),
            ),
            None => reference::embedding(Tensor::from_primitive::<AdCk>(p), ids),
        },
        Route::Other(t) => reference::embedding(t, ids),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-row product of plain Flex tensors takes the GEMV, against a weight (rows
    /// contiguous) and a transposed table (columns contiguous), and equals Burn's product of
    /// the same row within 1e-4.
    #[test]
    fn one_row_products_take_the_gemv_with_burns_values() {
        let dev = Device::flex();
        let values = |t: Tensor<2>| t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
        let (k, n) = (70, 300);
        let x = Tensor::<2>::from_data(
            TensorData::new((0..k).map(|i| (i as f32 * 0.37).sin()).collect(), [1, k]),
            &dev,
        );
        let w = Tensor::<2>::from_data(
            TensorData::new(
                (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect(),
                [k, n],
            ),
            &dev,
        );
        let table = w.clone().transpose().into_data();
        let table = Tensor::<2>::from_data(table, &dev).transpose();
        for b in [w, table] {
            let want = values(x.clone().matmul(b.clone()));
            let (Route::Flex(xp), Ok(bp)) =
                (route(x.clone()), b.clone().try_into_primitive::<Flex>())
            else {
                panic!("plain Flex f32 tensors")
            };
            let direct = values(Tensor::from_primitive::<Flex>(
                flex::matvec(xp, &bp).unwrap(),
            ));
            let got = values(matmul_f32(x.clone(), b.clone()));
            assert_eq!(got, direct, "matmul_f32 took the GEMV");
            let err = want
                .iter()
                .zip(&got)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(err < 1e-4, "{err}");
        }
    }

    /// The batched bf16 product (an attention core's): values and both gradients are the
    /// products of bf16-rounded operands (the output gradient rounded too) summed in f64, on
    /// 4-D tensors, for every path the CPU has that `bf16::gemm_batched` takes here.
    #[test]
    fn batched_bf16_products_and_their_gradients_round_every_operand() {
        let dev = Device::flex().autodiff();
        dev.seed(5);
        let dist = burn::tensor::Distribution::Normal(0.0, 1.0);
        let (bt, m, k, n) = (6, 5, 7, 4);
        let a = Tensor::<4>::random([2, 3, m, k], dist, &dev).require_grad();
        // b handed over as a transposed view, as the attention core's Kᵀ is.
        let b_t = Tensor::<4>::random([2, 3, n, k], dist, &dev).require_grad();
        let b = b_t.clone().swap_dims(2, 3);
        let w = Tensor::<4>::random([2, 3, m, n], dist, &dev);
        let y = matmul_bf16(a.clone(), b.clone());
        let grads = (y.clone() * w.clone()).sum().backward();
        let v = |t: Tensor<4>| t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
        let (av, bv, gv, yv) = (v(a.clone()), v(b.clone()), v(w), v(y));
        let da = v(a.grad(&grads).unwrap());
        let db = v(b_t.grad(&grads).unwrap().swap_dims(2, 3));
        use crate::bf16::tests::{assert_sum, bf};
        for t in 0..bt {
            let (a_, b_, g_) = (&av[t * m * k..], &bv[t * k * n..], &gv[t * m * n..]);
            for i in 0..m {
                for j in 0..n {
                    let terms = (0..k).map(|p| bf(a_[i * k + p]) * bf(b_[p * n + j]));
                    assert_sum(yv[t * m * n + i * n + j], terms, "y");
                }
                for p in 0..k {
                    let terms = (0..n).map(|j| bf(g_[i * n + j]) * bf(b_[p * n + j]));
                    assert_sum(da[t * m * k + i * k + p], terms, "da");
                }
            }
            for p in 0..k {
                for j in 0..n {
                    let terms = (0..m).map(|i| bf(a_[i * k + p]) * bf(g_[i * n + j]));
                    assert_sum(db[t * k * n + p * n + j], terms, "db");
                }
            }
        }
    }

    fn mask(seed: Option<u64>) -> Vec<f32> {
        let dev = Device::flex().autodiff();
        let x = Tensor::<2>::ones([4, 64], &dev).require_grad();
        let f = || {
            dropout(x.clone(), 0.5)
                .into_data()
                .try_to_vec::<f32>()
                .unwrap()
        };
        match seed {
            Some(s) => with_seed_stream(s, f),
            None => f(),
        }
    }

    #[test]
    fn seed_streams_give_reproducible_masks_independent_of_the_device_rng() {
        let a = mask(Some(11));
        Device::flex().autodiff().seed(1);
        let b = mask(Some(11));
        Device::flex().autodiff().seed(2);
        let c = mask(Some(11));
        assert_eq!(a, b);
        assert_eq!(a, c, "the device RNG does not matter inside a stream");
        assert_ne!(a, mask(Some(12)), "another stream, another mask");
        // Half the entries dropped (and the rest scaled by 2), roughly.
        let kept = a.iter().filter(|&&v| v == 2.0).count();
        assert!((96..=160).contains(&kept), "{kept} of 256 kept");
        assert!(
            SEED_STREAM.with(|c| c.get()).is_none(),
            "restored after the scope"
        );
    }
}
