//! The AVX512_BF16 dot product (`vdpbf16ps`) for bf16 products on CPUs without AMX (AMD Zen 4
//! and later, Intel Cooper Lake): each instruction multiplies 16 pairs of bf16 values in each
//! of 16 lanes and adds both products to the lane's f32 sum. It reads the same packed operands
//! as the AMX tiles ([`crate::bf16`]): B's k-pairs of 16 columns are one vector, A's pair of a
//! row is broadcast to every lane.

use std::arch::x86_64::*;

/// Rows of the register tile.
pub(crate) const ROWS: usize = 8;
/// Columns of the register tile (two vectors of 16 f32).
pub(crate) const COLS: usize = 32;

/// Whether this CPU has AVX-512F and AVX512_BF16.
pub(crate) fn available() -> bool {
    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")
}

/// Whether the CPU is AMD's (CPUID vendor "AuthenticAMD"): where `vdpbf16ps` outruns f32 FMAs
/// (Zen 4's bf16 dot product does twice the multiply-adds of its f32 FMA; on Intel Sapphire
/// Rapids it does half, measured: 200 against 300 GFLOP/s, so Intel takes AMX or f32).
pub(crate) fn preferred() -> bool {
    let v = __cpuid(0);
    let vendor: Vec<u8> = [v.ebx, v.edx, v.ecx]
        .iter()
        .flat_map(|r| r.to_le_bytes())
        .collect();
    available() && vendor == b"AuthenticAMD"
}

/// An 8 × 32 tile of `A · B` over `pairs` k-pairs, written row-major into `out`.
///
/// `a`: one 16-row group of A packed as for the AMX tiles (u32 pairs: the pair `q` of group row
/// `r` at `(q / 16)·256 + r·16 + q % 16`), of which rows `r0..r0 + 8` are multiplied; `b`: two
/// 16-column groups of B, the pair row `q` of each at `q·16..q·16 + 16`.
///
/// # Panics
/// Where the CPU lacks the features, or a slice is shorter than the pairs read from it.
pub(crate) fn tile(a: &[u32], r0: usize, b: [&[u32]; 2], pairs: usize, out: &mut [f32; 256]) {
    assert!(available(), "vdpbf16ps needs AVX-512F and AVX512_BF16");
    assert!(r0 + ROWS <= 16, "rows of one 16-row group");
    let chunks = pairs.div_ceil(16);
    assert!(a.len() >= chunks * 256, "A shorter than its pairs");
    assert!(
        b[0].len() >= pairs * 16 && b[1].len() >= pairs * 16,
        "B shorter than its pairs"
    );
    // SAFETY: the features are present (asserted); every read is in bounds: A's reads are at
    // (q / 16)·256 + (r0 + r)·16 + q % 16 < chunks·256 ≤ a.len() for q < pairs, r < 8,
    // r0 + 8 ≤ 16; B's vector loads cover q·16..q·16 + 16 ≤ pairs·16 ≤ len.
    unsafe { tile_avx512(a, r0, b, pairs, out) }
}

#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn tile_avx512(a: &[u32], r0: usize, b: [&[u32]; 2], pairs: usize, out: &mut [f32; 256]) {
    let mut acc = [[_mm512_setzero_ps(); 2]; ROWS];
    let (ap, bp0, bp1) = (a.as_ptr(), b[0].as_ptr(), b[1].as_ptr());
    for q in 0..pairs {
        // SAFETY: in bounds per `tile`'s assertions; unaligned loads.
        let (b0, b1) = unsafe {
            (
                _mm512_loadu_si512(bp0.add(q * 16).cast()),
                _mm512_loadu_si512(bp1.add(q * 16).cast()),
            )
        };
        let (b0, b1): (__m512bh, __m512bh) = (bh(b0), bh(b1));
        let base = (q / 16) * 256 + r0 * 16 + q % 16;
        for (r, row) in acc.iter_mut().enumerate() {
            // SAFETY: base + r·16 is in bounds per `tile`'s assertions.
            let pair = unsafe { *ap.add(base + r * 16) };
            let av = bh(_mm512_set1_epi32(pair as i32));
            row[0] = _mm512_dpbf16_ps(row[0], av, b0);
            row[1] = _mm512_dpbf16_ps(row[1], av, b1);
        }
    }
    for (r, row) in acc.iter().enumerate() {
        let (lo, hi) = out[r * COLS..(r + 1) * COLS].split_at_mut(16);
        // SAFETY: each store writes 16 f32 into a 16-element slice.
        unsafe {
            _mm512_storeu_ps(lo.as_mut_ptr(), row[0]);
            _mm512_storeu_ps(hi.as_mut_ptr(), row[1]);
        }
    }
}

/// The 32 bf16 halves of a vector's 16 u32 lanes, as `vdpbf16ps` reads them.
#[inline(always)]
fn bh(v: __m512i) -> __m512bh {
    // SAFETY: both are 512-bit plain-data vectors; every bit pattern is a valid value of each.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
}
