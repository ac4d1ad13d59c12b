//! The only `unsafe` code in mopt: CPU instructions that stable Rust offers no safe way to
//! reach. AMX has no intrinsics on stable (inline assembly, [`amx`]); the AVX512_BF16 dot
//! product has intrinsics, but calling a function compiled for a feature the build does not
//! assume, and loading vectors from memory, are `unsafe` ([`dpbf16`]). Each `unsafe` block
//! states what it relies on; the safe callers check the CPU first and hand over slices whose
//! lengths the kernels assert.
#![allow(unsafe_code)]

pub(crate) mod amx;
pub(crate) mod dpbf16;

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
