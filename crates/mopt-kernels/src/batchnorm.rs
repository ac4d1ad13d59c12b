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

/// Per-channel (mean, biased variance) of `x`, accumulated in f64.
fn statistics(x: &[f32], s: &BnShape) -> (Vec<f32>, Vec<f32>) {
    (0..s.channels)
        .into_par_iter()
        .map(|c| {
            let sum: f64 = s
                .runs(c)
                .map(|r| x[r].iter().map(|&v| v as f64).sum::<f64>())
                .sum();
            let mean = sum / s.count();
            let sq: f64 = s
                .runs(c)
                .map(|r| x[r].iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>())
                .sum();
            (mean as f32, (sq / s.count()) as f32)
        })
        .unzip()
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
    let (mean, var) = statistics(x, s);
    let mut y = vec![0.0f32; x.len()];
    let coef: Vec<(f32, f32)> = (0..s.channels)
        .map(|c| {
            let a = gamma[c] / (var[c] + eps).sqrt();
            (a, beta[c] - a * mean[c])
        })
        .collect();
    y.par_chunks_mut(s.plane)
        .zip(x.par_chunks(s.plane))
        .enumerate()
        .for_each(|(i, (yo, xi))| {
            let (a, b) = coef[i % s.channels];
            for (o, &v) in yo.iter_mut().zip(xi) {
                *o = a * v + b;
            }
        });
    (y, mean, var)
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
    let inv: Vec<f32> = var.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
    let (dgamma, dbeta): (Vec<f32>, Vec<f32>) = (0..s.channels)
        .into_par_iter()
        .map(|c| {
            let (mut dg, mut db) = (0.0f64, 0.0f64);
            for r in s.runs(c) {
                for (&gv, &xv) in g[r.clone()].iter().zip(&x[r]) {
                    db += gv as f64;
                    dg += gv as f64 * ((xv - mean[c]) * inv[c]) as f64;
                }
            }
            (dg as f32, db as f32)
        })
        .unzip();
    let m = s.count() as f32;
    let mut dx = vec![0.0f32; x.len()];
    dx.par_chunks_mut(s.plane).enumerate().for_each(|(i, d)| {
        let c = i % s.channels;
        let (k, mg, mgx) = (gamma[c] * inv[c], dbeta[c] / m, dgamma[c] / m);
        let base = i * s.plane;
        for (j, o) in d.iter_mut().enumerate() {
            let xh = (x[base + j] - mean[c]) * inv[c];
            *o = k * (g[base + j] - mg - xh * mgx);
        }
    });
    (dx, dgamma, dbeta)
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
}
