//! The plain CNN as a model family: the contracts of `mopt-core` for [`Cnn`].

use std::path::Path;

use burn::prelude::*;
use mopt_core::{Checkpoint, Classifier, FeatureMaps, MemoryEstimate, ModelConfig, ModelFault};
use mopt_data::ImageBatch;

use super::config::CnnConfig;
use super::model::Cnn;
use crate::burnpack::load_burnpack;
use crate::shape_file::{self, ShapeFile};

impl ModelConfig for CnnConfig {
    fn arch(&self) -> &'static str {
        "cnn"
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
            ("widths".into(), format!("{:?}", self.widths)),
            (
                "input".into(),
                format!("{}x{}x{}", self.channels, self.image_size, self.image_size),
            ),
        ]
    }

    /// `CNN, block widths [16, 32], input 1x28x28`.
    fn describe(&self) -> String {
        format!(
            "CNN, block widths {:?}, input {}x{}x{}",
            self.widths, self.channels, self.image_size, self.image_size
        )
    }

    /// `widths`: each block's channels.
    fn facts(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut m = serde_json::Map::new();
        m.insert("widths".into(), self.widths.clone().into());
        m
    }

    fn training_memory(&self, batch: usize, _size: usize) -> MemoryEstimate {
        MemoryEstimate::adamw_f32(self.parameters(), batch as u64 * self.activation_floats())
    }
}

impl Classifier for Cnn {
    type Batch = ImageBatch;

    fn logits(&self, batch: &ImageBatch) -> Tensor<2> {
        self.forward(batch.images.clone())
    }
}

/// Each block's output, in order.
impl FeatureMaps for Cnn {
    fn feature_shapes(c: &CnnConfig) -> Vec<[usize; 3]> {
        (0..c.widths.len())
            .map(|b| [c.widths[b], c.side(b + 1), c.side(b + 1)])
            .collect()
    }

    fn forward_maps(&self, batch: &ImageBatch) -> (Vec<Tensor<4>>, Tensor<2>) {
        self.forward_features(batch.images.clone())
    }
}

impl Checkpoint for Cnn {
    type Config = CnnConfig;

    fn init(config: &CnnConfig, device: &Device) -> Self {
        Cnn::new(config, device)
    }

    /// `model.bpk` (Burn's format, BatchNorm running statistics included) and `config.json`.
    fn save(&self, config: &CnnConfig, dir: &Path) -> Result<(), ModelFault> {
        Ok(shape_file::save(self, config, "cnn", dir)?)
    }

    fn load(dir: &Path, device: &Device) -> Result<(Self, CnnConfig), ModelFault> {
        let config = CnnConfig::from_file(&dir.join("config.json"))?;
        let mut model = Cnn::new(&config, device);
        load_burnpack(&mut model, &dir.join("model.bpk"))?;
        Ok((model, config))
    }

    /// Images of a smooth pattern, the config's size.
    fn bench_batch(
        c: &CnnConfig,
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

    /// Parameters, declared feature shapes, and a save/reload with trained BatchNorm statistics.
    #[test]
    fn shapes_parameters_and_a_reload() {
        let ad = Device::flex().autodiff();
        let c = CnnConfig::new(&[4, 6], 1, 9);
        let m = Cnn::new(&c, &ad);
        // 1·4·9 + 8 + 4·6·9 + 12 + 6·10 + 10
        assert_eq!(c.parameters(), 36 + 8 + 216 + 12 + 70);
        assert_eq!(
            m.num_params(),
            c.parameters() + 2 * (4 + 6),
            "Burn counts running stats"
        );
        let x = Tensor::<4>::random(
            [3, 1, 9, 9],
            burn::tensor::Distribution::Normal(0.0, 1.0),
            &ad,
        );
        let (maps, _) = m.forward_features(x.clone());
        let got: Vec<[usize; 3]> = maps
            .iter()
            .map(|t| {
                let [_, a, b, d] = t.dims();
                [a, b, d]
            })
            .collect();
        assert_eq!(got, Cnn::feature_shapes(&c));
        assert_eq!(got, vec![[4, 4, 4], [6, 2, 2]]);
        let m = m.valid();
        let dir = tempfile::tempdir().unwrap();
        m.save(&c, dir.path()).unwrap();
        let (back, bc) = Cnn::load(dir.path(), &Device::flex()).unwrap();
        assert_eq!(bc, c);
        let x = x.inner();
        assert_eq!(
            back.forward(x.clone()).into_data(),
            m.forward(x).into_data()
        );
    }
}
