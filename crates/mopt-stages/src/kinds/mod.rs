//! The stage kinds. A new kind is a module here plus one line in [`crate::stage::kinds`].

pub mod distill;
pub mod export;
pub mod finetune;
