//! Products with one row of A: a decoder's batch-1 decoding step (`x · W` for every
//! projection, `h · Eᵀ` for a tied head). Such a product reads every weight once for two
//! flops: it is a stream through B, and the work is to keep the stream going. B's two layouts:
//!
//! - rows contiguous (`cs = 1`, a linear layer's `[in, out]` weight): `c += a[p] · B[p, ·]`
//!   over p, an axpy per row into a block of C that stays in registers/L1;
//! - columns contiguous (`rs = 1`, a transposed `[out, in]` matrix such as the tied embedding):
//!   one dot product per column (the element-wise kernels' [`crate::cpu`] `dot`).
//!
//! Both run under the crate's SIMD dispatch (`simd_fn!`: AVX-512 or AVX2+FMA as the CPU has,
//! `MOPT_SIMD=avx2` to hold them to AVX2).
//!
//! Columns are split between the pool's threads in blocks of [`BLOCK`]; each output's sum runs
//! in one fixed order whatever the thread count, so the result does not depend on it.
//!
//! Decoding reaches it through [`crate::autocast::matmul`] (`matmul_f32`): Burn's matmul had
//! sent these products to the `gemm` crate's one-row path, 74% of a SmolLM2-135M decoding
//! profile; the effect is measured in the book (language models, decoding on mopt's own GEMV).

use rayon::prelude::*;

use crate::cpu::{dot, simd_fn};
use crate::gemm::View;

/// Columns of C one task computes (a multiple of the 16 lanes).
const BLOCK: usize = 256;

/// Whether [`sgemv`] takes this product: one row of A, and B with contiguous rows or columns.
pub(crate) fn takes(a: &View, b: &View) -> bool {
    a.rows == 1 && (b.cs == 1 || b.rs == 1) && b.cols >= 1 && b.rows >= 1
}

/// `c[..n] = a · b` for a `1 × k` view `a` and a `k × n` view `b` with contiguous rows or
/// columns ([`takes`]).
///
/// # Panics
/// When the shapes disagree, a view runs past its data or `c` is shorter than `n`.
pub(crate) fn sgemv(a: &View, b: &View, c: &mut [f32]) {
    let (k, n) = (a.cols, b.cols);
    assert!(takes(a, b) && b.rows == k && c.len() >= n, "sgemv shapes");
    let last = |v: &View| v.offset + (v.rows - 1) * v.rs + (v.cols - 1) * v.cs;
    assert!(
        last(a) < a.data.len() && last(b) < b.data.len(),
        "a view past its data"
    );
    let x: Vec<f32> = (0..k).map(|p| a.data[a.offset + p * a.cs]).collect();
    let b_data = &b.data[b.offset..=last(b)];
    let block = |(i, out): (usize, &mut [f32])| {
        out.fill(0.0);
        if b.cs == 1 {
            rows(&x, b_data, b.rs, i * BLOCK, out);
        } else {
            columns(&x, b_data, b.cs, i * BLOCK, out);
        }
    };
    let c = &mut c[..n];
    if n > BLOCK && k * n >= 1 << 15 {
        c.par_chunks_mut(BLOCK).enumerate().for_each(block);
    } else {
        c.chunks_mut(BLOCK).enumerate().for_each(block);
    }
}

simd_fn! {
    /// `acc[j] = Σ_p x[p] · b[p·rs + j0 + j]`, four rows of B a pass (a quarter of the
    /// accumulators' loads and stores).
    fn rows<'a>(x: &'a [f32], b: &'a [f32], rs: usize, j0: usize, acc: &'a mut [f32]) {
        let w = acc.len();
        let row = |p: usize| &b[p * rs + j0..p * rs + j0 + w];
        let k4 = x.len() - x.len() % 4;
        for p in (0..k4).step_by(4) {
            let (x0, x1, x2, x3) = (x[p], x[p + 1], x[p + 2], x[p + 3]);
            let (r0, r1, r2, r3) = (row(p), row(p + 1), row(p + 2), row(p + 3));
            for j in 0..w {
                acc[j] += x0 * r0[j] + x1 * r1[j] + x2 * r2[j] + x3 * r3[j];
            }
        }
        for (p, &xp) in x.iter().enumerate().skip(k4) {
            for (s, &v) in acc.iter_mut().zip(row(p)) {
                *s += xp * v;
            }
        }
    }
}

simd_fn! {
    /// `acc[j] = Σ_p x[p] · b[(j0 + j)·cs + p]`: one [`dot`] per column.
    fn columns<'a>(x: &'a [f32], b: &'a [f32], cs: usize, j0: usize, acc: &'a mut [f32]) {
        for (j, s) in acc.iter_mut().enumerate() {
            let at = (j0 + j) * cs;
            *s = dot(x, &b[at..at + x.len()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize, salt: u32) -> Vec<f32> {
        (0..len as u32)
            .map(|i| ((i.wrapping_mul(2654435761) ^ salt) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    }

    fn naive(a: &View, b: &View) -> Vec<f64> {
        (0..b.cols)
            .map(|j| {
                (0..a.cols)
                    .map(|p| {
                        a.data[a.offset + p * a.cs] as f64
                            * b.data[b.offset + p * b.rs + j * b.cs] as f64
                    })
                    .sum()
            })
            .collect()
    }

    /// Both layouts of B, A's row strided or not, sizes across the lanes, the block and the
    /// threading threshold.
    #[test]
    fn one_row_products_match_the_naive_sum() {
        for &(k, n) in &[
            (1, 1),
            (15, 17),
            (16, 256),
            (33, 257),
            (576, 192),
            (576, 1536),
            (1536, 576),
            (100, 4099),
        ] {
            let ad = data(2 * k + 3, 1);
            let bd = data(k * n + 7, 2);
            for a_strided in [false, true] {
                let a = if a_strided {
                    View {
                        offset: 3,
                        cs: 2,
                        ..View::row_major(&ad, 1, k)
                    }
                } else {
                    View::row_major(&ad, 1, k)
                };
                for b_rows in [true, false] {
                    let b = if b_rows {
                        View {
                            offset: 7,
                            ..View::row_major(&bd, k, n)
                        }
                    } else {
                        View {
                            offset: 7,
                            ..View::row_major(&bd, n, k)
                        }
                        .t()
                    };
                    assert!(takes(&a, &b));
                    let want = naive(&a, &b);
                    let mut c = vec![f32::NAN; n + 2];
                    sgemv(&a, &b, &mut c);
                    let tol = 1e-5 * (k as f64).sqrt() * 4.0;
                    for j in 0..n {
                        let what = format!("k {k} n {n} rows {b_rows} strided {a_strided} j {j}");
                        assert!((c[j] as f64 - want[j]).abs() < tol, "{what}: {}", c[j]);
                    }
                    assert!(c[n..].iter().all(|v| v.is_nan()), "past n untouched");
                }
            }
        }
    }

    /// The same product on one thread and on four: the same bits.
    #[test]
    fn the_thread_count_does_not_change_a_bit() {
        let (k, n) = (300, 2000);
        let (ad, bd) = (data(k, 3), data(k * n, 4));
        let (a, b) = (View::row_major(&ad, 1, k), View::row_major(&bd, k, n));
        let on = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut c = vec![0f32; n];
            pool.install(|| sgemv(&a, &b, &mut c));
            c
        };
        assert_eq!(on(1), on(4));
    }
}
