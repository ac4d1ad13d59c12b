//! BatchNorm with batch statistics (training), forward and backward, for NCHW f32 tensors: one
//! pass for the mean, one for the variance, one writing the output; two passes backward. Burn's
//! default composes each of them from transposes, reductions and broadcasts (about ten passes
//! over the activation and as many temporaries). Channels run in parallel; a channel's values
//! are `batch` contiguous runs of `height·width`.

use rayon::prelude::*;

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

/// `(Σ (v − shift), Σ (v − shift)²)` over one run, in 16 independent f32 lanes (so that it
/// vectorizes), returned in f64.
#[inline(always)]
fn shifted_sums(v: &[f32], shift: f32) -> (f64, f64) {
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

/// Per-channel (mean, biased variance) of `x`: one pass of shifted sums (shifted by the
/// channel's first value, so that a large mean does not cancel the variance away), each
/// image's run summed in f32 lanes and the runs in f64.
fn statistics(x: &[f32], s: &BnShape) -> (Vec<f32>, Vec<f32>) {
    (0..s.channels)
        .into_par_iter()
        .map(|c| {
            let shift = x[c * s.plane];
            let (mut sum, mut sq) = (0.0f64, 0.0f64);
            for r in s.runs(c) {
                let (a, b) = shifted_sums(&x[r], shift);
                sum += a;
                sq += b;
            }
            let mean = sum / s.count();
            let var = (sq / s.count() - mean * mean).max(0.0);
            ((mean + shift as f64) as f32, var as f32)
        })
        .unzip()
}

/// What the normalisation's pass also does: add a residual, then ReLU (a ResNet block's
/// `relu(bn(conv(x)) + shortcut)`), saving their passes and temporaries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Epilogue {
    /// A residual of x's shape is added after the normalisation.
    pub residual: bool,
    /// ReLU last.
    pub relu: bool,
}

/// The forward pass with the batch's statistics: `y = γ·(x − μ)/√(σ² + ε) + β` per channel.
/// Returns `(y, μ, σ²)` (σ² biased, what running statistics are fed).
pub fn forward(
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    eps: f32,
    s: &BnShape,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    forward_fused(x, (gamma, beta), eps, (None, false), s)
}

/// [`forward`] followed by `+ residual` (when given) and ReLU (when `relu`), in the same pass.
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
    let coef: Vec<(f32, f32)> = (0..s.channels)
        .map(|c| {
            let a = gamma[c] / (var[c] + eps).sqrt();
            (a, beta[c] - a * mean[c])
        })
        .collect();
    let floor = if relu { 0.0 } else { f32::NEG_INFINITY };
    y.par_chunks_mut(s.plane)
        .zip(x.par_chunks(s.plane))
        .enumerate()
        .for_each(|(i, (yo, xi))| {
            let (a, b) = coef[i % s.channels];
            match residual {
                Some(r) => {
                    let r = &r[i * s.plane..][..s.plane];
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
        });
    y
}

/// Gradients of [`forward`] from the output gradient `g`: `(dx, dγ, dβ)`, with
/// `x̂ = (x − μ)·r`, `r = 1/√(σ² + ε)`, `dβ = Σ g`, `dγ = Σ g·x̂` and
/// `dx = γ·r·(g − dβ/M − x̂·dγ/M)` (M values a channel).
pub fn backward(
    x: &[f32],
    gamma: &[f32],
    (mean, var): (&[f32], &[f32]),
    eps: f32,
    g: &[f32],
    s: &BnShape,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (dx, dgamma, dbeta, _) = backward_fused(x, gamma, (mean, var), eps, (g, None), false, s);
    (dx, dgamma, dbeta)
}

/// Gradients of [`forward_fused`]: `(dx, dγ, dβ, d residual)`. With ReLU, `y` (the forward
/// output) masks `g` (`g·[y > 0]`, the gradient that reaches the sum); the residual's gradient
/// is that masked gradient, returned when `want_residual`.
pub fn backward_fused(
    x: &[f32],
    gamma: &[f32],
    (mean, var): (&[f32], &[f32]),
    eps: f32,
    (g, y): (&[f32], Option<&[f32]>),
    want_residual: bool,
    s: &BnShape,
) -> (Vec<f32>, Vec<f32>, Vec<f32>, Option<Vec<f32>>) {
    let inv: Vec<f32> = var.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
    let (dgamma, dbeta): (Vec<f32>, Vec<f32>) = (0..s.channels)
        .into_par_iter()
        .map(|c| {
            let (mut db, mut gx) = (0.0f64, 0.0f64);
            for r in s.runs(c) {
                let (a, b) = match y {
                    Some(y) => masked_sums::<true>(&g[r.clone()], &x[r.clone()], &y[r], mean[c]),
                    None => masked_sums::<false>(&g[r.clone()], &x[r.clone()], &g[r], mean[c]),
                };
                db += a;
                gx += b;
            }
            ((gx * inv[c] as f64) as f32, db as f32)
        })
        .unzip();
    let m = s.count() as f32;
    let mut dx = vec![0.0f32; x.len()];
    let mut dres = want_residual.then(|| vec![0.0f32; x.len()]);
    let plane = s.plane;
    let body = |i: usize, d: &mut [f32], dr: Option<&mut [f32]>| {
        let c = i % s.channels;
        let k = gamma[c] * inv[c];
        // dx = k·(gm − dβ/M − (x − μ)·r·dγ/M) = k·gm + (k·r·dγ/M)·(μ − x) − k·dβ/M
        let coef = (k, k * inv[c] * dgamma[c] / m, k * dbeta[c] / m, mean[c]);
        let span = i * plane..(i + 1) * plane;
        let (g, x) = (&g[span.clone()], &x[span.clone()]);
        match (y, dr) {
            (Some(y), Some(dr)) => input_grad::<true, true>((g, x, &y[span]), coef, d, dr),
            (Some(y), None) => input_grad::<true, false>((g, x, &y[span]), coef, d, &mut []),
            (None, Some(dr)) => input_grad::<false, true>((g, x, g), coef, d, dr),
            (None, None) => input_grad::<false, false>((g, x, g), coef, d, &mut []),
        }
    };
    match dres.as_mut() {
        Some(dr) => dx
            .par_chunks_mut(plane)
            .zip(dr.par_chunks_mut(plane))
            .enumerate()
            .for_each(|(i, (d, r))| body(i, d, Some(r))),
        None => dx
            .par_chunks_mut(plane)
            .enumerate()
            .for_each(|(i, d)| body(i, d, None)),
    }
    (dx, dgamma, dbeta, dres)
}

/// [`backward_fused`] with `g` overwritten by the masked gradient `gm` (which is then the
/// residual's gradient): the mask is applied in the statistics' pass, and the input gradient's
/// pass reads two arrays instead of three, with no second output to allocate.
/// Returns `(dx, dγ, dβ)`.
pub fn backward_in_place(
    x: &[f32],
    gamma: &[f32],
    (mean, var): (&[f32], &[f32]),
    eps: f32,
    (g, y): (&mut [f32], Option<&[f32]>),
    s: &BnShape,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let plane = s.plane;
    // Per-plane sums (Σ gm, Σ gm·(x − μ)), masking g on the way.
    let partial: Vec<(f64, f64)> = g
        .par_chunks_mut(plane)
        .zip(x.par_chunks(plane))
        .enumerate()
        .map(|(i, (gp, xp))| {
            let c = i % s.channels;
            if let Some(y) = y {
                for (gv, &yv) in gp.iter_mut().zip(&y[i * plane..(i + 1) * plane]) {
                    if yv <= 0.0 {
                        *gv = 0.0;
                    }
                }
            }
            masked_sums::<false>(gp, xp, gp, mean[c])
        })
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
    let mut dx = vec![0.0f32; x.len()];
    let g: &[f32] = g;
    dx.par_chunks_mut(plane).enumerate().for_each(|(i, d)| {
        let c = i % s.channels;
        let k = gamma[c] * inv[c];
        let coef = (k, k * inv[c] * dgamma[c] / m, k * dbeta[c] / m, mean[c]);
        let span = i * plane..(i + 1) * plane;
        let (gp, xp) = (&g[span.clone()], &x[span]);
        input_grad::<false, false>((gp, xp, gp), coef, d, &mut []);
    });
    (dx, dgamma, dbeta)
}

/// `(Σ gm, Σ gm·(x − μ))` over one run, `gm = g·[y > 0]` when `RELU` (else `g`; `y` unread).
#[inline(always)]
fn masked_sums<const RELU: bool>(g: &[f32], x: &[f32], y: &[f32], mean: f32) -> (f64, f64) {
    let (mut s1, mut s2) = ([0.0f32; 16], [0.0f32; 16]);
    let full = g.len() / 16 * 16;
    let gm = |gv: f32, yv: f32| if RELU && yv <= 0.0 { 0.0 } else { gv };
    for ((gc, xc), yc) in g[..full]
        .chunks_exact(16)
        .zip(x[..full].chunks_exact(16))
        .zip(y[..full].chunks_exact(16))
    {
        for l in 0..16 {
            let v = gm(gc[l], yc[l]);
            s1[l] += v;
            s2[l] += v * (xc[l] - mean);
        }
    }
    let (mut t1, mut t2) = (0.0f64, 0.0f64);
    for i in full..g.len() {
        let v = gm(g[i], y[i]) as f64;
        t1 += v;
        t2 += v * (x[i] - mean) as f64;
    }
    let sum = |a: [f32; 16]| a.iter().map(|&v| v as f64).sum::<f64>();
    (sum(s1) + t1, sum(s2) + t2)
}

/// One plane of dx (and of the residual's gradient when `RES`): `coef = (k, a, b, μ)` with
/// `dx = k·gm + a·(μ − x) − b`.
#[inline(always)]
fn input_grad<const RELU: bool, const RES: bool>(
    (g, x, y): (&[f32], &[f32], &[f32]),
    (k, a, b, mean): (f32, f32, f32, f32),
    d: &mut [f32],
    dr: &mut [f32],
) {
    for i in 0..d.len() {
        let gm = if RELU && y[i] <= 0.0 { 0.0 } else { g[i] };
        d[i] = k * gm + a * (mean - x[i]) - b;
        if RES {
            dr[i] = gm;
        }
    }
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
        let (y, mean, var) = forward(&x, &gamma, &beta, 1e-5, &s);
        let (want, _) = naive(&x, &gamma, &beta, &s, &r);
        for (a, b) in y.iter().zip(&want) {
            assert!((*a as f64 - b).abs() < 1e-4, "{a} vs {b}");
        }
        let (dx, dgamma, dbeta) = backward(&x, &gamma, (&mean, &var), 1e-5, &r, &s);
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
        let (dx, dgamma, dbeta, dres) =
            backward_fused(&x, &gamma, (&mean, &var), 1e-5, (&r, Some(&y)), true, &s);
        let dres = dres.expect("asked for");
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

    /// The in-place backward gives [`backward_fused`]'s gradients, and leaves the masked
    /// gradient (the residual's) in `g`.
    #[test]
    fn in_place_backward_matches() {
        let s = BnShape {
            batch: 3,
            channels: 5,
            plane: 37,
        };
        let n = s.batch * s.channels * s.plane;
        let (x, r, res) = (data(n, 6), data(n, 7), data(n, 8));
        let (gamma, beta) = (vec![0.9f32, -1.1, 1.3, 0.5, 2.0], vec![0.1f32; 5]);
        for relu in [false, true] {
            let residual = relu.then_some(&res[..]);
            let (y, mean, var) = forward_fused(&x, (&gamma, &beta), 1e-5, (residual, relu), &s);
            let mask = relu.then_some(&y[..]);
            let (dx, dg, db, dres) =
                backward_fused(&x, &gamma, (&mean, &var), 1e-5, (&r, mask), true, &s);
            let mut g = r.clone();
            let (dx2, dg2, db2) =
                backward_in_place(&x, &gamma, (&mean, &var), 1e-5, (&mut g, mask), &s);
            let max = |a: &[f32], b: &[f32]| {
                a.iter()
                    .zip(b)
                    .map(|(p, q)| (p - q).abs())
                    .fold(0.0, f32::max)
            };
            assert!(max(&dx, &dx2) < 1e-5 && max(&dg, &dg2) < 1e-4 && max(&db, &db2) < 1e-4);
            assert_eq!(g, dres.unwrap(), "g holds the masked gradient");
            assert_eq!(g.contains(&0.0), relu);
        }
    }
}
