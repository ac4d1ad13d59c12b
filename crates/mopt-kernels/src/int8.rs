//! Integer products for int8 inference: `u8 · s8 → i32`, exact, with the weight packed once.
//!
//! A quantized linear layer computes `(x_q − z)·s_x · (W_q·s_w)`; its integer part
//! `Σ_i x_q[i]·W_q[i, j]` is what ONNX Runtime's `MatMulInteger` and llama.cpp's int8 dots
//! compute, and it is exact in i32, where the fake-quantized float product rounds. The weight is
//! read a byte a value, not four: at batch 1 (decoding) a product's time is the weight's
//! reading, so int8 weights are the faster model.
//!
//! [`PackedS8`] holds a `[k, n]` weight in blocks of 16 columns × 4 k-values (64 bytes), the
//! operand of AVX-512 VNNI's `vpdpbusd`; [`matmul_u8s8`] runs it where the CPU has it, AVX2's
//! widening `vpmaddwd` or a portable loop elsewhere ([`Path`]; the same integers on each).

use rayon::prelude::*;

/// The widest input whose sums fit i32 whatever the bytes: `255 · 128 · k ≤ i32::MAX`.
pub const MAX_K: usize = i32::MAX as usize / (255 * 128);

/// Columns of a packed block.
const COLS: usize = 16;
/// Bytes of a block's k-quad: 16 columns × 4 k-values.
const QUAD: usize = COLS * 4;

/// A `[k, n]` int8 weight packed for [`matmul_u8s8`], with its column sums (the zero-point
/// correction `z · Σ_i W[i, j]` needs them).
#[derive(Clone)]
pub struct PackedS8 {
    k: usize,
    n: usize,
    /// Column block `b`, k-quad `q`, column `j` of the block, k-offset `t` at
    /// `(b·quads + q)·64 + 4j + t`; zeros beyond `k` and `n`.
    data: Vec<i8>,
    col_sums: Vec<i32>,
}

impl std::fmt::Debug for PackedS8 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedS8 {{ k: {}, n: {} }}", self.k, self.n)
    }
}

impl PackedS8 {
    /// Pack the row-major `[k, n]` int8 weight `w`.
    ///
    /// # Panics
    /// When `w` does not hold `k · n` values, or `k` exceeds [`MAX_K`] (the i32 sums could
    /// overflow).
    pub fn pack(w: &[i8], k: usize, n: usize) -> Self {
        assert_eq!(w.len(), k * n, "a [{k}, {n}] weight");
        assert!(k <= MAX_K, "{k} inputs: the i32 sums hold {MAX_K} at most");
        let (quads, blocks) = (k.div_ceil(4), n.div_ceil(COLS));
        let mut data = vec![0i8; blocks * quads * QUAD];
        let mut col_sums = vec![0i32; n];
        for (i, row) in w.chunks_exact(n.max(1)).enumerate().take(k) {
            let (q, t) = (i / 4, i % 4);
            for (j, &v) in row.iter().enumerate() {
                let (b, c) = (j / COLS, j % COLS);
                data[(b * quads + q) * QUAD + c * 4 + t] = v;
                col_sums[j] += v as i32;
            }
        }
        Self {
            k,
            n,
            data,
            col_sums,
        }
    }

    /// The weight's input width.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The weight's output width.
    pub fn n(&self) -> usize {
        self.n
    }

    /// `Σ_i W[i, j]` for every column `j`.
    pub fn col_sums(&self) -> &[i32] {
        &self.col_sums
    }

    fn quads(&self) -> usize {
        self.k.div_ceil(4)
    }

    /// Column block `b`'s bytes.
    fn block(&self, b: usize) -> &[i8] {
        let len = self.quads() * QUAD;
        &self.data[b * len..(b + 1) * len]
    }
}

/// `u · W` in i32, exactly: `out[r·n + j] = Σ_i u[r·k + i] · W[i, j]` for the `rows` rows of the
/// row-major `u` (`[rows, k]`).
///
/// # Panics
/// When `u` does not hold `rows · k` values.
///
/// # Shapes
/// - u: `[rows, k]`; w: `[k, n]`; output: `[rows, n]`
pub fn matmul_u8s8(u: &[u8], rows: usize, w: &PackedS8) -> Vec<i32> {
    let (k, n) = (w.k, w.n);
    assert_eq!(u.len(), rows * k, "a [{rows}, {k}] input");
    let mut out = vec![0i32; rows * n];
    if n == 0 || rows == 0 || k == 0 {
        return out;
    }
    let quads = w.quads();
    // Each row padded to whole quads (zeros add nothing).
    let mut padded = vec![0u8; rows * quads * 4];
    for (dst, src) in padded.chunks_exact_mut(quads * 4).zip(u.chunks_exact(k)) {
        dst[..k].copy_from_slice(src);
    }
    crate::threads::keep_warm();
    let path = Path::best();
    let row = |r: usize, cols: std::ops::Range<usize>, dst: &mut [i32]| {
        let x = &padded[r * quads * 4..(r + 1) * quads * 4];
        for (b, chunk) in (cols.start / COLS..).zip(dst.chunks_mut(COLS)) {
            let mut acc = [0i32; COLS];
            block(x, w.block(b), quads, &mut acc, path);
            chunk.copy_from_slice(&acc[..chunk.len()]);
        }
    };
    if rows == 1 {
        // Decoding: the columns split between the threads (the weight is the work).
        let per_task = blocks_per_task(k, n) * COLS;
        out.par_chunks_mut(per_task)
            .enumerate()
            .for_each(|(t, dst)| row(0, t * per_task..t * per_task + dst.len(), dst));
    } else {
        out.par_chunks_mut(n)
            .enumerate()
            .for_each(|(r, dst)| row(r, 0..n, dst));
    }
    out
}

/// Column blocks a task takes at batch 1: about 256 KiB of weight, at least one block.
fn blocks_per_task(k: usize, n: usize) -> usize {
    let per_block = k.div_ceil(4) * QUAD;
    let blocks = n.div_ceil(COLS);
    (256 * 1024 / per_block.max(1)).clamp(1, blocks.max(1))
}

/// Which instructions run the products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// AVX-512 VNNI's `vpdpbusd`: 64 byte products an instruction.
    Vnni,
    /// AVX2: bytes widened to i16, `vpmaddwd` pairs.
    Avx2,
    /// Plain Rust.
    Portable,
}

impl Path {
    /// The fastest path this CPU has (`MOPT_SIMD=avx2` hides AVX-512).
    pub fn best() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            use crate::native::dpbusd;
            if !crate::cpu::avx2_only() && dpbusd::available() {
                return Path::Vnni;
            }
            if dpbusd::avx2_available() {
                return Path::Avx2;
            }
        }
        Path::Portable
    }

    /// The path's name, as `generate` prints it.
    pub fn name(self) -> &'static str {
        match self {
            Path::Vnni => "AVX-512 VNNI",
            Path::Avx2 => "AVX2",
            Path::Portable => "portable",
        }
    }
}

/// One row's 16-column block on `path`.
fn block(x: &[u8], w: &[i8], quads: usize, acc: &mut [i32; COLS], path: Path) {
    #[cfg(target_arch = "x86_64")]
    match path {
        Path::Vnni => return crate::native::dpbusd::block(x, w, quads, acc),
        Path::Avx2 => return crate::native::dpbusd::block_avx2(x, w, quads, acc),
        Path::Portable => {}
    }
    let _ = path;
    for (xq, wq) in x.chunks_exact(4).zip(w.chunks_exact(QUAD)).take(quads) {
        for (c, a) in acc.iter_mut().enumerate() {
            let col = &wq[c * 4..c * 4 + 4];
            *a += (0..4).map(|t| xq[t] as i32 * col[t] as i32).sum::<i32>();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic pseudo-random byte stream.
    fn bytes(len: usize, seed: u32) -> Vec<u8> {
        let mut s = seed.wrapping_mul(2_654_435_761).max(1);
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s >> 24) as u8
            })
            .collect()
    }

    fn naive(u: &[u8], rows: usize, w: &[i8], k: usize, n: usize) -> Vec<i32> {
        let mut out = vec![0i32; rows * n];
        for r in 0..rows {
            for j in 0..n {
                out[r * n + j] = (0..k)
                    .map(|i| u[r * k + i] as i32 * w[i * n + j] as i32)
                    .sum();
            }
        }
        out
    }

    #[test]
    fn products_equal_the_naive_sums_at_every_shape() {
        // Widths off the block and quad sizes, the extremes of both types included.
        // (1, 576, 1160): three tasks at batch 1, the last ending in a partial block.
        for (rows, k, n) in [
            (1, 576, 1152),
            (1, 576, 1160),
            (1, 7, 5),
            (3, 13, 33),
            (5, 64, 16),
            (2, 1, 1),
        ] {
            let u = bytes(rows * k, (k * n) as u32);
            let mut w: Vec<i8> = bytes(k * n, n as u32)
                .into_iter()
                .map(|b| b as i8)
                .collect();
            w[0] = -128;
            let mut u = u;
            u[0] = 255;
            let p = PackedS8::pack(&w, k, n);
            assert_eq!(
                matmul_u8s8(&u, rows, &p),
                naive(&u, rows, &w, k, n),
                "{rows}x{k}x{n}"
            );
            let sums: Vec<i32> = (0..n)
                .map(|j| (0..k).map(|i| w[i * n + j] as i32).sum())
                .collect();
            assert_eq!(p.col_sums(), sums.as_slice());
        }
    }

    #[test]
    fn every_path_gives_the_same_integers() {
        let (k, n) = (100, 40);
        let u = bytes(k, 3);
        let w: Vec<i8> = bytes(k * n, 4).into_iter().map(|b| b as i8).collect();
        let p = PackedS8::pack(&w, k, n);
        let quads = p.quads();
        let mut x = u.clone();
        x.resize(quads * 4, 0);
        // Blocks 1 (columns 16..32) and 2, a partial one (columns 32..40).
        let want = naive(&u, 1, &w, k, n);
        for b in [1, 2] {
            let mut portable = [0i32; COLS];
            block(&x, p.block(b), quads, &mut portable, Path::Portable);
            let cols = b * 16..(b * 16 + 16).min(n);
            assert_eq!(&portable[..cols.len()], &want[cols.clone()]);
            #[cfg(target_arch = "x86_64")]
            for (path, has) in [
                (Path::Vnni, crate::native::dpbusd::available()),
                (Path::Avx2, crate::native::dpbusd::avx2_available()),
            ] {
                if has {
                    let mut fast = [0i32; COLS];
                    block(&x, p.block(b), quads, &mut fast, path);
                    assert_eq!(fast, portable, "{path:?}, block {b}");
                }
            }
        }
    }
}
