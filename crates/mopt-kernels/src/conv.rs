//! 2-D convolution (no bias, square kernel, symmetric padding, groups 1) on the GEMM of
//! [`crate::gemm`], forward and backward, for NCHW f32 tensors.
//!
//! No patch matrix is built. Each image is first *prepared*: zero-padded and, for a stride
//! `s > 1`, split into its `s × s` phases (`x[s·i + a, s·j + b]` in phase `(a, b)`), so that
//! for every kernel offset the inputs of a run of outputs are a contiguous run of the
//! prepared image. The outputs are computed on a grid as wide as a prepared row (`Wg`
//! columns, the last `Wg − OW` of each row discarded), and row `k = (c, ky, kx)` of the
//! patch matrix is the prepared image read from offset `off(k)`: its panels are packed
//! straight from the image, next to weights packed once for the whole batch.
//!
//! - forward: `y = W · patches` a grid row per output channel, in parallel over images;
//! - dX, stride 1: the forward convolution of the output gradient with the flipped,
//!   transposed kernel; stride > 1: `Wᵀ · g` scattered back onto the prepared image (runs of
//!   contiguous adds), then un-prepared;
//! - dW: with the prepared input and the gradient both channels-last, `dW[:, :, ky, kx]` is one
//!   product `gᵀ · X_shifted` over every pixel of the batch (all packing is copies), the batch
//!   split over threads and the partial sums added.
//!
//! The 3×3 stride-1 padding-1 convolutions whose channels fill whole vectors take Winograd's
//! F(2×2, 3×3) instead, all three products (`crate::winograd`; `MOPT_CONV=direct` keeps them
//! here).

use rayon::prelude::*;

use crate::batchnorm::normalize_run;
use crate::transpose::transpose;

use crate::gemm::{
    aligned, copy_run, copy_short, depth_blocks, gemm_serial, Direct, PackA, PackB, PackedA,
    Strided, Table, View, NR_512,
};

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
    #[cfg(test)]
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
}

/// Where a convolution reads its prepared input: phases `s × s`, each `[C, Hg, Wg]`.
#[derive(Debug, Clone, Copy)]
struct Grid {
    /// Prepared rows and columns (a phase's height and width).
    hg: usize,
    wg: usize,
    /// Values of one prepared image (with slack for the last panel's reads).
    len: usize,
}

impl ConvShape {
    fn grid(&self) -> Grid {
        let s = self.stride;
        let (hg, wg) = (
            (self.height + 2 * self.pad).div_ceil(s),
            (self.width + 2 * self.pad).div_ceil(s),
        );
        let body = s * s * self.channels * hg * wg;
        let (oh, _) = self.out_hw();
        let max_off = body - hg * wg + (self.kernel - 1) / s * (wg + 1);
        let len = body.max(max_off + (oh * wg).div_ceil(64) * 64 + 64);
        Grid { hg, wg, len }
    }

    /// Offsets of the patch rows `k = (c, ky, kx)` in a prepared image.
    fn offsets(&self, g: &Grid) -> Vec<usize> {
        let (s, plane) = (self.stride, g.hg * g.wg);
        let mut off = Vec::with_capacity(self.patch());
        for c in 0..self.channels {
            for ky in 0..self.kernel {
                for kx in 0..self.kernel {
                    let phase = (ky % s) * s + kx % s;
                    off.push((phase * self.channels + c) * plane + (ky / s) * g.wg + kx / s);
                }
            }
        }
        off
    }

    /// Where input rows and columns land in a prepared image: NCHW-prepared
    /// (`[phase, c, i, j]`: `y[row] + x[col] + c·plane`) and channels-last
    /// (`[i, j, phase, c]`: `y_cl[row] + x_cl[col] + c`).
    fn maps(&self, g: &Grid) -> Maps {
        let (s, p, c) = (self.stride, self.pad, self.channels);
        let plane = g.hg * g.wg;
        let split = |v: usize| ((v + p) % s, (v + p) / s);
        let (mut m, ph) = (Maps::default(), s * s);
        for y in 0..self.height {
            let (a, i) = split(y);
            m.y.push(a * s * c * plane + i * g.wg);
            m.y_cl.push((i * g.wg * ph + a * s) * c);
        }
        for x in 0..self.width {
            let (b, j) = split(x);
            m.x.push(b * c * plane + j);
            m.x_cl.push((j * ph + b) * c);
        }
        m
    }
}

/// See [`ConvShape::maps`].
#[derive(Debug, Default)]
struct Maps {
    y: Vec<usize>,
    x: Vec<usize>,
    y_cl: Vec<usize>,
    x_cl: Vec<usize>,
}

/// Prepare image `img: [C, H, W]` into `out` ([`Grid::len`] values).
fn prepare(img: &[f32], geo: &Geometry, out: &mut [f32]) {
    let (s, g, m) = (geo.s, &geo.grid, &geo.maps);
    let plane = g.hg * g.wg;
    if s.stride == 1 {
        let rows =
            |c: usize| img[c * s.height * s.width..][..s.height * s.width].chunks_exact(s.width);
        for (c, plane) in out.chunks_exact_mut(plane).take(s.channels).enumerate() {
            place_padded(plane, rows(c), (s.pad, g.wg, 1));
        }
        out[s.channels * plane..].fill(0.0);
        return;
    }
    out.fill(0.0);
    for c in 0..s.channels {
        for (y, &at) in m.y.iter().enumerate() {
            let row = &img[(c * s.height + y) * s.width..][..s.width];
            let out = &mut out[c * plane + at..];
            for (&v, &x) in row.iter().zip(&m.x) {
                out[x] = v;
            }
        }
    }
}

/// `rows` (each `w·unit` values) into `plane`, a zero-padded plane of rows `wg·unit` values
/// wide: row `y` at padded row `pad + y`, after `pad·unit` values of left padding. Only the
/// padding is written with zeros (each value once); `plane` is exactly the plane.
fn place_padded<'a>(
    plane: &mut [f32],
    rows: impl Iterator<Item = &'a [f32]>,
    (pad, wg, unit): (usize, usize, usize),
) {
    let mut end = 0;
    for (y, row) in rows.enumerate() {
        let at = ((pad + y) * wg + pad) * unit;
        plane[end..at].fill(0.0);
        copy_short(&mut plane[at..], row);
        end = at + row.len();
    }
    plane[end..].fill(0.0);
}

/// The patch rows of a prepared image, as GEMM panels: `B[k, q] = img[off[k] + q]`.
struct Shifted<'a> {
    img: &'a [f32],
    off: &'a [usize],
}

impl PackB for Shifted<'_> {
    fn pack(&self, (p0, kc): (usize, usize), (j0, nc): (usize, usize), nr: usize, out: &mut [f32]) {
        for (jp, panel) in out.chunks_exact_mut(kc * nr).enumerate() {
            let j = j0 + jp * nr;
            let w = nr.min(j0 + nc - j);
            if w < nr {
                panel.fill(0.0);
            }
            for (dst, &o) in panel.chunks_exact_mut(nr).zip(&self.off[p0..p0 + kc]) {
                copy_run(dst, &self.img[o + j..o + j + w]);
            }
        }
    }
}

/// `y = conv(x, w)`: x `[batch, C, H, W]`, w `[O, C, k, k]` → `[batch, O, OH, OW]`.
pub fn conv2d(x: &[f32], w: &[f32], s: &ConvShape) -> Vec<f32> {
    conv2d_then(x, w, s, None)
}

/// What a convolution does to each output value as it writes it (inference BatchNorm, the
/// block's shortcut, ReLU): `max(a_o · y + b_o (+ r), floor)` for output channel `o`, the
/// same arithmetic as [`crate::batchnorm::normalize`], so the fused result equals the
/// convolution followed by the BatchNorm pass bit for bit, one pass over the output fewer.
#[derive(Debug, Clone, Copy)]
pub struct Epilogue<'a> {
    /// `(a, b)` per output channel.
    pub coef: &'a [(f32, f32)],
    /// Added after the affine map, shaped like the output.
    pub residual: Option<&'a [f32]>,
    /// `0` for a ReLU, `-inf` for none.
    pub floor: f32,
}

impl<'a> Epilogue<'a> {
    /// The part for output channels from `c0` on, whose first value is at `at` of the output.
    pub(crate) fn from(&self, c0: usize, at: usize) -> Epilogue<'a> {
        Epilogue {
            coef: &self.coef[c0..],
            residual: self.residual.map(|r| &r[at..]),
            floor: self.floor,
        }
    }
}

/// [`conv2d`], each output value passed through `then` as it is written.
pub fn conv2d_then(x: &[f32], w: &[f32], s: &ConvShape, then: Option<&Epilogue>) -> Vec<f32> {
    crate::threads::keep_warm();
    if let Some(y) = crate::winograd::conv2d(x, w, s, then) {
        return y;
    }
    if let Some(t) = s.pointwise_strided() {
        return conv2d_then(&subsample(x, s), w, &t, then);
    }
    let packed = PackedA::new(View::row_major(w, s.out_channels, s.patch()));
    forward_packed(x, &packed, s, then)
}

impl ConvShape {
    /// A pointwise (1 × 1, unpadded) convolution of stride > 1 reads only every `stride`-th
    /// pixel of every `stride`-th row: it is the stride-1 convolution of the input
    /// subsampled ([`subsample`]), this shape, without a phase split or a padded grid.
    fn pointwise_strided(&self) -> Option<ConvShape> {
        let (oh, ow) = self.out_hw();
        (self.kernel == 1 && self.pad == 0 && self.stride > 1).then_some(ConvShape {
            height: oh,
            width: ow,
            stride: 1,
            ..*self
        })
    }
}

/// The pixels a pointwise strided convolution reads: `[batch, C, OH, OW]` of `x`'s every
/// `stride`-th.
fn subsample(x: &[f32], s: &ConvShape) -> Vec<f32> {
    let (oh, ow) = s.out_hw();
    let mut out = vec![0.0f32; s.batch * s.channels * oh * ow];
    out.par_chunks_mut(oh * ow)
        .zip(x.par_chunks(s.height * s.width))
        .for_each(|(o, plane)| {
            for (oy, row) in o.chunks_exact_mut(ow).enumerate() {
                let src = &plane[oy * s.stride * s.width..];
                for (v, &x) in row.iter_mut().zip(src.iter().step_by(s.stride)) {
                    *v = x;
                }
            }
        });
    out
}

/// The inverse placement of [`subsample`]: `d` (`[batch, C, OH, OW]`) at every `stride`-th
/// pixel of a zero `[batch, C, H, W]`.
fn unsubsample(d: &[f32], s: &ConvShape) -> Vec<f32> {
    let (oh, ow) = s.out_hw();
    let mut out = vec![0.0f32; s.batch * s.image()];
    out.par_chunks_mut(s.height * s.width)
        .zip(d.par_chunks(oh * ow))
        .for_each(|(plane, src)| {
            for (oy, row) in src.chunks_exact(ow).enumerate() {
                let dst = &mut plane[oy * s.stride * s.width..];
                for (v, &x) in dst.iter_mut().step_by(s.stride).zip(row) {
                    *v = x;
                }
            }
        });
    out
}

/// Per-thread buffers, reused from call to call (a fresh megabyte a image would cost page
/// faults and zeroing every time).
#[derive(Default)]
struct Scratch {
    prep: Vec<f32>,
    grid: Vec<f32>,
    bbuf: Vec<f32>,
    cols: Vec<f32>,
    abuf: Vec<f32>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
}

/// Run `f` with this thread's scratch buffers (fresh ones if they are in use).
fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut s) => f(&mut s),
        Err(_) => f(&mut Scratch::default()),
    })
}

/// `v` resized to `len` zeros.
fn zeroed(v: &mut Vec<f32>, len: usize) -> &mut [f32] {
    v.clear();
    v.resize(len, 0.0);
    v
}

/// [`conv2d`] with the weights already packed (`[O, C·k·k]`).
fn forward_packed(x: &[f32], w: &PackedA, s: &ConvShape, then: Option<&Epilogue>) -> Vec<f32> {
    let (o, (oh, ow)) = (s.out_channels, s.out_hw());
    let mut y = vec![0.0f32; s.batch * o * oh * ow];
    // Whole images a task when the batch keeps every thread busy; otherwise each image's
    // output channels split over the threads.
    let threads = rayon::current_num_threads().max(1);
    let mr = w.tile_rows();
    let panels = o.div_ceil(mr);
    let split = if s.batch >= 2 * threads {
        1
    } else {
        threads.min(panels)
    };
    let per = panels.div_ceil(split);
    let geometry = Geometry::new(s);
    y.par_chunks_mut(o * oh * ow)
        .enumerate()
        .for_each(|(n, out)| {
            let img = &x[n * s.image()..][..s.image()];
            let at = n * o * oh * ow;
            if split == 1 {
                let then = then.map(|e| e.from(0, at));
                forward_rows(img, w, (0, panels), &geometry, (out, then.as_ref()));
            } else {
                out.par_chunks_mut(per * mr * oh * ow)
                    .enumerate()
                    .for_each(|(ci, out)| {
                        let range = (ci * per, ((ci + 1) * per).min(panels));
                        let c0 = range.0 * mr;
                        let then = then.map(|e| e.from(c0, at + c0 * oh * ow));
                        forward_rows(img, w, range, &geometry, (out, then.as_ref()));
                    });
            }
        });
    y
}

/// A convolution's shape with its grid and patch-row offsets, computed once a call.
struct Geometry<'a> {
    s: &'a ConvShape,
    grid: Grid,
    off: Vec<usize>,
    maps: Maps,
}

impl<'a> Geometry<'a> {
    fn new(s: &'a ConvShape) -> Self {
        let grid = s.grid();
        Self {
            s,
            off: s.offsets(&grid),
            maps: s.maps(&grid),
            grid,
        }
    }
}

/// Output channels of panels `[p0, p1)` of one image (`out`: those channels' planes, `then`
/// from their first channel on).
fn forward_rows(
    img: &[f32],
    w: &PackedA,
    (p0, p1): (usize, usize),
    geo: &Geometry,
    (out, then): (&mut [f32], Option<&Epilogue>),
) {
    let (s, g) = (geo.s, &geo.grid);
    let (oh, ow) = s.out_hw();
    let q = oh * g.wg;
    let rows = (p1 * w.tile_rows()).min(s.out_channels) - p0 * w.tile_rows();
    with_scratch(|sc| {
        sc.prep.resize(g.len, 0.0);
        prepare(img, geo, &mut sc.prep);
        let grid = aligned(&mut sc.grid, rows * q);
        match Direct::get() {
            // Weights packed, the input's shifted rows read in place.
            Some(direct) => {
                let (mr, nr) = (direct.mr(), direct.nr());
                debug_assert_eq!(mr, w.tile_rows());
                for (d0, kc) in w.depth_blocks() {
                    let a = w.panel_range(d0, kc, (p0, p1));
                    let a_rows = |ip: usize| Strided {
                        base: ip * kc * mr,
                        stride: mr,
                    };
                    let off = &geo.off[d0..d0 + kc];
                    let b_rows = |jp: usize| Table { off, add: jp * nr };
                    let dims = (rows, q, kc);
                    direct.block((a, &a_rows), (&sc.prep, &b_rows), dims, grid, q, d0 > 0);
                }
            }
            None => {
                let src = Shifted {
                    img: &sc.prep,
                    off: &geo.off,
                };
                let (row0, k) = (p0 * w.tile_rows(), s.patch());
                let (abuf, bbuf) = (&mut sc.abuf, &mut sc.bbuf);
                gemm_serial(
                    w,
                    &src,
                    (row0, row0 + rows),
                    (k, q),
                    grid,
                    false,
                    abuf,
                    bbuf,
                );
            }
        }
        let planes = out.chunks_exact_mut(oh * ow).zip(grid.chunks_exact(q));
        for (c, (dst, src)) in planes.enumerate() {
            let rows = dst.chunks_exact_mut(ow).zip(src.chunks_exact(g.wg));
            for (y, (d, r)) in rows.enumerate() {
                match then {
                    None => copy_short(d, &r[..ow]),
                    Some(e) => {
                        let res = e.residual.map(|v| &v[(c * oh + y) * ow..][..ow]);
                        normalize_run(d, &r[..ow], res, e.coef[c], e.floor);
                    }
                }
            }
        }
    })
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
    crate::threads::keep_warm();
    if let Some(t) = s.pointwise_strided() {
        let dx = want_dx.then(|| unsubsample(&input_grad_flipped(w, g, &t), s));
        let dw = want_dw.then(|| weight_grad(&subsample(x, s), g, &t));
        return (dx, dw);
    }
    let dx = want_dx.then(|| {
        if s.stride == 1 && s.pad < s.kernel {
            input_grad_flipped(w, g, s)
        } else {
            input_grad_scatter(w, g, s)
        }
    });
    let dw = want_dw
        .then(|| crate::winograd::weight_grad(x, g, s).unwrap_or_else(|| weight_grad(x, g, s)));
    (dx, dw)
}

/// dX of a stride-1 convolution: `g` convolved with the kernel flipped and transposed
/// (`W'[c, o, ky, kx] = W[o, c, k−1−ky, k−1−kx]`), padding `k − 1 − pad`.
fn input_grad_flipped(w: &[f32], g: &[f32], s: &ConvShape) -> Vec<f32> {
    let k = s.kernel;
    let (oh, ow) = s.out_hw();
    let mut flipped = vec![0.0f32; w.len()];
    for o in 0..s.out_channels {
        for c in 0..s.channels {
            for ky in 0..k {
                for kx in 0..k {
                    flipped[((c * s.out_channels + o) * k + (k - 1 - ky)) * k + (k - 1 - kx)] =
                        w[((o * s.channels + c) * k + ky) * k + kx];
                }
            }
        }
    }
    let t = ConvShape {
        batch: s.batch,
        channels: s.out_channels,
        height: oh,
        width: ow,
        out_channels: s.channels,
        kernel: k,
        stride: 1,
        pad: k - 1 - s.pad,
    };
    debug_assert_eq!(t.out_hw(), (s.height, s.width));
    if let Some(dx) = crate::winograd::conv2d(g, &flipped, &t, None) {
        return dx;
    }
    forward_packed(
        g,
        &PackedA::new(View::row_major(&flipped, s.channels, t.patch())),
        &t,
        None,
    )
}

/// dX of any convolution: per image, `Wᵀ · g` (the patch rows' gradients, on the output
/// grid) added back onto the prepared image at each row's offset, then un-prepared.
fn input_grad_scatter(w: &[f32], g: &[f32], s: &ConvShape) -> Vec<f32> {
    let geo = Geometry::new(s);
    let (grid, o, (oh, ow)) = (geo.grid, s.out_channels, s.out_hw());
    let (kk, q) = (s.patch(), oh * grid.wg);
    let wt = PackedA::new(View::row_major(w, o, kk).t());
    let plane = grid.hg * grid.wg;
    let mut dx = vec![0.0f32; s.batch * s.image()];
    dx.par_chunks_mut(s.image())
        .enumerate()
        .for_each(|(n, img)| {
            with_scratch(|sc| {
                let gq = zeroed(&mut sc.grid, o * q);
                for (dst, src) in gq
                    .chunks_exact_mut(q)
                    .zip(g[n * o * oh * ow..].chunks_exact(oh * ow))
                {
                    for (d, r) in dst.chunks_exact_mut(grid.wg).zip(src.chunks_exact(ow)) {
                        copy_short(d, r);
                    }
                }
                let dcols = aligned(&mut sc.cols, kk * q);
                let gq = View::row_major(gq, o, q);
                let (abuf, bbuf) = (&mut sc.abuf, &mut sc.bbuf);
                gemm_serial(&wt, &gq, (0, kk), (o, q), dcols, false, abuf, bbuf);
                let dprep = zeroed(&mut sc.prep, grid.len);
                for (row, &at) in dcols.chunks_exact(q).zip(&geo.off) {
                    for (d, v) in dprep[at..at + q].iter_mut().zip(row) {
                        *d += v;
                    }
                }
                for (c, img) in img.chunks_exact_mut(s.height * s.width).enumerate() {
                    for (row, &at) in img.chunks_exact_mut(s.width).zip(&geo.maps.y) {
                        let src = &dprep[c * plane + at..];
                        for (d, &x) in row.iter_mut().zip(&geo.maps.x) {
                            *d = src[x];
                        }
                    }
                }
            })
        });
    dx
}

/// The shifted input rows of the weight gradient: `A[(ky, kx, c), d] = xt[pos[d] + off[r]]`
/// over the channels-last prepared batch (`d` an output pixel of the batch, `pos[d]` where its
/// window starts).
struct ShiftedCols<'a> {
    xt: &'a [f32],
    off: &'a [usize],
    pos: &'a [usize],
}

impl PackA for ShiftedCols<'_> {
    fn pack(&self, (i0, mc): (usize, usize), (p0, kc): (usize, usize), mr: usize, out: &mut [f32]) {
        for (ip, panel) in out.chunks_exact_mut(kc * mr).enumerate() {
            let rows = &self.off[i0 + ip * mr..(i0 + (ip + 1) * mr).min(i0 + mc)];
            // Runs of rows that are consecutive in memory (consecutive channels of one offset).
            let mut runs: Vec<(usize, usize, usize)> = Vec::with_capacity(4);
            for (r, &o) in rows.iter().enumerate() {
                match runs.last_mut() {
                    Some((_, len, at)) if *at + *len == o => *len += 1,
                    _ => runs.push((r, 1, o)),
                }
            }
            if rows.len() < mr {
                panel.fill(0.0);
            }
            for (dst, &base) in panel.chunks_exact_mut(mr).zip(&self.pos[p0..p0 + kc]) {
                for &(r, len, at) in &runs {
                    copy_run(&mut dst[r..], &self.xt[base + at..base + at + len]);
                }
            }
        }
    }
}

/// The batch's images `n0..n0 + images` prepared channels-last (`[n, i, j, phase, c]`) into
/// `xt`, and their output gradients channels-last over the output pixels (`[n, oy, ox, o]`)
/// into `gt`.
fn channels_last(
    (x, g): (&[f32], &[f32]),
    (n0, images): (usize, usize),
    geo: &Geometry,
    (xt, gt): (&mut [f32], &mut [f32]),
) {
    let (s, grid, maps) = (geo.s, &geo.grid, &geo.maps);
    let (c, o, (oh, ow)) = (s.channels, s.out_channels, s.out_hw());
    let (hw, rs) = (s.height * s.width, s.stride * s.stride * c);
    let (pix, w, p) = (grid.hg * grid.wg, s.width, s.pad);
    if s.stride > 1 {
        xt.fill(0.0);
    } else {
        xt[images * pix * c..].fill(0.0);
    }
    let mut pixels = vec![0.0f32; hw * c];
    for n in 0..images {
        let img = &x[(n0 + n) * s.image()..][..s.image()];
        let xt = &mut xt[n * pix * rs..];
        // The image transposed to `[y, x, c]`, then placed: a row at a time at stride 1
        // (its pixels are consecutive there; only the padding between rows is zeroed), pixel
        // by pixel into the phases otherwise.
        transpose((img, hw), (c, hw), &mut pixels, c);
        if s.stride == 1 {
            place_padded(
                &mut xt[..pix * c],
                pixels.chunks_exact(w * c),
                (p, grid.wg, c),
            );
        } else {
            for (row, &at) in pixels.chunks_exact(w * c).zip(&maps.y_cl) {
                for (px, &xa) in row.chunks_exact(c).zip(&maps.x_cl) {
                    copy_short(&mut xt[at + xa..], px);
                }
            }
        }
        let gn = &g[(n0 + n) * o * oh * ow..][..o * oh * ow];
        transpose((gn, oh * ow), (o, oh * ow), &mut gt[n * oh * ow * o..], o);
    }
}

/// dW: with `X` the batch prepared channels-last (`[n, i, j, phase, c]`) and `G` the output
/// gradient channels-last (`[n, oy, ox, o]`), `dWᵀ[(ky, kx, c), o] = Σ_d X[pos(d) +
/// shift(ky, kx), phase(ky, kx), c] · G[d, o]`: one product over every output pixel `d` of the
/// batch (the grid's padding never multiplied), the batch split over the threads and the parts
/// added.
fn weight_grad(x: &[f32], g: &[f32], s: &ConvShape) -> Vec<f32> {
    let geo = Geometry::new(s);
    let (o, c, k) = (s.out_channels, s.channels, s.kernel);
    let threads = rayon::current_num_threads().max(1);
    let per = s.batch.div_ceil(threads);
    let parts: Vec<(Vec<f32>, bool)> = (0..s.batch.div_ceil(per))
        .into_par_iter()
        .map(|part| {
            let (n0, n1) = (part * per, ((part + 1) * per).min(s.batch));
            with_scratch(|sc| weight_grad_part((x, g), (n0, n1 - n0), &geo, sc))
        })
        .collect();
    // Sum the parts and reorder `[ky, kx, c, o]` (or `[o, ky, kx, c]`) → `[o, c, ky, kx]`,
    // an output channel a task.
    let kk = k * k;
    let mut dw = vec![0.0f32; o * c * kk];
    dw.par_chunks_mut(c * kk).enumerate().for_each(|(oc, dwo)| {
        for (part, transposed) in &parts {
            for kxy in 0..kk {
                for (ci, d) in dwo.iter_mut().skip(kxy).step_by(kk).enumerate() {
                    *d += if *transposed {
                        part[(kxy * c + ci) * o + oc]
                    } else {
                        part[(oc * kk + kxy) * c + ci]
                    };
                }
            }
        }
    });
    dw
}

/// Where kernel offset `(ky, kx)` reads in a channels-last prepared image, relative to the
/// window's start: `(shift · phases + phase) · c`.
fn offset_cl(s: &ConvShape, wg: usize, (ky, kx): (usize, usize)) -> usize {
    let st = s.stride;
    let shift = (ky / st) * wg + kx / st;
    let phase = (ky % st) * st + kx % st;
    (shift * st * st + phase) * s.channels
}

/// One thread's share of [`weight_grad`]: images `n0..n0 + images`; `true` when the result
/// is `[ky, kx, c, o]`, `false` when `[o, ky, kx, c]`.
fn weight_grad_part(
    (x, g): (&[f32], &[f32]),
    (n0, images): (usize, usize),
    geo: &Geometry,
    sc: &mut Scratch,
) -> (Vec<f32>, bool) {
    let (s, grid) = (geo.s, &geo.grid);
    let (o, c, k, (oh, ow)) = (s.out_channels, s.channels, s.kernel, s.out_hw());
    let rs = s.stride * s.stride * c;
    let pix = grid.hg * grid.wg;
    // Channels-last input, with a slack image of zeros for the reads past the last channel
    // (every value written by `channels_last`).
    let len = (images + 1) * pix * rs;
    sc.prep.resize(len, 0.0);
    let xt = &mut sc.prep[..len];
    let gt = aligned(&mut sc.grid, images * oh * ow * o + NR_512);
    channels_last((x, g), (n0, images), geo, (xt, gt));
    // Where each output pixel's window starts in `xt`.
    let pos: Vec<usize> = (0..images)
        .flat_map(|n| (0..oh).flat_map(move |oy| (0..ow).map(move |ox| (n, oy, ox))))
        .map(|(n, oy, ox)| (n * pix + oy * grid.wg + ox) * rs)
        .collect();
    let depth = pos.len();
    let offsets: Vec<(usize, usize)> = (0..k)
        .flat_map(|ky| (0..k).map(move |kx| (ky, kx)))
        .collect();
    // Few output channels (G's rows short): dW = Gᵀ · X with both read in place, G's rows of
    // 12 output channels `o` apart, X's rows of 32 channels of one kernel offset (measured
    // faster at o = 32; from o = 64 the transposed form below is).
    if let Some(direct) = Direct::get().filter(|d| c % d.nr() == 0 && o <= d.nr()) {
        let (mr, nr) = (direct.mr(), direct.nr());
        let mut dw = vec![0.0f32; o * k * k * c];
        for (d0, kc) in depth_blocks(depth) {
            let tab = &pos[d0..];
            let a_rows = |ip: usize| Strided {
                base: d0 * o + ip * mr,
                stride: o,
            };
            let b_rows = |jp: usize| {
                let col = jp * nr;
                let add = offset_cl(s, grid.wg, (col / c / k, (col / c) % k)) + col % c;
                Table { off: tab, add }
            };
            let (a, b): (&[f32], &[f32]) = (gt, xt);
            direct.block(
                (a, &a_rows),
                (b, &b_rows),
                (o, k * k * c, kc),
                &mut dw,
                k * k * c,
                d0 > 0,
            );
        }
        return (dw, false);
    }
    let mut dwt = vec![0.0f32; k * k * c * o];
    if let Some(direct) = Direct::get().filter(|d| c >= d.mr()) {
        let (mr, nr) = (direct.mr(), direct.nr());
        // More output channels: dWᵀ per kernel offset, X's rows of 12 channels against G's
        // rows of 32 output channels `o` apart.
        for (d0, kc) in depth_blocks(depth) {
            let tab = &pos[d0..];
            for (&kxy, out) in offsets.iter().zip(dwt.chunks_exact_mut(c * o)) {
                let add = offset_cl(s, grid.wg, kxy);
                let a_rows = |ip: usize| Table {
                    off: tab,
                    add: add + ip * mr,
                };
                let b_rows = |jp: usize| Strided {
                    base: d0 * o + jp * nr,
                    stride: o,
                };
                let (a, b): (&[f32], &[f32]) = (xt, gt);
                direct.block((a, &a_rows), (b, &b_rows), (c, o, kc), out, o, d0 > 0);
            }
        }
        return (dwt, true);
    }
    let off: Vec<usize> = offsets
        .iter()
        .flat_map(|&kxy| (0..c).map(move |ci| (kxy, ci)))
        .map(|(kxy, ci)| offset_cl(s, grid.wg, kxy) + ci)
        .collect();
    let a = ShiftedCols {
        xt,
        off: &off,
        pos: &pos,
    };
    let b = View::row_major(gt, depth, o);
    let (abuf, bbuf) = (&mut sc.abuf, &mut sc.bbuf);
    gemm_serial(
        &a,
        &b,
        (0, k * k * c),
        (depth, o),
        &mut dwt,
        false,
        abuf,
        bbuf,
    );
    (dwt, true)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The definition, in f64.
    pub(crate) fn naive(x: &[f32], w: &[f32], s: &ConvShape) -> Vec<f32> {
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

    pub(crate) fn data(n: usize, seed: u32) -> Vec<f32> {
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
            // batch 1 (the channels split over threads), more channels than a tile
            s(1, 6, 8, 33, 3, 1, 1),
            s(5, 4, 6, 14, 3, 1, 1),
            // no padding, a 5×5 kernel of stride 2, stride 3
            s(2, 3, 9, 4, 3, 1, 0),
            s(2, 3, 10, 5, 5, 2, 2),
            s(2, 2, 11, 3, 3, 3, 1),
            // 32 channels (the weight gradient read in place where the CPU has AVX2 or AVX-512), and
            // more output channels than a tile is wide
            s(2, 32, 5, 14, 3, 1, 1),
            s(2, 32, 6, 13, 3, 2, 1),
            s(2, 16, 4, 40, 3, 1, 1),
            // a pointwise projection of stride 3 (subsampled), 32 channels
            s(2, 32, 7, 12, 1, 3, 0),
            // Winograd F(2x2, 3x3) where the CPU has a register tile (whole vectors of
            // channels), forward and input gradient; larger ones in `winograd::tests`
            s(2, 32, 3, 32, 3, 1, 1),
            s(3, 16, 4, 32, 3, 1, 1),
        ]
    }

    /// Run `f` on the packed path and, where the CPU has it, the direct one.
    fn both_paths(f: impl Fn() + Sync) {
        use crate::gemm::tests::PACKED_ONLY;
        // The conv's own rayon pool runs the products: pin them to this thread's setting.
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        for packed in [false, true] {
            pool.install(|| {
                PACKED_ONLY.with(|p| p.set(packed));
                f();
                PACKED_ONLY.with(|p| p.set(false));
            });
        }
    }

    #[test]
    fn forward_matches_the_definition() {
        both_paths(forward_checks);
    }

    fn forward_checks() {
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

    /// The fused epilogue (inference BatchNorm, residual, ReLU) gives exactly the convolution
    /// followed by [`crate::batchnorm::normalize`], whole images a task and output channels
    /// split over threads (batch 2 on 3 threads), on both product paths.
    #[test]
    fn the_epilogue_equals_the_convolution_then_the_batch_norm_pass() {
        use crate::batchnorm::{normalize, BnShape};
        use crate::gemm::tests::PACKED_ONLY;
        for (threads, packed) in [(1, false), (3, false), (3, true)] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                PACKED_ONLY.with(|p| p.set(packed));
                for s in shapes() {
                    epilogue_check(&s);
                }
                PACKED_ONLY.with(|p| p.set(false));
            });
        }
        fn epilogue_check(s: &ConvShape) {
            let (o, (oh, ow)) = (s.out_channels, s.out_hw());
            let x = data(s.batch * s.image(), 1);
            let w = data(o * s.patch(), 2);
            let (gamma, beta) = (data(o, 3), data(o, 4));
            let (mean, var): (Vec<f32>, Vec<f32>) =
                (data(o, 5), data(o, 6).iter().map(|v| v + 1.5).collect());
            let r = data(s.batch * o * oh * ow, 7);
            let bn = BnShape {
                batch: s.batch,
                channels: o,
                plane: oh * ow,
            };
            let coef = crate::batchnorm::coefficients((&gamma, &beta), (&mean, &var), 1e-5, o);
            for (residual, relu) in [(None, false), (Some(&r[..]), true), (Some(&r[..]), false)] {
                let then = Epilogue {
                    coef: &coef,
                    residual,
                    floor: if relu { 0.0 } else { f32::NEG_INFINITY },
                };
                let fused = conv2d_then(&x, &w, s, Some(&then));
                let y = conv2d(&x, &w, s);
                let want = normalize(
                    &y,
                    (&gamma, &beta),
                    (&mean, &var),
                    1e-5,
                    (residual, relu),
                    &bn,
                );
                assert!(
                    fused == want,
                    "{s:?} residual {} relu {relu}",
                    residual.is_some()
                );
                assert!(fused != y, "the epilogue did something");
            }
        }
    }

    /// The backward pass against finite differences of `L = Σ y ⊙ r` (r fixed).
    #[test]
    fn gradients_match_finite_differences() {
        both_paths(gradient_checks);
    }

    fn gradient_checks() {
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
                    // Relative past 1: the loss sums f32 outputs, whose rounding the difference
                    // quotient magnifies where the gradient is large.
                    assert!(
                        (fd - grad[i] as f64).abs() < 2e-3 * (1.0 + (grad[i] as f64).abs()),
                        "{s:?} {which} {i}: {fd} vs {}",
                        grad[i]
                    );
                }
            }
        }
    }
}
