//! The AVX-512 VNNI dot product (`vpdpbusd`) for int8 products: each instruction multiplies 4
//! unsigned bytes by 4 signed bytes in each of 16 lanes and adds the four products to the
//! lane's i32 sum, exactly (no saturation). It reads [`crate::int8::PackedS8`]'s blocks: 16
//! columns × 4 k-values are one 64-byte vector, a row's 4 input bytes are broadcast to every
//! lane.

use std::arch::x86_64::*;

/// Whether this CPU has AVX-512F and AVX512_VNNI.
pub(crate) fn available() -> bool {
    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vnni")
}

/// One 16-column block of `u · W` for one row: `out[j] = Σ_q Σ_t u[4q + t] · block[q·64 + 4j + t]`
/// over the `quads` groups of 4 k-values.
///
/// # Panics
/// Where the CPU lacks the features, or `u` or `block` is shorter than the quads read.
pub(crate) fn block(u: &[u8], block: &[i8], quads: usize, out: &mut [i32; 16]) {
    assert!(available(), "vpdpbusd needs AVX-512F and AVX512_VNNI");
    check_lengths(u, block, quads);
    // SAFETY: the features are present (asserted); the reads are in bounds: u's at 4q..4q + 4
    // ≤ 4·quads ≤ u.len(), the block's 64-byte loads at q·64 ≤ (quads − 1)·64, ending by
    // quads·64 ≤ block.len().
    unsafe { block_avx512(u, block, quads, out) }
}

/// The bounds both kernels' reads rely on: `quads` groups of 4 input bytes and of 64 weight
/// bytes.
fn check_lengths(u: &[u8], block: &[i8], quads: usize) {
    assert!(u.len() >= quads * 4, "input shorter than its quads");
    assert!(block.len() >= quads * 64, "block shorter than its quads");
}

#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn block_avx512(u: &[u8], block: &[i8], quads: usize, out: &mut [i32; 16]) {
    // Four sums in flight hide the instruction's latency; added at the end.
    let mut acc = [_mm512_setzero_si512(); 4];
    let (up, bp) = (u.as_ptr(), block.as_ptr());
    for q in 0..quads {
        // SAFETY: in bounds per `block`'s assertions; unaligned reads.
        let (a, b) = unsafe {
            (
                up.add(q * 4).cast::<i32>().read_unaligned(),
                _mm512_loadu_si512(bp.add(q * 64).cast()),
            )
        };
        let s = &mut acc[q % 4];
        *s = _mm512_dpbusd_epi32(*s, _mm512_set1_epi32(a), b);
    }
    let sum = _mm512_add_epi32(
        _mm512_add_epi32(acc[0], acc[1]),
        _mm512_add_epi32(acc[2], acc[3]),
    );
    // SAFETY: the store writes 16 i32 into a 16-element array.
    unsafe { _mm512_storeu_si512(out.as_mut_ptr().cast(), sum) }
}

/// Whether this CPU has AVX2 (the fallback's widening products).
pub(crate) fn avx2_available() -> bool {
    is_x86_feature_detected!("avx2")
}

/// [`block`] on AVX2: no byte dot product there, so the bytes widen to i16 and `vpmaddwd`
/// multiplies pairs into i32 (exact for any int8 weight, unlike `vpmaddubsw`, whose i16 pair
/// sums saturate for 8-bit weights).
///
/// # Panics
/// Where the CPU lacks AVX2, or `u` or `block` is shorter than the quads read.
pub(crate) fn block_avx2(u: &[u8], block: &[i8], quads: usize, out: &mut [i32; 16]) {
    assert!(avx2_available(), "the widening products need AVX2");
    check_lengths(u, block, quads);
    // SAFETY: AVX2 is present (asserted); the reads are in bounds as in `block`.
    unsafe { widening_avx2(u, block, quads, out) }
}

#[target_feature(enable = "avx2")]
unsafe fn widening_avx2(u: &[u8], block: &[i8], quads: usize, out: &mut [i32; 16]) {
    // acc[c] holds columns 4c..4c + 4, two i32 lanes each (k-offsets 0-1 and 2-3).
    let mut acc = [_mm256_setzero_si256(); 4];
    let (up, bp) = (u.as_ptr(), block.as_ptr());
    for q in 0..quads {
        // SAFETY: in bounds per `block_avx2`'s assertions; unaligned reads.
        let (x, w) = unsafe {
            (
                up.add(q * 4).cast::<i32>().read_unaligned(),
                [
                    _mm_loadu_si128(bp.add(q * 64).cast()),
                    _mm_loadu_si128(bp.add(q * 64 + 16).cast()),
                    _mm_loadu_si128(bp.add(q * 64 + 32).cast()),
                    _mm_loadu_si128(bp.add(q * 64 + 48).cast()),
                ],
            )
        };
        // The 4 input bytes as i16, repeated for the 4 columns of a vector.
        let x = _mm256_cvtepu8_epi16(_mm_set1_epi32(x));
        for (a, w) in acc.iter_mut().zip(w) {
            *a = _mm256_add_epi32(*a, _mm256_madd_epi16(_mm256_cvtepi8_epi16(w), x));
        }
    }
    let mut lanes = [0i32; 32];
    for (c, a) in acc.iter().enumerate() {
        // SAFETY: each store writes 8 i32 into an 8-element piece of `lanes`.
        unsafe { _mm256_storeu_si256(lanes[c * 8..].as_mut_ptr().cast(), *a) };
    }
    for (j, o) in out.iter_mut().enumerate() {
        *o = lanes[2 * j] + lanes[2 * j + 1];
    }
}
