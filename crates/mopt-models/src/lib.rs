//! # mopt-models
//!
//! Models mopt trains and compresses, written with Burn modules, with shapes that pruning can
//! shrink (per-layer attention heads and FFN widths live in the config), loaders for Hugging Face
//! safetensors checkpoints and savers for Burn's own format and HF-style safetensors.

#![deny(missing_docs)]
pub mod bert;
pub mod burnpack;
pub mod cnn;
mod error;
pub mod llama;
pub mod norm;
pub mod resnet;
pub mod shape_file;

pub use error::ModelError;
