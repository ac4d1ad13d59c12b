//! The feature-map contract: a model whose intermediate feature maps (a CNN's stem and stage
//! outputs) distillation can match, FitNets-style (the student's map, projected by a learned 1×1
//! convolution where the widths differ, against the teacher's) or by attention transfer
//! (Zagoruyko & Komodakis: the maps' spatial attention `Σ_c x²`, normalised).

use burn::prelude::*;

use crate::model::Checkpoint;

/// A model whose feature maps distillation can match.
pub trait FeatureMaps: Checkpoint {
    /// `[channels, height, width]` of every feature map a forward pass returns, in order, for a
    /// model of `config` (a ResNet: the stem's output, then each stage's).
    fn feature_shapes(config: &Self::Config) -> Vec<[usize; 3]>;

    /// The forward pass with every feature map.
    ///
    /// # Shapes
    /// - output: one `[batch, channels_i, height_i, width_i]` a map, and the logits
    ///   `[batch, classes]`
    fn forward_maps(&self, batch: &Self::Batch) -> (Vec<Tensor<4>>, Tensor<2>);
}
