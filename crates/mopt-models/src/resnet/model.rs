//! The ResNet modules: a convolution with its BatchNorm, the BasicBlock, the network.

use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::{BatchNorm, BatchNormConfig, Linear, LinearConfig, PaddingConfig2d};
use burn::prelude::*;
use burn::tensor::activation::relu;

use super::config::ResNetConfig;

/// A bias-free convolution followed by BatchNorm.
#[derive(Module, Debug)]
pub struct ConvBn {
    pub conv: Conv2d,
    pub bn: BatchNorm,
}

impl ConvBn {
    /// A `kernel`×`kernel` convolution `input → output` of `stride` ("same" padding).
    pub fn new(input: usize, output: usize, kernel: usize, stride: usize, device: &Device) -> Self {
        let p = kernel / 2;
        Self {
            conv: Conv2dConfig::new([input, output], [kernel, kernel])
                .with_stride([stride, stride])
                .with_padding(PaddingConfig2d::Explicit(p, p, p, p))
                .with_bias(false)
                .init(device),
            bn: BatchNormConfig::new(output).init(device),
        }
    }

    /// # Shapes
    /// - input: `[batch, input, side, side]`
    /// - output: `[batch, output, side / stride, side / stride]`
    pub fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        // mopt's convolution on the GEMM (Burn's elsewhere); same weights, same layout.
        let pad = self.conv.kernel_size[0] / 2;
        let y = mopt_kernels::conv2d(x, self.conv.weight.val(), self.conv.stride[0], pad);
        self.bn.forward(y)
    }
}

/// Two 3×3 convolutions with BatchNorm and ReLU, plus a shortcut (identity, or a 1×1
/// projection with BatchNorm when the width or the size changes).
#[derive(Module, Debug)]
pub struct BasicBlock {
    pub conv1: ConvBn,
    pub conv2: ConvBn,
    pub shortcut: Option<ConvBn>,
}

impl BasicBlock {
    /// `input → inner → output` channels; the first convolution (and the projection) of `stride`.
    pub fn new(
        (input, inner, output): (usize, usize, usize),
        stride: usize,
        projection: bool,
        device: &Device,
    ) -> Self {
        Self {
            conv1: ConvBn::new(input, inner, 3, stride, device),
            conv2: ConvBn::new(inner, output, 3, 1, device),
            shortcut: projection.then(|| ConvBn::new(input, output, 1, stride, device)),
        }
    }

    /// # Shapes
    /// - input: `[batch, input, side, side]`
    /// - output: `[batch, output, side / stride, side / stride]`
    pub fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        let y = self.conv2.forward(relu(self.conv1.forward(x.clone())));
        let skip = match &self.shortcut {
            Some(p) => p.forward(x),
            None => x,
        };
        relu(y + skip)
    }
}

/// The network: stem, stages of blocks, global average pooling, classifier.
#[derive(Module, Debug)]
pub struct ResNet {
    pub stem: ConvBn,
    /// Stage by stage, block by block.
    pub stages: Vec<Vec<BasicBlock>>,
    pub classifier: Linear,
}

impl ResNet {
    pub fn new(c: &ResNetConfig, device: &Device) -> Self {
        let stages = c
            .stages
            .iter()
            .enumerate()
            .map(|(s, st)| {
                let mut input = c.stage_input(s);
                st.blocks
                    .iter()
                    .enumerate()
                    .map(|(b, &inner)| {
                        let block = BasicBlock::new(
                            (input, inner, st.width),
                            c.stride(s, b),
                            c.has_projection(s, b),
                            device,
                        );
                        input = st.width;
                        block
                    })
                    .collect()
            })
            .collect();
        let last = c.stages.last().map_or(0, |s| s.width);
        Self {
            stem: ConvBn::new(c.channels, c.stages[0].width, 3, 1, device),
            stages,
            classifier: LinearConfig::new(last, c.num_labels).init(device),
        }
    }

    /// The output of every stage (feature maps for distillation), then the logits.
    ///
    /// # Shapes
    /// - images: `[batch, channels, side, side]`
    /// - output: one `[batch, width_s, side_s, side_s]` a stage, and `[batch, num_labels]`
    pub fn forward_features(&self, images: Tensor<4>) -> (Vec<Tensor<4>>, Tensor<2>) {
        let mut x = relu(self.stem.forward(images));
        let mut features = Vec::with_capacity(self.stages.len());
        for stage in &self.stages {
            for block in stage {
                x = block.forward(x);
            }
            features.push(x.clone());
        }
        let [b, c, h, w] = x.dims();
        let pooled = x.reshape([b, c, h * w]).mean_dim(2).reshape([b, c]);
        (features, self.classifier.forward(pooled))
    }

    /// # Shapes
    /// - images: `[batch, channels, side, side]`
    /// - output: `[batch, num_labels]`
    pub fn forward(&self, images: Tensor<4>) -> Tensor<2> {
        self.forward_features(images).1
    }
}
