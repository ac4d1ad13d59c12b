//! The ResNet's shape: stages of BasicBlocks whose widths pruning can shrink one by one.

use mopt_quant::node::QuantConfig;
use serde::{Deserialize, Serialize};

use crate::shape_file::ShapeFile;

/// One stage: BasicBlocks that share a residual width (tied across every shortcut and
/// BatchNorm of the stage); the first block of a stage after the first halves the image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageConfig {
    /// Residual channels: the stage's block outputs and shortcuts.
    pub width: usize,
    /// Each block's inner channels (its first convolution's outputs), one entry a block.
    pub blocks: Vec<usize>,
}

/// A CIFAR-style ResNet for small images: a 3×3 stem, stages of BasicBlocks (two 3×3
/// convolutions with BatchNorm and ReLU, identity or 1×1-projection shortcuts), global average
/// pooling and a linear classifier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResNetConfig {
    /// Input channels (1 for grey images).
    pub channels: usize,
    /// Input side in pixels (FLOPs and the benchmark input; the network accepts any size).
    pub image_size: usize,
    /// The stages, in order.
    pub stages: Vec<StageConfig>,
    /// Classes (a recipe's `[model] config` may leave it out: the data's labels set it).
    #[serde(default)]
    pub num_labels: usize,
    /// Class names in label order (written by mopt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<Vec<String>>,
    /// BatchNorm folded into the convolutions (each convolution has a bias and no BatchNorm):
    /// the form quantization starts from.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub folded: bool,
    /// The quantization of a quantized network (written by mopt's `ptq` / `qat` stages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quant: Option<QuantConfig>,
}

impl ResNetConfig {
    /// A ResNet with `blocks` BasicBlocks in each stage of the given widths (inner widths equal
    /// to the residual width, as an unpruned network has).
    pub fn new(widths: &[usize], blocks: usize, channels: usize, image_size: usize) -> Self {
        Self {
            channels,
            image_size,
            stages: widths
                .iter()
                .map(|&w| StageConfig {
                    width: w,
                    blocks: vec![w; blocks],
                })
                .collect(),
            num_labels: 10,
            labels: None,
            folded: false,
            quant: None,
        }
    }

    /// The stride of block `b` of stage `s`: 2 for the first block of every stage but the first.
    pub fn stride(&self, s: usize, b: usize) -> usize {
        if s > 0 && b == 0 {
            2
        } else {
            1
        }
    }

    /// Channels entering stage `s` (the stem's width for the first).
    pub fn stage_input(&self, s: usize) -> usize {
        if s == 0 {
            self.stages[0].width
        } else {
            self.stages[s - 1].width
        }
    }

    /// Whether block `b` of stage `s` has a projection shortcut (its input differs in width or
    /// size from its output).
    pub fn has_projection(&self, s: usize, b: usize) -> bool {
        b == 0 && (self.stride(s, b) != 1 || self.stage_input(s) != self.stages[s].width)
    }

    /// Image side inside stage `s`.
    pub fn side(&self, s: usize) -> usize {
        // A 3×3 convolution of stride 2 and padding 1 gives ceil(side / 2).
        (0..s).fold(self.image_size, |side, _| side.div_ceil(2))
    }

    /// Parameters: convolutions, BatchNorm scales and shifts (a folded network: convolution
    /// biases), the classifier.
    pub fn parameters(&self) -> usize {
        let conv = |i: usize, o: usize, k: usize| i * o * k * k;
        let per_channel = if self.folded { 1 } else { 2 };
        let bn = |c: usize| per_channel * c;
        let mut n = conv(self.channels, self.stages[0].width, 3) + bn(self.stages[0].width);
        for (s, st) in self.stages.iter().enumerate() {
            let mut input = self.stage_input(s);
            for (b, &inner) in st.blocks.iter().enumerate() {
                n += conv(input, inner, 3) + bn(inner) + conv(inner, st.width, 3) + bn(st.width);
                if self.has_projection(s, b) {
                    n += conv(input, st.width, 1) + bn(st.width);
                }
                input = st.width;
            }
        }
        let last = self.stages.last().map_or(0, |s| s.width);
        n + last * self.num_labels + self.num_labels
    }

    /// Forward multiply-adds x 2 of one image of `image_size`.
    pub fn forward_flops(&self) -> f64 {
        let conv =
            |i: usize, o: usize, k: usize, side: usize| (2 * i * o * k * k * side * side) as f64;
        let mut f = conv(self.channels, self.stages[0].width, 3, self.image_size);
        for (s, st) in self.stages.iter().enumerate() {
            let side = self.side(s);
            let mut input = self.stage_input(s);
            for (b, &inner) in st.blocks.iter().enumerate() {
                f += conv(input, inner, 3, side) + conv(inner, st.width, 3, side);
                if self.has_projection(s, b) {
                    f += conv(input, st.width, 1, side);
                }
                input = st.width;
            }
        }
        let last = self.stages.last().map_or(0, |s| s.width);
        f + (2 * last * self.num_labels) as f64
    }

    /// f32 activations the backward pass keeps for one image: each convolution's output, its
    /// BatchNorm output and its ReLU output.
    pub fn activation_floats(&self) -> u64 {
        let mut a = 3 * self.stages[0].width * self.image_size * self.image_size;
        for (s, st) in self.stages.iter().enumerate() {
            let area = self.side(s) * self.side(s);
            for (b, &inner) in st.blocks.iter().enumerate() {
                a += 3 * (inner + st.width) * area;
                if self.has_projection(s, b) {
                    a += 2 * st.width * area;
                }
            }
        }
        a as u64
    }
}

impl ShapeFile for ResNetConfig {
    const KEYS: &'static str = "a ResNet config: channels, image_size, stages [{width, blocks}]";

    /// Every width positive, at least one stage with one block.
    fn validate(&self) -> Result<(), String> {
        if self.channels == 0 || self.image_size == 0 || self.num_labels < 2 {
            return Err("channels and image_size must be positive, num_labels at least 2".into());
        }
        if self.stages.is_empty() {
            return Err("`stages` is empty: a ResNet needs at least one stage".into());
        }
        for (s, st) in self.stages.iter().enumerate() {
            if st.width == 0 || st.blocks.is_empty() || st.blocks.contains(&0) {
                return Err(format!(
                    "stage {s}: width {} and block widths {:?} must be positive, with at least one block",
                    st.width, st.blocks
                ));
            }
        }
        Ok(())
    }

    fn classes_mut(&mut self) -> (&mut usize, &mut Option<Vec<String>>) {
        (&mut self.num_labels, &mut self.labels)
    }

    fn class_names(&self) -> Option<&[String]> {
        self.labels.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_and_flops_count_every_convolution() {
        // One stage of one block, 1 -> 4 channels at 8x8, 3 classes, identity shortcut.
        let c = ResNetConfig {
            channels: 1,
            image_size: 8,
            stages: vec![StageConfig {
                width: 4,
                blocks: vec![2],
            }],
            num_labels: 3,
            labels: None,
            folded: false,
            quant: None,
        };
        // stem 1*4*9 + bn 8; block 4*2*9 + 4 + 2*4*9 + 8; head 4*3 + 3
        assert_eq!(c.parameters(), 36 + 8 + 72 + 4 + 72 + 8 + 15);
        // Folded: a bias a channel instead of BatchNorm's scale and shift.
        let folded = ResNetConfig {
            folded: true,
            ..c.clone()
        };
        assert_eq!(folded.parameters(), 36 + 4 + 72 + 2 + 72 + 4 + 15);
        let stem = 2.0 * 36.0 * 64.0;
        let block = 2.0 * 72.0 * 64.0 * 2.0;
        assert_eq!(c.forward_flops(), stem + block + 24.0);
        assert!(!c.has_projection(0, 0));
        let two = ResNetConfig::new(&[4, 8], 2, 1, 28);
        assert!(two.has_projection(1, 0) && !two.has_projection(1, 1));
        assert_eq!((two.side(0), two.side(1)), (28, 14));
    }
}
