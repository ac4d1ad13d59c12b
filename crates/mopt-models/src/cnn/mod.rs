//! A plain CNN for small images: blocks of a 3×3 convolution with BatchNorm, ReLU and 2×2 max
//! pooling, then global average pooling and a linear classifier. Each block's width lives in the
//! config so that channel pruning can shrink it; the blocks' outputs are the feature maps
//! distillation can match.
//!
//! ```
//! use burn::prelude::*;
//! use mopt_models::cnn::{Cnn, CnnConfig};
//!
//! let config = CnnConfig::new(&[8, 16], 1, 12);
//! let model = Cnn::new(&config, &Device::flex());
//! let logits = model.forward(Tensor::zeros([2, 1, 12, 12], &Device::flex()));
//! assert_eq!(logits.dims(), [2, 10]);
//! ```

mod config;
mod family;
mod model;
mod onnx;
mod prune;

pub use config::CnnConfig;
pub use model::{Cnn, CnnBlock};
pub use prune::Channels;
