//! The only `unsafe` code in mopt: CPU instructions that stable Rust offers no safe way to
//! reach. AMX has no intrinsics on stable (inline assembly, [`amx`]); the AVX512_BF16 dot
//! product has intrinsics, but calling a function compiled for a feature the build does not
//! assume, and loading vectors from memory, are `unsafe` ([`dpbf16`]). Each `unsafe` block
//! states what it relies on; the safe callers check the CPU first and hand over slices whose
//! lengths the kernels assert.
#![allow(unsafe_code)]

pub(crate) mod amx;
pub(crate) mod dpbf16;
