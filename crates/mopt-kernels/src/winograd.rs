//! Winograd's minimal filtering F(2×2, 3×3) for the stride-1, padding-1 3×3 convolutions
//! (the ResNet blocks' body and, through the flipped kernel, their input gradient), and its
//! transpose F(3×3, 2×2) for their weight gradient ([`weight_grad`]).
//!
//! Each 2×2 block of outputs (a *tile*) is computed from the 4×4 input patch `d` around it as
//! `Y = Aᵀ [ Σ_c (G g G^T) ⊙ (Bᵀ d B) ] A`: 16 products a tile and input-output channel pair
//! instead of 36, so the products' arithmetic falls 2.25×. The 16 element-wise products over
//! channels are 16 matrix products `M_ξ[t, o] = Σ_c V_ξ[t, c] · U_ξ[c, o]` (tiles × output
//! channels), run on a register tile of the GEMM's shape (12 × 32 on AVX-512, 6 × 16 on AVX2)
//! with tiles as rows and output channels as columns.
//!
//! The transforms run channels-last, a vector of channels at a time: each image is first
//! transposed to a zero-padded `[H + 2, W + 2, C]`, the outputs are gathered channels-last and
//! transposed back to NCHW at the end (where the inference epilogue is applied). Tiles are
//! taken in chunks whose transformed inputs and products stay in L2.
//!
//! # Error
//!
//! `G` has the entries `±½` and `Bᵀ`, `Aᵀ` only `0, ±1`: every transform is a few additions, so
//! the result differs from the direct convolution by rounding only (a few ulps of the terms'
//! magnitude; `tests` bounds it against the definition in f64 beside the direct path's).

use std::cell::RefCell;

use pulp::{Simd, WithSimd};
use rayon::prelude::*;

use crate::batchnorm::normalize_run;
use crate::conv::{ConvShape, Epilogue};
use crate::transpose::transpose;

/// The vector width F(2×2, 3×3) runs this convolution at, if it runs it: 3×3, stride 1,
/// padding 1, channels and output channels in whole vectors, a SIMD register tile on this CPU,
/// and `MOPT_CONV` not `direct`.
fn isa_for(s: &ConvShape) -> Option<Isa> {
    let isa = Isa::get()?;
    let lanes = isa.lanes();
    (s.kernel == 3
        && s.stride == 1
        && s.pad == 1
        && s.channels.is_multiple_of(lanes)
        && s.out_channels.is_multiple_of(lanes)
        && !direct_only())
    .then_some(isa)
}

/// `MOPT_CONV=direct`: every convolution on the direct (shifted-row) products, for comparisons.
fn direct_only() -> bool {
    static DIRECT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DIRECT.get_or_init(|| std::env::var("MOPT_CONV").is_ok_and(|v| v == "direct"))
}

/// The vector width the transforms and the register tile run at.
#[derive(Debug, Clone, Copy)]
enum Isa {
    #[cfg(target_arch = "x86_64")]
    V4(pulp::x86::V4),
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    V3(pulp::x86::V3),
}

impl Isa {
    /// The tile the GEMM uses on this CPU (none on the portable tile, or when tests force the
    /// packed products).
    fn get() -> Option<Self> {
        #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
        {
            let direct = crate::gemm::Direct::get()?;
            #[cfg(target_arch = "x86_64")]
            if direct.wide() {
                return crate::cpu::v4().map(Isa::V4);
            }
            pulp::x86::V3::try_new().map(Isa::V3)
        }
        #[cfg(not(any(target_arch = "x86", target_arch = "x86_64")))]
        None
    }

    /// Run `op` compiled for this vector width.
    fn vectorize<Op: WithSimd>(self, op: Op) -> Op::Output {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::V4(v) => Simd::vectorize(v, op),
            #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
            Isa::V3(v) => Simd::vectorize(v, op),
        }
    }

    /// Rows of its register tile.
    fn tile_rows(self) -> usize {
        if self.lanes() == 16 {
            12
        } else {
            6
        }
    }

    fn lanes(self) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::V4(_) => 16,
            #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
            Isa::V3(_) => 8,
        }
    }
}

/// `U_ξ[c, o]` for `ξ = 4i + j`: `(G g G^T)[i, j]` of every filter `g = w[o, c]`, a vector of
/// output channels at a time (the weights first transposed to `[C, 3, 3, O]`).
///
/// # Shapes
/// - `w`: `[O, C, 3, 3]`
/// - returns `[16, C, O]`
fn filters(isa: Isa, w: &[f32], c: usize, o: usize) -> Vec<f32> {
    let mut wt = vec![0.0f32; w.len()];
    transpose((w, c * 9), (o, c * 9), &mut wt, o);
    let mut u = vec![0.0f32; 16 * c * o];
    let run = Filters {
        wt: &wt,
        u: &mut u,
        c,
        o,
    };
    isa.vectorize(run);
    u
}

/// [`filters`], compiled for the CPU's vector width.
struct Filters<'a> {
    wt: &'a [f32],
    u: &'a mut [f32],
    c: usize,
    o: usize,
}

impl WithSimd for Filters<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let Filters { wt, u, c, o } = self;
        let half = simd.splat_f32s(0.5);
        let (add, sub) = (|a, b| simd.add_f32s(a, b), |a, b| simd.sub_f32s(a, b));
        let z = simd.splat_f32s(0.0);
        for ic in 0..c {
            for o0 in (0..o).step_by(S::F32_LANES) {
                let mut g = [z; 9];
                for (k, gk) in g.iter_mut().enumerate() {
                    *gk = load::<S>(&wt[(ic * 9 + k) * o + o0..]);
                }
                // t = G g (4 × 3), then u = t Gᵀ (4 × 4).
                let mut t = [[z; 3]; 4];
                for j in 0..3 {
                    let (g0, g1, g2) = (g[j], g[3 + j], g[6 + j]);
                    t[0][j] = g0;
                    t[1][j] = simd.mul_f32s(half, add(add(g0, g1), g2));
                    t[2][j] = simd.mul_f32s(half, add(sub(g0, g1), g2));
                    t[3][j] = g2;
                }
                for (i, &[t0, t1, t2]) in t.iter().enumerate() {
                    let row = [
                        t0,
                        simd.mul_f32s(half, add(add(t0, t1), t2)),
                        simd.mul_f32s(half, add(sub(t0, t1), t2)),
                        t2,
                    ];
                    for (j, v) in row.into_iter().enumerate() {
                        store::<S>(&mut u[((i * 4 + j) * c + ic) * o + o0..], v);
                    }
                }
            }
        }
    }
}

/// The geometry of one call.
#[derive(Debug, Clone, Copy)]
struct Plan {
    c: usize,
    o: usize,
    h: usize,
    w: usize,
    /// Tiles down and across.
    th: usize,
    tw: usize,
    /// Padded width, in pixels (`2·tw + 2`); the padded height is `2·th + 2`.
    wp: usize,
    /// Rows of the register tile.
    mr: usize,
    /// Tiles a chunk of the forward (and input gradient).
    chunk: usize,
}

impl Plan {
    fn new(s: &ConvShape, mr: usize) -> Self {
        let (th, tw) = (s.height.div_ceil(2), s.width.div_ceil(2));
        let mut p = Self {
            c: s.channels,
            o: s.out_channels,
            h: s.height,
            w: s.width,
            th,
            tw,
            wp: 2 * tw + 2,
            mr,
            chunk: 0,
        };
        // A chunk's transformed inputs and products within ~384 KiB.
        p.chunk = p.tiles_within(384);
        p
    }

    /// Tiles (whole register tiles, at least one) whose 16 transformed inputs and outputs,
    /// `16·tiles·(C + O)` values, fit in `kib` KiB.
    fn tiles_within(&self, kib: usize) -> usize {
        let fit = (kib * 1024 / 4 / 16 / (self.c + self.o)).max(self.mr);
        fit / self.mr * self.mr
    }

    fn padded(&self) -> usize {
        (2 * self.th + 2) * self.wp * self.c
    }
}

/// An image's buffers, reused from call to call by the thread that runs the image.
#[derive(Default)]
struct ImageBufs {
    /// The image channels-last: unpadded, then zero-padded.
    flat: Vec<f32>,
    padded: Vec<f32>,
    /// The output channels-last `[H, W, O]`, then NCHW before the epilogue.
    yc: Vec<f32>,
    out: Vec<f32>,
}

/// A chunk's buffers: transformed inputs `[16, chunk + SLACK, C]` and products
/// `[16, chunk + SLACK, O]` (the rows past the chunk only read by a short register tile).
#[derive(Default)]
struct ChunkBufs {
    v: Vec<f32>,
    m: Vec<f32>,
}

thread_local! {
    static IMAGE: RefCell<ImageBufs> = RefCell::default();
    static CHUNK: RefCell<ChunkBufs> = RefCell::default();
}

/// Run `f` with this thread's buffers in `key` (fresh ones if they are in use).
fn with<T: Default + 'static, R>(
    key: &'static std::thread::LocalKey<RefCell<T>>,
    f: impl FnOnce(&mut T) -> R,
) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut held) => f(&mut held),
        Err(_) => f(&mut T::default()),
    })
}

/// Rows past a chunk's last tile that a short register tile may read (never stored).
const SLACK: usize = 12;

/// `y = conv(x, w)` (+ `then` on every output value), or `None` when F(2×2, 3×3) does not run
/// this shape ([`isa_for`]).
/// Whole images a task when the batch keeps every thread busy; otherwise each image's tile
/// rows split over the threads.
///
/// # Shapes
/// - `x`: `[batch, C, H, W]`, `w`: `[O, C, 3, 3]`
/// - returns `[batch, O, H, W]`
pub(crate) fn conv2d(
    x: &[f32],
    w: &[f32],
    s: &ConvShape,
    then: Option<&Epilogue>,
) -> Option<Vec<f32>> {
    let isa = isa_for(s)?;
    let p = Plan::new(s, isa.tile_rows());
    let u = filters(isa, w, p.c, p.o);
    let (image, plane, o) = (p.c * p.h * p.w, p.h * p.w, p.o);
    let mut y = vec![0.0f32; s.batch * o * plane];
    let threads = rayon::current_num_threads().max(1);
    // Image `n`'s input and epilogue.
    let part = |n: usize| {
        let then = then.map(|e| e.from(0, n * o * plane));
        (&x[n * image..][..image], then)
    };
    if s.batch >= 2 * threads {
        y.par_chunks_mut(o * plane)
            .enumerate()
            .for_each(|(n, out)| {
                let (img, then) = part(n);
                with(&IMAGE, |ib| {
                    pad_channels_last(img, &p, ib);
                    ib.yc.resize(plane * o, 0.0);
                    with(&CHUNK, |cb| {
                        tiles(isa, &p, (0, p.th), (&ib.padded, &u), cb, &mut ib.yc)
                    });
                    finish(&p, ib, out, then.as_ref());
                })
            });
        return Some(y);
    }
    let per = p.th.div_ceil(threads);
    for (n, out) in y.chunks_mut(o * plane).enumerate() {
        let (img, then) = part(n);
        with(&IMAGE, |ib| {
            pad_channels_last(img, &p, ib);
            ib.yc.resize(plane * o, 0.0);
            let padded = &ib.padded;
            ib.yc
                .par_chunks_mut(2 * per * p.w * o)
                .enumerate()
                .for_each(|(i, yc)| {
                    let rows = (i * per, ((i + 1) * per).min(p.th));
                    with(&CHUNK, |cb| tiles(isa, &p, rows, (padded, &u), cb, yc));
                });
            finish(&p, ib, out, then.as_ref());
        })
    }
    Some(y)
}

/// Tile rows `r0..r1` of an image (`padded` as [`pad_channels_last`] leaves it, `u` from
/// [`filters`]): their outputs into `yc`, channels-last from output row `2·r0` on.
fn tiles(
    isa: Isa,
    p: &Plan,
    (r0, r1): (usize, usize),
    (padded, u): (&[f32], &[f32]),
    cb: &mut ChunkBufs,
    yc: &mut [f32],
) {
    let run = Tiles {
        p,
        rows: (r0, r1),
        padded,
        u,
        cb,
        yc,
    };
    isa.vectorize(run)
}

/// [`tiles`], compiled for the CPU's vector width.
struct Tiles<'a> {
    p: &'a Plan,
    rows: (usize, usize),
    padded: &'a [f32],
    u: &'a [f32],
    cb: &'a mut ChunkBufs,
    yc: &'a mut [f32],
}

impl WithSimd for Tiles<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let Tiles {
            p,
            rows: (r0, r1),
            padded,
            u,
            cb,
            yc,
        } = self;
        let rows = p.chunk + SLACK;
        cb.v.resize(16 * rows * p.c, 0.0);
        cb.m.resize(16 * rows * p.o, 0.0);
        let end = r1 * p.tw;
        for t0 in (r0 * p.tw..end).step_by(p.chunk) {
            let nt = p.chunk.min(end - t0);
            inputs(simd, p, (t0, nt), padded, (&mut cb.v, rows, 0));
            for xi in 0..16 {
                let a = &cb.v[xi * rows * p.c..][..rows * p.c];
                let b = &u[xi * p.c * p.o..][..p.c * p.o];
                let m = &mut cb.m[xi * rows * p.o..][..rows * p.o];
                product(simd, p.mr, (a, b, m), (nt, p.c, p.o));
            }
            outputs(simd, p, (t0, nt), &cb.m, (yc, 2 * r0));
        }
    }
}

/// The image's output, channels-last in `ib.yc`, into `out` (`[O, H, W]`), through the
/// epilogue when there is one.
fn finish(p: &Plan, ib: &mut ImageBufs, out: &mut [f32], then: Option<&Epilogue>) {
    let plane = p.h * p.w;
    let Some(e) = then else {
        return transpose((&ib.yc, p.o), (plane, p.o), out, plane);
    };
    ib.out.resize(p.o * plane, 0.0);
    transpose((&ib.yc, p.o), (plane, p.o), &mut ib.out, plane);
    let planes = out.chunks_exact_mut(plane).zip(ib.out.chunks_exact(plane));
    for (c, (dst, src)) in planes.enumerate() {
        let res = e.residual.map(|r| &r[c * plane..][..plane]);
        normalize_run(dst, src, res, e.coef[c], e.floor);
    }
}

/// `img` (`[C, H, W]`) into `ib.padded` as `[2·th + 2, wp, C]`, the image at row and column 1,
/// zeros around it (only the border is written with zeros).
fn pad_channels_last(img: &[f32], p: &Plan, ib: &mut ImageBufs) {
    let (c, row) = (p.c, p.wp * p.c);
    let plane = p.h * p.w;
    ib.flat.resize(plane * c, 0.0);
    transpose((img, plane), (c, plane), &mut ib.flat, c);
    ib.padded.resize(p.padded(), 0.0);
    let padded = &mut ib.padded[..];
    padded[..row].fill(0.0);
    padded[(p.h + 1) * row..].fill(0.0);
    for y in 0..p.h {
        let r = &mut padded[(y + 1) * row..][..row];
        r[..c].fill(0.0);
        r[(p.w + 1) * c..].fill(0.0);
        r[c..(p.w + 1) * c].copy_from_slice(&ib.flat[y * p.w * c..][..p.w * c]);
    }
}

#[inline(always)]
fn load<S: Simd>(s: &[f32]) -> S::f32s {
    pulp::bytemuck::pod_read_unaligned(pulp::bytemuck::cast_slice(&s[..S::F32_LANES]))
}

#[inline(always)]
fn store<S: Simd>(d: &mut [f32], v: S::f32s) {
    d[..S::F32_LANES].copy_from_slice(pulp::bytemuck::cast_slice(core::slice::from_ref(&v)));
}

/// `V_ξ[t, c] = (Bᵀ d B)[ξ]` for tiles `t0..t0 + nt`, `d` the 4 × 4 patch at padded
/// `(2·ty, 2·tx)`: into `v` as `[16, rows, C]` from row `r0` on.
#[inline(always)]
fn inputs<S: Simd>(
    simd: S,
    p: &Plan,
    (t0, nt): (usize, usize),
    padded: &[f32],
    (v, rows, r0): (&mut [f32], usize, usize),
) {
    let (c, l) = (p.c, S::F32_LANES);
    for tl in 0..nt {
        let (ty, tx) = ((t0 + tl) / p.tw, (t0 + tl) % p.tw);
        let base = (2 * ty * p.wp + 2 * tx) * c;
        for c0 in (0..c).step_by(l) {
            // (Plain loops: `core::array::from_fn`'s closures are not inlined into the
            // vectorised function and would run without its target features.)
            let z = simd.splat_f32s(0.0);
            let mut d = [[z; 4]; 4];
            for (i, row) in d.iter_mut().enumerate() {
                let at = base + i * p.wp * c + c0;
                for (j, v) in row.iter_mut().enumerate() {
                    *v = load::<S>(&padded[at + j * c..]);
                }
            }
            // t = Bᵀ d (rows), then V = t B (columns).
            let (add, sub) = (|a, b| simd.add_f32s(a, b), |a, b| simd.sub_f32s(a, b));
            let mut t = [[z; 4]; 4];
            for (j, tj) in t.iter_mut().enumerate() {
                *tj = [
                    sub(d[0][j], d[2][j]),
                    add(d[1][j], d[2][j]),
                    sub(d[2][j], d[1][j]),
                    sub(d[1][j], d[3][j]),
                ];
            }
            for i in 0..4 {
                let row = [
                    sub(t[0][i], t[2][i]),
                    add(t[1][i], t[2][i]),
                    sub(t[2][i], t[1][i]),
                    sub(t[1][i], t[3][i]),
                ];
                for (j, val) in row.into_iter().enumerate() {
                    store::<S>(&mut v[((i * 4 + j) * rows + r0 + tl) * c + c0..], val);
                }
            }
        }
    }
}

/// `Y = Aᵀ M A` for tiles `t0..t0 + nt` into `yc` (`[H, W, O]` from row `y0` on), the 2 × 2
/// outputs of tile `(ty, tx)` at `(2·ty, 2·tx)`, those past the image's edge dropped.
#[inline(always)]
fn outputs<S: Simd>(
    simd: S,
    p: &Plan,
    (t0, nt): (usize, usize),
    m: &[f32],
    (yc, y0): (&mut [f32], usize),
) {
    let (o, l, rows) = (p.o, S::F32_LANES, p.chunk + SLACK);
    let (add, sub) = (|a, b| simd.add_f32s(a, b), |a, b| simd.sub_f32s(a, b));
    for tl in 0..nt {
        let (ty, tx) = ((t0 + tl) / p.tw, (t0 + tl) % p.tw);
        for o0 in (0..o).step_by(l) {
            let mut mv = [[simd.splat_f32s(0.0); 4]; 4];
            for (i, row) in mv.iter_mut().enumerate() {
                for (j, v) in row.iter_mut().enumerate() {
                    *v = load::<S>(&m[((i * 4 + j) * rows + tl) * o + o0..]);
                }
            }
            // s = Aᵀ M (2 × 4), then Y = s A (2 × 2).
            let (mut s0, mut s1) = (mv[0], mv[0]);
            for j in 0..4 {
                s0[j] = add(add(mv[0][j], mv[1][j]), mv[2][j]);
                s1[j] = sub(sub(mv[1][j], mv[2][j]), mv[3][j]);
            }
            let s = [s0, s1];
            for (a, sa) in s.iter().enumerate() {
                let y = 2 * ty + a;
                if y >= p.h {
                    break;
                }
                let pair = [add(add(sa[0], sa[1]), sa[2]), sub(sub(sa[1], sa[2]), sa[3])];
                for (b, val) in pair.into_iter().enumerate() {
                    let x = 2 * tx + b;
                    if x < p.w {
                        store::<S>(&mut yc[((y - y0) * p.w + x) * o + o0..], val);
                    }
                }
            }
        }
    }
}

/// `m[t, :] = Σ_c a[t, c] · b[c, :]` for `t < nt`: `a` is `[rows, C]`, `b` `[C, O]`, `m`
/// `[rows, O]` (rows up to `nt + SLACK`, so a short register tile stays inside).
#[inline(always)]
fn product<S: Simd>(
    simd: S,
    mr: usize,
    (a, b, m): (&[f32], &[f32], &mut [f32]),
    (nt, c, o): (usize, usize, usize),
) {
    let nr = 2 * S::F32_LANES;
    for t0 in (0..nt).step_by(mr) {
        let h = mr.min(nt - t0);
        let a = &a[t0 * c..];
        let m = &mut m[t0 * o..];
        for o0 in (0..o).step_by(nr) {
            let b = &b[o0..];
            let m = &mut m[o0..];
            let args = ((a, c), (b, o), c, (m, o));
            match (mr, h, o - o0 >= nr) {
                (12, 9.., true) => tile::<S, 12, 2>(simd, args),
                (12, 5..=8, true) => tile::<S, 8, 2>(simd, args),
                (_, 5.., true) => tile::<S, 6, 2>(simd, args),
                (_, 3..=4, true) => tile::<S, 4, 2>(simd, args),
                (_, _, true) => tile::<S, 2, 2>(simd, args),
                // A last block of output channels one vector wide.
                (12, 9.., false) => tile::<S, 12, 1>(simd, args),
                (_, 5.., false) => tile::<S, 8, 1>(simd, args),
                (_, _, false) => tile::<S, 4, 1>(simd, args),
            }
        }
    }
}

/// A row-major matrix and its row stride.
type Rows<'a> = (&'a [f32], usize);
/// [`Rows`], written.
type RowsMut<'a> = (&'a mut [f32], usize);

/// The register tile: `m[r, 0..V·L] = Σ_k a[r·lda + k] · b[k·ldb + 0..V·L]` for `r < R` (`L`
/// lanes, `V` vectors), A broadcast from its rows in place.
#[inline(always)]
fn tile<S: Simd, const R: usize, const V: usize>(
    simd: S,
    ((a, lda), (b, ldb), kc, (m, ldm)): (Rows, Rows, usize, RowsMut),
) {
    let l = S::F32_LANES;
    let mut rows: [&[f32]; R] = [&[]; R];
    for (r, row) in rows.iter_mut().enumerate() {
        *row = &a[r * lda..][..kc];
    }
    let z = simd.splat_f32s(0.0);
    let mut acc = [[z; V]; R];
    for k in 0..kc {
        let bk = &b[k * ldb..][..V * l];
        let mut bv = [z; V];
        for (v, bv) in bv.iter_mut().enumerate() {
            *bv = load::<S>(&bk[v * l..]);
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            let av = simd.splat_f32s(rows[r][k]);
            for (acc, &bv) in acc.iter_mut().zip(&bv) {
                *acc = simd.mul_add_f32s(av, bv, *acc);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (v, &acc) in acc.iter().enumerate() {
            store::<S>(&mut m[r * ldm + v * l..], acc);
        }
    }
}

/// The weight gradient `dW[o, c, ky, kx] = Σ g[n, o, y, x] · x[n, c, y + ky − 1, x + kx − 1]`
/// by F(3×3, 2×2), the transposed algorithm: each 2 × 2 block of the output gradient `e` and
/// the 4 × 4 input patch `d` under it (the forward's tile) add `(A e Aᵀ) ⊙ (Bᵀ d B)` to `M`,
/// and `dW = Gᵀ M G` at the end. `M_ξ[o, c] = Σ_t E_ξ[t, o] · V_ξ[t, c]` over every tile of the
/// batch is 16 products of depth `tiles` (2.25× fewer multiplications than the direct 9); the
/// batch is split over the threads and their partial sums added. `None` when [`isa_for`]
/// declines the shape.
///
/// # Shapes
/// - `x`: `[batch, C, H, W]`, `g`: `[batch, O, H, W]`
/// - returns `[O, C, 3, 3]`
pub(crate) fn weight_grad(x: &[f32], g: &[f32], s: &ConvShape) -> Option<Vec<f32>> {
    let isa = isa_for(s)?;
    let p = Plan::new(s, isa.tile_rows());
    let threads = rayon::current_num_threads().max(1);
    let per = s.batch.div_ceil(threads);
    let parts: Vec<Vec<f32>> = (0..s.batch.div_ceil(per))
        .into_par_iter()
        .map(|part| {
            let images = (part * per, ((part + 1) * per).min(s.batch));
            let mut m = vec![0.0f32; 16 * p.o * p.c];
            with(&IMAGE, |ib| {
                with(&CHUNK, |cb| {
                    let run = Gradients {
                        p: &p,
                        xg: (x, g),
                        images,
                        bufs: (ib, cb),
                        m: &mut m,
                    };
                    isa.vectorize(run)
                })
            });
            m
        })
        .collect();
    let mut dw = vec![0.0f32; p.o * p.c * 9];
    dw.par_chunks_mut(p.c * 9).enumerate().for_each(|(o, dwo)| {
        for (c, k) in dwo.chunks_exact_mut(9).enumerate() {
            let mut m = [[0.0f32; 4]; 4];
            for part in &parts {
                for (xi, v) in m.as_flattened_mut().iter_mut().enumerate() {
                    *v += part[(xi * p.o + o) * p.c + c];
                }
            }
            k.copy_from_slice(&filter_gradient(&m));
        }
    });
    Some(dw)
}

/// `Gᵀ M G` (3 × 3), `G` the filter transform's matrix.
fn filter_gradient(m: &[[f32; 4]; 4]) -> [f32; 9] {
    let g_t = |v: [f32; 4]| {
        [
            v[0] + 0.5 * (v[1] + v[2]),
            0.5 * (v[1] - v[2]),
            0.5 * (v[1] + v[2]) + v[3],
        ]
    };
    let rows: [[f32; 3]; 4] = [g_t(m[0]), g_t(m[1]), g_t(m[2]), g_t(m[3])];
    let mut out = [0.0f32; 9];
    for kx in 0..3 {
        let col = g_t([rows[0][kx], rows[1][kx], rows[2][kx], rows[3][kx]]);
        for ky in 0..3 {
            out[ky * 3 + kx] = col[ky];
        }
    }
    out
}

/// Images `n0..n1`'s tiles added to `m` (`[16, O, C]`), compiled for the CPU's vector width.
/// Tiles are gathered across images into chunks (the order of a sum's terms is free), so a
/// 7-pixel image's 16 tiles do not each pass over all of `m`.
struct Gradients<'a> {
    p: &'a Plan,
    xg: (&'a [f32], &'a [f32]),
    images: (usize, usize),
    bufs: (&'a mut ImageBufs, &'a mut ChunkBufs),
    m: &'a mut [f32],
}

impl WithSimd for Gradients<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let Gradients {
            p,
            xg: (x, g),
            images: (n0, n1),
            bufs: (ib, cb),
            m,
        } = self;
        // A chunk's transformed inputs and gradients within ~768 KiB: the depth of the
        // products, so the larger the fewer passes over `m`.
        let chunk = p.tiles_within(768);
        let rows = chunk + SLACK;
        cb.v.resize(16 * rows * p.c, 0.0);
        cb.m.resize(16 * rows * p.o, 0.0);
        let plane = p.h * p.w;
        let tiles = p.th * p.tw;
        let mut fill = 0;
        for n in n0..n1 {
            pad_channels_last(&x[n * p.c * plane..][..p.c * plane], p, ib);
            ib.yc.resize(plane * p.o, 0.0);
            let gn = &g[n * p.o * plane..][..p.o * plane];
            transpose((gn, plane), (p.o, plane), &mut ib.yc, p.o);
            let mut t0 = 0;
            while t0 < tiles {
                let nt = (chunk - fill).min(tiles - t0);
                inputs(simd, p, (t0, nt), &ib.padded, (&mut cb.v, rows, fill));
                output_grads(simd, p, (t0, nt), &ib.yc, (&mut cb.m, rows, fill));
                (fill, t0) = (fill + nt, t0 + nt);
                if fill == chunk {
                    flush(simd, (p, rows), cb, fill, m);
                    fill = 0;
                }
            }
        }
        if fill > 0 {
            flush(simd, (p, rows), cb, fill, m);
        }
    }
}

/// A chunk of `nt` tiles' 16 products added to `m` (a function, not a closure: closures are
/// not always inlined into the vectorised caller, and would run without its target features).
#[inline(always)]
fn flush<S: Simd>(simd: S, (p, rows): (&Plan, usize), cb: &ChunkBufs, nt: usize, m: &mut [f32]) {
    for xi in 0..16 {
        let ev = &cb.m[xi * rows * p.o..][..rows * p.o];
        let v = &cb.v[xi * rows * p.c..][..rows * p.c];
        let mx = &mut m[xi * p.o * p.c..][..p.o * p.c];
        product_t(simd, p.mr, (ev, v, mx), (nt, p.o, p.c));
    }
}

/// `E_ξ[t, o] = (A e Aᵀ)[ξ]` for tiles `t0..t0 + nt`, `e` the 2 × 2 block of the output
/// gradient at `(2·ty, 2·tx)` (zeros past the image's edge): into `out` as `[16, rows, O]`
/// from row `r0` on.
#[inline(always)]
fn output_grads<S: Simd>(
    simd: S,
    p: &Plan,
    (t0, nt): (usize, usize),
    e: &[f32],
    (out, rows, r0): (&mut [f32], usize, usize),
) {
    let (o, l) = (p.o, S::F32_LANES);
    let z = simd.splat_f32s(0.0);
    let (add, sub) = (|a, b| simd.add_f32s(a, b), |a, b| simd.sub_f32s(a, b));
    for tl in 0..nt {
        let (ty, tx) = ((t0 + tl) / p.tw, (t0 + tl) % p.tw);
        for o0 in (0..o).step_by(l) {
            let mut d = [[z; 2]; 2];
            for (a, row) in d.iter_mut().enumerate() {
                for (b, v) in row.iter_mut().enumerate() {
                    let (y, x) = (2 * ty + a, 2 * tx + b);
                    if y < p.h && x < p.w {
                        *v = load::<S>(&e[(y * p.w + x) * o + o0..]);
                    }
                }
            }
            // u = A e (4 × 2), then E = u Aᵀ (4 × 4); A = [1 0; 1 1; 1 −1; 0 −1].
            let a_col = |v0, v1| [v0, add(v0, v1), sub(v0, v1), sub(z, v1)];
            let u = [a_col(d[0][0], d[1][0]), a_col(d[0][1], d[1][1])];
            for i in 0..4 {
                let row = a_col(u[0][i], u[1][i]);
                for (j, val) in row.into_iter().enumerate() {
                    store::<S>(&mut out[((i * 4 + j) * rows + r0 + tl) * o + o0..], val);
                }
            }
        }
    }
}

/// `m[o, :] += Σ_t e[t, o] · v[t, :]` for `t < nt`: `e` is `[rows, O]`, `v` `[rows, C]`, `m`
/// `[O, C]`.
#[inline(always)]
fn product_t<S: Simd>(
    simd: S,
    mr: usize,
    (e, v, m): (&[f32], &[f32], &mut [f32]),
    (nt, o, c): (usize, usize, usize),
) {
    let nr = 2 * S::F32_LANES;
    for o0 in (0..o).step_by(mr) {
        let h = mr.min(o - o0);
        for c0 in (0..c).step_by(nr) {
            let args = (&e[o0..], o, &v[c0..], c, nt, &mut m[o0 * c + c0..]);
            // `O` is whole vectors, so a short last block is exactly 2, 4 or 8 rows.
            match (h, c - c0 >= nr) {
                (12, true) => tile_t::<S, 12, 2>(simd, args),
                (8, true) => tile_t::<S, 8, 2>(simd, args),
                (6, true) => tile_t::<S, 6, 2>(simd, args),
                (4, true) => tile_t::<S, 4, 2>(simd, args),
                (2, true) => tile_t::<S, 2, 2>(simd, args),
                (12, false) => tile_t::<S, 12, 1>(simd, args),
                (8, false) => tile_t::<S, 8, 1>(simd, args),
                (6, false) => tile_t::<S, 6, 1>(simd, args),
                (4, false) => tile_t::<S, 4, 1>(simd, args),
                (2, false) => tile_t::<S, 2, 1>(simd, args),
                _ => unreachable!("{h} rows of output channels in whole vectors"),
            }
        }
    }
}

/// The register tile with A read transposed and the sums added: `m[r·ldm + 0..V·L] +=
/// Σ_k a[k·lda + r] · b[k·ldb + 0..V·L]` for `r < R`.
#[inline(always)]
fn tile_t<S: Simd, const R: usize, const V: usize>(
    simd: S,
    (a, lda, b, ldb, kc, m): (&[f32], usize, &[f32], usize, usize, &mut [f32]),
) {
    let (l, ldm) = (S::F32_LANES, ldb);
    let z = simd.splat_f32s(0.0);
    let mut acc = [[z; V]; R];
    for k in 0..kc {
        let ak = &a[k * lda..][..R];
        let bk = &b[k * ldb..][..V * l];
        let mut bv = [z; V];
        for (v, bv) in bv.iter_mut().enumerate() {
            *bv = load::<S>(&bk[v * l..]);
        }
        for (acc, &ar) in acc.iter_mut().zip(ak) {
            let av = simd.splat_f32s(ar);
            for (acc, &bv) in acc.iter_mut().zip(&bv) {
                *acc = simd.mul_add_f32s(av, bv, *acc);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (v, &acc) in acc.iter().enumerate() {
            let at = r * ldm + v * l;
            let sum = simd.add_f32s(load::<S>(&m[at..]), acc);
            store::<S>(&mut m[at..], sum);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv::tests::{data, naive};

    fn pool_of(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
    }

    fn applies(s: &ConvShape) -> bool {
        isa_for(s).is_some()
    }

    fn shape(batch: usize, channels: usize, side: usize, out_channels: usize) -> ConvShape {
        ConvShape {
            batch,
            channels,
            height: side,
            width: side + 1,
            out_channels,
            kernel: 3,
            stride: 1,
            pad: 1,
        }
    }

    /// Where the CPU has a register tile, F(2×2, 3×3) runs these shapes and stays within a
    /// few ulps of the definition (f64), as close as the direct products; a 1-pixel error in
    /// a transform (a wrong sign, a shifted patch) would miss by the values' size (~1).
    #[test]
    fn winograd_matches_the_definition() {
        if Isa::get().is_none() {
            return;
        }
        let pool = pool_of(1);
        pool.install(|| {
            // 28, 14 and 7 px as the ResNet's, odd and even, one chunk and several.
            for s in [
                shape(2, 32, 28, 32),
                shape(2, 64, 14, 64),
                shape(2, 128, 7, 128),
                shape(3, 16, 5, 32),
                shape(2, 32, 1, 64),
                // output channels one vector wide (AVX-512), and one and a half tiles
                shape(2, 16, 6, 16),
                shape(2, 32, 4, 48),
            ] {
                let x = data(s.batch * s.channels * s.height * s.width, 1);
                let w = data(s.out_channels * s.channels * 9, 2);
                let y = conv2d(&x, &w, &s, None).expect("winograd runs this shape");
                let want = naive(&x, &w, &s);
                let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let err = y
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f32::max);
                assert!(err < 2e-6 * scale, "{s:?}: {err} (values up to {scale})");
            }
        });
    }

    /// The weight gradient by F(3×3, 2×2) against its definition in f64, on the ResNet's
    /// sides, an odd one (a half tile of zeros at the edge) and a batch split unevenly over
    /// three threads.
    #[test]
    fn weight_gradient_matches_the_definition() {
        if Isa::get().is_none() {
            return;
        }
        for (s, threads) in [
            (shape(2, 32, 28, 32), 1),
            (shape(2, 64, 14, 16), 1),
            (shape(3, 16, 7, 48), 3),
            (shape(5, 32, 5, 32), 3),
        ] {
            let (o, c, plane) = (s.out_channels, s.channels, s.height * s.width);
            let x = data(s.batch * c * plane, 1);
            let g = data(s.batch * o * plane, 2);
            let pool = pool_of(threads);
            let dw = pool
                .install(|| weight_grad(&x, &g, &s))
                .expect("winograd runs it");
            let mut want = vec![0.0f64; o * c * 9];
            for n in 0..s.batch {
                for (oc, ic) in (0..o).flat_map(|oc| (0..c).map(move |ic| (oc, ic))) {
                    for (ky, kx) in (0..3).flat_map(|ky| (0..3).map(move |kx| (ky, kx))) {
                        let mut acc = 0.0f64;
                        for y in 0..s.height {
                            for xx in 0..s.width {
                                let (iy, ix) = (y + ky, xx + kx);
                                if iy < 1 || ix < 1 || iy > s.height || ix > s.width {
                                    continue;
                                }
                                let gv = g[((n * o + oc) * s.height + y) * s.width + xx];
                                let xv = x[((n * c + ic) * s.height + iy - 1) * s.width + ix - 1];
                                acc += gv as f64 * xv as f64;
                            }
                        }
                        want[(oc * c + ic) * 9 + ky * 3 + kx] += acc;
                    }
                }
            }
            let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let err = dw
                .iter()
                .zip(&want)
                .map(|(a, b)| (*a as f64 - b).abs())
                .fold(0.0, f64::max);
            assert!(err < 2e-6 * scale, "{s:?}: {err} (values up to {scale})");
        }
    }

    /// Shapes it leaves to the direct path: other kernels, strides and paddings, channels
    /// that are not whole vectors.
    #[test]
    fn other_shapes_are_left_to_the_direct_path() {
        if Isa::get().is_none() {
            return;
        }
        let base = shape(4, 32, 8, 32);
        for s in [
            ConvShape {
                kernel: 5,
                pad: 2,
                ..base
            },
            ConvShape { stride: 2, ..base },
            ConvShape { pad: 0, ..base },
            ConvShape {
                channels: 12,
                ..base
            },
            ConvShape {
                out_channels: 12,
                ..base
            },
        ] {
            assert!(!applies(&s), "{s:?}");
        }
        assert!(applies(&base));
    }

    /// A batch too small for whole images a thread splits each image's tile rows over the
    /// threads (uneven parts, an odd height); every tile is computed as on one thread, so the
    /// results are equal bit for bit, with and without the epilogue.
    #[test]
    fn tile_rows_split_over_threads_equal_whole_images() {
        if Isa::get().is_none() {
            return;
        }
        let s = shape(2, 32, 13, 64);
        let (x, w) = (data(2 * 32 * 13 * 14, 1), data(64 * 32 * 9, 2));
        let coef: Vec<(f32, f32)> = (0..64).map(|i| (0.5 + i as f32 / 64.0, -0.1)).collect();
        let r = data(2 * 64 * 13 * 14, 3);
        let then = Epilogue {
            coef: &coef,
            residual: Some(&r),
            floor: 0.0,
        };
        let on = |threads: usize, then: Option<&Epilogue>| {
            let pool = pool_of(threads);
            pool.install(|| conv2d(&x, &w, &s, then)).unwrap()
        };
        for then in [None, Some(&then)] {
            let whole = on(1, then);
            assert_eq!(on(3, then), whole);
            assert_eq!(on(5, then), whole);
        }
    }
}
