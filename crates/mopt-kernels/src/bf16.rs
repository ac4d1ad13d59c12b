//! Native bf16 products: `C (+)= bf16(A) · bf16(B)` with f32 accumulation and an f32 result.
//!
//! The operands are rounded to bf16 (to nearest, ties to even) while they are packed, so a
//! caller hands over its f32 tensors as they are, and the kernel computes what autocast's
//! definition asks ([`crate::autocast`]): exact products of bf16 values summed in f32.
//!
//! Paths, chosen once from the CPU ([`path`]):
//! - `amx`: Intel AMX tiles (Sapphire Rapids and later), `tdpbf16ps` on 16 × 32 bf16 tiles,
//!   a 2 × 2 block of 16 × 16 f32 accumulators (`mopt_kernels::native::amx`, private);
//! - `avx512-bf16`: on AMD CPUs with AVX512_BF16 (Zen 4 and later), `vdpbf16ps` on the same
//!   packed operands, an 8 × 32 register tile (`mopt_kernels::native::dpbf16`, private); not taken by default
//!   on Intel, where it runs at half the f32 FMA rate (Sapphire Rapids: 200 against 300
//!   GFLOP/s);
//! - `emulated`: everywhere else, the operands rounded to bf16 in f32 copies and multiplied by
//!   the f32 GEMM ([`crate::gemm`]): the same values, at f32 speed.
//!
//! `MOPT_BF16=amx`, `avx512-bf16` or `emulated` picks a path this CPU runs (comparisons,
//! tests); the tests check every path the CPU has.

use rayon::prelude::*;

use crate::gemm::View;

/// `f32 → bf16` bits: round to nearest, ties to even (what `half::bf16::from_f32` gives:
/// overflow to ±inf); NaN stays NaN (quiet). Branch-free, so loops over it vectorise.
#[inline(always)]
pub fn to_bf16(v: f32) -> u16 {
    let b = v.to_bits();
    let nan = (b & 0x7FFF_FFFF) > 0x7F80_0000;
    let r = if nan {
        b | 0x0040_0000
    } else {
        b.wrapping_add(0x7FFF + ((b >> 16) & 1))
    };
    (r >> 16) as u16
}

/// Where bf16 products run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    Amx,
    Dpbf16,
    Emulated,
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::Amx => "amx",
            Path::Dpbf16 => "avx512-bf16",
            Path::Emulated => "emulated",
        }
    }

    /// The path taken by default: AMX, else the AVX512_BF16 dot product where it is faster
    /// than f32 ([`crate::native::dpbf16::preferred`]: AMD), else emulated.
    fn default_path() -> Path {
        #[cfg(target_arch = "x86_64")]
        {
            if crate::native::amx::available() {
                return Path::Amx;
            }
            if crate::native::dpbf16::preferred() {
                return Path::Dpbf16;
            }
        }
        Path::Emulated
    }

    /// The paths this CPU runs.
    fn supported() -> Vec<Path> {
        let mut out = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if crate::native::amx::available() {
                out.push(Path::Amx);
            }
            if crate::native::dpbf16::available() {
                out.push(Path::Dpbf16);
            }
        }
        out.push(Path::Emulated);
        out
    }
}

/// The path of this process: [`Path::default_path`], or the one `MOPT_BF16` names where this
/// CPU runs it.
fn chosen() -> Path {
    static PATH: std::sync::OnceLock<Path> = std::sync::OnceLock::new();
    *PATH.get_or_init(|| {
        let want = std::env::var("MOPT_BF16").unwrap_or_default();
        let supported = Path::supported();
        let forced = supported.iter().find(|p| p.name() == want);
        forced.copied().unwrap_or_else(Path::default_path)
    })
}

/// The path bf16 products take in this process: `amx`, `avx512-bf16` or `emulated`.
pub fn path() -> &'static str {
    chosen().name()
}

/// Whether products run on native bf16 instructions (AMX or AVX512_BF16).
pub fn native() -> bool {
    chosen() != Path::Emulated
}

/// `C = bf16(A)·bf16(B)` (or `C += …` with `beta_one`), sums in f32: `C` row-major `m × n`.
pub fn gemm(a: View, b: View, c: &mut [f32], beta_one: bool) {
    if crate::gemm::degenerate(&a, &b, c, beta_one) {
        return;
    }
    crate::threads::keep_warm();
    on(chosen(), a, b, c, (beta_one, false));
}

/// `C_i = bf16(A_i)·bf16(B_i)` for `batch` small products (an attention core's, one per
/// sequence and head): item `i`'s operands are `views(i)`, its `m × n` result row-major at
/// `c[i·m·n..]`. The items run in parallel, each on one thread.
pub fn gemm_batched<'a>(
    batch: usize,
    views: impl Fn(usize) -> (View<'a>, View<'a>) + Sync,
    c: &mut [f32],
    (m, n): (usize, usize),
) {
    assert!(c.len() >= batch * m * n, "output size");
    if m == 0 || n == 0 {
        return;
    }
    crate::threads::keep_warm();
    let path = chosen();
    c[..batch * m * n]
        .par_chunks_mut(m * n)
        .enumerate()
        .for_each(|(i, ci)| {
            let (a, b) = views(i);
            assert!(a.rows == m && b.cols == n, "item shapes");
            if !crate::gemm::degenerate(&a, &b, ci, false) {
                on(path, a, b, ci, (false, true));
            }
        });
}

/// [`gemm()`] on `path` (one this CPU runs); with `serial`, on this thread only (the native
/// paths: a batch item).
fn on(path: Path, a: View, b: View, c: &mut [f32], (beta_one, serial): (bool, bool)) {
    match path {
        #[cfg(target_arch = "x86_64")]
        Path::Amx | Path::Dpbf16 => tiles::gemm(path == Path::Amx, a, b, c, beta_one, serial),
        _ => emulated(a, b, c, beta_one),
    }
}

/// The operands rounded to bf16 in f32 copies, then the f32 GEMM.
fn emulated(a: View, b: View, c: &mut [f32], beta_one: bool) {
    let copy = |v: &View| -> Vec<f32> {
        let mut out = vec![0.0f32; v.rows * v.cols];
        out.par_chunks_mut(v.cols).enumerate().for_each(|(i, row)| {
            for (j, o) in row.iter_mut().enumerate() {
                *o = v.data[v.offset + i * v.rs + j * v.cs];
            }
        });
        crate::cpu::round_bf16(&mut out);
        out
    };
    let (ar, br) = (copy(&a), copy(&b));
    crate::gemm::sgemm(
        View::row_major(&ar, a.rows, a.cols),
        View::row_major(&br, b.rows, b.cols),
        c,
        1.0,
        beta_one,
    );
}

#[cfg(target_arch = "x86_64")]
mod tiles {
    //! Packing and blocking around [`crate::native::amx::Tiles::block`].

    use std::cell::RefCell;
    use std::thread::LocalKey;

    use crate::cpu::simd_fn;
    use rayon::prelude::*;

    use super::to_bf16;
    use crate::gemm::{store, View};
    use crate::native::amx::{Tiles, K_TILE, TILE, TILE_ELEMS};
    use crate::native::{dpbf16, prefetch};

    /// Rows of C a task computes at most (its A block, 128 × depth bf16, stays in L2).
    const ROWS: usize = 128;
    /// Rows and columns of the register block.
    const BLOCK: usize = 2 * TILE;

    simd_fn! {
        /// A packed into tiles: for each 16-row group, its depth chunks in order, each chunk a
        /// 16 × 32 tile of bf16 (row-major, zero-padded past `rows` and the depth).
        fn pack_a<'a>(a: &'a View<'a>, rows: (usize, usize), chunks: usize, out: &'a mut [u16]) {
            let (i0, rows) = rows;
            let group = chunks * TILE_ELEMS;
            // Where A[i0 + r, p] goes: its group's tile of chunk p / 32, row r % 16, column p % 32.
            let slot = |r: usize, p: usize| {
                (r / TILE) * group + (p / K_TILE) * TILE_ELEMS + (r % TILE) * K_TILE + p % K_TILE
            };
            if a.cs == 1 {
                // Rows are runs: each chunk of 32 is one tile row.
                for r in 0..rows {
                    let s = a.offset + (i0 + r) * a.rs;
                    let row = &a.data[s..s + a.cols];
                    for (q, run) in row.chunks(K_TILE).enumerate() {
                        let dst = &mut out[slot(r, q * K_TILE)..][..run.len()];
                        dst.iter_mut().zip(run).for_each(|(d, &v)| *d = to_bf16(v));
                    }
                }
            } else if a.rs == 1 {
                // A transposed operand (Xᵀ in dW = Xᵀ·G): column p of the block is a run of
                // `rows` values; read the runs in order (one pass over memory), spread each over
                // the tiles (the 32 columns of a chunk write the same cache lines).
                for p in 0..a.cols {
                    let s = a.offset + i0 + p * a.cs;
                    // The runs are a row of X apart (pages, for wide X): prefetch 4 ahead.
                    for off in (0..rows).step_by(16) {
                        prefetch(a.data, s + 4 * a.cs + off);
                    }
                    for (r, &v) in a.data[s..s + rows].iter().enumerate() {
                        out[slot(r, p)] = to_bf16(v);
                    }
                }
            } else {
                for r in 0..rows {
                    for p in 0..a.cols {
                        out[slot(r, p)] = to_bf16(a.data[a.offset + (i0 + r) * a.rs + p * a.cs]);
                    }
                }
            }
        }
    }

    simd_fn! {
        /// Column group `g` of B (16 columns) packed into tiles: its depth chunks in order, each
        /// chunk 16 rows of k-pairs × 16 columns × 2 (the VNNI layout `tdpbf16ps` reads),
        /// zero-padded; held as u32 pairs (`bf16(B[2q, j]) | bf16(B[2q+1, j]) << 16`).
        fn pack_b_group<'a>(b: &'a View<'a>, g: usize, group: &'a mut [u32]) {
            let pairs = TILE_ELEMS / 2;
            let k = b.rows;
            let pair = |hi: u16, lo: u16| lo as u32 | (hi as u32) << 16;
            let width = TILE.min(b.cols.saturating_sub(g * TILE));
            if width == 0 {
                return; // a padding group: zeros
            }
            let j0 = b.offset + g * TILE * b.cs;
            if b.rs == 1 && b.cs != 1 {
                // A transposed operand (Wᵀ in dX = G·Wᵀ): each column is a run of k.
                for j in 0..width {
                    let col = &b.data[j0 + j * b.cs..][..k];
                    for (q, two) in col.chunks(2).enumerate() {
                        let hi = two.get(1).map_or(0, |&v| to_bf16(v));
                        let at = (q / TILE) * pairs + (q % TILE) * TILE + j;
                        group[at] = pair(hi, to_bf16(two[0]));
                    }
                }
                return;
            }
            for q in 0..k.div_ceil(2) {
                let dst = &mut group[(q / TILE) * pairs + (q % TILE) * TILE..][..width];
                let (p0, p1) = (2 * q, 2 * q + 1);
                let at = |p: usize, j: usize| b.data[j0 + p * b.rs + j * b.cs];
                if p1 < k && b.cs == 1 {
                    let r0 = &b.data[j0 + p0 * b.rs..][..width];
                    let r1 = &b.data[j0 + p1 * b.rs..][..width];
                    for ((d, &x0), &x1) in dst.iter_mut().zip(r0).zip(r1) {
                        *d = pair(to_bf16(x1), to_bf16(x0));
                    }
                } else {
                    for (j, d) in dst.iter_mut().enumerate() {
                        let hi = if p1 < k { to_bf16(at(p1, j)) } else { 0 };
                        *d = pair(hi, to_bf16(at(p0, j)));
                    }
                }
            }
        }
    }

    thread_local! {
        static A_PACK: RefCell<Vec<u16>> = const { RefCell::new(Vec::new()) };
        static B_PACK: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
    }

    /// `f` on `len` values of this thread's buffer `key` (kept between products: packing into
    /// a fresh allocation each time cost page faults), or of a fresh one where the buffer is
    /// in use (a product started while this thread waits inside another). Zeros with `zero`;
    /// without, stale values a packer overwrites (every value: no padding to leave at zero).
    fn with_buffer<T: Copy + Default, R>(
        key: &'static LocalKey<RefCell<Vec<T>>>,
        (len, zero): (usize, bool),
        f: impl FnOnce(&mut [T]) -> R,
    ) -> R {
        key.with(|cell| match cell.try_borrow_mut() {
            Ok(mut v) => {
                if zero {
                    v.clear();
                }
                let keep = len.max(v.len());
                v.resize(keep, T::default());
                f(&mut v[..len])
            }
            Err(_) => f(&mut vec![T::default(); len]),
        })
    }

    /// Whether packing `rows × depth` leaves padding (rows or depth not a multiple of 32),
    /// which must read as zeros.
    fn padded(rows: usize, depth: usize) -> bool {
        !rows.is_multiple_of(BLOCK) || !depth.is_multiple_of(K_TILE)
    }

    /// See [`super::gemm`] (AMX or AVX512_BF16 present, `amx` says which); with `serial`, all
    /// on this thread (an item of [`super::gemm_batched`]).
    pub(super) fn gemm(amx: bool, a: View, b: View, c: &mut [f32], beta_one: bool, serial: bool) {
        let (m, k, n) = (a.rows, a.cols, b.cols);
        let chunks = k.div_ceil(K_TILE);
        let group = chunks * TILE_ELEMS / 2;
        let groups = n.div_ceil(BLOCK) * 2;
        with_buffer(&B_PACK, (groups * group, padded(n, k)), |packed| {
            if serial {
                for (g, part) in packed.chunks_exact_mut(group).enumerate() {
                    pack_b_group(&b, g, part);
                }
            } else {
                packed
                    .par_chunks_mut(group)
                    .enumerate()
                    .for_each(|(g, part)| pack_b_group(&b, g, part));
            }
            let bp: &[u16] = pulp::bytemuck::cast_slice(packed);
            if serial {
                task(amx, &a, (0, m), bp, (chunks, n), c, beta_one);
            } else {
                run(amx, &a, bp, (m, n, chunks), c, beta_one);
            }
        });
    }

    /// Rows `i0..i0 + h` of C from A's rows (packed here) and packed B.
    fn task(
        amx: bool,
        a: &View,
        (i0, h): (usize, usize),
        bp: &[u16],
        (chunks, n): (usize, usize),
        rows: &mut [f32],
        beta_one: bool,
    ) {
        let a_len = h.div_ceil(BLOCK) * 2 * chunks * TILE_ELEMS;
        with_buffer(&A_PACK, (a_len, padded(h, a.cols)), |ap| {
            pack_a(a, (i0, h), chunks, ap);
            if amx {
                let tiles = Tiles::new().expect("AMX checked before dispatch");
                rows_block(&tiles, (ap, bp), chunks, (h, n), rows, beta_one);
            } else {
                rows_dp(
                    pulp::bytemuck::cast_slice(ap),
                    bp,
                    chunks,
                    (h, n),
                    rows,
                    beta_one,
                );
            }
        });
    }

    /// The row tasks of [`gemm()`] over packed B.
    fn run(
        amx: bool,
        a: &View,
        bp: &[u16],
        (m, n, chunks): (usize, usize, usize),
        c: &mut [f32],
        beta_one: bool,
    ) {
        // Row blocks of up to ROWS, at least four tasks a thread where the rows allow.
        let threads = rayon::current_num_threads().max(1);
        let rows_per = ROWS.min(m.div_ceil(4 * threads).div_ceil(BLOCK) * BLOCK);
        c[..m * n]
            .par_chunks_mut(rows_per * n)
            .enumerate()
            .for_each(|(t, rows)| {
                let i0 = t * rows_per;
                let h = rows_per.min(m - i0);
                task(amx, a, (i0, h), bp, (chunks, n), rows, beta_one);
            });
    }

    /// One task's rows of C (`h × n`, row stride `n`) from its packed A rows and all of B: for
    /// each 32-column B panel (`depth × 32` bf16, in L1/L2), every 32-row block of A passes
    /// over it. (Blocking the depth too, to keep the panel in L1, was slower: each depth block
    /// drains the tile pipeline once more.)
    fn rows_block(
        tiles: &Tiles,
        (ap, bp): (&[u16], &[u16]),
        chunks: usize,
        (h, n): (usize, usize),
        rows: &mut [f32],
        beta_one: bool,
    ) {
        let group = chunks * TILE_ELEMS;
        // The range of 16-row (A) or 16-column (B) group g in its packing.
        let part = |g: usize| (g * group, (g + 1) * group);
        let mut scratch = [0.0f32; BLOCK * BLOCK];
        for jb in 0..n.div_ceil(BLOCK) {
            let (b0, b1) = (part(2 * jb), part(2 * jb + 1));
            let bt = [&bp[b0.0..b0.1], &bp[b1.0..b1.1]];
            let w = BLOCK.min(n - jb * BLOCK);
            for ib in 0..h.div_ceil(BLOCK) {
                let (a0, a1) = (part(2 * ib), part(2 * ib + 1));
                let at = [&ap[a0.0..a0.1], &ap[a1.0..a1.1]];
                let hb = BLOCK.min(h - ib * BLOCK);
                let origin = ib * BLOCK * n + jb * BLOCK;
                if hb == BLOCK && w == BLOCK {
                    tiles.block(at, bt, chunks, &mut rows[origin..], n, beta_one);
                } else {
                    // An edge block: through a full-size scratch block.
                    tiles.block(at, bt, chunks, &mut scratch, BLOCK, false);
                    let at = (ib * BLOCK, jb * BLOCK);
                    store(rows, n, at, (&scratch, BLOCK), (hb, w), 1.0, beta_one);
                }
            }
        }
    }

    /// [`rows_block`] on the AVX512_BF16 dot product: for each 32-column B panel, every 8 rows
    /// of A, an 8 × 32 register tile ([`dpbf16::tile`]) through a scratch tile into C.
    fn rows_dp(
        ap: &[u32],
        bp: &[u16],
        chunks: usize,
        (h, n): (usize, usize),
        rows: &mut [f32],
        beta_one: bool,
    ) {
        let bp: &[u32] = pulp::bytemuck::cast_slice(bp);
        let group = chunks * TILE_ELEMS / 2;
        let pairs = chunks * K_TILE / 2;
        let mut scratch = [0.0f32; dpbf16::ROWS * dpbf16::COLS];
        for jb in 0..n.div_ceil(BLOCK) {
            let bt = [
                &bp[2 * jb * group..(2 * jb + 1) * group],
                &bp[(2 * jb + 1) * group..(2 * jb + 2) * group],
            ];
            let w = BLOCK.min(n - jb * BLOCK);
            for i in (0..h).step_by(dpbf16::ROWS) {
                let (g, r0) = (i / TILE, i % TILE);
                dpbf16::tile(&ap[g * group..(g + 1) * group], r0, bt, pairs, &mut scratch);
                let hb = dpbf16::ROWS.min(h - i);
                let tile = (&scratch[..], dpbf16::COLS);
                store(rows, n, (i, jb * BLOCK), tile, (hb, w), 1.0, beta_one);
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `v` rounded to bf16, as f64 (the reference products' operands).
    pub(crate) fn bf(v: f32) -> f64 {
        f32::from_bits((to_bf16(v) as u32) << 16) as f64
    }

    /// `got` is the sum of `terms` (exact products of bf16 values, in f64) up to f32 summation
    /// error: within 1e-6 of the sum of their magnitudes.
    pub(crate) fn assert_sum(got: f32, terms: impl Iterator<Item = f64>, what: &str) {
        let (sum, mag) = terms.fold((0.0, 0.0), |(s, a), t| (s + t, a + t.abs()));
        assert!(
            (got as f64 - sum).abs() <= mag * 1e-6 + 1e-6,
            "{what}: {got} vs {sum}"
        );
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (s >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0
            })
            .collect()
    }

    /// C against the reference (bf16-rounded operands, products and sums in f64): within f32
    /// summation error, for row-major and transposed operands, edge blocks and accumulation.
    #[test]
    fn products_match_bf16_operands_summed_exactly() {
        for &(m, k, n) in &[
            (1, 1, 1),
            (37, 70, 29),
            (64, 384, 96),
            (130, 33, 47),
            (5, 600, 3),
            // Packed without zeroing, into buffers the shape before left dirty.
            (32, 64, 32),
        ] {
            let (a, b) = (values(m * k, 3), values(k * n, 5));
            let init = values(m * n, 7);
            for (transposed, beta_one) in [(false, false), (true, true)] {
                let at: Vec<f32>;
                let av = if transposed {
                    at = (0..k * m).map(|i| a[(i % m) * k + i / m]).collect();
                    View::row_major(&at, k, m).t()
                } else {
                    View::row_major(&a, m, k)
                };
                for path in Path::supported() {
                    let mut c = init.clone();
                    on(
                        path,
                        av,
                        View::row_major(&b, k, n),
                        &mut c,
                        (beta_one, false),
                    );
                    for i in 0..m {
                        for j in 0..n {
                            let init = if beta_one {
                                init[i * n + j] as f64
                            } else {
                                0.0
                            };
                            let terms = (0..k).map(|p| bf(a[i * k + p]) * bf(b[p * n + j]));
                            let what = format!("{m}x{k}x{n} ({i},{j}) {}", path.name());
                            assert_sum(c[i * n + j], std::iter::once(init).chain(terms), &what);
                        }
                    }
                }
            }
        }
    }

    /// A linear layer's kernels with bf16 products: the forward and both backward products
    /// multiply bf16-rounded operands, the output gradient included, and add the f32 bias.
    #[test]
    fn a_linear_layer_in_bf16_rounds_every_operand_of_its_three_products() {
        let (m, k, n) = (19, 45, 37);
        let (x, w, b, g) = (
            values(m * k, 1),
            values(k * n, 2),
            values(n, 3),
            values(m * n, 4),
        );
        let y = crate::cpu::linear(&x, &w, &b, (m, k, n), true);
        let (dx, dw, db) =
            crate::cpu::linear_backward(&x, &w, &g, (m, k, n), (true, true, true), true);
        let (dx, dw, db) = (dx.unwrap(), dw.unwrap(), db.unwrap());
        for i in 0..m {
            for j in 0..n {
                let terms = (0..k).map(|p| bf(x[i * k + p]) * bf(w[p * n + j]));
                assert_sum(y[i * n + j], std::iter::once(b[j] as f64).chain(terms), "y");
            }
            for p in 0..k {
                let terms = (0..n).map(|j| bf(g[i * n + j]) * bf(w[p * n + j]));
                assert_sum(dx[i * k + p], terms, "dx");
            }
        }
        for p in 0..k {
            for j in 0..n {
                let terms = (0..m).map(|i| bf(x[i * k + p]) * bf(g[i * n + j]));
                assert_sum(dw[p * n + j], terms, "dw");
            }
        }
        // The bias gradient sums the f32 gradient (no product, nothing rounded).
        for j in 0..n {
            let want: f64 = (0..m).map(|i| g[i * n + j] as f64).sum();
            let bound = m as f64 * 2.0 * 1e-6 + 1e-6;
            assert!(
                (db[j] as f64 - want).abs() <= bound,
                "db: {} vs {want}",
                db[j]
            );
        }
        // And differs from the f32 kernels' results (the rounding is real).
        let y32 = crate::cpu::linear(&x, &w, &b, (m, k, n), false);
        assert!(y.iter().zip(&y32).any(|(a, b)| a != b));
    }

    #[test]
    fn rounding_is_to_nearest_even_and_keeps_nan() {
        assert_eq!(to_bf16(1.0), 0x3F80);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1).
        assert_eq!(to_bf16(1.0 + 1.0 / 256.0), 0x3F80);
        assert_eq!(to_bf16(1.0 + 3.0 / 256.0), 0x3F82);
        assert!(f32::from_bits((to_bf16(f32::NAN) as u32) << 16).is_nan());
        assert_eq!(to_bf16(f32::INFINITY), 0x7F80);
        assert_eq!(to_bf16(-2.0), 0xC000);
    }
}
