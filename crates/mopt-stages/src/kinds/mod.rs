//! The stage kinds. A new kind is a module here plus one line in [`crate::Registry::builtin_kinds`]
//! (a program registers a kind of its own with [`crate::Registry::with_kind`]).

pub mod checkpoint;
pub mod distill;
pub mod export;
pub mod finetune;
pub mod kd;
pub mod kd_maps;
pub mod kd_student;
pub mod prune;
pub mod quantize;
pub mod vocab;
