//! The plain CNN's modules.

use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{BatchNorm, BatchNormConfig, Linear, LinearConfig, PaddingConfig2d};
use burn::prelude::*;
use burn::tensor::activation::relu;

use super::config::CnnConfig;

/// A 3×3 convolution (no bias) with BatchNorm, ReLU and 2×2 max pooling.
#[derive(Module, Debug)]
pub struct CnnBlock {
    /// The convolution, "same" padding.
    pub conv: Conv2d,
    /// Its BatchNorm.
    pub bn: BatchNorm,
    /// 2×2 max pooling, stride 2.
    pub pool: MaxPool2d,
}

impl CnnBlock {
    fn new(input: usize, output: usize, device: &Device) -> Self {
        Self {
            conv: Conv2dConfig::new([input, output], [3, 3])
                .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                .with_bias(false)
                .init(device),
            bn: BatchNormConfig::new(output).init(device),
            pool: MaxPool2dConfig::new([2, 2]).with_strides([2, 2]).init(),
        }
    }

    /// # Shapes
    /// - input: `[batch, input, side, side]`
    /// - output: `[batch, output, side / 2, side / 2]`
    pub fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        let y = mopt_kernels::conv2d(x, self.conv.weight.val(), 1, 1);
        self.pool
            .forward(relu(crate::norm::batch_norm(&self.bn, y)))
    }
}

/// The network.
#[derive(Module, Debug)]
pub struct Cnn {
    /// The blocks, in order.
    pub blocks: Vec<CnnBlock>,
    /// The classifier on the pooled last block.
    pub classifier: Linear,
}

impl Cnn {
    /// A fresh network of shape `c`.
    pub fn new(c: &CnnConfig, device: &Device) -> Self {
        Self {
            blocks: (0..c.widths.len())
                .map(|b| CnnBlock::new(c.block_input(b), c.widths[b], device))
                .collect(),
            classifier: LinearConfig::new(*c.widths.last().expect("validated"), c.num_labels)
                .init(device),
        }
    }

    /// Every block's output (feature maps for distillation), then the logits.
    ///
    /// # Shapes
    /// - images: `[batch, channels, side, side]`
    /// - output: one `[batch, width_b, side_b, side_b]` a block, and `[batch, num_labels]`
    pub fn forward_features(&self, images: Tensor<4>) -> (Vec<Tensor<4>>, Tensor<2>) {
        let mut x = images;
        let mut maps = Vec::with_capacity(self.blocks.len());
        for block in &self.blocks {
            x = block.forward(x);
            maps.push(x.clone());
        }
        let [b, c, h, w] = x.dims();
        let pooled = x.reshape([b, c, h * w]).mean_dim(2).reshape([b, c]);
        (maps, self.classifier.forward(pooled))
    }

    /// # Shapes
    /// - images: `[batch, channels, side, side]`
    /// - output: `[batch, num_labels]`
    pub fn forward(&self, images: Tensor<4>) -> Tensor<2> {
        self.forward_features(images).1
    }
}
