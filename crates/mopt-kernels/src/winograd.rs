//! Winograd's minimal filtering F(2×2, 3×3) for the stride-1, padding-1 3×3 convolutions
//! (the ResNet blocks' body and, through the flipped kernel, their input gradient).
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

use pulp::{Simd, WithSimd};
use rayon::prelude::*;

use crate::batchnorm::normalize_run;
use crate::conv::{ConvShape, Epilogue};
use crate::transpose::transpose;

/// Whether F(2×2, 3×3) runs this convolution: 3×3, stride 1, padding 1, channels and output
/// channels in whole vectors, a SIMD register tile on this CPU, and `MOPT_CONV` not `direct`.
pub(crate) fn applies(s: &ConvShape) -> bool {
    let Some(isa) = Isa::get() else {
        return false;
    };
    let lanes = isa.lanes();
    s.kernel == 3
        && s.stride == 1
        && s.pad == 1
        && s.channels % lanes == 0
        && s.out_channels % (2 * lanes) == 0
        && !direct_only()
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
                return pulp::x86::V4::try_new().map(Isa::V4);
            }
            pulp::x86::V3::try_new().map(Isa::V3)
        }
        #[cfg(not(any(target_arch = "x86", target_arch = "x86_64")))]
        None
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

/// `U_ξ[c, o]` for `ξ = 4i + j`: `(G g G^T)[i, j]` of every filter `g = w[o, c]`.
///
/// # Shapes
/// - `w`: `[O, C, 3, 3]`
/// - returns `[16, C, O]`
fn filters(w: &[f32], c: usize, o: usize) -> Vec<f32> {
    let mut u = vec![0.0f32; 16 * c * o];
    for oc in 0..o {
        for ic in 0..c {
            let g = &w[(oc * c + ic) * 9..][..9];
            // t = G g (4 × 3), then u = t Gᵀ (4 × 4).
            let mut t = [[0.0f32; 3]; 4];
            for j in 0..3 {
                let (g0, g1, g2) = (g[j], g[3 + j], g[6 + j]);
                t[0][j] = g0;
                t[1][j] = 0.5 * (g0 + g1 + g2);
                t[2][j] = 0.5 * (g0 - g1 + g2);
                t[3][j] = g2;
            }
            for (i, &[t0, t1, t2]) in t.iter().enumerate() {
                let row = [t0, 0.5 * (t0 + t1 + t2), 0.5 * (t0 - t1 + t2), t2];
                for (j, v) in row.into_iter().enumerate() {
                    u[((i * 4 + j) * c + ic) * o + oc] = v;
                }
            }
        }
    }
    u
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
    /// Tiles a chunk.
    chunk: usize,
}

impl Plan {
    fn new(s: &ConvShape, mr: usize) -> Self {
        let (th, tw) = (s.height.div_ceil(2), s.width.div_ceil(2));
        // A chunk's transformed inputs and products, 16·chunk·(C + O) values, within ~384 KiB.
        let fit = (6144 / (s.channels + s.out_channels)).max(mr);
        Self {
            c: s.channels,
            o: s.out_channels,
            h: s.height,
            w: s.width,
            th,
            tw,
            wp: 2 * tw + 2,
            chunk: fit / mr * mr,
        }
    }

    fn padded(&self) -> usize {
        (2 * self.th + 2) * self.wp * self.c
    }
}

/// Per-thread buffers, reused from call to call.
#[derive(Default)]
struct Scratch {
    /// The image channels-last, unpadded, then the output channels-last.
    flat: Vec<f32>,
    /// The image channels-last, zero-padded.
    padded: Vec<f32>,
    /// Transformed inputs `[16, chunk + slack, C]` and products `[16, chunk + slack, O]`.
    v: Vec<f32>,
    m: Vec<f32>,
    /// The output NCHW before the epilogue.
    out: Vec<f32>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
}

/// Rows past a chunk's last tile that a short register tile may read (never stored).
const SLACK: usize = 12;

/// `y = conv(x, w)` (+ `then` on every output value), or `None` when [`applies`] is false or
/// the batch is too small to give every thread whole images (the direct path splits an
/// image's channels over threads instead).
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
    let isa = Isa::get()?;
    if !applies(s) || s.batch < 2 * rayon::current_num_threads().max(1) {
        return None;
    }
    let u = filters(w, s.channels, s.out_channels);
    let (image, plane) = (s.channels * s.height * s.width, s.height * s.width);
    let mut y = vec![0.0f32; s.batch * s.out_channels * plane];
    y.par_chunks_mut(s.out_channels * plane)
        .enumerate()
        .for_each(|(n, out)| {
            let then = then.map(|e| e.from(0, n * s.out_channels * plane));
            let img = &x[n * image..][..image];
            SCRATCH.with(|cell| {
                let mut fresh = Scratch::default();
                let mut held = cell.try_borrow_mut();
                let sc = match held.as_deref_mut() {
                    Ok(sc) => sc,
                    Err(_) => &mut fresh,
                };
                let run = Image {
                    img,
                    u: &u,
                    out,
                    then,
                    sc,
                    s,
                };
                match isa {
                    #[cfg(target_arch = "x86_64")]
                    Isa::V4(v) => Simd::vectorize(v, run),
                    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
                    Isa::V3(v) => Simd::vectorize(v, run),
                }
            })
        });
    Some(y)
}

/// One image, start to end, compiled for the CPU's vector width.
struct Image<'a> {
    img: &'a [f32],
    u: &'a [f32],
    out: &'a mut [f32],
    then: Option<Epilogue<'a>>,
    sc: &'a mut Scratch,
    s: &'a ConvShape,
}

impl WithSimd for Image<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let Image {
            img,
            u,
            out,
            then,
            sc,
            s,
        } = self;
        let mr = if S::F32_LANES == 16 { 12 } else { 6 };
        let p = Plan::new(s, mr);
        pad_channels_last(img, &p, sc);
        let tiles = p.th * p.tw;
        let rows = p.chunk + SLACK;
        sc.v.resize(16 * rows * p.c, 0.0);
        sc.m.resize(16 * rows * p.o, 0.0);
        sc.flat.resize(p.h * p.w * p.o, 0.0);
        for t0 in (0..tiles).step_by(p.chunk) {
            let nt = p.chunk.min(tiles - t0);
            inputs(simd, &p, (t0, nt), &sc.padded, &mut sc.v);
            for xi in 0..16 {
                let a = &sc.v[xi * rows * p.c..][..rows * p.c];
                let b = &u[xi * p.c * p.o..][..p.c * p.o];
                let m = &mut sc.m[xi * rows * p.o..][..rows * p.o];
                product(simd, mr, (a, b, m), (nt, p.c, p.o));
            }
            outputs(simd, &p, (t0, nt), &sc.m, &mut sc.flat);
        }
        let plane = p.h * p.w;
        match then {
            None => transpose((&sc.flat, p.o), (plane, p.o), out, plane),
            Some(e) => {
                sc.out.resize(p.o * plane, 0.0);
                transpose((&sc.flat, p.o), (plane, p.o), &mut sc.out, plane);
                let planes = out.chunks_exact_mut(plane).zip(sc.out.chunks_exact(plane));
                for (c, (dst, src)) in planes.enumerate() {
                    let res = e.residual.map(|r| &r[c * plane..][..plane]);
                    normalize_run(dst, src, res, e.coef[c], e.floor);
                }
            }
        }
    }
}
/// `img` (`[C, H, W]`) into `sc.padded` as `[2·th + 2, wp, C]`, the image at row and column 1,
/// zeros around it (only the border is written with zeros).
fn pad_channels_last(img: &[f32], p: &Plan, sc: &mut Scratch) {
    let (c, row) = (p.c, p.wp * p.c);
    let plane = p.h * p.w;
    sc.flat.resize(plane * c.max(p.o), 0.0);
    transpose((img, plane), (c, plane), &mut sc.flat, c);
    sc.padded.resize(p.padded(), 0.0);
    let padded = &mut sc.padded[..p.padded()];
    padded[..row].fill(0.0);
    padded[(p.h + 1) * row..].fill(0.0);
    for y in 0..p.h {
        let r = &mut padded[(y + 1) * row..][..row];
        r[..c].fill(0.0);
        r[(p.w + 1) * c..].fill(0.0);
        r[c..(p.w + 1) * c].copy_from_slice(&sc.flat[y * p.w * c..][..p.w * c]);
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
/// `(2·ty, 2·tx)`: into `v` as `[16, chunk + SLACK, C]`.
#[inline(always)]
fn inputs<S: Simd>(simd: S, p: &Plan, (t0, nt): (usize, usize), padded: &[f32], v: &mut [f32]) {
    let (c, l, rows) = (p.c, S::F32_LANES, p.chunk + SLACK);
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
                    store::<S>(&mut v[((i * 4 + j) * rows + tl) * c + c0..], val);
                }
            }
        }
    }
}

/// `Y = Aᵀ M A` for tiles `t0..t0 + nt` into `flat` (`[H, W, O]`), the 2 × 2 outputs of tile
/// `(ty, tx)` at `(2·ty, 2·tx)`, those past the image's edge dropped.
#[inline(always)]
fn outputs<S: Simd>(simd: S, p: &Plan, (t0, nt): (usize, usize), m: &[f32], flat: &mut [f32]) {
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
                let pair = [
                    add(add(sa[0], sa[1]), sa[2]),
                    sub(sub(sa[1], sa[2]), sa[3]),
                ];
                for (b, val) in pair.into_iter().enumerate() {
                    let x = 2 * tx + b;
                    if x < p.w {
                        store::<S>(&mut flat[(y * p.w + x) * o + o0..], val);
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
            match (mr, h) {
                (12, 9..) => tile::<S, 12>(simd, (a, c), (b, o), c, (m, o)),
                (12, 5..=8) => tile::<S, 8>(simd, (a, c), (b, o), c, (m, o)),
                (_, 5..) => tile::<S, 6>(simd, (a, c), (b, o), c, (m, o)),
                (_, 3..=4) => tile::<S, 4>(simd, (a, c), (b, o), c, (m, o)),
                _ => tile::<S, 2>(simd, (a, c), (b, o), c, (m, o)),
            }
        }
    }
}

/// The register tile: `m[r, 0..2L] = Σ_k a[r·lda + k] · b[k·ldb + 0..2L]` for `r < R`
/// (`L` lanes), A broadcast from its rows in place, B's row two vectors.
#[inline(always)]
fn tile<S: Simd, const R: usize>(
    simd: S,
    (a, lda): (&[f32], usize),
    (b, ldb): (&[f32], usize),
    kc: usize,
    (m, ldm): (&mut [f32], usize),
) {
    let l = S::F32_LANES;
    let mut rows: [&[f32]; R] = [&[]; R];
    for (r, row) in rows.iter_mut().enumerate() {
        *row = &a[r * lda..][..kc];
    }
    let z = simd.splat_f32s(0.0);
    let mut acc = [[z; 2]; R];
    for k in 0..kc {
        let bk = &b[k * ldb..][..2 * l];
        let (b0, b1) = (load::<S>(bk), load::<S>(&bk[l..]));
        for (r, acc) in acc.iter_mut().enumerate() {
            let av = simd.splat_f32s(rows[r][k]);
            acc[0] = simd.mul_add_f32s(av, b0, acc[0]);
            acc[1] = simd.mul_add_f32s(av, b1, acc[1]);
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        store::<S>(&mut m[r * ldm..], acc[0]);
        store::<S>(&mut m[r * ldm + l..], acc[1]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv::tests::{data, naive};

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
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        pool.install(|| {
            // 28, 14 and 7 px as the ResNet's, odd and even, one chunk and several.
            for s in [
                shape(2, 32, 28, 32),
                shape(2, 64, 14, 64),
                shape(2, 128, 7, 128),
                shape(3, 16, 5, 32),
                shape(2, 32, 1, 64),
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

    /// Shapes it leaves to the direct path: other kernels, strides and paddings, channels
    /// that are not whole vectors, a batch smaller than twice the threads.
    #[test]
    fn other_shapes_are_left_to_the_direct_path() {
        if Isa::get().is_none() {
            return;
        }
        let base = shape(4, 32, 8, 32);
        for s in [
            ConvShape { kernel: 5, pad: 2, ..base },
            ConvShape { stride: 2, ..base },
            ConvShape { pad: 0, ..base },
            ConvShape { channels: 12, ..base },
            ConvShape { out_channels: 24, ..base },
        ] {
            assert!(!applies(&s), "{s:?}");
        }
        assert!(applies(&base));
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let small = ConvShape { batch: 3, ..base };
        let (x, w) = (data(3 * 32 * 8 * 9, 1), data(32 * 32 * 9, 2));
        assert!(pool.install(|| conv2d(&x, &w, &small, None)).is_none());
    }
}
