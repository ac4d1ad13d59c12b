//! The ResNet modules: a convolution with its BatchNorm, the BasicBlock, the network. Quantized,
//! each convolution fake-quantizes its input and weight (and, where ONNX Runtime's `QLinearConv`
//! writes integers, its output), with BatchNorm folded in beforehand.

use burn::module::{Module, Param};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::{BatchNorm, BatchNormConfig, Linear, LinearConfig, PaddingConfig2d};
use burn::prelude::*;
use burn::tensor::activation::relu as relu_fn;
use mopt_quant::fake::fake_quant;
use mopt_quant::node::{LinearQuant, Phase};

use super::config::ResNetConfig;

/// A bias-free convolution followed by BatchNorm; folded, a convolution with a bias.
#[derive(Module, Debug)]
pub struct ConvBn {
    /// The convolution.
    pub conv: Conv2d,
    /// `None` once folded into the convolution ([`ResNetConfig::folded`]).
    pub bn: Option<BatchNorm>,
    /// Its quantizers, when quantized.
    pub quant: Option<LinearQuant>,
}

impl ConvBn {
    /// A `kernel`×`kernel` convolution `input → output` of `stride` ("same" padding), with a
    /// BatchNorm, or a bias when `folded`.
    pub fn new(
        (input, output): (usize, usize),
        kernel: usize,
        stride: usize,
        folded: bool,
        device: &Device,
    ) -> Self {
        let p = kernel / 2;
        Self {
            conv: Conv2dConfig::new([input, output], [kernel, kernel])
                .with_stride([stride, stride])
                .with_padding(PaddingConfig2d::Explicit(p, p, p, p))
                .with_bias(folded)
                .init(device),
            bn: (!folded).then(|| BatchNormConfig::new(output).init(device)),
            quant: None,
        }
    }

    /// # Shapes
    /// - input: `[batch, input, side, side]`
    /// - output: `[batch, output, side / stride, side / stride]`
    pub fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        self.forward_act(x, None, false)
    }

    /// `relu(self(x) + residual)` (the residual and ReLU each when asked): in training with
    /// BatchNorm, one fused kernel after the convolution.
    ///
    /// # Shapes
    /// - input: `[batch, input, side, side]`
    /// - residual, output: `[batch, output, side / stride, side / stride]`
    pub fn forward_act(&self, x: Tensor<4>, residual: Option<Tensor<4>>, relu: bool) -> Tensor<4> {
        // mopt's convolution on the GEMM (Burn's elsewhere); same weights, same layout.
        let pad = self.conv.kernel_size[0] / 2;
        if let (Some(bn), None, None) = (&self.bn, &self.quant, &self.conv.bias) {
            let (xw, conv) = ((x, self.conv.weight.val()), (self.conv.stride[0], pad));
            return crate::norm::conv_batch_norm_act(bn, xw, conv, residual, relu);
        }
        let (x, w) = match &self.quant {
            Some(q) => (q.input.forward(x), q.weight.forward(self.conv.weight.val())),
            None => (x, self.conv.weight.val()),
        };
        let mut y = mopt_kernels::conv2d(x, w, self.conv.stride[0], pad);
        if let Some(b) = &self.conv.bias {
            let n = b.val().dims()[0];
            y = y + self.bias(b.val()).reshape([1, n, 1, 1]);
        }
        let out = self.quant.as_ref().and_then(|q| q.output.as_ref());
        let (y, residual) = match (&self.bn, out) {
            (Some(bn), None) => return crate::norm::batch_norm_act(bn, y, residual, relu),
            (Some(bn), Some(out)) => (out.forward(crate::norm::batch_norm(bn, y)), residual),
            (None, Some(out)) => (out.forward(y), residual),
            (None, None) => (y, residual),
        };
        let y = match residual {
            Some(r) => y + r,
            None => y,
        };
        if relu {
            relu_fn(y)
        } else {
            y
        }
    }

    /// The bias as the deployed graph holds it: quantized, int32 at scale `input · weight`
    /// (what `QLinearConv` adds to its accumulator); float otherwise.
    fn bias(&self, b: Tensor<1>) -> Tensor<1> {
        match &self.quant {
            Some(q) if q.input.phase() == Phase::Quantize => {
                let s = q.input.scale.val().detach() * q.weight.scale.val().detach();
                let z = s.zeros_like();
                fake_quant(b, s, z, i32::MIN, i32::MAX)
            }
            _ => b,
        }
    }

    /// This convolution with its BatchNorm folded in (inference statistics): `W'_c = s·W_c`,
    /// `b'_c = s·(b_c − μ_c) + β_c`, `s = γ_c / √(σ²_c + ε)`. Unchanged when already folded.
    pub fn folded(mut self) -> Self {
        if self.bn.is_none() {
            return self;
        }
        let (w, b) = mopt_export::cnn::fold_batch_norm(&self.conv, self.bn.as_ref());
        let device = self.conv.weight.val().device();
        let dims = self.conv.weight.val().dims();
        self.conv.weight = Param::from_tensor(Tensor::from_data(TensorData::new(w, dims), &device));
        let n = b.len();
        self.conv.bias = Some(Param::from_tensor(Tensor::from_data(
            TensorData::new(b, [n]),
            &device,
        )));
        self.bn = None;
        self
    }
}

/// Two 3×3 convolutions with BatchNorm and ReLU, plus a shortcut (identity, or a 1×1
/// projection with BatchNorm when the width or the size changes).
#[derive(Module, Debug)]
pub struct BasicBlock {
    /// The first 3×3 convolution (and the block's stride).
    pub conv1: ConvBn,
    /// The second 3×3 convolution.
    pub conv2: ConvBn,
    /// The 1×1 projection shortcut, where the width or the size changes.
    pub shortcut: Option<ConvBn>,
}

impl BasicBlock {
    /// `input → inner → output` channels; the first convolution (and the projection) of `stride`.
    pub fn new(
        (input, inner, output): (usize, usize, usize),
        stride: usize,
        projection: bool,
        folded: bool,
        device: &Device,
    ) -> Self {
        Self {
            conv1: ConvBn::new((input, inner), 3, stride, folded, device),
            conv2: ConvBn::new((inner, output), 3, 1, folded, device),
            shortcut: projection.then(|| ConvBn::new((input, output), 1, stride, folded, device)),
        }
    }

    /// # Shapes
    /// - input: `[batch, input, side, side]`
    /// - output: `[batch, output, side / stride, side / stride]`
    pub fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        let skip = match &self.shortcut {
            Some(p) => p.forward(x.clone()),
            None => self.identity_skip(x.clone()),
        };
        let y = self.conv1.forward_act(x, None, true);
        self.conv2.forward_act(y, Some(skip), true)
    }

    /// The identity shortcut: `x`, quantized as the first convolution quantizes it when the
    /// second convolution's output is quantized (the residual `Add` then runs on integers in
    /// ONNX Runtime, reading the same quantized `x`).
    fn identity_skip(&self, x: Tensor<4>) -> Tensor<4> {
        let out_quantized = self
            .conv2
            .quant
            .as_ref()
            .is_some_and(|q| q.output.is_some());
        match &self.conv1.quant {
            Some(q) if out_quantized => q.input.forward(x),
            _ => x,
        }
    }

    /// This block with its BatchNorms folded into the convolutions.
    pub fn folded(self) -> Self {
        Self {
            conv1: self.conv1.folded(),
            conv2: self.conv2.folded(),
            shortcut: self.shortcut.map(ConvBn::folded),
        }
    }
}

/// The network: stem, stages of blocks, global average pooling, classifier.
#[derive(Module, Debug)]
pub struct ResNet {
    /// The 3×3 stem convolution.
    pub stem: ConvBn,
    /// Stage by stage, block by block.
    pub stages: Vec<Vec<BasicBlock>>,
    /// The classifier on the pooled last stage.
    pub classifier: Linear,
    /// The classifier's quantizers, when quantized.
    pub classifier_quant: Option<LinearQuant>,
}

impl ResNet {
    /// A fresh network of shape `c` on `device`.
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
                            c.folded,
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
            stem: ConvBn::new((c.channels, c.stages[0].width), 3, 1, c.folded, device),
            stages,
            classifier: LinearConfig::new(last, c.num_labels).init(device),
            classifier_quant: None,
        }
    }

    /// This network with every BatchNorm folded into its convolution (eval-mode outputs
    /// unchanged up to rounding); its config has [`ResNetConfig::folded`] set.
    pub fn folded(self) -> Self {
        Self {
            stem: self.stem.folded(),
            stages: self
                .stages
                .into_iter()
                .map(|st| st.into_iter().map(BasicBlock::folded).collect())
                .collect(),
            classifier: self.classifier,
            classifier_quant: self.classifier_quant,
        }
    }

    /// The stem's output and every stage's (feature maps for distillation), then the logits.
    ///
    /// # Shapes
    /// - images: `[batch, channels, side, side]`
    /// - output: the stem's `[batch, width_0, side, side]`, one `[batch, width_s, side_s,
    ///   side_s]` a stage, and `[batch, num_labels]`
    pub fn forward_features(&self, images: Tensor<4>) -> (Vec<Tensor<4>>, Tensor<2>) {
        let mut x = self.stem.forward_act(images, None, true);
        let mut features = Vec::with_capacity(self.stages.len() + 1);
        features.push(x.clone());
        for stage in &self.stages {
            for block in stage {
                x = block.forward(x);
            }
            features.push(x.clone());
        }
        let [b, c, h, w] = x.dims();
        let pooled = x.reshape([b, c, h * w]).mean_dim(2).reshape([b, c]);
        let logits = match &self.classifier_quant {
            Some(q) => {
                let y = q
                    .input
                    .forward(pooled)
                    .matmul(q.weight.forward(self.classifier.weight.val()));
                match &self.classifier.bias {
                    Some(bias) => y + bias.val().unsqueeze(),
                    None => y,
                }
            }
            None => self.classifier.forward(pooled),
        };
        (features, logits)
    }

    /// # Shapes
    /// - images: `[batch, channels, side, side]`
    /// - output: `[batch, num_labels]`
    pub fn forward(&self, images: Tensor<4>) -> Tensor<2> {
        self.forward_features(images).1
    }
}
