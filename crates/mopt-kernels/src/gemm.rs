//! Single-precision GEMM, `C = α·A·B (+ C)`, blocked as BLIS does: B is packed into
//! `KC × NR` column panels, A into `MR × KC` row panels, and a 6 × 16 register-tile
//! micro-kernel (12 AVX2 accumulators) runs over them. Inputs are strided views (a transpose is
//! a stride swap, never a copy); the output is row-major. Row blocks of C are split over
//! rayon's pool; each task packs its own A block.
//!
//! The micro-kernel is plain Rust over fixed-size arrays, compiled under `pulp`'s runtime
//! dispatch for AVX2+FMA (or AVX-512) where the CPU has it: LLVM keeps the tile in registers
//! and emits one FMA per 8 lanes.

use pulp::{Arch, Simd, WithSimd};
use rayon::prelude::*;

/// Rows of the register tile.
pub const MR: usize = 6;
/// Columns of the register tile (two 8-lane vectors).
pub const NR: usize = 16;
/// Depth of a packed panel (A panel 6×256 f32 = 6 KiB, B panel 256×16 = 16 KiB: L1).
const KC: usize = 256;
/// Rows of A per task (an A block of 96×256 f32 = 96 KiB stays in L2).
const MC: usize = 96;
/// Columns of B packed at once (256 × 2048 f32 = 2 MiB, shared by all tasks, in L3).
const NC: usize = 2048;

/// A strided matrix view: element (i, j) is `data[offset + i·rs + j·cs]`.
#[derive(Debug, Clone, Copy)]
pub struct View<'a> {
    pub data: &'a [f32],
    pub offset: usize,
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a> View<'a> {
    /// A row-major `rows × cols` matrix.
    pub fn row_major(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self {
            data,
            offset: 0,
            rows,
            cols,
            rs: cols,
            cs: 1,
        }
    }

    /// The transpose (no copy).
    pub fn t(self) -> Self {
        Self {
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
            ..self
        }
    }

    #[inline(always)]
    fn at(&self, i: usize, j: usize) -> f32 {
        self.data[self.offset + i * self.rs + j * self.cs]
    }
}

/// Pack `B[p0..p0+kc, j0..j0+nc]` into panels of `NR` columns, k-major, zero-padded.
fn pack_b(b: &View, p0: usize, kc: usize, j0: usize, nc: usize, out: &mut Vec<f32>) {
    let panels = nc.div_ceil(NR);
    out.clear();
    out.resize(panels * kc * NR, 0.0);
    out.par_chunks_mut(kc * NR)
        .enumerate()
        .for_each(|(jp, panel)| {
            let j = j0 + jp * NR;
            let w = NR.min(j0 + nc - j);
            if b.cs == 1 && w == NR {
                for (k, dst) in panel.chunks_exact_mut(NR).enumerate() {
                    let s = b.offset + (p0 + k) * b.rs + j;
                    dst.copy_from_slice(&b.data[s..s + NR]);
                }
            } else if b.rs == 1 {
                // A transposed operand (e.g. Wᵀ in dX = G·Wᵀ): read each column as a run.
                for c in 0..w {
                    let s = b.offset + p0 + (j + c) * b.cs;
                    for (k, &v) in b.data[s..s + kc].iter().enumerate() {
                        panel[k * NR + c] = v;
                    }
                }
            } else {
                for (k, dst) in panel.chunks_exact_mut(NR).enumerate() {
                    for (c, d) in dst.iter_mut().enumerate().take(w) {
                        *d = b.at(p0 + k, j + c);
                    }
                }
            }
        });
}

/// Pack `A[i0..i0+mc, p0..p0+kc]` into panels of `MR` rows, k-major, zero-padded.
fn pack_a(a: &View, i0: usize, mc: usize, p0: usize, kc: usize, out: &mut [f32]) {
    if a.rs == 1 && a.cs != 1 {
        // A transposed operand (e.g. Xᵀ in dW = Xᵀ·G): row k of the block is a contiguous run
        // of `mc` values; spread it over the panels.
        let panels = out.len() / (kc * MR);
        for k in 0..kc {
            let s = a.offset + i0 + (p0 + k) * a.cs;
            let run = &a.data[s..s + mc];
            for ip in 0..panels {
                let dst = &mut out[ip * kc * MR + k * MR..ip * kc * MR + (k + 1) * MR];
                let lo = ip * MR;
                let h = MR.min(mc - lo);
                dst[..h].copy_from_slice(&run[lo..lo + h]);
                dst[h..].fill(0.0);
            }
        }
        return;
    }
    for (ip, panel) in out.chunks_exact_mut(kc * MR).enumerate() {
        let i = i0 + ip * MR;
        let h = MR.min(i0 + mc - i);
        if a.cs == 1 {
            for r in 0..MR {
                if r < h {
                    let s = a.offset + (i + r) * a.rs + p0;
                    for (k, &v) in a.data[s..s + kc].iter().enumerate() {
                        panel[k * MR + r] = v;
                    }
                } else {
                    for k in 0..kc {
                        panel[k * MR + r] = 0.0;
                    }
                }
            }
        } else {
            for (k, dst) in panel.chunks_exact_mut(MR).enumerate() {
                for (r, d) in dst.iter_mut().enumerate() {
                    *d = if r < h { a.at(i + r, p0 + k) } else { 0.0 };
                }
            }
        }
    }
}

/// The 6 × 16 tile of `Apanel · Bpanel` over `kc` (portable version).
#[inline(always)]
fn micro(a: &[f32], b: &[f32]) -> [[f32; NR]; MR] {
    let mut c = [[0.0f32; NR]; MR];
    for (ak, bk) in a.chunks_exact(MR).zip(b.chunks_exact(NR)) {
        for r in 0..MR {
            for j in 0..NR {
                c[r][j] += ak[r] * bk[j];
            }
        }
    }
    c
}

/// The same tile with AVX2 FMAs: 12 accumulators, one broadcast of A and two loads of B per k.
#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
#[inline(always)]
fn micro_v3(v: pulp::x86::V3, a: &[f32], b: &[f32]) -> [[f32; NR]; MR] {
    use pulp::f32x8;
    let z = v.splat_f32x8(0.0);
    let mut c = [[z; 2]; MR];
    for (ak, bk) in a.chunks_exact(MR).zip(b.chunks_exact(NR)) {
        let (lo, hi) = bk.split_at(8);
        let b0: f32x8 = pulp::bytemuck::cast(<[f32; 8]>::try_from(lo).expect("8 lanes"));
        let b1: f32x8 = pulp::bytemuck::cast(<[f32; 8]>::try_from(hi).expect("8 lanes"));
        for r in 0..MR {
            let ar = v.splat_f32x8(ak[r]);
            c[r][0] = v.mul_add_f32x8(ar, b0, c[r][0]);
            c[r][1] = v.mul_add_f32x8(ar, b1, c[r][1]);
        }
    }
    pulp::bytemuck::cast(c)
}

/// One task's work: every (A panel, B panel) tile of its row block.
struct Block<'a> {
    apack: &'a [f32],
    bpack: &'a [f32],
    rows: &'a mut [f32],
    kc: usize,
    mc: usize,
    n: usize,
    j0: usize,
    nc: usize,
    alpha: f32,
    accumulate: bool,
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    v3: Option<pulp::x86::V3>,
}

impl WithSimd for Block<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, _simd: S) {
        let Block {
            apack,
            bpack,
            rows,
            kc,
            mc,
            n,
            j0,
            nc,
            alpha,
            accumulate,
            ..
        } = self;
        for (ip, ap) in apack.chunks_exact(kc * MR).enumerate() {
            let h = MR.min(mc - ip * MR);
            for (jp, bpanel) in bpack.chunks_exact(kc * NR).enumerate() {
                let j = j0 + jp * NR;
                let w = NR.min(j0 + nc - j);
                #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
                let tile = match self.v3 {
                    Some(v) => micro_v3(v, ap, bpanel),
                    None => micro(ap, bpanel),
                };
                #[cfg(not(any(target_arch = "x86", target_arch = "x86_64")))]
                let tile = micro(ap, bpanel);
                store(rows, n, ip * MR, j, &tile, h, w, alpha, accumulate);
            }
        }
    }
}

/// `C[i0.., j0..] (+)= α · tile` for the valid `h × w` corner.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn store(
    c: &mut [f32],
    ldc: usize,
    row0: usize,
    j: usize,
    tile: &[[f32; NR]; MR],
    h: usize,
    w: usize,
    alpha: f32,
    accumulate: bool,
) {
    for r in 0..h {
        let dst = &mut c[(row0 + r) * ldc + j..(row0 + r) * ldc + j + w];
        if accumulate {
            for (d, &t) in dst.iter_mut().zip(&tile[r][..w]) {
                *d += alpha * t;
            }
        } else {
            for (d, &t) in dst.iter_mut().zip(&tile[r][..w]) {
                *d = alpha * t;
            }
        }
    }
}

/// `C = α·A·B + β·C` with β ∈ {0, 1}: `C` is row-major `m × n` with leading dimension `n`.
/// With `beta_one`, C's current values are kept and the product added (bias initialisation,
/// gradient accumulation).
pub fn sgemm(a: View, b: View, c: &mut [f32], alpha: f32, beta_one: bool) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(b.rows, k, "inner dimensions");
    assert!(c.len() >= m * n, "output size");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !beta_one {
            c[..m * n].fill(0.0);
        }
        return;
    }
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    let v3 = pulp::x86::V3::try_new();
    // Row blocks: MC rows, or fewer when that would leave threads idle (batch-1 inference has
    // 64 rows: two blocks of 36 and 28 rather than one of 64).
    let threads = rayon::current_num_threads().max(1);
    let mc_rows = if m < MC * threads {
        m.div_ceil(threads).div_ceil(MR).max(1) * MR
    } else {
        MC
    };
    let mut bpack = Vec::new();
    for j0 in (0..n).step_by(NC) {
        let nc = NC.min(n - j0);
        for p0 in (0..k).step_by(KC) {
            let kc = KC.min(k - p0);
            pack_b(&b, p0, kc, j0, nc, &mut bpack);
            let accumulate = beta_one || p0 > 0;
            let bp = &bpack;
            // Row blocks of C in parallel; each owns its rows of C.
            c[..m * n]
                .par_chunks_mut(mc_rows * n)
                .enumerate()
                .for_each(|(ib, rows)| {
                    let i0 = ib * mc_rows;
                    let mc = mc_rows.min(m - i0);
                    let mut apack = vec![0.0f32; mc.div_ceil(MR) * MR * kc];
                    pack_a(&a, i0, mc, p0, kc, &mut apack);
                    let block = Block {
                        apack: &apack,
                        bpack: bp,
                        rows,
                        kc,
                        mc,
                        n,
                        j0,
                        nc,
                        alpha,
                        accumulate,
                        #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
                        v3,
                    };
                    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
                    match v3 {
                        Some(v) => Simd::vectorize(v, block),
                        None => Arch::new().dispatch(block),
                    }
                    #[cfg(not(any(target_arch = "x86", target_arch = "x86_64")))]
                    Arch::new().dispatch(block);
                });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &View, b: &View) -> Vec<f32> {
        let mut c = vec![0.0f32; a.rows * b.cols];
        for i in 0..a.rows {
            for j in 0..b.cols {
                let mut s = 0.0f64;
                for p in 0..a.cols {
                    s += a.at(i, p) as f64 * b.at(p, j) as f64;
                }
                c[i * b.cols + j] = s as f32;
            }
        }
        c
    }

    fn data(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) % 2001) as f32
                    / 1000.0
                    - 1.0
            })
            .collect()
    }

    #[test]
    fn matches_the_naive_product_for_odd_shapes_and_transposes() {
        // Shapes that straddle MR, NR, KC, MC and NC boundaries.
        for &(m, k, n) in &[
            (1, 1, 1),
            (7, 3, 17),
            (13, 300, 33),
            (97, 257, 20),
            (6, 16, 2050),
        ] {
            let ad = data(m * k, 1);
            let bd = data(k * n, 2);
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                let a = if ta {
                    View::row_major(&ad, k, m).t()
                } else {
                    View::row_major(&ad, m, k)
                };
                let b = if tb {
                    View::row_major(&bd, n, k).t()
                } else {
                    View::row_major(&bd, k, n)
                };
                let want = naive(&a, &b);
                let mut c = vec![f32::NAN; m * n];
                sgemm(a, b, &mut c, 1.0, false);
                let err = c
                    .iter()
                    .zip(&want)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0.0f32, f32::max);
                assert!(
                    err < 1e-4 * (k as f32).sqrt(),
                    "{m}x{k}x{n} t=({ta},{tb}): {err}"
                );
                // Accumulate mode adds the product to C.
                let mut c2 = vec![1.0f32; m * n];
                sgemm(a, b, &mut c2, 2.0, true);
                for (x, y) in c2.iter().zip(&want) {
                    assert!((x - (1.0 + 2.0 * y)).abs() < 2e-4 * (k as f32).sqrt());
                }
            }
        }
    }
}
