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
pub mod limits;
pub mod llama;
pub mod norm;
pub mod resnet;
pub mod shape_file;

pub use error::ModelError;

/// Check that every per-layer list a config carries (`name`, its values) has one entry per
/// layer of the `layers` the config declares.
pub(crate) fn check_layer_lists(
    layers: usize,
    lists: &[(&str, &Option<Vec<usize>>)],
) -> Result<(), String> {
    for (name, v) in lists {
        if let Some(v) = v {
            if v.len() != layers {
                return Err(format!(
                    "{name} has {} entries but num_hidden_layers is {layers}",
                    v.len()
                ));
            }
        }
    }
    Ok(())
}
