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
    assert!(u.len() >= quads * 4, "input shorter than its quads");
    assert!(block.len() >= quads * 64, "block shorter than its quads");
    // SAFETY: the features are present (asserted); the reads are in bounds: u's at 4q..4q + 4
    // ≤ 4·quads ≤ u.len(), the block's 64-byte loads at q·64 ≤ (quads − 1)·64, ending by
    // quads·64 ≤ block.len().
    unsafe { block_avx512(u, block, quads, out) }
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
