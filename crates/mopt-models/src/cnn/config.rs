//! The plain CNN's shape: one width a block.

use serde::{Deserialize, Serialize};

use crate::shape_file::ShapeFile;

/// Blocks of conv 3×3 → BatchNorm → ReLU → max-pool 2×2, global average pooling, a classifier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CnnConfig {
    /// Input channels (1 for grey images).
    pub channels: usize,
    /// Input side in pixels.
    pub image_size: usize,
    /// Output channels of each block.
    pub widths: Vec<usize>,
    /// Classes (a recipe's `[model] config` may leave it out: the data's labels set it).
    #[serde(default)]
    pub num_labels: usize,
    /// Class names in label order (written by mopt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<Vec<String>>,
}

impl CnnConfig {
    /// Blocks of `widths` for `channels`-channel images of `image_size`, ten classes.
    pub fn new(widths: &[usize], channels: usize, image_size: usize) -> Self {
        Self {
            channels,
            image_size,
            widths: widths.to_vec(),
            num_labels: 10,
            labels: None,
        }
    }

    /// Image side after `b` blocks (each pooling halves it, rounding down).
    pub fn side(&self, b: usize) -> usize {
        self.image_size >> b
    }

    /// Input channels of block `b`.
    pub fn block_input(&self, b: usize) -> usize {
        if b == 0 {
            self.channels
        } else {
            self.widths[b - 1]
        }
    }

    /// Parameters: convolutions, BatchNorm scales and shifts, the classifier.
    pub fn parameters(&self) -> usize {
        let blocks: usize = (0..self.widths.len())
            .map(|b| self.block_input(b) * self.widths[b] * 9 + 2 * self.widths[b])
            .sum();
        let last = *self.widths.last().expect("validated");
        blocks + last * self.num_labels + self.num_labels
    }

    /// Forward multiply-adds × 2 of one image.
    pub fn forward_flops(&self) -> f64 {
        let convs: f64 = (0..self.widths.len())
            .map(|b| (2 * self.block_input(b) * self.widths[b] * 9 * self.side(b).pow(2)) as f64)
            .sum();
        convs + (2 * self.widths.last().expect("validated") * self.num_labels) as f64
    }

    /// f32 activations the backward pass keeps for one image (conv, BatchNorm and ReLU outputs).
    pub fn activation_floats(&self) -> u64 {
        (0..self.widths.len())
            .map(|b| 3 * self.widths[b] * self.side(b).pow(2))
            .sum::<usize>() as u64
    }
}

impl ShapeFile for CnnConfig {
    const KEYS: &'static str = "a CNN config: channels, image_size, widths";

    /// Positive widths, at least one block, and an image that survives every pooling.
    fn validate(&self) -> Result<(), String> {
        if self.channels == 0 || self.num_labels < 2 {
            return Err("channels must be positive, num_labels at least 2".into());
        }
        if self.widths.is_empty() || self.widths.contains(&0) {
            return Err(format!(
                "widths {:?}: at least one block, every width positive",
                self.widths
            ));
        }
        if self.side(self.widths.len()) == 0 {
            return Err(format!(
                "an image of {} pixels does not survive {} 2×2 poolings",
                self.image_size,
                self.widths.len()
            ));
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
