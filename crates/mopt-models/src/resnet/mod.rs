//! ResNets for small images (CIFAR-style: a 3×3 stem, no max-pool): BasicBlocks with BatchNorm,
//! identity and 1×1-projection shortcuts, per-stage residual widths and per-block inner widths in
//! the config so that channel pruning can shrink each one.
//!
//! ```
//! use burn::prelude::*;
//! use mopt_models::resnet::{ResNet, ResNetConfig};
//!
//! let config = ResNetConfig::new(&[8, 16], 1, 1, 8);
//! let model = ResNet::new(&config, &Device::flex());
//! let logits = model.forward(Tensor::zeros([2, 1, 8, 8], &Device::flex()));
//! assert_eq!(logits.dims(), [2, 10]);
//! ```

mod config;
mod family;
mod model;
mod onnx;
mod prune;
mod quant;

pub use config::{ResNetConfig, StageConfig};
pub use model::{BasicBlock, ConvBn, ResNet};
pub use prune::{Channels, Residual};
