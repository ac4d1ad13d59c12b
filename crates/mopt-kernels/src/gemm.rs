//! Single-precision GEMM, `C = α·A·B (+ C)`, blocked as BLIS does: B is packed into
//! `KC × nr` column panels, A into `mr × KC` row panels, and a register-tile micro-kernel runs
//! over them. Inputs are strided views (a transpose is a stride swap, never a copy); the output
//! is row-major. Row blocks of C are split over rayon's pool; each task packs its own A block.
//!
//! The tile is chosen at run time from the CPU's features ([`path`]): AVX-512F, a 12 × 32 tile
//! (24 zmm accumulators, B's two vectors loaded and A's entry broadcast once per k); AVX2+FMA,
//! a 6 × 16 tile (12 ymm accumulators, plain Rust under `pulp`'s V3 dispatch, where LLVM keeps
//! the tile in registers); otherwise the same 6 × 16 tile in portable Rust. `MOPT_GEMM=avx2`
//! (or `portable`) forces a narrower path, for comparisons; `avx2-packed` also packs the
//! operands the convolutions otherwise read in place ([`Direct`]).

use pulp::{Arch, Simd, WithSimd};
use rayon::prelude::*;

/// Rows of the AVX2 / portable register tile.
pub const MR: usize = 6;
/// Columns of the AVX2 / portable register tile (two 8-lane vectors).
pub const NR: usize = 16;
/// Rows of the AVX-512 register tile.
pub const MR_512: usize = 12;
/// Columns of the AVX-512 register tile (two 16-lane vectors).
pub const NR_512: usize = 32;
/// The largest tile, for the stack buffer a micro-kernel writes.
const TILE_MAX: usize = MR_512 * NR_512;
/// Depth of a packed panel (A panel 12×256 f32 = 12 KiB, B panel 256×32 = 32 KiB: L1/L2).
const KC: usize = 256;
/// Rows of A per task (an A block of 96×256 f32 = 96 KiB stays in L2).
const MC: usize = 96;

/// The micro-kernel a product runs.
#[derive(Debug, Clone, Copy)]
enum Kernel {
    Portable,
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    Avx2(pulp::x86::V3),
    #[cfg(target_arch = "x86_64")]
    Avx512(pulp::x86::V4),
}

/// The register tile: `mr × nr` and the kernel that computes it.
#[derive(Debug, Clone, Copy)]
struct Tile {
    mr: usize,
    nr: usize,
    kernel: Kernel,
}

/// The widest tile this CPU runs (or `MOPT_GEMM` allows), detected once.
fn tile() -> Tile {
    static TILE: std::sync::OnceLock<Tile> = std::sync::OnceLock::new();
    *TILE.get_or_init(|| {
        let cap = std::env::var("MOPT_GEMM").unwrap_or_default();
        let portable = Tile {
            mr: MR,
            nr: NR,
            kernel: Kernel::Portable,
        };
        if cap == "portable" {
            return portable;
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(v) = crate::cpu::v4().filter(|_| !cap.starts_with("avx2")) {
            // (the products go to the `gemm` crate unless `avx512-own`: see `on_gemm_crate`.)
            return Tile {
                mr: MR_512,
                nr: NR_512,
                kernel: Kernel::Avx512(v),
            };
        }
        #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
        if let Some(v) = pulp::x86::V3::try_new() {
            return Tile {
                kernel: Kernel::Avx2(v),
                ..portable
            };
        }
        portable
    })
}

/// The GEMM path this process takes: `avx512+gemm-crate` (the products on the `gemm` crate,
/// the convolutions on the 12×32 tile), `avx512` (the tile for all, few-row products reading B
/// in place: `MOPT_GEMM=avx512-own`), `avx2` (6×16) or `portable`.
pub fn path() -> &'static str {
    match tile().kernel {
        Kernel::Portable => "portable",
        #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
        Kernel::Avx2(_) => "avx2",
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512(_) if on_gemm_crate() => "avx512+gemm-crate",
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512(_) => "avx512",
    }
}
/// Columns of B packed at once (256 × 2048 f32 = 2 MiB, shared by all tasks, in L3).
const NC: usize = 2048;

/// A strided matrix view: element (i, j) is `data[offset + i·rs + j·cs]`.
#[derive(Debug, Clone, Copy)]
pub struct View<'a> {
    /// The backing values.
    pub data: &'a [f32],
    /// Index of element (0, 0).
    pub offset: usize,
    /// Rows of the view.
    pub rows: usize,
    /// Columns of the view.
    pub cols: usize,
    /// Stride between rows.
    pub rs: usize,
    /// Stride between columns.
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

/// Pack `B[p0..p0+kc, j0..j0+nc]` into panels of `nr` columns, k-major, zero-padded.
fn pack_b(
    b: &View,
    (p0, kc): (usize, usize),
    (j0, nc): (usize, usize),
    nr: usize,
    out: &mut [f32],
) {
    out.par_chunks_mut(kc * nr)
        .enumerate()
        .for_each(|(jp, panel)| {
            let j = j0 + jp * nr;
            pack_b_panel(b, (p0, kc), (j, nr.min(j0 + nc - j)), nr, panel);
        });
}

/// One panel of [`pack_b`]: columns `j..j+w` of `B[p0..p0+kc, ..]` (the rest of the panel's
/// `nr` columns left as they are: zero).
fn pack_b_panel(
    b: &View,
    (p0, kc): (usize, usize),
    (j, w): (usize, usize),
    nr: usize,
    panel: &mut [f32],
) {
    if w < nr {
        panel.fill(0.0);
    }
    if b.cs == 1 && w == nr {
        for (k, dst) in panel.chunks_exact_mut(nr).enumerate() {
            let s = b.offset + (p0 + k) * b.rs + j;
            copy_run(dst, &b.data[s..s + nr]);
        }
    } else if b.rs == 1 {
        // A transposed operand (e.g. Wᵀ in dX = G·Wᵀ): read each column as a run.
        for c in 0..w {
            let s = b.offset + p0 + (j + c) * b.cs;
            for (k, &v) in b.data[s..s + kc].iter().enumerate() {
                panel[k * nr + c] = v;
            }
        }
    } else {
        for (k, dst) in panel.chunks_exact_mut(nr).enumerate() {
            for (c, d) in dst.iter_mut().enumerate().take(w) {
                *d = b.at(p0 + k, j + c);
            }
        }
    }
}

/// Pack `A[i0..i0+mc, p0..p0+kc]` into panels of `mr` rows, k-major, zero-padded.
fn pack_a(
    a: &View,
    (i0, mc): (usize, usize),
    (p0, kc): (usize, usize),
    mr: usize,
    out: &mut [f32],
) {
    if a.rs == 1 && a.cs != 1 {
        // A transposed operand (e.g. Xᵀ in dW = Xᵀ·G): row k of the block is a contiguous run
        // of `mc` values; spread it over the panels.
        let panels = out.len() / (kc * mr);
        for k in 0..kc {
            let s = a.offset + i0 + (p0 + k) * a.cs;
            let run = &a.data[s..s + mc];
            for ip in 0..panels {
                let dst = &mut out[ip * kc * mr + k * mr..ip * kc * mr + (k + 1) * mr];
                let lo = ip * mr;
                let h = mr.min(mc - lo);
                dst[..h].copy_from_slice(&run[lo..lo + h]);
                dst[h..].fill(0.0);
            }
        }
        return;
    }
    for (ip, panel) in out.chunks_exact_mut(kc * mr).enumerate() {
        let i = i0 + ip * mr;
        let h = mr.min(i0 + mc - i);
        if a.cs == 1 {
            for r in 0..mr {
                if r < h {
                    let s = a.offset + (i + r) * a.rs + p0;
                    for (k, &v) in a.data[s..s + kc].iter().enumerate() {
                        panel[k * mr + r] = v;
                    }
                } else {
                    for k in 0..kc {
                        panel[k * mr + r] = 0.0;
                    }
                }
            }
        } else {
            for (k, dst) in panel.chunks_exact_mut(mr).enumerate() {
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

/// The 12 × 32 tile with AVX-512 FMAs over packed panels ([`micro_direct`] with rows 12 and
/// 32 values apart): 24 zmm accumulators; per k, B's two vectors are loaded once and each of
/// A's 12 entries is broadcast once. Writes the tile row-major into `out` (`12 × 32`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn micro_v4(v: pulp::x86::V4, a: &[f32], b: &[f32], out: &mut [f32]) {
    let rows = |stride| Strided { base: 0, stride };
    let kc = a.len() / MR_512;
    micro_direct::<MR_512>(v, (a, rows(MR_512)), (b, rows(NR_512)), kc, out);
}

/// Where the rows of an operand read in place start: row `k` of a panel is the `12` (A) or
/// `32` (B) values from `at(k)` (a packed panel, a strided matrix, a convolution's shifted
/// input rows).
pub(crate) trait Rows: Copy {
    /// Start of row `k`.
    fn at(&self, k: usize) -> usize;
}

/// Rows `stride` apart from `base`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Strided {
    pub base: usize,
    pub stride: usize,
}

impl Rows for Strided {
    #[inline(always)]
    fn at(&self, k: usize) -> usize {
        self.base + k * self.stride
    }
}

/// Rows at a table of offsets, shifted by `add`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Table<'a> {
    pub off: &'a [usize],
    pub add: usize,
}

impl Rows for Table<'_> {
    #[inline(always)]
    fn at(&self, k: usize) -> usize {
        self.off[k] + self.add
    }
}

/// Products whose operands are read in place, without packing: the convolutions' shifted
/// rows are already contiguous runs of the tile's width. The AVX-512 tile (12 × 32) or the
/// AVX2 one (6 × 16); `None` on the portable tile, whose callers pack.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Direct {
    tile: Tile,
}

impl Direct {
    /// The direct path, when this process runs the AVX-512 or the AVX2 tile.
    pub(crate) fn get() -> Option<Self> {
        #[cfg(test)]
        if tests::PACKED_ONLY.with(|p| p.get()) {
            return None;
        }
        match tile() {
            Tile {
                kernel: Kernel::Portable,
                ..
            } => None,
            _ if packed_only() => None,
            tile => Some(Self { tile }),
        }
    }

    /// Whether this is the AVX-512 tile.
    pub(crate) fn wide(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        if let Kernel::Avx512(_) = self.tile.kernel {
            return true;
        }
        false
    }

    /// Rows of its tile.
    pub(crate) fn mr(self) -> usize {
        self.tile.mr
    }

    /// Columns of its tile.
    pub(crate) fn nr(self) -> usize {
        self.tile.nr
    }

    /// `C (+)= A·B` over one depth block of `kc`: C is `m × n` (leading dimension `ldc`), A's
    /// panel `ip` (rows `mr·ip..`) has its rows at `a_rows(ip)` in `a`, B's panel `jp`
    /// (columns `nr·jp..`) at `b_rows(jp)` in `b`. Reads past the last valid row or column
    /// must stay inside `a` and `b` (their values are discarded).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn block<RA: Rows, RB: Rows>(
        self,
        (a, a_rows): (&[f32], &(dyn Fn(usize) -> RA + Sync)),
        (b, b_rows): (&[f32], &(dyn Fn(usize) -> RB + Sync)),
        (m, n, kc): (usize, usize, usize),
        c: &mut [f32],
        ldc: usize,
        accumulate: bool,
    ) {
        struct Run<'a, RA: Rows, RB: Rows> {
            tile: Tile,
            a: (&'a [f32], &'a (dyn Fn(usize) -> RA + Sync)),
            b: (&'a [f32], &'a (dyn Fn(usize) -> RB + Sync)),
            dims: (usize, usize, usize),
            c: &'a mut [f32],
            ldc: usize,
            accumulate: bool,
        }
        impl<RA: Rows, RB: Rows> WithSimd for Run<'_, RA, RB> {
            type Output = ();
            #[inline(always)]
            fn with_simd<S: Simd>(self, _: S) {
                let (m, n, kc) = self.dims;
                let Tile { mr, nr, kernel } = self.tile;
                let mut buf = [0.0f32; TILE_MAX];
                for ip in 0..m.div_ceil(mr) {
                    let ar = (self.a.1)(ip);
                    let h = mr.min(m - ip * mr);
                    for jp in 0..n.div_ceil(nr) {
                        let br = (self.b.1)(jp);
                        let w = nr.min(n - jp * nr);
                        let (a, b) = ((self.a.0, ar), (self.b.0, br));
                        // A short last panel runs a tile of only the rows it has.
                        match kernel {
                            #[cfg(target_arch = "x86_64")]
                            Kernel::Avx512(v) => match h {
                                9.. => micro_direct::<MR_512>(v, a, b, kc, &mut buf),
                                5..=8 => micro_direct::<8>(v, a, b, kc, &mut buf),
                                _ => micro_direct::<4>(v, a, b, kc, &mut buf),
                            },
                            #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
                            Kernel::Avx2(v) => match h {
                                5.. => micro_direct_v3::<MR>(v, a, b, kc, &mut buf),
                                3..=4 => micro_direct_v3::<4>(v, a, b, kc, &mut buf),
                                _ => micro_direct_v3::<2>(v, a, b, kc, &mut buf),
                            },
                            Kernel::Portable => unreachable!("no direct portable tile"),
                        }
                        let at = (ip * mr, jp * nr);
                        store(
                            self.c,
                            self.ldc,
                            at,
                            (&buf[..], nr),
                            (h, w),
                            1.0,
                            self.accumulate,
                        );
                    }
                }
            }
        }
        let run = Run {
            tile: self.tile,
            a: (a, a_rows),
            b: (b, b_rows),
            dims: (m, n, kc),
            c,
            ldc,
            accumulate,
        };
        match self.tile.kernel {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512(v) => Simd::vectorize(v, run),
            #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
            Kernel::Avx2(v) => Simd::vectorize(v, run),
            Kernel::Portable => unreachable!("no direct portable tile"),
        }
    }
}

/// `MOPT_GEMM=avx2-packed`: the AVX2 tile with every operand packed (no [`Direct`]), for
/// comparisons.
fn packed_only() -> bool {
    static PACKED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PACKED.get_or_init(|| std::env::var("MOPT_GEMM").is_ok_and(|v| v == "avx2-packed"))
}

/// The 6 × 16 AVX2 tile with its operands read in place (as [`micro_direct`]): A's row `k`
/// is the values at `a_rows.at(k)` (the first `R` multiplied), B's the 16 at `b_rows.at(k)`.
/// Writes `R` rows of 16 into `out`.
#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
#[inline(always)]
fn micro_direct_v3<const R: usize>(
    v: pulp::x86::V3,
    (a, a_rows): (&[f32], impl Rows),
    (b, b_rows): (&[f32], impl Rows),
    kc: usize,
    out: &mut [f32],
) {
    use pulp::f32x8;
    let z = v.splat_f32x8(0.0);
    let mut c = [[z; 2]; R];
    for k in 0..kc {
        let bk = &b[b_rows.at(k)..][..NR];
        let ak = &a[a_rows.at(k)..][..R];
        let (lo, hi) = bk.split_at(8);
        let b0: f32x8 = pulp::bytemuck::cast(<[f32; 8]>::try_from(lo).expect("8 lanes"));
        let b1: f32x8 = pulp::bytemuck::cast(<[f32; 8]>::try_from(hi).expect("8 lanes"));
        for (r, acc) in c.iter_mut().enumerate() {
            let ar = v.splat_f32x8(ak[r]);
            acc[0] = v.mul_add_f32x8(ar, b0, acc[0]);
            acc[1] = v.mul_add_f32x8(ar, b1, acc[1]);
        }
    }
    for (r, acc) in c.iter().enumerate() {
        let row: [[f32; 8]; 2] = pulp::bytemuck::cast(*acc);
        out[r * NR..r * NR + 8].copy_from_slice(&row[0]);
        out[r * NR + 8..(r + 1) * NR].copy_from_slice(&row[1]);
    }
}

/// [`micro_v4`] with its operands read in place: A's row `k` is the 12 values at
/// `a_rows.at(k)` (of which the first `R` are multiplied: `R` = 4 or 8 for a short last
/// panel), B's the 32 at `b_rows.at(k)`. Writes `R` rows of 32 into `out`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn micro_direct<const R: usize>(
    v: pulp::x86::V4,
    (a, a_rows): (&[f32], impl Rows),
    (b, b_rows): (&[f32], impl Rows),
    kc: usize,
    out: &mut [f32],
) {
    use pulp::f32x16;
    let z = v.splat_f32x16(0.0);
    let mut c = [[z; 2]; R];
    for k in 0..kc {
        // B's rows read in place may be a weight matrix's, a page apart: the hardware
        // prefetchers do not follow them, so ask for the row PREFETCH ahead.
        if k + PREFETCH < kc {
            let ahead = b_rows.at(k + PREFETCH);
            crate::native::prefetch(b, ahead);
            crate::native::prefetch(b, ahead + 16);
        }
        let bk = &b[b_rows.at(k)..][..NR_512];
        let ak = &a[a_rows.at(k)..][..R];
        let (lo, hi) = bk.split_at(16);
        let b0: f32x16 = pulp::bytemuck::cast(<[f32; 16]>::try_from(lo).expect("16 lanes"));
        let b1: f32x16 = pulp::bytemuck::cast(<[f32; 16]>::try_from(hi).expect("16 lanes"));
        for (r, acc) in c.iter_mut().enumerate() {
            let ar = v.splat_f32x16(ak[r]);
            acc[0] = v.mul_add_f32x16(ar, b0, acc[0]);
            acc[1] = v.mul_add_f32x16(ar, b1, acc[1]);
        }
    }
    for (r, acc) in c.iter().enumerate() {
        let row: [[f32; 16]; 2] = pulp::bytemuck::cast(*acc);
        out[r * NR_512..r * NR_512 + 16].copy_from_slice(&row[0]);
        out[r * NR_512 + 16..(r + 1) * NR_512].copy_from_slice(&row[1]);
    }
}

/// Rows of B ahead that [`micro_direct`] prefetches.
#[cfg(target_arch = "x86_64")]
const PREFETCH: usize = 8;

/// B panels a row block's A panels pass over before the next group ([`Block`]).
const B_GROUP: usize = 16;

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
    tile: Tile,
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
        let Tile { mr, nr, kernel } = self.tile;
        let mut buf = [0.0f32; TILE_MAX];
        // B's panels in groups of B_GROUP under each A panel: the group (256 × 512 f32 =
        // 512 KiB at the AVX-512 tile) stays in L2 while the row block's A panels pass over
        // it; all of a 2,048-column block at once did not fit (2048³: 269 → 303 GFLOP/s).
        // (Accumulating full tiles straight into C instead of through `buf` was slower:
        // 280-300 against 310-328 GFLOP/s on the BERT shapes.)
        let panels = bpack.len() / (kc * nr);
        for g0 in (0..panels).step_by(B_GROUP) {
            for (ip, ap) in apack.chunks_exact(kc * mr).enumerate() {
                let h = mr.min(mc - ip * mr);
                for jp in g0..(g0 + B_GROUP).min(panels) {
                    let bpanel = &bpack[jp * kc * nr..(jp + 1) * kc * nr];
                    let j = j0 + jp * nr;
                    let w = nr.min(j0 + nc - j);
                    match kernel {
                        Kernel::Portable => flat(&micro(ap, bpanel), &mut buf),
                        #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
                        Kernel::Avx2(v) => flat(&micro_v3(v, ap, bpanel), &mut buf),
                        #[cfg(target_arch = "x86_64")]
                        Kernel::Avx512(v) => micro_v4(v, ap, bpanel, &mut buf),
                    }
                    let at = (ip * mr, j);
                    store(
                        rows,
                        n,
                        at,
                        (&buf[..mr * nr], nr),
                        (h, w),
                        alpha,
                        accumulate,
                    );
                }
            }
        }
    }
}

/// A 6 × 16 tile, row-major, into `buf`.
#[inline(always)]
fn flat(tile: &[[f32; NR]; MR], buf: &mut [f32]) {
    for (r, row) in tile.iter().enumerate() {
        buf[r * NR..(r + 1) * NR].copy_from_slice(row);
    }
}

/// `C[row0.., j..] (+)= α · tile` for the valid `h × w` corner of a row-major tile of `nr`
/// columns.
#[inline(always)]
pub(crate) fn store(
    c: &mut [f32],
    ldc: usize,
    (row0, j): (usize, usize),
    (tile, nr): (&[f32], usize),
    (h, w): (usize, usize),
    alpha: f32,
    accumulate: bool,
) {
    for r in 0..h {
        let dst = &mut c[(row0 + r) * ldc + j..(row0 + r) * ldc + j + w];
        let src = &tile[r * nr..r * nr + w];
        if accumulate {
            for (d, &t) in dst.iter_mut().zip(src) {
                *d += alpha * t;
            }
        } else {
            for (d, &t) in dst.iter_mut().zip(src) {
                *d = alpha * t;
            }
        }
    }
}

/// `C = α·A·B + β·C` with β ∈ {0, 1}: `C` is row-major `m × n` with leading dimension `n`.
/// With `beta_one`, C's current values are kept and the product added (bias initialisation,
/// gradient accumulation).
pub fn sgemm(a: View, b: View, c: &mut [f32], alpha: f32, beta_one: bool) {
    if degenerate(&a, &b, c, beta_one) {
        return;
    }
    crate::threads::keep_warm();
    #[cfg(target_arch = "x86_64")]
    if on_gemm_crate() {
        return crate::native::gemm_crate(&a, &b, (c, b.cols), alpha, beta_one);
    }
    if let Some(direct) = Direct::get().filter(|d| d.wide() && direct_b_pays(&a, &b, alpha)) {
        return sgemm_b_in_place(direct, a, b, c, beta_one);
    }
    sgemm_on(tile(), a, b, c, alpha, beta_one);
}

/// Checks a product's shapes; finishes it when an operand is empty (an empty depth gives zeros,
/// or leaves C with `beta_one`) and says so.
///
/// # Panics
/// When the inner dimensions differ or C is shorter than `rows × cols`.
pub(crate) fn degenerate(a: &View, b: &View, c: &mut [f32], beta_one: bool) -> bool {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(b.rows, k, "inner dimensions");
    assert!(c.len() >= m * n, "output size");
    if m == 0 || n == 0 {
        return true;
    }
    if k == 0 && !beta_one {
        c[..m * n].fill(0.0);
    }
    k == 0
}

/// Whether the products go to the `gemm` crate (Burn Flex's GEMM, called directly): where this
/// process runs the AVX-512 tile, unless `MOPT_GEMM=avx512-own`. Its AVX-512 kernels ran
/// 418-428 GFLOP/s on the BERT shapes against 285-322 for mopt's 12 × 32 tile (2 threads,
/// Sapphire Rapids; MKL: ~430), and the 3-layer student's step went from 405-413 to 330-342 ms.
/// Few-row products too: a batch-1 forward pass (64 tokens) took 4.6 ms for the student and
/// 9.2-9.5 ms for the teacher there against 5.6-5.8 and 11.4-12.2 with B read in place by the
/// own tile (the crate packs B, whose contiguous copy the hardware prefetchers stream from L3;
/// the in-place reads, a weight row apart, stalled on L3). On AVX2 mopt's own 6 × 16 tile stays
/// (it matched MKL there; the crate reached ~45% of peak).
#[cfg(target_arch = "x86_64")]
fn on_gemm_crate() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        matches!(tile().kernel, Kernel::Avx512(_))
            && std::env::var("MOPT_GEMM").map_or(true, |v| v != "avx512-own")
    })
}

/// Whether B is better read in place than packed: few rows of A (batch-1 inference: 64 tokens),
/// so packing B (a layer's weights, every call) would cost as much as the product; B's rows
/// contiguous runs (row-major), at least one full 32-column panel.
fn direct_b_pays(a: &View, b: &View, alpha: f32) -> bool {
    a.rows <= SMALL_M && b.cs == 1 && b.cols >= NR_512 && alpha == 1.0
}

/// Rows of A up to which [`sgemm`] reads B in place (the AVX-512 tile, `MOPT_GEMM=avx512-own`).
const SMALL_M: usize = 96;

/// [`sgemm`] for few rows of A: A packed (it is small), B's full 32-column panels read in
/// place by the AVX-512 tile, column ranges split over the threads; B's last columns (fewer
/// than 32) through the packed product into a scratch block.
fn sgemm_b_in_place(direct: Direct, a: View, b: View, c: &mut [f32], beta_one: bool) {
    let (m, n) = (a.rows, b.cols);
    let full = n / direct.nr() * direct.nr();
    // A, all rows, packed once per depth block (it is small).
    let apacks: Vec<(usize, usize, Vec<f32>)> = depth_blocks(a.cols)
        .map(|(p0, kc)| {
            let mut apack = vec![0.0f32; m.div_ceil(direct.mr()) * direct.mr() * kc];
            pack_a(&a, (0, m), (p0, kc), direct.mr(), &mut apack);
            (p0, kc, apack)
        })
        .collect();
    // Column ranges of B over the tasks, so that each weight is read from memory once; a task
    // computes its columns of C into its own block, added or copied into C after.
    let threads = rayon::current_num_threads().max(1);
    let panels = full / direct.nr();
    let per = panels.div_ceil((2 * threads).min(panels)) * direct.nr();
    let starts: Vec<usize> = (0..full).step_by(per).collect();
    let parts: Vec<(usize, usize, Vec<f32>)> = starts
        .into_par_iter()
        .map(|j0| {
            let w = per.min(full - j0);
            let mut local = vec![0.0f32; m * w];
            for (p0, kc, apack) in &apacks {
                let a_rows = |ip: usize| Strided {
                    base: ip * kc * direct.mr(),
                    stride: direct.mr(),
                };
                // One B panel at a time under every A panel: its strided rows come from
                // memory once, then from L1.
                for j in (0..w).step_by(direct.nr()) {
                    let b_rows = |_: usize| Strided {
                        base: b.offset + p0 * b.rs + j0 + j,
                        stride: b.rs,
                    };
                    let dims = (m, direct.nr(), *kc);
                    let (a_in, b_in) = ((&apack[..], &a_rows as _), (b.data, &b_rows as _));
                    direct.block(a_in, b_in, dims, &mut local[j..], w, *p0 > 0);
                }
            }
            (j0, w, local)
        })
        .collect();
    for (j0, w, local) in parts {
        store(c, n, (0, j0), (&local, w), (m, w), 1.0, beta_one);
    }
    if full < n {
        let rest = View {
            offset: b.offset + full,
            cols: n - full,
            ..b
        };
        let mut tail = vec![0.0f32; m * rest.cols];
        sgemm_on(tile(), a, rest, &mut tail, 1.0, false);
        store(
            c,
            n,
            (0, full),
            (&tail, rest.cols),
            (m, rest.cols),
            1.0,
            beta_one,
        );
    }
}

/// [`sgemm`] with the tile `t`.
fn sgemm_on(t: Tile, a: View, b: View, c: &mut [f32], alpha: f32, beta_one: bool) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let (mr, nr) = (t.mr, t.nr);
    // Row blocks: MC rows, or fewer when that would leave threads idle (batch-1 inference has
    // 64 rows: two blocks rather than one).
    let threads = rayon::current_num_threads().max(1);
    let mc_rows = if m < MC * threads {
        m.div_ceil(threads).div_ceil(mr).max(1) * mr
    } else {
        MC.div_ceil(mr) * mr
    };
    let blocks: Vec<(usize, usize)> = depth_blocks(k).collect();
    let mut bstore = Vec::new();
    for j0 in (0..n).step_by(NC) {
        let nc = NC.min(n - j0);
        let panels = nc.div_ceil(nr);
        // Every depth block of these columns of B packed once, the block at `p0` at
        // `p0 · panels · nr`: each row block of C below then runs all its depth blocks while
        // its rows of C stay in cache. (Depth blocks outermost passed over all of C once a
        // block: a 1,536-deep product read and wrote its 3 MB of C six times.)
        let bpack = aligned(&mut bstore, panels * k * nr);
        for &(p0, kc) in &blocks {
            let at = p0 * panels * nr;
            pack_b(
                &b,
                (p0, kc),
                (j0, nc),
                nr,
                &mut bpack[at..at + kc * panels * nr],
            );
        }
        let bp = &*bpack;
        c[..m * n]
            .par_chunks_mut(mc_rows * n)
            .enumerate()
            .for_each(|(ib, rows)| {
                let i0 = ib * mc_rows;
                let mc = mc_rows.min(m - i0);
                let mut astore = Vec::new();
                for &(p0, kc) in &blocks {
                    let apack = aligned(&mut astore, mc.div_ceil(mr) * mr * kc);
                    pack_a(&a, (i0, mc), (p0, kc), mr, apack);
                    let at = p0 * panels * nr;
                    run_block(Block {
                        apack,
                        bpack: &bp[at..at + kc * panels * nr],
                        rows: &mut *rows,
                        kc,
                        mc,
                        n,
                        j0,
                        nc,
                        alpha,
                        accumulate: beta_one || p0 > 0,
                        tile: t,
                    });
                }
            });
    }
}

/// A source of B panels for the single-threaded products ([`gemm_serial`]): fills
/// `out` (`⌈nc/nr⌉` panels of `kc × nr`, k-major, every value written, padding with zeros) with
/// `B[p0..p0+kc, j0..j0+nc]`. A [`View`] is one; a convolution's shifted input rows are another.
pub(crate) trait PackB: Sync {
    /// Pack the block.
    fn pack(&self, depth: (usize, usize), cols: (usize, usize), nr: usize, out: &mut [f32]);
}

impl PackB for View<'_> {
    fn pack(&self, (p0, kc): (usize, usize), (j0, nc): (usize, usize), nr: usize, out: &mut [f32]) {
        for (jp, panel) in out.chunks_exact_mut(kc * nr).enumerate() {
            let j = j0 + jp * nr;
            pack_b_panel(self, (p0, kc), (j, nr.min(j0 + nc - j)), nr, panel);
        }
    }
}

/// A left operand packed once for many products (a convolution's weights, used for every
/// image): all of its rows, in `KC`-deep blocks of `mr`-row panels.
#[derive(Debug, Clone)]
pub struct PackedA {
    tile: Tile,
    rows: usize,
    depth: usize,
    data: Vec<f32>,
}

impl PackedA {
    /// Pack `a` for this CPU's tile.
    pub fn new(a: View) -> Self {
        Self::with_tile(tile(), a)
    }

    fn with_tile(t: Tile, a: View) -> Self {
        let (rows, depth) = (a.rows, a.cols);
        let padded = rows.div_ceil(t.mr) * t.mr;
        let mut data = vec![0.0f32; padded * depth];
        for (p0, kc) in depth_blocks(depth) {
            pack_a(
                &a,
                (0, rows),
                (p0, kc),
                t.mr,
                &mut data[p0 * padded..(p0 + kc) * padded],
            );
        }
        Self {
            tile: t,
            rows,
            depth,
            data,
        }
    }

    /// Rows of a panel (the register tile's height).
    pub fn tile_rows(&self) -> usize {
        self.tile.mr
    }

    /// The depth blocks `(p0, kc)` its panels are packed in.
    pub(crate) fn depth_blocks(&self) -> impl Iterator<Item = (usize, usize)> {
        depth_blocks(self.depth)
    }

    /// Panels `[ip0, ip1)` of the depth block at `p0` (`kc` deep).
    pub(crate) fn panel_range(&self, p0: usize, kc: usize, (ip0, ip1): (usize, usize)) -> &[f32] {
        let padded = self.rows.div_ceil(self.tile.mr) * self.tile.mr;
        let block = &self.data[p0 * padded..(p0 + kc) * padded];
        &block[ip0 * kc * self.tile.mr..ip1 * kc * self.tile.mr]
    }
}

/// A source of A panels for [`gemm_serial`]: fills `out` (`⌈mc/mr⌉` panels of `kc × mr`,
/// k-major, every value written, padding with zeros) with `A[i0..i0+mc, p0..p0+kc]`.
pub(crate) trait PackA {
    /// Pack the block.
    fn pack(&self, rows: (usize, usize), depth: (usize, usize), mr: usize, out: &mut [f32]);

    /// The block's panels: packed into `buf` (or borrowed, where they are packed already).
    fn panels<'a>(
        &'a self,
        (i0, mc): (usize, usize),
        depth: (usize, usize),
        mr: usize,
        buf: &'a mut Vec<f32>,
    ) -> &'a [f32] {
        let out = aligned(buf, mc.div_ceil(mr) * mr * depth.1);
        self.pack((i0, mc), depth, mr, out);
        out
    }
}

impl PackA for View<'_> {
    fn pack(&self, rows: (usize, usize), depth: (usize, usize), mr: usize, out: &mut [f32]) {
        pack_a(self, rows, depth, mr, out);
    }
}

impl PackA for PackedA {
    fn pack(&self, rows: (usize, usize), depth: (usize, usize), mr: usize, out: &mut [f32]) {
        out.copy_from_slice(PackA::panels(self, rows, depth, mr, &mut Vec::new()));
    }

    /// Borrowed: packed once, used by every product (a convolution's weights, every image).
    fn panels<'a>(
        &'a self,
        (i0, mc): (usize, usize),
        (p0, kc): (usize, usize),
        mr: usize,
        _: &'a mut Vec<f32>,
    ) -> &'a [f32] {
        assert!(mr == self.tile.mr && i0 % mr == 0, "panels of its own tile");
        self.panel_range(p0, kc, (i0 / mr, (i0 + mc).div_ceil(mr)))
    }
}

/// `C (+)= A[r0..r1] · B` on the calling thread, `A` `· × k` and `B` `k × n`; `c` holds the
/// rows `r0..r1` (`r0` a multiple of the tile's height). For callers that split the work
/// themselves: a convolution's images, a weight gradient's per-thread parts.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_serial(
    a: &impl PackA,
    b: &impl PackB,
    (r0, r1): (usize, usize),
    (k, n): (usize, usize),
    c: &mut [f32],
    accumulate: bool,
    abuf: &mut Vec<f32>,
    bbuf: &mut Vec<f32>,
) {
    let t = tile();
    for j0 in (0..n).step_by(NC) {
        let nc = NC.min(n - j0);
        for (p0, kc) in depth_blocks(k) {
            let bbuf = aligned(bbuf, nc.div_ceil(t.nr) * kc * t.nr);
            b.pack((p0, kc), (j0, nc), t.nr, bbuf);
            for i0 in (r0..r1).step_by(MC) {
                let mc = MC.min(r1 - i0);
                run_block(Block {
                    apack: a.panels((i0, mc), (p0, kc), t.mr, abuf),
                    bpack: bbuf,
                    rows: &mut c[(i0 - r0) * n..(i0 - r0 + mc) * n],
                    kc,
                    mc,
                    n,
                    j0,
                    nc,
                    alpha: 1.0,
                    accumulate: accumulate || p0 > 0,
                    tile: t,
                });
            }
        }
    }
}

/// The depth blocks `(p0, kc)` of a product `depth` deep: as few as hold at most [`KC`] each,
/// equally deep (to one), so that no short last block pays a pass over C for a few products
/// (a 288-deep convolution ran 256 + 32).
pub(crate) fn depth_blocks(depth: usize) -> impl Iterator<Item = (usize, usize)> {
    let blocks = depth.div_ceil(KC).max(1);
    let (base, extra) = (depth / blocks, depth % blocks);
    (0..blocks).map(move |b| (b * base + b.min(extra), base + usize::from(b < extra)))
}

/// `len` values of `buf` starting on a 64-byte boundary (a packed panel's rows then never
/// straddle cache lines: a split 64-byte load costs two), grown when short; the values are
/// stale: callers write every one (a packer, or a product that overwrites its output).
pub(crate) fn aligned(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    const LANES: usize = 16;
    if buf.len() < len + LANES {
        buf.resize(len + LANES, 0.0);
    }
    let skip = buf.as_ptr().align_offset(64).min(LANES);
    &mut buf[skip..skip + len]
}

/// Copy `N` values (a fixed size, so that it compiles to a few vector moves instead of a call
/// to `memcpy`).
#[inline(always)]
fn copy_n<const N: usize>(dst: &mut [f32], src: &[f32]) {
    let d: &mut [f32; N] = (&mut dst[..N]).try_into().expect("N values");
    *d = *<&[f32; N]>::try_from(&src[..N]).expect("N values");
}

/// Copy `src` into the front of `dst`: the register tile's common widths inline.
#[inline(always)]
pub(crate) fn copy_run(dst: &mut [f32], src: &[f32]) {
    match src.len() {
        32 => copy_n::<32>(dst, src),
        16 => copy_n::<16>(dst, src),
        12 => copy_n::<12>(dst, src),
        8 => copy_n::<8>(dst, src),
        6 => copy_n::<6>(dst, src),
        n => dst[..n].copy_from_slice(src),
    }
}

/// Copy `src` into the front of `dst`, inline whatever its length (a convolution's rows and
/// pixels are 7-128 values: through `memcpy` each paid a call).
#[inline(always)]
pub(crate) fn copy_short(dst: &mut [f32], src: &[f32]) {
    let n = src.len();
    let (dst, mut i) = (&mut dst[..n], 0);
    while i + 16 <= n {
        copy_n::<16>(&mut dst[i..], &src[i..]);
        i += 16;
    }
    if i + 8 <= n {
        copy_n::<8>(&mut dst[i..], &src[i..]);
        i += 8;
    }
    if i + 4 <= n {
        copy_n::<4>(&mut dst[i..], &src[i..]);
        i += 4;
    }
    if i + 2 <= n {
        copy_n::<2>(&mut dst[i..], &src[i..]);
        i += 2;
    }
    if i < n {
        dst[i] = src[i];
    }
}

/// Run one block with its tile's kernel.
fn run_block(block: Block) {
    match block.tile.kernel {
        #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
        Kernel::Avx2(v) => Simd::vectorize(v, block),
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512(v) => Simd::vectorize(v, block),
        Kernel::Portable => Arch::new().dispatch(block),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    thread_local! {
        /// Set by a test to take the packed paths where [`Direct`] would run.
        pub(crate) static PACKED_ONLY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

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

    /// Every tile this CPU can run.
    fn tiles() -> Vec<Tile> {
        let mut t = vec![Tile {
            mr: MR,
            nr: NR,
            kernel: Kernel::Portable,
        }];
        #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
        if let Some(v) = pulp::x86::V3::try_new() {
            t.push(Tile {
                mr: MR,
                nr: NR,
                kernel: Kernel::Avx2(v),
            });
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(v) = pulp::x86::V4::try_new() {
            t.push(Tile {
                mr: MR_512,
                nr: NR_512,
                kernel: Kernel::Avx512(v),
            });
        }
        t
    }

    /// `c` is `α·want` (plus `init` with `beta_one`) to f32 summation error over depth `k`.
    fn assert_product(
        c: &[f32],
        (want, alpha): (&[f32], f32),
        (init, beta_one): (&[f32], bool),
        (m, k, n): (usize, usize, usize),
    ) {
        for (i, (&got, &w)) in c.iter().zip(want).enumerate() {
            let w = alpha * w + if beta_one { init[i] } else { 0.0 };
            let tol = 1e-4 * (k as f32).sqrt();
            assert!((got - w).abs() <= tol, "{m}x{k}x{n} [{i}]: {got} vs {w}");
        }
    }

    /// The `gemm` crate behind large products: the naive product for odd shapes, transposed
    /// and offset views, α and accumulation.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_gemm_crate_path_matches_the_naive_product() {
        for &(m, k, n) in &[(1, 1, 1), (37, 70, 29), (130, 300, 65)] {
            let (av, bv) = (data(m * k + 3, 4), data(k * n, 5));
            // A stored transposed (k × m) after 3 values; B row-major.
            let a = View {
                offset: 3,
                ..View::row_major(&av[..], k, m)
            }
            .t();
            let a = View {
                rows: m,
                cols: k,
                ..a
            };
            let b = View::row_major(&bv, k, n);
            let want = naive(&a, &b);
            for (alpha, beta_one) in [(1.0, false), (0.5, true)] {
                let init = data(m * n, 6);
                let mut c = init.clone();
                crate::native::gemm_crate(&a, &b, (&mut c, n), alpha, beta_one);
                assert_product(&c, (&want, alpha), (&init, beta_one), (m, k, n));
            }
        }
    }

    /// Few rows of A (batch-1 inference) read B in place: every shape around the panel width,
    /// the remainder columns, a depth over two blocks, accumulation; the naive product's values
    /// to f32 rounding of the sums.
    #[test]
    fn few_rows_read_b_in_place_and_match_the_naive_product() {
        let Some(direct) = Direct::get() else {
            return; // the portable tile: sgemm never takes this path
        };
        for &(m, k, n) in &[
            (1, 7, 32),
            (13, 300, 70),
            (64, 384, 1536),
            (96, 600, 33),
            (5, 1, 40),
        ] {
            let (av, bv) = (data(m * k, 1), data(k * n, 2));
            let (a, b) = (View::row_major(&av, m, k), View::row_major(&bv, k, n));
            assert!(direct_b_pays(&a, &b, 1.0));
            let want = naive(&a, &b);
            for beta_one in [false, true] {
                let init = data(m * n, 3);
                let mut c = init.clone();
                sgemm_b_in_place(direct, a, b, &mut c, beta_one);
                assert_product(&c, (&want, 1.0), (&init, beta_one), (m, k, n));
            }
        }
    }

    /// Depth blocks cover the depth once, in order, each at most `KC` deep and within one of
    /// the others; `copy_short` copies every length exactly and nothing past it.
    #[test]
    fn depth_blocks_are_even_and_short_copies_exact() {
        for depth in [1, 31, 255, 256, 257, 288, 576, 1152, 1537] {
            let blocks: Vec<(usize, usize)> = depth_blocks(depth).collect();
            assert_eq!(blocks.len(), depth.div_ceil(KC));
            let mut at = 0;
            for &(p0, kc) in &blocks {
                assert_eq!(p0, at, "{depth}: contiguous");
                assert!(kc <= KC && kc > 0);
                at += kc;
            }
            assert_eq!(at, depth);
            let (lo, hi) = blocks
                .iter()
                .fold((usize::MAX, 0), |(a, b), &(_, k)| (a.min(k), b.max(k)));
            assert!(hi - lo <= 1, "{depth}: {blocks:?}");
        }
        for n in 0..70 {
            let src: Vec<f32> = (0..n).map(|v| v as f32 + 1.0).collect();
            let mut dst = vec![-1.0f32; n + 3];
            copy_short(&mut dst, &src);
            assert_eq!(&dst[..n], &src[..]);
            assert!(dst[n..].iter().all(|&v| v == -1.0), "{n}");
        }
    }

    #[test]
    fn matches_the_naive_product_for_odd_shapes_and_transposes() {
        // Shapes that straddle MR, NR, KC, MC and NC boundaries.
        for &(m, k, n) in &[
            (1, 1, 1),
            (7, 3, 17),
            (13, 300, 33),
            (25, 40, 65),
            (97, 257, 20),
            (6, 16, 2050),
            // Several row blocks, each through three depth blocks.
            (250, 700, 45),
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
                for t in tiles() {
                    check(t, (a, b), &want, k);
                }
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

    /// The tile `t`'s product of `a · b` against `want`, overwriting and accumulating.
    fn check(t: Tile, (a, b): (View, View), want: &[f32], k: usize) {
        let mut c = vec![f32::NAN; want.len()];
        sgemm_on(t, a, b, &mut c, 1.0, false);
        let err = c
            .iter()
            .zip(want)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        assert!(err < 1e-4 * (k as f32).sqrt(), "{t:?}: {err}");
        let mut c2 = vec![1.0f32; want.len()];
        sgemm_on(t, a, b, &mut c2, 2.0, true);
        for (x, y) in c2.iter().zip(want) {
            assert!(
                (x - (1.0 + 2.0 * y)).abs() < 2e-4 * (k as f32).sqrt(),
                "{t:?}"
            );
        }
    }
}
