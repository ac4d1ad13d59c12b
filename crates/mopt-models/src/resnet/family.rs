//! The ResNet as a model family: the contracts of `mopt-core` for [`ResNet`].

use std::path::Path;

use burn::prelude::*;
use mopt_core::{
    Checkpoint, Classifier, FeatureMaps, MemoryEstimate, ModelConfig, ModelFault, Quantizable,
};
use mopt_data::ImageBatch;
use mopt_quant::node::Phase;

use super::config::ResNetConfig;
use super::model::ResNet;
use crate::burnpack::load_burnpack;
use crate::shape_file::{self, ShapeFile};

impl ModelConfig for ResNetConfig {
    fn arch(&self) -> &'static str {
        "resnet"
    }

    fn num_params(&self) -> usize {
        self.parameters()
    }

    fn num_labels(&self) -> usize {
        self.num_labels
    }

    /// Images have one size: `size` is ignored.
    fn flops(&self, _size: usize) -> f64 {
        self.forward_flops()
    }

    fn summary(&self) -> Vec<(String, String)> {
        vec![
            (
                "widths".into(),
                format!(
                    "{:?}",
                    self.stages.iter().map(|s| s.width).collect::<Vec<_>>()
                ),
            ),
            (
                "blocks".into(),
                format!(
                    "{:?}",
                    self.stages
                        .iter()
                        .map(|s| s.blocks.clone())
                        .collect::<Vec<_>>()
                ),
            ),
            (
                "input".into(),
                format!("{}x{}x{}", self.channels, self.image_size, self.image_size),
            ),
        ]
    }

    /// `ResNet, stage widths [32, 64], block widths [[32, 32], [64, 64]], input 1x28x28`.
    fn describe(&self) -> String {
        let s = self.summary();
        format!(
            "ResNet, stage widths {}, block widths {}, input {}",
            s[0].1, s[1].1, s[2].1
        )
    }

    /// `widths` (residual channels a stage) and `blocks` (inner channels a block).
    fn facts(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut m = serde_json::Map::new();
        m.insert(
            "widths".into(),
            self.stages
                .iter()
                .map(|s| s.width)
                .collect::<Vec<_>>()
                .into(),
        );
        m.insert(
            "blocks".into(),
            serde_json::json!(self.stages.iter().map(|s| &s.blocks).collect::<Vec<_>>()),
        );
        m
    }

    /// Quantized or folded (BatchNorm gone): pruning's groups need the BatchNorms.
    fn is_quantized(&self) -> bool {
        self.quant.is_some() || self.folded
    }

    fn training_memory(&self, batch: usize, _size: usize) -> MemoryEstimate {
        MemoryEstimate::adamw_f32(self.parameters(), batch as u64 * self.activation_floats())
    }
}

impl Classifier for ResNet {
    type Batch = ImageBatch;

    fn logits(&self, batch: &ImageBatch) -> Tensor<2> {
        self.forward(batch.images.clone())
    }
}

/// The stem's output (map 0), then each stage's output (map `s`, 1-based).
impl FeatureMaps for ResNet {
    fn feature_shapes(c: &ResNetConfig) -> Vec<[usize; 3]> {
        let stem = [c.stages[0].width, c.image_size, c.image_size];
        std::iter::once(stem)
            .chain((0..c.stages.len()).map(|s| [c.stages[s].width, c.side(s), c.side(s)]))
            .collect()
    }

    fn forward_maps(&self, batch: &ImageBatch) -> (Vec<Tensor<4>>, Tensor<2>) {
        self.forward_features(batch.images.clone())
    }
}

impl Checkpoint for ResNet {
    type Config = ResNetConfig;

    /// Quantized configs get their quantizers (placeholder scales until loaded).
    fn init(config: &ResNetConfig, device: &Device) -> Self {
        let mut model = ResNet::new(config, device);
        if let Some(q) = &config.quant {
            model.attach_quantizers(q, Phase::Quantize, device);
        }
        model
    }

    /// `model.bpk` (Burn's format, BatchNorm running statistics included) and `config.json`.
    fn save(&self, config: &ResNetConfig, dir: &Path) -> Result<(), ModelFault> {
        Ok(shape_file::save(self, config, "resnet", dir)?)
    }

    fn load(dir: &Path, device: &Device) -> Result<(Self, ResNetConfig), ModelFault> {
        let config = ResNetConfig::from_file(&dir.join("config.json"))?;
        let mut model = Self::init(&config, device);
        load_burnpack(&mut model, &dir.join("model.bpk"))?;
        Ok((model, config))
    }

    /// Images of a smooth pattern, the config's size.
    fn bench_batch(
        c: &ResNetConfig,
        batch: usize,
        _size: usize,
        device: &Device,
    ) -> Option<ImageBatch> {
        Some(shape_file::pattern_batch(
            batch,
            c.channels,
            c.image_size,
            device,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::module::Module;

    fn values(t: Tensor<2>) -> Vec<f32> {
        t.into_data().convert::<f32>().try_to_vec().unwrap()
    }

    /// The declared feature shapes are the maps' (an odd side halves up: 7 → 4).
    #[test]
    fn feature_shapes_match_the_forward_maps() {
        let dev = Device::flex();
        let c = ResNetConfig::new(&[4, 8, 6], 1, 1, 7);
        let m = ResNet::new(&c, &dev);
        let batch = ResNet::bench_batch(&c, 2, 0, &dev).unwrap();
        let (maps, logits) = m.forward_maps(&batch);
        let got: Vec<[usize; 3]> = maps
            .iter()
            .map(|t| {
                let [_, ch, h, w] = t.dims();
                [ch, h, w]
            })
            .collect();
        assert_eq!(got, ResNet::feature_shapes(&c));
        assert_eq!(got, vec![[4, 7, 7], [4, 7, 7], [8, 4, 4], [6, 2, 2]]);
        assert_eq!(logits.dims(), [2, 10]);
    }

    /// Training-mode forwards move BatchNorm's running statistics; a saved and reloaded model
    /// has the same statistics and gives the same eval-mode logits, which differ from the
    /// train-mode (batch-statistics) logits.
    #[test]
    fn batchnorm_statistics_are_trained_saved_and_reloaded() {
        let ad = Device::flex().autodiff();
        let c = ResNetConfig::new(&[4, 8], 1, 1, 6);
        let model = ResNet::new(&c, &ad);
        let x = Tensor::<4>::random(
            [5, 1, 6, 6],
            burn::tensor::Distribution::Normal(0.5, 2.0),
            &ad,
        );
        let train_logits = values(model.forward(x.clone()).inner());
        // `valid()` syncs the running statistics (what the trainer saves).
        let inference = model.valid();
        let mean = inference
            .stem
            .bn
            .as_ref()
            .unwrap()
            .running_mean
            .value()
            .into_data();
        let moved: Vec<f32> = mean.convert::<f32>().try_to_vec().unwrap();
        assert!(
            moved.iter().any(|v| v.abs() > 1e-3),
            "running mean moved: {moved:?}"
        );
        let dir = tempfile::tempdir().unwrap();
        inference.save(&c, dir.path()).unwrap();
        let (back, c2) = ResNet::load(dir.path(), &Device::flex()).unwrap();
        assert_eq!(c2, c);
        let xi = x.inner();
        let (a, b) = (
            values(inference.forward(xi.clone())),
            values(back.forward(xi)),
        );
        assert_eq!(a, b, "reloaded eval logits are identical");
        let diff = a
            .iter()
            .zip(&train_logits)
            .map(|(p, q)| (p - q).abs())
            .fold(0.0, f32::max);
        assert!(
            diff > 1e-3,
            "eval mode uses running statistics, not the batch's ({diff})"
        );
    }

    #[test]
    fn pruned_widths_build_and_count() {
        let mut c = ResNetConfig::new(&[8, 16], 2, 1, 8);
        c.stages[0].blocks = vec![3, 5];
        c.stages[1].width = 12;
        c.stages[1].blocks = vec![7, 2];
        let m = ResNet::new(&c, &Device::flex());
        let logits = m.forward(Tensor::zeros([2, 1, 8, 8], &Device::flex()));
        assert_eq!(logits.dims(), [2, 10]);
        // Burn counts BatchNorm's running mean and variance too (two values a channel).
        let bn_channels = 8 + (3 + 8) + (5 + 8) + (7 + 12 + 12) + (2 + 12);
        assert_eq!(m.num_params(), c.parameters() + 2 * bn_channels);
    }
}
