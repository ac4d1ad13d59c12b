//! Out-of-place matrix transposes (the layout changes of the convolutions' weight gradient):
//! 16 × 16 blocks in AVX-512 registers where the CPU has it, 16 × 16 scalar blocks elsewhere
//! and on the edges.

/// `dst[j·ldd + i] = src[i·lds + j]` for `i < rows`, `j < cols`.
///
/// # Shapes
/// - `src`: `rows` rows of at least `cols` values, `lds` apart
/// - `dst`: `cols` rows of at least `rows` values, `ldd` apart
pub fn transpose(
    (src, lds): (&[f32], usize),
    (rows, cols): (usize, usize),
    dst: &mut [f32],
    ldd: usize,
) {
    const B: usize = 16;
    #[cfg(target_arch = "x86_64")]
    let simd = crate::cpu::v4();
    for i0 in (0..rows).step_by(B) {
        let i1 = (i0 + B).min(rows);
        for j0 in (0..cols).step_by(B) {
            let j1 = (j0 + B).min(cols);
            #[cfg(target_arch = "x86_64")]
            if let (Some(v), B, B) = (simd, i1 - i0, j1 - j0) {
                block_v4(
                    v,
                    (&src[i0 * lds + j0..], lds),
                    &mut dst[j0 * ldd + i0..],
                    ldd,
                );
                continue;
            }
            for j in j0..j1 {
                let d = &mut dst[j * ldd + i0..j * ldd + i1];
                for (v, i) in d.iter_mut().zip(i0..i1) {
                    *v = src[i * lds + j];
                }
            }
        }
    }
}

/// One full 16 × 16 block: rows interleaved in pairs (`unpack*_ps`), then in fours
/// (`unpack*_pd`), then 128-bit lanes gathered across the four row groups (`shuffle_f32x4`,
/// twice).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn block_v4(v: pulp::x86::V4, (src, lds): (&[f32], usize), dst: &mut [f32], ldd: usize) {
    use core::arch::x86_64::{__m512, __m512d};
    use pulp::bytemuck::cast;
    struct Run<'a> {
        v: pulp::x86::V4,
        src: (&'a [f32], usize),
        dst: (&'a mut [f32], usize),
    }
    impl pulp::WithSimd for Run<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _: S) {
            let (a, (src, lds), (dst, ldd)) = (self.v.avx512f, self.src, self.dst);
            let r: [__m512; 16] = std::array::from_fn(|i| {
                let row: [f32; 16] = src[i * lds..i * lds + 16].try_into().expect("16 values");
                cast(row)
            });
            // t[2i], t[2i+1]: rows 2i and 2i+1 interleaved (low and high pairs of each lane).
            let t: [__m512; 16] = std::array::from_fn(|i| {
                let (x, y) = (r[i & !1], r[i | 1]);
                if i % 2 == 0 {
                    a._mm512_unpacklo_ps(x, y)
                } else {
                    a._mm512_unpackhi_ps(x, y)
                }
            });
            // u[4g + j], lane L: rows 4g..4g+4 of column 4L + j.
            let u: [__m512; 16] = std::array::from_fn(|i| {
                let (g, j) = (i / 4, i % 4);
                let x: __m512d = cast(t[4 * g + j / 2]);
                let y: __m512d = cast(t[4 * g + 2 + j / 2]);
                cast(if j % 2 == 0 {
                    a._mm512_unpacklo_pd(x, y)
                } else {
                    a._mm512_unpackhi_pd(x, y)
                })
            });
            // w[j] = (u[j].L0, u[j].L2, u[4+j].L0, u[4+j].L2), w[4+j] the odd lanes; likewise
            // w[8+j], w[12+j] from u[8+j], u[12+j].
            let w: [__m512; 16] = std::array::from_fn(|i| {
                let (h, odd, j) = (i / 8, (i / 4) % 2, i % 4);
                let (x, y) = (u[8 * h + j], u[8 * h + 4 + j]);
                if odd == 0 {
                    a._mm512_shuffle_f32x4::<0x88>(x, y)
                } else {
                    a._mm512_shuffle_f32x4::<0xdd>(x, y)
                }
            });
            // Column 4L + j: lane L of u[j], u[4+j], u[8+j], u[12+j].
            for col in 0..16 {
                let (l, j) = (col / 4, col % 4);
                let (x, y) = (w[(l % 2) * 4 + j], w[8 + (l % 2) * 4 + j]);
                let out = if l < 2 {
                    a._mm512_shuffle_f32x4::<0x88>(x, y)
                } else {
                    a._mm512_shuffle_f32x4::<0xdd>(x, y)
                };
                let row: [f32; 16] = cast(out);
                dst[col * ldd..col * ldd + 16].copy_from_slice(&row);
            }
        }
    }
    pulp::Simd::vectorize(
        v,
        Run {
            v,
            src: (src, lds),
            dst: (dst, ldd),
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_definition_on_full_blocks_and_edges() {
        for (rows, cols, lds, ldd) in [
            (16, 16, 16, 16),
            (37, 50, 53, 40),
            (5, 33, 33, 5),
            (64, 196, 200, 70),
        ] {
            let src: Vec<f32> = (0..rows * lds).map(|i| i as f32).collect();
            let mut dst = vec![-1.0f32; cols * ldd];
            transpose((&src, lds), (rows, cols), &mut dst, ldd);
            for i in 0..rows {
                for j in 0..cols {
                    assert_eq!(
                        dst[j * ldd + i],
                        src[i * lds + j],
                        "({rows}x{cols}) at ({i}, {j})"
                    );
                }
            }
            // Nothing outside the destination's `rows` columns is written.
            for j in 0..cols {
                assert!(dst[j * ldd + rows..(j + 1) * ldd]
                    .iter()
                    .all(|&v| v == -1.0));
            }
        }
    }
}
