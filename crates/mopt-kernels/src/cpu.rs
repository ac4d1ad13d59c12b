//! Slice kernels. Each public function splits its rows over rayon's pool and runs each chunk
//! under `pulp`'s runtime CPU dispatch, so the plain loops below are compiled (and
//! auto-vectorised) for AVX2+FMA or AVX-512 where the CPU has them, and for baseline x86-64
//! otherwise. Reductions keep `LANES` partial sums so that they vectorise without
//! reassociating floating-point additions behind the compiler's back.

use pulp::{Arch, Simd, WithSimd};
use rayon::prelude::*;

/// Partial sums per reduction (one AVX2 register of f32).
const LANES: usize = 8;
/// Elements per parallel task (below this, work stays on one thread).
const GRAIN: usize = 16 * 1024;

/// Defines a function whose body is compiled for the CPU's widest SIMD level: the body goes
/// into a `pulp::WithSimd` struct's `#[inline(always)]` method, which `pulp` inlines into its
/// AVX2 / AVX-512 functions. A closure handed to `pulp`'s dispatch cannot carry that
/// attribute, and a large one was not inlined there: softmax, LayerNorm, the backward passes
/// and BatchNorm ran as baseline SSE2 code (found with `perf annotate`; a function item passed
/// as a closure compiled the same way). Every kernel of this crate's element-wise passes goes
/// through here. Arguments with references name the lifetime `'a`.
macro_rules! simd_fn {
    (
        $(#[$m:meta])* $vis:vis fn $name:ident<'a>($($arg:ident: $ty:ty),* $(,)?)
        $(-> $ret:ty)? $body:block
    ) => {
        $(#[$m])*
        $vis fn $name<'a>($($arg: $ty),*) $(-> $ret)? {
            struct Kernel<'a> {
                $($arg: $ty,)*
                _life: std::marker::PhantomData<&'a ()>,
            }
            impl<'a> pulp::WithSimd for Kernel<'a> {
                type Output = simd_fn!(@out $($ret)?);
                #[inline(always)]
                fn with_simd<S: pulp::Simd>(self, _simd: S) -> Self::Output {
                    let Kernel { $($arg,)* _life } = self;
                    $body
                }
            }
            $crate::cpu::arch().dispatch(Kernel { $($arg,)* _life: std::marker::PhantomData })
        }
    };
    (@out) => { () };
    (@out $t:ty) => { $t };
}
pub(crate) use simd_fn;

/// `MOPT_SIMD=avx2`: every kernel of this crate on AVX2 (+FMA) although the CPU has AVX-512
/// (the element-wise passes, the transposes, the GEMM's tile and the convolutions), to
/// measure an AVX2-only machine where none is at hand. A proxy: the caches, the clock and the
/// core stay the AVX-512 machine's.
pub fn avx2_only() -> bool {
    static ONLY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ONLY.get_or_init(|| std::env::var("MOPT_SIMD").is_ok_and(|v| v == "avx2"))
}

/// The widest SIMD level the kernels dispatch to: `pulp`'s detection, capped at AVX2 by
/// [`avx2_only`]; decided once (every element-wise kernel call asks).
pub(crate) fn arch() -> Arch {
    static ARCH: std::sync::OnceLock<Arch> = std::sync::OnceLock::new();
    *ARCH.get_or_init(|| {
        #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
        if avx2_only() {
            if let Some(v) = pulp::x86::V3::try_new() {
                return Arch::V3(v);
            }
        }
        Arch::new()
    })
}

/// The AVX-512 level, when the CPU has it and [`avx2_only`] does not hide it.
#[cfg(target_arch = "x86_64")]
pub(crate) fn v4() -> Option<pulp::x86::V4> {
    pulp::x86::V4::try_new().filter(|_| !avx2_only())
}

/// `len` zeros for an output every element of which is written next, in parallel where the
/// `native` module is built (a serial `vec![0.0; len]` elsewhere).
pub(crate) fn zeros(len: usize) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    return crate::native::zeros(len);
    #[cfg(not(target_arch = "x86_64"))]
    return vec![0.0f32; len];
}

/// `m` copies of `row` one after the other, written once (in parallel where the `native`
/// module is built; `row.repeat(m)` elsewhere).
pub(crate) fn repeat_rows(row: &[f32], m: usize) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    return crate::native::repeat_rows(row, m);
    #[cfg(not(target_arch = "x86_64"))]
    return row.repeat(m);
}

/// Rows per parallel task for rows of `row_len` elements.
pub(crate) fn rows_per_task(row_len: usize) -> usize {
    (GRAIN / row_len.max(1)).max(1)
}

// ---------------------------------------------------------------------------------------------
// Elementary functions (branch-free, vectorisable)

const LOG2E: f32 = std::f32::consts::LOG2_E;

/// `exp(x)` (Cephes' single-precision polynomial after range reduction; relative error about
/// 2 ulp on [-87, 88]). Rounding and the power of two are done with the 1.5·2²³ trick and
/// integer bit operations, so the function vectorises even without SSE4.1's `round`.
///
/// Inputs below -87 give exactly 0, never a subnormal: a masked attention score (-10⁴) used to
/// give 1.6e-38, softmax turned it into subnormal probabilities, and every gradient through
/// them was subnormal too. Intel cores take a microcode assist on each subnormal operand (the
/// GEMM ran at 1 GFLOP/s instead of 150 on a Sapphire Rapids: a student step 12 s instead of
/// 0.8 s); true `exp` underflows there anyway.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 · 2^23
    let underflow = x < -87.0;
    let x = x.clamp(-87.0, 88.0);
    let t = x * LOG2E + MAGIC;
    let n = t - MAGIC;
    let r = x - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let mut y = 1.987_569_1e-4;
    y = y * r + 1.398_199_9e-3;
    y = y * r + 8.333_452e-3;
    y = y * r + 4.166_579_6e-2;
    y = y * r + 1.666_666_5e-1;
    y = y * r + 0.5;
    y = y * r * r + r + 1.0;
    let pow2 = (t.to_bits().wrapping_sub(0x4B40_0000).wrapping_add(127)) << 23;
    let e = y * f32::from_bits(pow2);
    if underflow {
        0.0
    } else {
        e
    }
}

/// `erf(x)`: a rational approximation on [-4, 4] (the form Eigen and XLA use for f32;
/// absolute error below 1e-6 against f64 `erf`, checked in the tests).
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = x2 * -2.726_142_3e-10 + 2.770_681_4e-8;
    p = p * x2 + -2.101_024e-6;
    p = p * x2 + -5.692_506_4e-5;
    p = p * x2 + -7.349_906_3e-4;
    p = p * x2 + -2.954_600_3e-3;
    p = p * x2 + -1.609_603_3e-2;
    p *= x;
    let mut q = x2 * -1.456_607_2e-5 + -2.133_740_6e-4;
    q = q * x2 + -1.682_827e-3;
    q = q * x2 + -7.373_329_3e-3;
    q = q * x2 + -1.426_474e-2;
    p / q
}

const FRAC_1_SQRT_2: f32 = std::f32::consts::FRAC_1_SQRT_2;
/// 1/√(2π)
const INV_SQRT_2PI: f32 = 0.398_942_3;

#[inline(always)]
fn gelu_one(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * FRAC_1_SQRT_2))
}

#[inline(always)]
fn gelu_grad_one(x: f32, g: f32) -> f32 {
    let cdf = 0.5 * (1.0 + erf(x * FRAC_1_SQRT_2));
    let pdf = INV_SQRT_2PI * exp(-0.5 * x * x);
    g * (cdf + x * pdf)
}

/// √(2/π)
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// The cubic term's weight in the tanh approximation.
const GELU_CUBIC: f32 = 0.044_715;

/// `tanh(u)` as `1 − 2 / (1 + e^{2u})` on [`exp`] (which saturates instead of overflowing).
#[inline(always)]
fn tanh(u: f32) -> f32 {
    1.0 - 2.0 / (1.0 + exp(2.0 * u))
}

/// The tanh approximation: `x/2 · (1 + tanh(√(2/π) (x + 0.044715 x³)))` (HF `gelu_new`, ONNX
/// Runtime's `FastGelu`).
#[inline(always)]
fn gelu_tanh_one(x: f32) -> f32 {
    let t = tanh(SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x));
    0.5 * x * (1.0 + t)
}

#[inline(always)]
fn gelu_tanh_grad_one(x: f32, g: f32) -> f32 {
    let x2 = x * x;
    let t = tanh(SQRT_2_OVER_PI * (x + GELU_CUBIC * x2 * x));
    let du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * x2);
    g * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du)
}

#[inline(always)]
fn sum(v: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let chunks = v.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            acc[i] += c[i];
        }
    }
    acc.iter().sum::<f32>() + tail.iter().sum::<f32>()
}

#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let ca = a.chunks_exact(LANES);
    let cb = b.chunks_exact(LANES);
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..LANES {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

simd_fn! {
    /// `c · c`.
    fn dot_self<'a>(c: &'a [f32]) -> f32 {
        dot(c, c)
    }
}

#[inline(always)]
fn max(v: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = v.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            acc[i] = if c[i] > acc[i] { c[i] } else { acc[i] };
        }
    }
    acc.iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m })
}

// ---------------------------------------------------------------------------------------------
// GELU

/// Which GELU the FFN computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GeluKind {
    /// The exact one, `x · Φ(x)` through `erf` (BERT's `hidden_act = "gelu"`).
    #[default]
    Erf,
    /// The tanh approximation (HF's `gelu_new`, ONNX Runtime's `FastGelu`): within 5e-4 of
    /// the exact one, and cheaper for a runtime that has no fast `erf`.
    Tanh,
}

/// `out = gelu(x)`.
pub fn gelu(x: &[f32], out: &mut [f32], kind: GeluKind) {
    let tanh = kind == GeluKind::Tanh;
    out.par_chunks_mut(GRAIN)
        .zip(x.par_chunks(GRAIN))
        .for_each(|(o, x)| gelu_chunk(x, o, tanh));
}

simd_fn! {
    fn gelu_chunk<'a>(x: &'a [f32], o: &'a mut [f32], tanh: bool) {
        // The branch sits outside the loops, so that each loop vectorises on its own.
        if tanh {
            for (o, &x) in o.iter_mut().zip(x) {
                *o = gelu_tanh_one(x);
            }
        } else {
            for (o, &x) in o.iter_mut().zip(x) {
                *o = gelu_one(x);
            }
        }
    }
}

/// `v ← gelu(v)` in place (an inference pass's intermediate, owned by nobody else).
pub fn gelu_in_place(v: &mut [f32], kind: GeluKind) {
    let tanh = kind == GeluKind::Tanh;
    v.par_chunks_mut(GRAIN)
        .for_each(|v| gelu_chunk_in_place(v, tanh));
}

simd_fn! {
    fn gelu_chunk_in_place<'a>(v: &'a mut [f32], tanh: bool) {
        if tanh {
            for x in v.iter_mut() {
                *x = gelu_tanh_one(*x);
            }
        } else {
            for x in v.iter_mut() {
                *x = gelu_one(*x);
            }
        }
    }
}

/// `g ← g · gelu'(x)` in place.
pub fn gelu_backward(x: &[f32], g: &mut [f32], kind: GeluKind) {
    let tanh = kind == GeluKind::Tanh;
    g.par_chunks_mut(GRAIN)
        .zip(x.par_chunks(GRAIN))
        .for_each(|(g, x)| gelu_backward_chunk(x, g, tanh));
}

simd_fn! {
    /// The body of [`gelu_backward`] for one chunk.
    fn gelu_backward_chunk<'a>(x: &'a [f32], g: &'a mut [f32], tanh: bool) {
        if tanh {
            for (g, &x) in g.iter_mut().zip(x) {
                *g = gelu_tanh_grad_one(x, *g);
            }
        } else {
            for (g, &x) in g.iter_mut().zip(x) {
                *g = gelu_grad_one(x, *g);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Softmax over rows of `n`

/// Row-wise softmax of `x` (rows of `n`) into `out`.
pub fn softmax(x: &[f32], out: &mut [f32], n: usize) {
    let per = rows_per_task(n) * n;
    out.par_chunks_mut(per)
        .zip(x.par_chunks(per))
        .for_each(|(o, x)| softmax_rows(x, o, n));
}

simd_fn! {
    /// [`softmax`] on whole rows.
    fn softmax_rows<'a>(x: &'a [f32], o: &'a mut [f32], n: usize) {
        for (o, x) in o.chunks_exact_mut(n).zip(x.chunks_exact(n)) {
            o.copy_from_slice(x);
            softmax_row(o);
        }
    }
}

/// One row's softmax, in place.
#[inline(always)]
fn softmax_row(o: &mut [f32]) {
    let m = max(o);
    for v in o.iter_mut() {
        *v = exp(*v - m);
    }
    let inv = 1.0 / sum(o);
    for v in o.iter_mut() {
        *v *= inv;
    }
}

/// Row-wise softmax of `v` (rows of `n`) in place.
pub fn softmax_in_place(v: &mut [f32], n: usize) {
    v.par_chunks_mut(rows_per_task(n) * n)
        .for_each(|c| softmax_rows_in_place(c, n));
}

simd_fn! {
    fn softmax_rows_in_place<'a>(v: &'a mut [f32], n: usize) {
        v.chunks_exact_mut(n).for_each(softmax_row);
    }
}

/// `g ← y ⊙ (g − Σ g⊙y)` per row, in place (the softmax vector-Jacobian product).
pub fn softmax_backward(y: &[f32], g: &mut [f32], n: usize) {
    softmax_backward_scaled(y, g, n, 1.0);
}

/// [`softmax_backward`] times `scale` (the gradient of `softmax(scale·x + bias)` w.r.t. `x`).
pub fn softmax_backward_scaled(y: &[f32], g: &mut [f32], n: usize, scale: f32) {
    let per = rows_per_task(n) * n;
    g.par_chunks_mut(per)
        .zip(y.par_chunks(per))
        .for_each(|(g, y)| softmax_backward_rows(y, g, n, scale));
}

/// Row-wise `softmax(scale·x + bias)` for `x` of rows of `n` (in place with `x = None`, on
/// `out`'s own values): `bias` holds one row of `n` per `rows_per_bias` consecutive rows (an
/// attention mask `[batch, 1, 1, n]` over scores `[batch, heads, rows, n]`: `heads·rows`).
pub fn softmax_biased(
    x: Option<&[f32]>,
    out: &mut [f32],
    (bias, rows_per_bias): (&[f32], usize),
    scale: f32,
    n: usize,
) {
    let rows = rows_per_task(n);
    out.par_chunks_mut(rows * n).enumerate().for_each(|(c, o)| {
        let x = x.map(|x| &x[c * rows * n..][..o.len()]);
        softmax_biased_rows(x, o, (bias, rows_per_bias, c * rows), scale, n);
    });
}

simd_fn! {
    /// [`softmax_biased`] on whole rows, the first being row `row0`.
    fn softmax_biased_rows<'a>(
        x: Option<&'a [f32]>,
        o: &'a mut [f32],
        bias: (&'a [f32], usize, usize),
        scale: f32,
        n: usize,
    ) {
        let (bias, rows_per_bias, row0) = bias;
        for (i, o) in o.chunks_exact_mut(n).enumerate() {
            let b = &bias[(row0 + i) / rows_per_bias * n..][..n];
            match x {
                Some(x) => {
                    for ((o, &x), &b) in o.iter_mut().zip(&x[i * n..][..n]).zip(b) {
                        *o = x * scale + b;
                    }
                }
                None => {
                    for (o, &b) in o.iter_mut().zip(b) {
                        *o = *o * scale + b;
                    }
                }
            }
            softmax_row(o);
        }
    }
}

simd_fn! {
    /// [`softmax_backward`] on whole rows.
    fn softmax_backward_rows<'a>(y: &'a [f32], g: &'a mut [f32], n: usize, scale: f32) {
        for (g, y) in g.chunks_exact_mut(n).zip(y.chunks_exact(n)) {
            let s = dot(g, y);
            for (g, &y) in g.iter_mut().zip(y) {
                *g = scale * (y * (*g - s));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// LayerNorm over rows of `n`

#[inline(always)]
fn moments(x: &[f32], eps: f32) -> (f32, f32) {
    let n = x.len() as f32;
    let mean = sum(x) / n;
    let mut acc = [0.0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail: f32 = chunks
        .remainder()
        .iter()
        .map(|&v| (v - mean) * (v - mean))
        .sum();
    for c in chunks {
        for i in 0..LANES {
            let d = c[i] - mean;
            acc[i] += d * d;
        }
    }
    let var = (acc.iter().sum::<f32>() + tail) / n;
    (mean, 1.0 / (var + eps).sqrt())
}

/// `out = (x − mean) / √(var + eps) · gamma + beta` per row (biased variance, as PyTorch).
pub fn layer_norm(x: &[f32], gamma: &[f32], beta: &[f32], eps: f32, out: &mut [f32]) {
    let n = gamma.len();
    let per = rows_per_task(n) * n;
    out.par_chunks_mut(per)
        .zip(x.par_chunks(per))
        .for_each(|(o, x)| layer_norm_rows(x, gamma, beta, eps, o));
}

simd_fn! {
    /// [`layer_norm`] on whole rows.
    fn layer_norm_rows<'a>(
        x: &'a [f32],
        gamma: &'a [f32],
        beta: &'a [f32],
        eps: f32,
        o: &'a mut [f32],
    ) {
        let n = gamma.len();
        for (o, x) in o.chunks_exact_mut(n).zip(x.chunks_exact(n)) {
            o.copy_from_slice(x);
            normalize_row(o, (gamma, beta), eps);
        }
    }
}

/// One row's LayerNorm, in place.
#[inline(always)]
fn normalize_row(o: &mut [f32], (gamma, beta): (&[f32], &[f32]), eps: f32) {
    let (mean, rstd) = moments(o, eps);
    for i in 0..o.len() {
        o[i] = (o[i] - mean) * rstd * gamma[i] + beta[i];
    }
}

/// [`layer_norm`] of `v` in place.
pub fn layer_norm_in_place(v: &mut [f32], gamma: &[f32], beta: &[f32], eps: f32) {
    let n = gamma.len();
    v.par_chunks_mut(rows_per_task(n) * n)
        .for_each(|c| layer_norm_rows_in_place(c, (gamma, beta), eps));
}

simd_fn! {
    fn layer_norm_rows_in_place<'a>(v: &'a mut [f32], gb: (&'a [f32], &'a [f32]), eps: f32) {
        for o in v.chunks_exact_mut(gb.0.len()) {
            normalize_row(o, gb, eps);
        }
    }
}

/// `layer_norm(x + r)` per row into `out` (with `x = None`: `out` holds x and is overwritten):
/// the residual sum and the norm in one pass.
pub fn add_layer_norm(
    x: Option<&[f32]>,
    out: &mut [f32],
    r: &[f32],
    (gamma, beta): (&[f32], &[f32]),
    eps: f32,
) {
    let per = rows_per_task(gamma.len()) * gamma.len();
    out.par_chunks_mut(per).enumerate().for_each(|(c, o)| {
        let span = c * per..c * per + o.len();
        let x = x.map(|x| &x[span.clone()]);
        add_layer_norm_rows(x, o, &r[span], (gamma, beta), eps);
    });
}

simd_fn! {
    /// [`add_layer_norm`] on whole rows.
    fn add_layer_norm_rows<'a>(
        x: Option<&'a [f32]>,
        o: &'a mut [f32],
        r: &'a [f32],
        gb: (&'a [f32], &'a [f32]),
        eps: f32,
    ) {
        match x {
            Some(x) => {
                for ((o, &x), &r) in o.iter_mut().zip(x).zip(r) {
                    *o = x + r;
                }
            }
            None => {
                for (o, &r) in o.iter_mut().zip(r) {
                    *o += r;
                }
            }
        }
        for o in o.chunks_exact_mut(gb.0.len()) {
            normalize_row(o, gb, eps);
        }
    }
}

/// LayerNorm backward: `g` (upstream, rows of `n`) becomes `dx` in place; returns
/// (`dgamma`, `dbeta`), summed over rows.
pub fn layer_norm_backward(
    x: &[f32],
    gamma: &[f32],
    g: &mut [f32],
    eps: f32,
) -> (Vec<f32>, Vec<f32>) {
    let n = gamma.len();
    let per = rows_per_task(n) * n;
    let partials: Vec<(Vec<f32>, Vec<f32>)> = g
        .par_chunks_mut(per)
        .zip(x.par_chunks(per))
        .map(|(g, x)| layer_norm_backward_rows(x, gamma, g, eps))
        .collect();
    let mut dgamma = vec![0.0f32; n];
    let mut dbeta = vec![0.0f32; n];
    for (dg, db) in partials {
        for i in 0..n {
            dgamma[i] += dg[i];
            dbeta[i] += db[i];
        }
    }
    (dgamma, dbeta)
}

simd_fn! {
    /// [`layer_norm_backward`] on whole rows: their (`dgamma`, `dbeta`).
    fn layer_norm_backward_rows<'a>(
        x: &'a [f32],
        gamma: &'a [f32],
        g: &'a mut [f32],
        eps: f32,
    ) -> (Vec<f32>, Vec<f32>) {
        let n = gamma.len();
        let mut dgamma = vec![0.0f32; n];
        let mut dbeta = vec![0.0f32; n];
        let mut xhat = vec![0.0f32; n];
        let mut gg = vec![0.0f32; n];
        for (g, x) in g.chunks_exact_mut(n).zip(x.chunks_exact(n)) {
            let (mean, rstd) = moments(x, eps);
            for i in 0..n {
                xhat[i] = (x[i] - mean) * rstd;
                gg[i] = g[i] * gamma[i];
                dgamma[i] += g[i] * xhat[i];
                dbeta[i] += g[i];
            }
            let a = sum(&gg) / n as f32;
            let b = dot(&gg, &xhat) / n as f32;
            for i in 0..n {
                g[i] = rstd * (gg[i] - a - xhat[i] * b);
            }
        }
        (dgamma, dbeta)
    }
}

// ---------------------------------------------------------------------------------------------
// Embedding

/// Gather rows `ids` of `table` (rows of `n`) into `out`.
pub fn embedding(table: &[f32], ids: &[usize], n: usize, out: &mut [f32]) {
    out.par_chunks_mut(rows_per_task(n) * n)
        .zip(ids.par_chunks(rows_per_task(n)))
        .for_each(|(o, ids)| {
            for (o, &id) in o.chunks_exact_mut(n).zip(ids) {
                o.copy_from_slice(&table[id * n..(id + 1) * n]);
            }
        });
}

/// Scatter-add the rows of `g` into a zeroed `[vocab, n]` gradient at rows `ids`. The zeroed
/// buffer comes from the allocator's zeroed pages, so only touched rows cost work here.
pub fn embedding_backward(ids: &[usize], g: &[f32], vocab: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; vocab * n];
    scatter_add_rows(ids, g, &mut out, n);
    out
}

simd_fn! {
    /// `out[id] += row` for each id and row of `g` (rows of `n`).
    fn scatter_add_rows<'a>(ids: &'a [usize], g: &'a [f32], out: &'a mut [f32], n: usize) {
        for (&id, row) in ids.iter().zip(g.chunks_exact(n)) {
            let dst = &mut out[id * n..(id + 1) * n];
            for (d, &s) in dst.iter_mut().zip(row) {
                *d += s;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Dropout (counter-based mask: element i of a call with seed s is kept when
// hash(s, i) < keep · 2²⁴, so the backward pass regenerates the mask instead of storing it)

#[inline(always)]
fn fmix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

#[inline(always)]
fn kept(seed: u64, i: usize, threshold: u32) -> bool {
    let lo = seed as u32;
    let hi = (seed >> 32) as u32;
    let h = fmix32(fmix32((i as u32).wrapping_mul(0x9e37_79b9) ^ lo) ^ hi);
    (h >> 8) < threshold
}

fn threshold(keep: f32) -> u32 {
    (keep as f64 * (1u64 << 24) as f64) as u32
}

/// `out = x · mask / keep` with the mask of `seed` (see above).
pub fn dropout(x: &[f32], out: &mut [f32], seed: u64, keep: f32) {
    let t = threshold(keep);
    let scale = 1.0 / keep;
    out.par_chunks_mut(GRAIN)
        .zip(x.par_chunks(GRAIN))
        .enumerate()
        .for_each(|(c, (o, x))| dropout_chunk(Some(x), o, (seed, c * GRAIN, t), scale));
}

simd_fn! {
    /// One chunk of [`dropout`] (`x = None`: of [`dropout_backward`], on `o`'s own values),
    /// its first element being element `base` of the whole.
    fn dropout_chunk<'a>(
        x: Option<&'a [f32]>,
        o: &'a mut [f32],
        mask: (u64, usize, u32),
        scale: f32,
    ) {
        let (seed, base, t) = mask;
        let keep = |j: usize, v: f32| if kept(seed, base + j, t) { v * scale } else { 0.0 };
        match x {
            Some(x) => {
                for (j, (o, &x)) in o.iter_mut().zip(x).enumerate() {
                    *o = keep(j, x);
                }
            }
            None => {
                for (j, o) in o.iter_mut().enumerate() {
                    *o = keep(j, *o);
                }
            }
        }
    }
}

/// `g ← g · mask / keep` in place, the mask regenerated from `seed`.
pub fn dropout_backward(g: &mut [f32], seed: u64, keep: f32) {
    let t = threshold(keep);
    let scale = 1.0 / keep;
    g.par_chunks_mut(GRAIN)
        .enumerate()
        .for_each(|(c, g)| dropout_chunk(None, g, (seed, c * GRAIN, t), scale));
}

// ---------------------------------------------------------------------------------------------
// Attention core: softmax(QKᵀ·scale + mask) → dropout → ·V, per (batch, head), reading the
// heads straight out of the `[batch·seq, heads·d]` projections (no split or merge copies).

/// Shape of an attention call.
#[derive(Debug, Clone, Copy)]
pub struct Attn {
    /// Sequences in the batch.
    pub batch: usize,
    /// Tokens a sequence.
    pub seq: usize,
    /// Attention heads.
    pub heads: usize,
    /// Width of one head.
    pub head_size: usize,
    /// `1/√head_size`
    pub scale: f32,
    /// Dropout keep probability on the attention probabilities (1 = no dropout).
    pub keep: f32,
    /// Seed of the dropout mask.
    pub seed: u64,
}

impl Attn {
    fn width(&self) -> usize {
        self.heads * self.head_size
    }
}

#[inline(always)]
fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// Head `h` of token rows `[seq, w]` of one batch element, transposed to `[d, seq]`.
#[inline(always)]
fn head_t(rows: &[f32], a: &Attn, h: usize, out: &mut [f32]) {
    let (s, d, w) = (a.seq, a.head_size, a.width());
    for j in 0..s {
        for c in 0..d {
            out[c * s + j] = rows[j * w + h * d + c];
        }
    }
}

/// One batch element of the forward pass (a struct, not a closure, so that `pulp` compiles it
/// inline in its AVX2/AVX-512 context).
struct AttnForward<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    mask: &'a [f32],
    b: usize,
    a: Attn,
    ctx: &'a mut [f32],
    probs: &'a mut [f32],
}

impl WithSimd for AttnForward<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, _simd: S) {
        let AttnForward {
            q: qb,
            k: kb,
            v: vb,
            mask: mb,
            b,
            a,
            ctx,
            probs,
        } = self;
        let (s, d, w, hn) = (a.seq, a.head_size, a.width(), a.heads);
        let t = threshold(a.keep);
        let inv_keep = 1.0 / a.keep;
        let mut kt = vec![0.0f32; d * s];
        let mut pd = vec![0.0f32; s];
        for h in 0..hn {
            head_t(kb, &a, h, &mut kt);
            for i in 0..s {
                let p = &mut probs[(h * s + i) * s..(h * s + i + 1) * s];
                p.copy_from_slice(mb);
                let qi = &qb[i * w + h * d..i * w + h * d + d];
                for c in 0..d {
                    axpy(p, qi[c] * a.scale, &kt[c * s..(c + 1) * s]);
                }
                let m = max(p);
                for x in p.iter_mut() {
                    *x = exp(*x - m);
                }
                let inv = 1.0 / sum(p);
                for x in p.iter_mut() {
                    *x *= inv;
                }
                let base = ((b * hn + h) * s + i) * s;
                if a.keep >= 1.0 {
                    pd.copy_from_slice(p);
                } else {
                    for j in 0..s {
                        pd[j] = if kept(a.seed, base + j, t) {
                            p[j] * inv_keep
                        } else {
                            0.0
                        };
                    }
                }
                let out = &mut ctx[i * w + h * d..i * w + h * d + d];
                for j in 0..s {
                    axpy(out, pd[j], &vb[j * w + h * d..j * w + h * d + d]);
                }
            }
        }
    }
}

/// Forward. `q`, `k`, `v`: `[batch·seq, heads·d]`; `mask`: `[batch, seq]` additive key bias.
/// Returns the context `[batch·seq, heads·d]` and the probabilities `[batch, heads, seq, seq]`
/// (before dropout).
pub fn attention(q: &[f32], k: &[f32], v: &[f32], mask: &[f32], a: Attn) -> (Vec<f32>, Vec<f32>) {
    let (s, w, hn) = (a.seq, a.width(), a.heads);
    let mut ctx = vec![0.0f32; a.batch * s * w];
    let mut probs = vec![0.0f32; a.batch * hn * s * s];
    ctx.par_chunks_mut(s * w)
        .zip(probs.par_chunks_mut(hn * s * s))
        .enumerate()
        .for_each(|(b, (ctx, probs))| {
            let rows = b * s * w..(b + 1) * s * w;
            arch().dispatch(AttnForward {
                q: &q[rows.clone()],
                k: &k[rows.clone()],
                v: &v[rows],
                mask: &mask[b * s..(b + 1) * s],
                b,
                a,
                ctx,
                probs,
            });
        });
    (ctx, probs)
}

struct AttnBackward<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    g: &'a [f32],
    probs: &'a [f32],
    b: usize,
    a: Attn,
    dq: &'a mut [f32],
    dk: &'a mut [f32],
    dv: &'a mut [f32],
}

impl WithSimd for AttnBackward<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, _simd: S) {
        let AttnBackward {
            q: qb,
            k: kb,
            v: vb,
            g: gb,
            probs,
            b,
            a,
            dq,
            dk,
            dv,
        } = self;
        let (s, d, w, hn) = (a.seq, a.head_size, a.width(), a.heads);
        let t = threshold(a.keep);
        let inv_keep = 1.0 / a.keep;
        let mut vt = vec![0.0f32; d * s];
        let mut dp = vec![0.0f32; s];
        for h in 0..hn {
            head_t(vb, &a, h, &mut vt);
            for i in 0..s {
                let p = &probs[(h * s + i) * s..(h * s + i + 1) * s];
                let gi = &gb[i * w + h * d..i * w + h * d + d];
                // dPd = g_i · Vᵀ
                dp.fill(0.0);
                for c in 0..d {
                    axpy(&mut dp, gi[c], &vt[c * s..(c + 1) * s]);
                }
                let base = ((b * hn + h) * s + i) * s;
                for j in 0..s {
                    let m = if a.keep >= 1.0 {
                        1.0
                    } else if kept(a.seed, base + j, t) {
                        inv_keep
                    } else {
                        0.0
                    };
                    // dV_j += Pd_ij · g_i
                    let pdj = p[j] * m;
                    if pdj != 0.0 {
                        axpy(&mut dv[j * w + h * d..j * w + h * d + d], pdj, gi);
                    }
                    dp[j] *= m;
                }
                // Softmax backward, then the scale.
                let sdot = dot(&dp, p);
                for j in 0..s {
                    dp[j] = p[j] * (dp[j] - sdot) * a.scale;
                }
                let qi = &qb[i * w + h * d..i * w + h * d + d];
                for j in 0..s {
                    let ds = dp[j];
                    if ds != 0.0 {
                        let kj = &kb[j * w + h * d..j * w + h * d + d];
                        axpy(&mut dq[i * w + h * d..i * w + h * d + d], ds, kj);
                        axpy(&mut dk[j * w + h * d..j * w + h * d + d], ds, qi);
                    }
                }
            }
        }
    }
}

/// Backward: from `g` (= dL/dctx, `[batch·seq, heads·d]`) to (dq, dk, dv).
pub fn attention_backward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    probs: &[f32],
    g: &[f32],
    a: Attn,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (s, w, hn) = (a.seq, a.width(), a.heads);
    let n = a.batch * s * w;
    let (mut dq, mut dk, mut dv) = (vec![0.0f32; n], vec![0.0f32; n], vec![0.0f32; n]);
    dq.par_chunks_mut(s * w)
        .zip(dk.par_chunks_mut(s * w))
        .zip(dv.par_chunks_mut(s * w))
        .enumerate()
        .for_each(|(b, ((dq, dk), dv))| {
            let rows = b * s * w..(b + 1) * s * w;
            arch().dispatch(AttnBackward {
                q: &q[rows.clone()],
                k: &k[rows.clone()],
                v: &v[rows.clone()],
                g: &g[rows],
                probs: &probs[b * hn * s * s..(b + 1) * hn * s * s],
                b,
                a,
                dq,
                dk,
                dv,
            });
        });
    (dq, dk, dv)
}

// ---------------------------------------------------------------------------------------------
// Linear layers

/// Column sums of a row-major `rows × n` matrix (the bias gradient).
pub fn column_sums(g: &[f32], n: usize) -> Vec<f32> {
    let per = rows_per_task(n) * n;
    let partials: Vec<Vec<f32>> = g.par_chunks(per).map(|c| column_sums_rows(c, n)).collect();
    let mut out = vec![0.0f32; n];
    for p in partials {
        for (o, v) in out.iter_mut().zip(p) {
            *o += v;
        }
    }
    out
}

simd_fn! {
    /// [`column_sums`] of whole rows.
    fn column_sums_rows<'a>(c: &'a [f32], n: usize) -> Vec<f32> {
        let mut acc = vec![0.0f32; n];
        for row in c.chunks_exact(n) {
            for (a, &v) in acc.iter_mut().zip(row) {
                *a += v;
            }
        }
        acc
    }
}

/// `out = x · w + b` for row-major `x: [m, k]`, `w: [k, n]`, `b: [n]`.
pub fn linear(
    x: &[f32],
    w: &[f32],
    b: &[f32],
    (m, k, n): (usize, usize, usize),
    bf16: bool,
) -> Vec<f32> {
    // The bias in every row, written once (no zeroing first), then C += x·w.
    let mut out = repeat_rows(b, m);
    product(
        bf16,
        crate::gemm::View::row_major(x, m, k),
        crate::gemm::View::row_major(w, k, n),
        &mut out,
        true,
    );
    out
}

/// `C (+)= A·B` in f32, or with `bf16` on bf16-rounded operands ([`crate::bf16::gemm`]).
fn product(bf16: bool, a: crate::gemm::View, b: crate::gemm::View, c: &mut [f32], beta_one: bool) {
    if bf16 {
        crate::bf16::gemm(a, b, c, beta_one);
    } else {
        crate::gemm::sgemm(a, b, c, 1.0, beta_one);
    }
}

/// (dx, dw, db), each present when asked for.
pub type LinearGrads = (Option<Vec<f32>>, Option<Vec<f32>>, Option<Vec<f32>>);

/// Gradients of `x · w + b` from the output gradient `g: [m, n]`: (dx = g·wᵀ, dw = xᵀ·g,
/// db = Σ rows of g); each only when asked for. With `bf16`, both products round their
/// operands (g included) to bf16, as autocast's backward does.
pub fn linear_backward(
    x: &[f32],
    w: &[f32],
    g: &[f32],
    (m, k, n): (usize, usize, usize),
    (want_dx, want_dw, want_db): (bool, bool, bool),
    bf16: bool,
) -> LinearGrads {
    use crate::gemm::View;
    let gv = View::row_major(g, m, n);
    let dx = want_dx.then(|| {
        let mut dx = zeros(m * k);
        product(bf16, gv, View::row_major(w, k, n).t(), &mut dx, false);
        dx
    });
    let dw = want_dw.then(|| {
        let mut dw = zeros(k * n);
        product(bf16, View::row_major(x, m, k).t(), gv, &mut dw, false);
        dw
    });
    let db = want_db.then(|| column_sums(g, n));
    (dx, dw, db)
}

// ---------------------------------------------------------------------------------------------
// Optimizer and clipping

/// One AdamW step's constants (Burn's `AdamW` formula, term for term).
#[derive(Debug, Clone, Copy)]
pub struct AdamWStep {
    /// Learning rate of this step.
    pub lr: f32,
    /// Decay of the first moment.
    pub beta_1: f32,
    /// Decay of the second moment.
    pub beta_2: f32,
    /// Added to the second moment's square root.
    pub epsilon: f32,
    /// `1 − lr·weight_decay`
    pub decay: f32,
    /// `1 − β₁ᵗ`
    pub correction_1: f32,
    /// `1 − β₂ᵗ`
    pub correction_2: f32,
}

/// AdamW in one pass: `m ← β₁m + (1−β₁)g`, `v ← β₂v + (1−β₂)g²`,
/// `p ← p·decay − lr · (m/c₁) / (√(v/c₂) + ε)`.
pub fn adamw(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], s: AdamWStep) {
    let (f1, f2) = (1.0 - s.beta_1, 1.0 - s.beta_2);
    p.par_chunks_mut(GRAIN)
        .zip(g.par_chunks(GRAIN))
        .zip(m.par_chunks_mut(GRAIN))
        .zip(v.par_chunks_mut(GRAIN))
        .for_each(|(((p, g), m), v)| adamw_chunk(p, g, (m, v), (s, f1, f2)));
}

simd_fn! {
    /// One chunk of [`adamw`] (`f1 = 1 − β₁`, `f2 = 1 − β₂`).
    fn adamw_chunk<'a>(
        p: &'a mut [f32],
        g: &'a [f32],
        mv: (&'a mut [f32], &'a mut [f32]),
        step: (AdamWStep, f32, f32),
    ) {
        let ((m, v), (s, f1, f2)) = (mv, step);
        for i in 0..p.len() {
            let gi = g[i];
            let mi = m[i] * s.beta_1 + gi * f1;
            let vi = v[i] * s.beta_2 + gi * gi * f2;
            m[i] = mi;
            v[i] = vi;
            let delta = (mi / s.correction_1) / ((vi / s.correction_2).sqrt() + s.epsilon);
            p[i] = p[i] * s.decay - delta * s.lr;
        }
    }
}

/// Σx² in f64 (partial sums in f32 lanes per chunk), the chunks added in order: the same
/// bits whatever the threads did (rayon's own `sum` associates as its work-stealing splits
/// fall, which made gradient clipping, and so training, differ run to run).
pub fn sum_squares(x: &[f32]) -> f64 {
    let parts: Vec<f64> = x.par_chunks(GRAIN).map(|c| dot_self(c) as f64).collect();
    parts.iter().sum()
}

/// `x ← x · factor` in place.
pub fn scale(x: &mut [f32], factor: f32) {
    x.par_chunks_mut(GRAIN).for_each(|c| scale_chunk(c, factor));
}

simd_fn! {
    fn scale_chunk<'a>(c: &'a mut [f32], factor: f32) {
        for v in c.iter_mut() {
            *v *= factor;
        }
    }
}

/// `x ← bf16(x)` in place, kept in f32 ([`crate::bf16::to_bf16`]: round to nearest, ties to
/// even, overflow to ±inf, NaN stays NaN).
pub fn round_bf16(x: &mut [f32]) {
    x.par_chunks_mut(GRAIN).for_each(round_bf16_chunk);
}

simd_fn! {
    fn round_bf16_chunk<'a>(c: &'a mut [f32]) {
        for v in c.iter_mut() {
            *v = f32::from_bits((crate::bf16::to_bf16(*v) as u32) << 16);
        }
    }
}

/// `x ← f16(x)` in place, kept in f32: round to nearest, ties to even, to 11 significant bits
/// in f16's normal range, to multiples of 2^-24 below it (f16's subnormals), ±inf from 65520 up
/// (what `half::f16::from_f32` gives; NaN stays NaN).
pub fn round_f16(x: &mut [f32]) {
    x.par_chunks_mut(GRAIN).for_each(round_f16_chunk);
}

simd_fn! {
    fn round_f16_chunk<'a>(c: &'a mut [f32]) {
        for v in c.iter_mut() {
            let b = v.to_bits();
            let sign = b & 0x8000_0000;
            let a = f32::from_bits(b & 0x7FFF_FFFF);
            let normal = (b & 0x7FFF_FFFF).wrapping_add(0xFFF + ((b >> 13) & 1)) & 0x7FFF_E000;
            // Below 2^-14, f32's own rounding of a + 0.5 lands on a multiple of 2^-24.
            let sub = ((a + 0.5) - 0.5).to_bits();
            let mag = if a.is_nan() {
                (b & 0x7FFF_FFFF) | 0x0040_0000
            } else if a >= 65520.0 {
                0x7F80_0000
            } else if a < 6.103_515_6e-5 {
                sub
            } else {
                normal
            };
            *v = f32::from_bits(sign | mag);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `round` on `vals` is bit for bit Burn's cast to `low` and back (the `half` crate's
    /// conversion), NaN for NaN.
    fn assert_rounds_like_burns_cast(
        vals: &[f32],
        round: fn(&mut [f32]),
        low: burn::tensor::DType,
    ) {
        let t = burn::prelude::Tensor::<1>::from_data(
            burn::prelude::TensorData::new(vals.to_vec(), [vals.len()]),
            &burn::prelude::Device::flex(),
        );
        let want: Vec<f32> = t
            .cast(low)
            .cast(burn::tensor::DType::F32)
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        let mut got = vals.to_vec();
        round(&mut got);
        for ((g, w), v) in got.iter().zip(&want).zip(vals) {
            assert!(
                g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                "{low:?} {v:e}: {g:e} vs {w:e}"
            );
        }
    }

    #[test]
    fn f16_rounding_matches_burns_cast_on_subnormals_overflow_and_nan() {
        let mut vals: Vec<f32> = vec![
            0.0,
            -0.0,
            1.0,
            1.0 + 1.0 / 2048.0,
            1.0 + 3.0 / 2048.0,
            65504.0,
            65519.0,
            65520.0,
            -70000.0,
            6.1035156e-5,
            6.1e-5,
            2.9802322e-8,
            5.9604645e-8,
            8.940_697e-8,
            1e-9,
            f32::INFINITY,
            -f32::INFINITY,
        ];
        let mut state = 11u64;
        vals.extend((0..20_000).map(|i| {
            state = crate::splitmix64(state);
            // Random bits, and random values around f16's range.
            if i % 2 == 0 {
                f32::from_bits(state as u32)
            } else {
                let e = (state >> 40) as i32 % 44 - 28;
                (state as u32 as f32 / u32::MAX as f32 - 0.5) * 2f32.powi(e)
            }
        }));
        assert_rounds_like_burns_cast(&vals, round_f16, burn::tensor::DType::F16);
    }

    #[test]
    fn bf16_rounding_matches_burns_cast_on_ties_infinities_and_nan() {
        let mut vals: Vec<f32> = vec![
            0.0,
            -0.0,
            1.0,
            1.0 + 1.0 / 256.0,
            1.0 + 3.0 / 256.0,
            1.0 + 1.0 / 512.0,
            -2.5e-39,
            3.3895e38,
            3.4e38,
            f32::MAX,
            f32::INFINITY,
            -f32::INFINITY,
            1e-40,
        ];
        let mut state = 9u64;
        vals.extend((0..10_000).map(|_| {
            state = crate::splitmix64(state);
            f32::from_bits(state as u32)
        }));
        assert_rounds_like_burns_cast(&vals, round_bf16, burn::tensor::DType::BF16);
    }

    fn erf64(x: f64) -> f64 {
        // Abramowitz–Stegun 7.1.26 is too coarse for a reference; integrate instead.
        let n = 20_000;
        let h = x / n as f64;
        let f = |t: f64| (-t * t).exp();
        let mut s = f(0.0) + f(x);
        for i in 1..n {
            s += f(i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 };
        }
        s * h / 3.0 * 2.0 / std::f64::consts::PI.sqrt()
    }

    #[test]
    fn exp_and_erf_are_accurate() {
        for i in -800..=800 {
            let x = i as f32 * 0.01;
            let e = exp(x) as f64;
            let want = (x as f64).exp();
            assert!(((e - want) / want).abs() < 3e-7, "exp({x}) = {e} vs {want}");
        }
        // Below the underflow threshold: exactly 0, never a subnormal (see `exp`).
        for x in [-87.01f32, -88.0, -103.0, -200.0, -10000.0, f32::MIN] {
            assert_eq!(exp(x), 0.0, "exp({x})");
        }
        for x in [-86.99f32, -80.0] {
            let e = exp(x);
            assert!(
                e.is_normal() && (e as f64 / (x as f64).exp() - 1.0).abs() < 1e-6,
                "exp({x}) = {e}"
            );
        }
        for i in -600..=600 {
            let x = i as f32 * 0.01;
            let got = erf(x) as f64;
            let want = erf64(x as f64);
            assert!((got - want).abs() < 1e-6, "erf({x}) = {got} vs {want}");
        }
    }

    #[test]
    fn dropout_keeps_the_requested_fraction_and_backward_uses_the_same_mask() {
        let n = 200_000;
        let x = vec![1.0f32; n];
        let mut y = vec![0.0f32; n];
        dropout(&x, &mut y, 12345, 0.9);
        let kept = y.iter().filter(|&&v| v != 0.0).count() as f64 / n as f64;
        assert!((kept - 0.9).abs() < 0.005, "kept {kept}");
        assert!(y.iter().all(|&v| v == 0.0 || (v - 1.0 / 0.9).abs() < 1e-6));
        let mut g = vec![1.0f32; n];
        dropout_backward(&mut g, 12345, 0.9);
        assert_eq!(g, y, "backward mask = forward mask");
        let mut other = vec![0.0f32; n];
        dropout(&x, &mut other, 54321, 0.9);
        assert_ne!(other, y, "another seed, another mask");
    }

    #[test]
    fn a_masked_softmax_and_its_gradient_hold_no_subnormals() {
        // One attention row with two padded keys (score − 10⁴, as BERT's mask bias adds): their
        // probabilities and gradients must be exactly 0, not subnormal (see `exp`).
        let x = [0.3f32, -1.2, 2.0, 0.7 - 10_000.0, -0.4 - 10_000.0, 1.1];
        let mut y = [0.0f32; 6];
        softmax(&x, &mut y, 6);
        assert_eq!((y[3], y[4]), (0.0, 0.0));
        let mut g = [0.5f32, -0.25, 1.0, 2.0, -3.0, 0.125];
        softmax_backward(&y, &mut g, 6);
        assert!(y.iter().chain(&g).all(|v| !v.is_subnormal()), "{y:?} {g:?}");
        assert_eq!((g[3], g[4]), (0.0, 0.0));
    }

    #[test]
    fn softmax_rows_sum_to_one_and_backward_is_the_jacobian_product() {
        let x: Vec<f32> = (0..24).map(|i| ((i * 7) % 11) as f32 * 0.3 - 1.0).collect();
        let mut y = vec![0.0; 24];
        softmax(&x, &mut y, 6);
        for r in y.chunks(6) {
            assert!((r.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        }
        // Finite differences of L = Σ w·softmax(x) for the first row.
        let w: Vec<f32> = (0..24).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut g = w.clone();
        softmax_backward(&y, &mut g, 6);
        let loss = |x: &[f32]| {
            let mut y = vec![0.0; 24];
            softmax(x, &mut y, 6);
            y.iter().zip(&w).map(|(a, b)| (a * b) as f64).sum::<f64>()
        };
        for i in 0..6 {
            let (mut xp, mut xm) = (x.clone(), x.clone());
            xp[i] += 1e-3;
            xm[i] -= 1e-3;
            let fd = (loss(&xp) - loss(&xm)) / 2e-3;
            assert!((fd - g[i] as f64).abs() < 1e-3, "d/dx{i}: {fd} vs {}", g[i]);
        }
    }
}
