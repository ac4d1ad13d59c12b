//! The only `unsafe` code in mopt: CPU instructions that stable Rust offers no safe way to
//! reach. AMX has no intrinsics on stable (inline assembly, [`amx`]); the AVX512_BF16 dot
//! product has intrinsics, but calling a function compiled for a feature the build does not
//! assume, and loading vectors from memory, are `unsafe` ([`dpbf16`]). Each `unsafe` block
//! states what it relies on; the safe callers check the CPU first and hand over slices whose
//! lengths the kernels assert.
#![allow(unsafe_code)]

pub(crate) mod amx;
pub(crate) mod dpbf16;
pub(crate) mod dpbusd;

/// Ask the CPU to bring the cache line holding `data[i]` into L1 ahead of its use (nothing
/// when `i` is past the end). A prefetch never faults and changes no value.
#[inline(always)]
pub(crate) fn prefetch(data: &[f32], i: usize) {
    if i < data.len() {
        // SAFETY: `data[i]` is in bounds (checked), so the address is valid; `prefetcht0`
        // only moves a cache line and cannot fault.
        unsafe {
            std::arch::x86_64::_mm_prefetch(
                data.as_ptr().add(i).cast::<i8>(),
                std::arch::x86_64::_MM_HINT_T0,
            )
        }
    }
}

/// `m` copies of `row` one after the other (a linear layer's bias in every row of its output),
/// written once, in parallel: safe Rust would zero the buffer first (`vec![0.0; len]`, a
/// serial pass as large as the output) or copy on one thread (`row.repeat(m)`); the serial
/// copy was 4% of a batch-32 BERT forward pass.
pub(crate) fn repeat_rows(row: &[f32], m: usize) -> Vec<f32> {
    use rayon::prelude::*;
    let n = row.len();
    let len = n.checked_mul(m).expect("output size overflows");
    let mut out: Vec<f32> = Vec::with_capacity(len);
    if len == 0 {
        return out;
    }
    out.spare_capacity_mut()[..len]
        .par_chunks_mut(crate::cpu::rows_per_task(n) * n)
        .for_each(|chunk| {
            for dst in chunk.chunks_exact_mut(n) {
                for (d, &v) in dst.iter_mut().zip(row) {
                    d.write(v);
                }
            }
        });
    // SAFETY: the capacity is at least `len`; the chunks (multiples of `n` long, the last one
    // too, as `len` is) cover the first `len` slots and every `n`-long piece of each was
    // written element by element above, so all `len` values are initialized.
    unsafe { out.set_len(len) };
    out
}

/// `len` zeros, written in parallel (`vec![0.0; len]` is one serial pass; a training step
/// allocates each layer's gradients this way).
pub(crate) fn zeros(len: usize) -> Vec<f32> {
    use rayon::prelude::*;
    let mut out: Vec<f32> = Vec::with_capacity(len);
    out.spare_capacity_mut()[..len]
        .par_chunks_mut(64 * 1024)
        .for_each(|chunk| chunk.fill(std::mem::MaybeUninit::new(0.0)));
    // SAFETY: the capacity is at least `len`, and the chunks cover the first `len` slots, each
    // of which was written above.
    unsafe { out.set_len(len) };
    out
}

/// `C = α·A·B`, or `C += α·A·B` with `beta_one`, on the `gemm` crate (the f32 GEMM Burn Flex
/// runs), over rayon: C row-major `a.rows × b.cols` at row stride `ldc`.
///
/// # Panics
/// When the views reach past their data, the inner dimensions differ or C is too short.
pub(crate) fn gemm_crate(
    a: &crate::gemm::View,
    b: &crate::gemm::View,
    (c, ldc): (&mut [f32], usize),
    alpha: f32,
    beta_one: bool,
) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(b.rows, k, "inner dimensions");
    if m == 0 || n == 0 || k == 0 {
        return; // callers finish empty products (crate::gemm::degenerate)
    }
    let last = |v: &crate::gemm::View| v.offset + (v.rows - 1) * v.rs + (v.cols - 1) * v.cs;
    assert!(
        last(a) < a.data.len() && last(b) < b.data.len(),
        "a view past its data"
    );
    assert!(
        ldc >= n && (m - 1) * ldc + n <= c.len(),
        "C shorter than the product"
    );
    // SAFETY: every element the product reads is inside its slice: A's (i, p) at offset +
    // i·rs + p·cs ≤ last(a) < len (asserted; strides non-negative), B's likewise; every element
    // it writes, C's (i, j) at i·ldc + j ≤ (m − 1)·ldc + n − 1 < c.len() (asserted). C does not
    // alias A or B (a `&mut` and two `&`). C is initialized: without `read_dst` the crate
    // may still copy an edge tile of C to scratch before overwriting it.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            ldc as isize,
            beta_one,
            a.data.as_ptr().add(a.offset),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr().add(b.offset),
            b.cs as isize,
            b.rs as isize,
            1.0,
            alpha,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(0),
        )
    }
}

/// glibc's allocator: serve tensors up to 32 MiB from the heap and return freed heap memory to
/// the system only past 1 GiB at its top (`mallopt`). By default every large tensor was a
/// fresh `mmap` (then zero-filled pages faulted in one by one, and unmapped when freed): ~15%
/// of a batch-32 forward pass went to page faults.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(crate) fn keep_freed_memory() {
    // SAFETY: `mallopt` only sets allocator parameters; both values are in glibc's accepted
    // ranges (the mmap threshold at most 32 MiB on 64-bit), and no allocation is in flight
    // inside the allocator here (it takes its own lock).
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}

#[cfg(test)]
mod tests {
    /// Every row written, across several parallel chunks and a short last one, and the empty
    /// cases.
    #[test]
    fn repeat_rows_is_row_repeat() {
        let row: Vec<f32> = (0..37).map(|i| i as f32 * 0.5 - 3.0).collect();
        for m in [0, 1, 2, 443, 5000] {
            assert_eq!(super::repeat_rows(&row, m), row.repeat(m), "m = {m}");
        }
        assert!(super::repeat_rows(&[], 7).is_empty());
    }

    #[test]
    fn zeros_are_zeros() {
        for len in [0, 1, 65_536, 200_003] {
            let z = super::zeros(len);
            assert_eq!(z.len(), len);
            assert!(z.iter().all(|&v| v.to_bits() == 0), "len = {len}");
        }
    }
}
