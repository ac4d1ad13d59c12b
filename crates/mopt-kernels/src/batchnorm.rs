//! BatchNorm with batch statistics (training), forward and backward, for NCHW f32 tensors, with
//! an optional residual sum and ReLU in the same passes: one pass for the statistics (shifted
//! sums), one writing the output; two passes backward. Burn's
//! default composes each of them from transposes, reductions and broadcasts (about ten passes
//! over the activation and as many temporaries). Channels run in parallel; a channel's values
//! are `batch` contiguous runs of `height·width`.

use rayon::prelude::*;

use crate::cpu::simd_fn;

/// `[batch, channels, height·width]` of an NCHW tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BnShape {
    /// Images.
    pub batch: usize,
    /// Channels (each normalised on its own).
    pub channels: usize,
    /// Values a channel has in one image (`height·width`).
    pub plane: usize,
}

impl BnShape {
    /// The runs of channel `c`: `(start, len)` in the flat tensor, one an image.
    #[cfg(test)]
    fn runs(&self, c: usize) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
        (0..self.batch).map(move |n| {
            let start = (n * self.channels + c) * self.plane;
            start..start + self.plane
        })
    }

    fn count(&self) -> f64 {
        (self.batch * self.plane) as f64
    }
}

simd_fn! {
    /// `(Σ (v − shift), Σ (v − shift)²)` over one run, in 16 independent f32 lanes (so that
    /// it vectorizes), returned in f64.
    fn shifted_sums<'a>(v: &'a [f32], shift: f32) -> (f64, f64) {
        let (mut s1, mut s2) = ([0.0f32; 16], [0.0f32; 16]);
        let mut chunks = v.chunks_exact(16);
        for c in &mut chunks {
            for l in 0..16 {
                let d = c[l] - shift;
                s1[l] += d;
                s2[l] += d * d;
            }
        }
        let (mut t1, mut t2) = (0.0f64, 0.0f64);
        for &x in chunks.remainder() {
            let d = (x - shift) as f64;
            t1 += d;
            t2 += d * d;
        }
        let sum = |a: [f32; 16]| a.iter().map(|&v| v as f64).sum::<f64>();
        (sum(s1) + t1, sum(s2) + t2)
    }
}

/// Per-channel (mean, biased variance) of `x`: one pass of shifted sums (shifted by the
/// channel's first value, so that a large mean does not cancel the variance away), in memory
/// order (each image's run of a channel summed in f32 lanes, in parallel), the runs then added
/// per channel in f64. (Channel by channel, the pass jumped between 64 runs far apart and ran
/// at a third of the speed.)
fn statistics(x: &[f32], s: &BnShape) -> (Vec<f32>, Vec<f32>) {
    let shift: Vec<f32> = (0..s.channels).map(|c| x[c * s.plane]).collect();
    let partial: Vec<(f64, f64)> = x
        .par_chunks(s.plane)
        .enumerate()
        .map(|(i, run)| shifted_sums(run, shift[i % s.channels]))
        .collect();
    let (mut sum, mut sq) = (vec![0.0f64; s.channels], vec![0.0f64; s.channels]);
    for (i, (a, b)) in partial.iter().enumerate() {
        sum[i % s.channels] += a;
        sq[i % s.channels] += b;
    }
    (0..s.channels)
        .map(|c| {
            let mean = sum[c] / s.count();
            let var = (sq[c] / s.count() - mean * mean).max(0.0);
            ((mean + shift[c] as f64) as f32, var as f32)
        })
        .unzip()
}

/// The forward pass with the batch's statistics, `y = γ·(x − μ)/√(σ² + ε) + β` per channel,
/// followed by `+ residual` (when given) and ReLU (when `relu`) in the same pass. Returns
/// `(y, μ, σ²)` (σ² biased, what running statistics are fed).
pub fn forward_fused(
    x: &[f32],
    (gamma, beta): (&[f32], &[f32]),
    eps: f32,
    (residual, relu): (Option<&[f32]>, bool),
    s: &BnShape,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (mean, var) = statistics(x, s);
    let y = normalize(x, (gamma, beta), (&mean, &var), eps, (residual, relu), s);
    (y, mean, var)
}

/// `γ·(x − μ)/√(σ² + ε) + β (+ residual)`, then ReLU when `relu`, with the given per-channel
/// statistics (the batch's in training, the running ones in inference): one pass.
pub fn normalize(
    x: &[f32],
    (gamma, beta): (&[f32], &[f32]),
    (mean, var): (&[f32], &[f32]),
    eps: f32,
    (residual, relu): (Option<&[f32]>, bool),
    s: &BnShape,
) -> Vec<f32> {
    let mut y = vec![0.0f32; x.len()];
    // The backward's `Mask::Input` recomputes the sign of `a·x + b` with these same values.
    let coef = coefficients((gamma, beta), (mean, var), eps, s.channels);
    let floor = if relu { 0.0 } else { f32::NEG_INFINITY };
    y.par_chunks_mut(s.plane)
        .zip(x.par_chunks(s.plane))
        .enumerate()
        .for_each(|(i, (yo, xi))| {
            let r = residual.map(|r| &r[i * s.plane..][..s.plane]);
            normalize_run(yo, xi, r, coef[i % s.channels], floor);
        });
    y
}

simd_fn! {
    /// [`normalize`] over one run: `max(a·x + b (+ r), floor)`.
    pub(crate) fn normalize_run<'a>(
        yo: &'a mut [f32],
        xi: &'a [f32],
        residual: Option<&'a [f32]>,
        ab: (f32, f32),
        floor: f32,
    ) {
        let (a, b) = ab;
        match residual {
            Some(r) => {
                for ((o, &v), &rv) in yo.iter_mut().zip(xi).zip(r) {
                    *o = (a * v + b + rv).max(floor);
                }
            }
            None => {
                for (o, &v) in yo.iter_mut().zip(xi) {
                    *o = (a * v + b).max(floor);
                }
            }
        }
    }
}

/// What masks the gradient of a BatchNorm that ended in ReLU.
#[derive(Debug, Clone, Copy)]
pub enum Mask<'a> {
    /// No ReLU: nothing masked.
    None,
    /// `[y > 0]` from the forward output `y` (needed when a residual was added before the
    /// ReLU).
    Output(&'a [f32]),
    /// `[γ·x̂ + β > 0]` recomputed from the input with the forward's own coefficients
    /// (exactly its pre-activation when no residual was added): the output is never read.
    Input,
}

/// Gradients of [`forward_fused`] from the output gradient `g`: `(dx, dγ, dβ)`, with
/// `x̂ = (x − μ)·r`, `r = 1/√(σ² + ε)`, `dβ = Σ gm`, `dγ = Σ gm·x̂` and
/// `dx = γ·r·(gm − dβ/M − x̂·dγ/M)` (M values a channel, `gm` the gradient masked by `mask`).
///
/// Two passes. With `keep` (a residual needs `gm`), `g` is overwritten by `gm` in the first and
/// `dx` is returned; without it, nothing is written in the first, and `g` is overwritten by
/// `dx` in the second (`None` returned: no output to allocate).
pub fn backward<'a>(
    x: &'a [f32],
    (gamma, beta): (&[f32], &[f32]),
    (mean, var): (&[f32], &[f32]),
    eps: f32,
    (g, mask, keep): (&mut [f32], Mask<'a>, bool),
    s: &BnShape,
) -> (Option<Vec<f32>>, Vec<f32>, Vec<f32>) {
    let plane = s.plane;
    let coef = coefficients((gamma, beta), (mean, var), eps, s.channels);
    // The mask's source for run `i` and the affine map whose sign decides it.
    let pre = |i: usize, xp: &'a [f32]| -> Option<(&'a [f32], (f32, f32))> {
        match mask {
            Mask::None => None,
            Mask::Output(y) => Some((&y[i * plane..(i + 1) * plane], (1.0, 0.0))),
            Mask::Input => Some((xp, coef[i % s.channels])),
        }
    };
    // Per-plane sums (Σ gm, Σ gm·(x − μ)), masking g on the way when it is kept.
    let partial: Vec<(f64, f64)> = g
        .par_chunks_mut(plane)
        .zip(x.par_chunks(plane))
        .enumerate()
        .map(|(i, (gp, xp))| plane_sums(gp, xp, mean[i % s.channels], pre(i, xp), keep))
        .collect();
    let inv: Vec<f32> = var.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
    let (mut dbeta, mut dgamma) = (vec![0.0f64; s.channels], vec![0.0f64; s.channels]);
    for (i, (a, b)) in partial.iter().enumerate() {
        dbeta[i % s.channels] += a;
        dgamma[i % s.channels] += b;
    }
    let dgamma: Vec<f32> = dgamma
        .iter()
        .zip(&inv)
        .map(|(v, r)| (v * *r as f64) as f32)
        .collect();
    let dbeta: Vec<f32> = dbeta.iter().map(|&v| v as f32).collect();
    let m = s.count() as f32;
    // dx = k·gm + (k·r·dγ/M)·(μ − x) − k·dβ/M, with k = γ·r.
    let terms = |i: usize| {
        let c = i % s.channels;
        let k = gamma[c] * inv[c];
        (k, k * inv[c] * dgamma[c] / m, k * dbeta[c] / m, mean[c])
    };
    if keep {
        let mut dx = vec![0.0f32; x.len()];
        let g: &[f32] = g;
        dx.par_chunks_mut(plane).enumerate().for_each(|(i, d)| {
            let span = i * plane..(i + 1) * plane;
            input_grad(d, &g[span.clone()], &x[span], terms(i));
        });
        return (Some(dx), dgamma, dbeta);
    }
    g.par_chunks_mut(plane)
        .zip(x.par_chunks(plane))
        .enumerate()
        .for_each(|(i, (gp, xp))| {
            input_grad_in_place(gp, xp, terms(i), pre(i, xp));
        });
    (None, dgamma, dbeta)
}

simd_fn! {
    /// One run's `(Σ gm, Σ gm·(x − μ))`, masking `g` on the way when it is kept (`keep`).
    fn plane_sums<'a>(
        gp: &'a mut [f32],
        xp: &'a [f32],
        m: f32,
        pre: Option<(&'a [f32], (f32, f32))>,
        keep: bool,
    ) -> (f64, f64) {
        match pre {
            None => gradient_sums(gp, xp, m),
            Some((p, ab)) if keep => {
                apply_mask(gp, p, ab);
                gradient_sums(gp, xp, m)
            }
            Some((p, ab)) => masked_gradient_sums(gp, xp, m, (p, ab)),
        }
    }
}

/// The forward's per-channel affine map `(a, b)`: `γ·x̂ + β = a·x + b`.
pub(crate) fn coefficients(
    (gamma, beta): (&[f32], &[f32]),
    (mean, var): (&[f32], &[f32]),
    eps: f32,
    channels: usize,
) -> Vec<(f32, f32)> {
    (0..channels)
        .map(|c| {
            let a = gamma[c] / (var[c] + eps).sqrt();
            (a, beta[c] - a * mean[c])
        })
        .collect()
}

/// `g = 0` where `a·p + b ≤ 0` (or is NaN).
#[inline(always)]
fn apply_mask(g: &mut [f32], p: &[f32], (a, b): (f32, f32)) {
    for (gv, &pv) in g.iter_mut().zip(p) {
        *gv = keep_where(*gv, a * pv + b > 0.0);
    }
}

/// `v` where `on`, `+0.0` elsewhere, as a bitwise AND (a select of a float by a float
/// comparison did not vectorize: the masked sums ran at a third of the unmasked ones' speed).
#[inline(always)]
fn keep_where(v: f32, on: bool) -> f32 {
    f32::from_bits(v.to_bits() & u32::from(on).wrapping_neg())
}

/// One input gradient: `k·gm + a·(μ − x) − b` with `terms = (k, a, b, μ)`.
#[inline(always)]
fn dx_of(gm: f32, xv: f32, (k, a, b, mean): (f32, f32, f32, f32)) -> f32 {
    k * gm + a * (mean - xv) - b
}

simd_fn! {
    /// [`dx_of`] over one run into `d` (`g` already masked).
    fn input_grad<'a>(d: &'a mut [f32], g: &'a [f32], x: &'a [f32], terms: (f32, f32, f32, f32)) {
        for ((o, &gv), &xv) in d.iter_mut().zip(g).zip(x) {
            *o = dx_of(gv, xv, terms);
        }
    }
}

simd_fn! {
    /// [`input_grad`] written over `g`, masking it on the way when `pre` is given.
    fn input_grad_in_place<'a>(
        g: &'a mut [f32],
        x: &'a [f32],
        terms: (f32, f32, f32, f32),
        pre: Option<(&'a [f32], (f32, f32))>,
    ) {
        match pre {
            None => {
                for (gv, &xv) in g.iter_mut().zip(x) {
                    *gv = dx_of(*gv, xv, terms);
                }
            }
            Some((p, (pa, pb))) => {
                for ((gv, &xv), &pv) in g.iter_mut().zip(x).zip(p) {
                    *gv = dx_of(keep_where(*gv, pa * pv + pb > 0.0), xv, terms);
                }
            }
        }
    }
}

/// `(Σ g, Σ g·(x − μ))` over one run, in 16 f32 lanes, returned in f64.
#[inline(always)]
fn gradient_sums(g: &[f32], x: &[f32], mean: f32) -> (f64, f64) {
    let (mut s1, mut s2) = ([0.0f32; 16], [0.0f32; 16]);
    let full = g.len() / 16 * 16;
    for (gc, xc) in g[..full].chunks_exact(16).zip(x[..full].chunks_exact(16)) {
        for l in 0..16 {
            s1[l] += gc[l];
            s2[l] += gc[l] * (xc[l] - mean);
        }
    }
    let (mut t1, mut t2) = (0.0f64, 0.0f64);
    for (&gv, &xv) in g[full..].iter().zip(&x[full..]) {
        t1 += gv as f64;
        t2 += gv as f64 * (xv - mean) as f64;
    }
    let sum = |a: [f32; 16]| a.iter().map(|&v| v as f64).sum::<f64>();
    (sum(s1) + t1, sum(s2) + t2)
}

/// [`gradient_sums`] of `g` masked by `[a·p + b > 0]`, without writing it.
#[inline(always)]
fn masked_gradient_sums(
    g: &[f32],
    x: &[f32],
    mean: f32,
    (p, (a, b)): (&[f32], (f32, f32)),
) -> (f64, f64) {
    let (mut s1, mut s2) = ([0.0f32; 16], [0.0f32; 16]);
    let full = g.len() / 16 * 16;
    let chunks = g[..full].chunks_exact(16).zip(x[..full].chunks_exact(16));
    for ((gc, xc), pc) in chunks.zip(p[..full].chunks_exact(16)) {
        for l in 0..16 {
            let gv = keep_where(gc[l], a * pc[l] + b > 0.0);
            s1[l] += gv;
            s2[l] += gv * (xc[l] - mean);
        }
    }
    let (mut t1, mut t2) = (0.0f64, 0.0f64);
    for ((&gv, &xv), &pv) in g[full..].iter().zip(&x[full..]).zip(&p[full..]) {
        let gv = keep_where(gv, a * pv + b > 0.0);
        t1 += gv as f64;
        t2 += gv as f64 * (xv - mean) as f64;
    }
    let sum = |a: [f32; 16]| a.iter().map(|&v| v as f64).sum::<f64>();
    (sum(s1) + t1, sum(s2) + t2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 9) as f32 / 4194304.0
                    - 1.0
                    + (i % 3) as f32
            })
            .collect()
    }

    /// The definition in f64: output and `L = Σ y ⊙ r`.
    fn naive(x: &[f32], gamma: &[f32], beta: &[f32], s: &BnShape, r: &[f32]) -> (Vec<f64>, f64) {
        let eps = 1e-5f64;
        let mut y = vec![0.0f64; x.len()];
        for c in 0..s.channels {
            let vals: Vec<f64> = s
                .runs(c)
                .flat_map(|run| x[run].iter().map(|&v| v as f64))
                .collect();
            let mean = vals.iter().sum::<f64>() / vals.len() as f64;
            let var = vals.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / vals.len() as f64;
            for run in s.runs(c) {
                for i in run {
                    y[i] = gamma[c] as f64 * (x[i] as f64 - mean) / (var + eps).sqrt()
                        + beta[c] as f64;
                }
            }
        }
        let l = y.iter().zip(r).map(|(a, b)| a * *b as f64).sum();
        (y, l)
    }

    #[test]
    fn forward_and_gradients_match_the_definition() {
        let s = BnShape {
            batch: 3,
            channels: 4,
            plane: 5,
        };
        let n = s.batch * s.channels * s.plane;
        let (x, r) = (data(n, 1), data(n, 2));
        let gamma = vec![0.5f32, -1.5, 2.0, 1.0];
        let beta = vec![0.1f32, 0.0, -0.3, 2.0];
        let (y, mean, var) = forward_fused(&x, (&gamma, &beta), 1e-5, (None, false), &s);
        let (want, _) = naive(&x, &gamma, &beta, &s, &r);
        for (a, b) in y.iter().zip(&want) {
            assert!((*a as f64 - b).abs() < 1e-4, "{a} vs {b}");
        }
        let mut kept = r.clone();
        let gb = (gamma.as_slice(), beta.as_slice());
        let (dx, dgamma, dbeta) = backward(
            &x,
            gb,
            (&mean, &var),
            1e-5,
            (&mut kept, Mask::None, true),
            &s,
        );
        let dx = dx.expect("kept: dx returned");
        assert_eq!(kept, r, "without ReLU nothing is masked");
        // Not kept: the same gradients, dx written over g.
        let mut g = r.clone();
        let (none, dgamma2, dbeta2) =
            backward(&x, gb, (&mean, &var), 1e-5, (&mut g, Mask::None, false), &s);
        assert!(none.is_none());
        assert_eq!((&g, &dgamma2, &dbeta2), (&dx, &dgamma, &dbeta));
        let h = 1e-3f32;
        for i in 0..n {
            let (mut xp, mut xm) = (x.clone(), x.clone());
            xp[i] += h;
            xm[i] -= h;
            let fd = (naive(&xp, &gamma, &beta, &s, &r).1 - naive(&xm, &gamma, &beta, &s, &r).1)
                / (2.0 * h as f64);
            assert!(
                (fd - dx[i] as f64).abs() < 2e-3,
                "dx[{i}]: {fd} vs {}",
                dx[i]
            );
        }
        for c in 0..s.channels {
            let (mut gp, mut gm) = (gamma.clone(), gamma.clone());
            gp[c] += h;
            gm[c] -= h;
            let fd = (naive(&x, &gp, &beta, &s, &r).1 - naive(&x, &gm, &beta, &s, &r).1)
                / (2.0 * h as f64);
            assert!((fd - dgamma[c] as f64).abs() < 2e-3, "dgamma[{c}]");
            let want_db: f64 = s
                .runs(c)
                .flat_map(|run| r[run].iter().map(|&v| v as f64))
                .sum();
            assert!((want_db - dbeta[c] as f64).abs() < 1e-4, "dbeta[{c}]");
        }
    }

    /// `L = Σ relu(bn(x) + res) ⊙ r` in f64, and the pre-activations.
    fn naive_act(
        x: &[f32],
        (gamma, beta): (&[f32], &[f32]),
        res: &[f32],
        s: &BnShape,
        r: &[f32],
    ) -> (f64, Vec<f64>) {
        let (y, _) = naive(x, gamma, beta, s, r);
        let pre: Vec<f64> = y.iter().zip(res).map(|(a, b)| a + *b as f64).collect();
        let l = pre.iter().zip(r).map(|(p, w)| p.max(0.0) * *w as f64).sum();
        (l, pre)
    }

    #[test]
    fn residual_and_relu_fused_match_the_definition() {
        let s = BnShape {
            batch: 2,
            channels: 3,
            plane: 7,
        };
        let n = s.batch * s.channels * s.plane;
        let (x, r, res) = (data(n, 3), data(n, 4), data(n, 5));
        let gamma = vec![0.7f32, -1.2, 1.5];
        let beta = vec![0.2f32, -0.1, 0.4];
        let (y, mean, var) = forward_fused(&x, (&gamma, &beta), 1e-5, (Some(&res), true), &s);
        let (_, pre) = naive_act(&x, (&gamma, &beta), &res, &s, &r);
        for (a, p) in y.iter().zip(&pre) {
            assert!((*a as f64 - p.max(0.0)).abs() < 1e-4, "{a} vs {p}");
        }
        assert!(y.contains(&0.0) && y.iter().any(|&v| v > 0.0));
        let mut dres = r.clone();
        let mask = (dres.as_mut_slice(), Mask::Output(&y), true);
        let (dx, dgamma, dbeta) = backward(&x, (&gamma, &beta), (&mean, &var), 1e-5, mask, &s);
        let dx = dx.expect("kept: dx returned");
        let h = 1e-3f32;
        let loss =
            |x: &[f32], g: &[f32], b: &[f32], res: &[f32]| naive_act(x, (g, b), res, &s, &r).0;
        for i in 0..n {
            let (mut p, mut m) = (x.clone(), x.clone());
            p[i] += h;
            m[i] -= h;
            let fd =
                (loss(&p, &gamma, &beta, &res) - loss(&m, &gamma, &beta, &res)) / (2.0 * h as f64);
            assert!(
                (fd - dx[i] as f64).abs() < 3e-3,
                "dx[{i}]: {fd} vs {}",
                dx[i]
            );
            if pre[i].abs() > 1e-2 {
                let (mut p, mut m) = (res.clone(), res.clone());
                p[i] += h;
                m[i] -= h;
                let fd =
                    (loss(&x, &gamma, &beta, &p) - loss(&x, &gamma, &beta, &m)) / (2.0 * h as f64);
                assert!((fd - dres[i] as f64).abs() < 1e-3, "dres[{i}]");
            }
        }
        for c in 0..s.channels {
            let (mut gp, mut gm) = (gamma.clone(), gamma.clone());
            gp[c] += h;
            gm[c] -= h;
            let fd = (loss(&x, &gp, &beta, &res) - loss(&x, &gm, &beta, &res)) / (2.0 * h as f64);
            assert!((fd - dgamma[c] as f64).abs() < 3e-3, "dgamma[{c}]");
            let (mut bp, mut bm) = (beta.clone(), beta.clone());
            bp[c] += h;
            bm[c] -= h;
            let fd = (loss(&x, &gamma, &bp, &res) - loss(&x, &gamma, &bm, &res)) / (2.0 * h as f64);
            assert!((fd - dbeta[c] as f64).abs() < 3e-3, "dbeta[{c}]");
        }
    }

    /// ReLU without a residual: the mask recomputed from the input (`y` never read, dx over
    /// g) gives bit for bit what the output's mask gives, and both match the definition.
    #[test]
    fn relu_mask_from_the_input_matches_the_output_mask_and_the_definition() {
        let s = BnShape {
            batch: 2,
            channels: 3,
            plane: 37,
        };
        let n = s.batch * s.channels * s.plane;
        let (x, r, zero) = (data(n, 6), data(n, 7), vec![0.0f32; n]);
        let gamma = vec![0.9f32, -0.8, 1.3];
        let beta = vec![0.3f32, 0.1, -0.5];
        let gb = (gamma.as_slice(), beta.as_slice());
        let (y, mean, var) = forward_fused(&x, gb, 1e-5, (None, true), &s);
        assert!(y.contains(&0.0) && y.iter().any(|&v| v > 0.0));
        let mut gm = r.clone();
        let from_y = backward(
            &x,
            gb,
            (&mean, &var),
            1e-5,
            (&mut gm, Mask::Output(&y), true),
            &s,
        );
        let mut dx = r.clone();
        let from_x = backward(
            &x,
            gb,
            (&mean, &var),
            1e-5,
            (&mut dx, Mask::Input, false),
            &s,
        );
        assert_eq!(from_y.0.as_ref(), Some(&dx));
        assert_eq!((from_y.1, from_y.2), (from_x.1, from_x.2));
        let (_, pre) = naive_act(&x, gb, &zero, &s, &r);
        for (i, (&m, p)) in gm.iter().zip(&pre).enumerate() {
            assert_eq!(m, if *p > 0.0 { r[i] } else { 0.0 }, "masked g[{i}]");
        }
        let h = 1e-3f32;
        for i in 0..n {
            let (mut xp, mut xm) = (x.clone(), x.clone());
            xp[i] += h;
            xm[i] -= h;
            let fd = (naive_act(&xp, gb, &zero, &s, &r).0 - naive_act(&xm, gb, &zero, &s, &r).0)
                / (2.0 * h as f64);
            assert!(
                (fd - dx[i] as f64).abs() < 3e-3,
                "dx[{i}]: {fd} vs {}",
                dx[i]
            );
        }
    }
}
