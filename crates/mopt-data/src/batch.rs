//! Dynamically padded batches and seeded epoch order.

use burn::prelude::*;

use crate::rng::SplitMix64;
use crate::tokenize::Encoded;

/// A padded batch on a device.
#[derive(Debug, Clone)]
pub struct TextBatch {
    /// `[batch, seq]`
    pub input_ids: Tensor<2, Int>,
    /// `[batch, seq]`, 1.0 for tokens and 0.0 for padding.
    pub attention_mask: Tensor<2>,
    /// `[batch, seq]`, all zeros (single-sentence tasks).
    pub token_type_ids: Tensor<2, Int>,
    /// `[batch]`
    pub labels: Tensor<1, Int>,
}

/// Builds batches padded to the longest sequence in each batch.
#[derive(Debug, Clone)]
pub struct Batcher {
    /// Token id of padding.
    pub pad_id: u32,
}

impl Batcher {
    /// A batcher padding with `pad_id`.
    pub fn new(pad_id: u32) -> Self {
        Self { pad_id }
    }

    /// Pad `items` (right padding) and move them to `device`.
    pub fn batch(&self, items: &[&Encoded], device: &Device) -> TextBatch {
        let b = items.len();
        let seq = items.iter().map(|e| e.ids.len()).max().unwrap_or(1).max(1);
        let mut ids = vec![self.pad_id as i64; b * seq];
        let mut mask = vec![0f32; b * seq];
        for (r, e) in items.iter().enumerate() {
            for (c, &id) in e.ids.iter().enumerate() {
                ids[r * seq + c] = id as i64;
                mask[r * seq + c] = 1.0;
            }
        }
        let labels: Vec<i64> = items.iter().map(|e| e.label as i64).collect();
        TextBatch {
            input_ids: Tensor::from_data(TensorData::new(ids, [b, seq]), device),
            attention_mask: Tensor::from_data(TensorData::new(mask, [b, seq]), device),
            token_type_ids: Tensor::zeros([b, seq], device),
            labels: Tensor::from_data(TensorData::new(labels, [b]), device),
        }
    }
}

/// Index order of one epoch: a SplitMix64 shuffle seeded by `seed` and `epoch`.
pub fn epoch_order(n: usize, seed: u64, epoch: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    SplitMix64::new(seed ^ (epoch as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).shuffle(&mut order);
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pads_to_longest_and_masks() {
        let d = Device::flex();
        let a = Encoded {
            ids: vec![101, 5, 102],
            label: 1,
        };
        let b = Encoded {
            ids: vec![101, 102],
            label: 0,
        };
        let batch = Batcher::new(0).batch(&[&a, &b], &d);
        assert_eq!(batch.input_ids.dims(), [2, 3]);
        let ids: Vec<i64> = batch
            .input_ids
            .into_data()
            .convert::<i64>()
            .try_to_vec()
            .unwrap();
        assert_eq!(ids, vec![101, 5, 102, 101, 102, 0]);
        let mask: Vec<f32> = batch.attention_mask.into_data().try_to_vec().unwrap();
        assert_eq!(mask, vec![1., 1., 1., 1., 1., 0.]);
    }

    #[test]
    fn epoch_order_is_seeded_and_varies_by_epoch() {
        assert_eq!(epoch_order(50, 1, 0), epoch_order(50, 1, 0));
        assert_ne!(epoch_order(50, 1, 0), epoch_order(50, 1, 1));
    }
}
