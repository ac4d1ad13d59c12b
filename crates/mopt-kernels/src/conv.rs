//! 2-D convolution (no bias, square kernel, symmetric padding, groups 1) on the GEMM of
//! [`crate::gemm`], forward and backward, for NCHW f32 tensors.
//!
//! Image by image (in parallel over the batch), the input's patches are unfolded into
//! `cols: [C·k·k, P]` (P output pixels; a row is one input plane shifted by one kernel offset,
//! so unfolding is a run of contiguous copies, and one image's matrix stays in L2), then:
//!
//! - forward: `y = W · cols` (`[O, P]`: the image's NCHW output, no transpose);
//! - dW: `Σ_images g · colsᵀ` (`[O, C·k·k]`);
//! - dX: `dcols = Wᵀ · g`, folded back onto the input (col2im: contiguous adds).

use rayon::prelude::*;

use crate::gemm::{sgemm, View};

/// The geometry of one convolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvShape {
    /// Images in the batch.
    pub batch: usize,
    /// Input channels.
    pub channels: usize,
    /// Input height.
    pub height: usize,
    /// Input width.
    pub width: usize,
    /// Output channels.
    pub out_channels: usize,
    /// Kernel side (square kernels).
    pub kernel: usize,
    /// Stride, both directions.
    pub stride: usize,
    /// Zero padding on every side.
    pub pad: usize,
}

impl ConvShape {
    /// Output height and width.
    pub fn out_hw(&self) -> (usize, usize) {
        let o = |n: usize| (n + 2 * self.pad - self.kernel) / self.stride + 1;
        (o(self.height), o(self.width))
    }

    /// Output pixels an image.
    fn pixels(&self) -> usize {
        let (oh, ow) = self.out_hw();
        oh * ow
    }

    /// Rows of the patch matrix: `C·k·k`.
    fn patch(&self) -> usize {
        self.channels * self.kernel * self.kernel
    }

    fn image(&self) -> usize {
        self.channels * self.height * self.width
    }

    /// For kernel offset `kx`: the output columns `[lo, hi)` whose input column is inside the
    /// image, and the input column of output column 0 (possibly negative).
    fn columns(&self, kx: usize, ow: usize) -> (usize, usize, isize) {
        let first = kx as isize - self.pad as isize;
        let s = self.stride as isize;
        let lo = if first < 0 { ((-first) + s - 1) / s } else { 0 } as usize;
        let last = self.width as isize - 1 - first;
        let hi = if last < 0 {
            0
        } else {
            ((last / s) + 1).min(ow as isize) as usize
        };
        (lo.min(hi), hi, first)
    }
}

/// Walk the rows of one image's patch matrix: `f(row, oy, iy, lo, hi, first_ix, plane)` for
/// each kernel offset and output row whose input row `iy` is inside the image.
fn for_each_segment(
    s: &ConvShape,
    mut f: impl FnMut(usize, usize, usize, (usize, usize, isize), usize),
) {
    let (oh, ow) = s.out_hw();
    for c in 0..s.channels {
        for ky in 0..s.kernel {
            for kx in 0..s.kernel {
                let row = (c * s.kernel + ky) * s.kernel + kx;
                let cols = s.columns(kx, ow);
                for oy in 0..oh {
                    let iy = (oy * s.stride + ky) as isize - s.pad as isize;
                    if iy >= 0 && (iy as usize) < s.height {
                        f(row, oy, iy as usize, cols, c);
                    }
                }
            }
        }
    }
}

/// One image's patch matrix `[C·k·k, P]` of `img: [C, H, W]` into `cols` (zeros outside).
fn im2col(img: &[f32], s: &ConvShape, cols: &mut [f32]) {
    let (_, ow) = s.out_hw();
    let p = s.pixels();
    let plane = s.height * s.width;
    if s.pad > 0 {
        // Only windows that reach into the padding keep zeros.
        cols.fill(0.0);
    }
    for_each_segment(s, |row, oy, iy, (lo, hi, first), c| {
        let src = &img[c * plane + iy * s.width..][..s.width];
        let dst = &mut cols[row * p + oy * ow..][..ow];
        if s.stride == 1 {
            let start = (lo as isize + first) as usize;
            dst[lo..hi].copy_from_slice(&src[start..start + hi - lo]);
        } else {
            for (ox, d) in dst.iter_mut().enumerate().take(hi).skip(lo) {
                *d = src[(ox as isize * s.stride as isize + first) as usize];
            }
        }
    });
}

/// Add one image's patch-matrix gradient `[C·k·k, P]` back onto its input gradient `[C, H, W]`.
fn col2im(dcols: &[f32], s: &ConvShape, img: &mut [f32]) {
    let (_, ow) = s.out_hw();
    let p = s.pixels();
    let plane = s.height * s.width;
    for_each_segment(s, |row, oy, iy, (lo, hi, first), c| {
        let dst = &mut img[c * plane + iy * s.width..][..s.width];
        let src = &dcols[row * p + oy * ow..][..ow];
        if s.stride == 1 {
            let start = (lo as isize + first) as usize;
            for (d, v) in dst[start..start + hi - lo].iter_mut().zip(&src[lo..hi]) {
                *d += v;
            }
        } else {
            for ox in lo..hi {
                dst[(ox as isize * s.stride as isize + first) as usize] += src[ox];
            }
        }
    });
}

/// `y = conv(x, w)`: x `[batch, C, H, W]`, w `[O, C, k, k]` → `[batch, O, OH, OW]`.
pub fn conv2d(x: &[f32], w: &[f32], s: &ConvShape) -> Vec<f32> {
    let (p, kk, o) = (s.pixels(), s.patch(), s.out_channels);
    let mut y = vec![0.0f32; s.batch * o * p];
    y.par_chunks_mut(o * p).enumerate().for_each_init(
        || vec![0.0f32; kk * p],
        |cols, (n, out)| {
            im2col(&x[n * s.image()..][..s.image()], s, cols);
            sgemm(
                View::row_major(w, o, kk),
                View::row_major(cols, kk, p),
                out,
                1.0,
                false,
            );
        },
    );
    y
}

/// Gradients of [`conv2d`] from the output gradient `g: [batch, O, OH, OW]`: (dx, dw), each
/// only when asked for.
pub fn conv2d_backward(
    x: &[f32],
    w: &[f32],
    g: &[f32],
    s: &ConvShape,
    (want_dx, want_dw): (bool, bool),
) -> (Option<Vec<f32>>, Option<Vec<f32>>) {
    let (p, kk, o) = (s.pixels(), s.patch(), s.out_channels);
    let dw = want_dw.then(|| {
        (0..s.batch)
            .into_par_iter()
            .fold(
                || (vec![0.0f32; o * kk], vec![0.0f32; kk * p]),
                |(mut dw, mut cols), n| {
                    im2col(&x[n * s.image()..][..s.image()], s, &mut cols);
                    let gn = &g[n * o * p..][..o * p];
                    sgemm(
                        View::row_major(gn, o, p),
                        View::row_major(&cols, kk, p).t(),
                        &mut dw,
                        1.0,
                        true,
                    );
                    (dw, cols)
                },
            )
            .map(|(dw, _)| dw)
            .reduce(
                || vec![0.0f32; o * kk],
                |mut a, b| {
                    a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
                    a
                },
            )
    });
    let dx = want_dx.then(|| {
        let mut dx = vec![0.0f32; s.batch * s.image()];
        dx.par_chunks_mut(s.image()).enumerate().for_each_init(
            || vec![0.0f32; kk * p],
            |dcols, (n, img)| {
                let gn = &g[n * o * p..][..o * p];
                sgemm(
                    View::row_major(w, o, kk).t(),
                    View::row_major(gn, o, p),
                    dcols,
                    1.0,
                    false,
                );
                col2im(dcols, s, img);
            },
        );
        dx
    });
    (dx, dw)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, in f64.
    fn naive(x: &[f32], w: &[f32], s: &ConvShape) -> Vec<f32> {
        let (oh, ow) = s.out_hw();
        let mut y = vec![0.0f32; s.batch * s.out_channels * oh * ow];
        for n in 0..s.batch {
            for oc in 0..s.out_channels {
                for oy in 0..oh {
                    for ox in 0..ow {
                        let mut acc = 0.0f64;
                        for c in 0..s.channels {
                            for ky in 0..s.kernel {
                                for kx in 0..s.kernel {
                                    let iy = (oy * s.stride + ky) as isize - s.pad as isize;
                                    let ix = (ox * s.stride + kx) as isize - s.pad as isize;
                                    if iy < 0
                                        || ix < 0
                                        || iy as usize >= s.height
                                        || ix as usize >= s.width
                                    {
                                        continue;
                                    }
                                    let xv = x[((n * s.channels + c) * s.height + iy as usize)
                                        * s.width
                                        + ix as usize];
                                    let wv =
                                        w[((oc * s.channels + c) * s.kernel + ky) * s.kernel + kx];
                                    acc += xv as f64 * wv as f64;
                                }
                            }
                        }
                        y[((n * s.out_channels + oc) * oh + oy) * ow + ox] = acc as f32;
                    }
                }
            }
        }
        y
    }

    fn data(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 9) as f32 / 8388608.0
                    - 1.0
            })
            .collect()
    }

    fn shapes() -> Vec<ConvShape> {
        let s = |batch, channels, side, out_channels, kernel, stride, pad| ConvShape {
            batch,
            channels,
            height: side,
            width: side + 1,
            out_channels,
            kernel,
            stride,
            pad,
        };
        vec![
            s(2, 3, 7, 5, 3, 1, 1),
            s(3, 4, 9, 6, 3, 2, 1),
            s(2, 5, 6, 7, 1, 2, 0),
            s(1, 2, 5, 3, 1, 1, 0),
        ]
    }

    #[test]
    fn forward_matches_the_definition() {
        for s in shapes() {
            let x = data(s.batch * s.channels * s.height * s.width, 1);
            let w = data(s.out_channels * s.patch(), 2);
            let (y, want) = (conv2d(&x, &w, &s), naive(&x, &w, &s));
            let err = y
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(err < 1e-4, "{s:?}: {err}");
        }
    }

    /// The backward pass against finite differences of `L = Σ y ⊙ r` (r fixed).
    #[test]
    fn gradients_match_finite_differences() {
        for s in shapes() {
            let x = data(s.batch * s.channels * s.height * s.width, 3);
            let w = data(s.out_channels * s.patch(), 4);
            let r = data(s.batch * s.out_channels * s.pixels(), 5);
            let loss = |x: &[f32], w: &[f32]| -> f64 {
                naive(x, w, &s)
                    .iter()
                    .zip(&r)
                    .map(|(a, b)| *a as f64 * *b as f64)
                    .sum()
            };
            let (dx, dw) = conv2d_backward(&x, &w, &r, &s, (true, true));
            let (dx, dw) = (dx.unwrap(), dw.unwrap());
            let h = 1e-2f32;
            for (grad, which) in [(&dx, 0), (&dw, 1)] {
                for i in (0..grad.len()).step_by(7) {
                    let (mut xp, mut wp) = (x.clone(), w.clone());
                    let (mut xm, mut wm) = (x.clone(), w.clone());
                    if which == 0 {
                        xp[i] += h;
                        xm[i] -= h;
                    } else {
                        wp[i] += h;
                        wm[i] -= h;
                    }
                    let fd = (loss(&xp, &wp) - loss(&xm, &wm)) / (2.0 * h as f64);
                    assert!(
                        (fd - grad[i] as f64).abs() < 2e-3,
                        "{s:?} {which} {i}: {fd} vs {}",
                        grad[i]
                    );
                }
            }
        }
    }
}
