//! Tokenized text as the algorithms' [`Examples`]: right-padded batches of token ids.

use burn::prelude::*;
use mopt_core::{Examples, Labeled};

use crate::batch::{Batcher, TextBatch};
use crate::tokenize::Encoded;

impl Labeled for TextBatch {
    fn labels(&self) -> Tensor<1, Int> {
        self.labels.clone()
    }
}

/// A split of tokenized examples, batched padded to each batch's longest sequence.
#[derive(Debug, Clone, Copy)]
pub struct TextExamples<'a> {
    /// The encoded examples.
    pub examples: &'a [Encoded],
    /// Token id of padding.
    pub pad_id: u32,
}

impl<'a> TextExamples<'a> {
    /// `examples`, padded with `pad_id` when batched.
    pub fn new(examples: &'a [Encoded], pad_id: u32) -> Self {
        Self { examples, pad_id }
    }
}

impl Examples for TextExamples<'_> {
    type Batch = TextBatch;

    fn len(&self) -> usize {
        self.examples.len()
    }

    fn label(&self, i: usize) -> usize {
        self.examples[i].label
    }

    /// The token count: evaluation batches sentences of similar length together.
    fn size(&self, i: usize) -> usize {
        self.examples[i].ids.len()
    }

    fn batch(&self, indices: &[usize], device: &Device) -> TextBatch {
        let items: Vec<&Encoded> = indices.iter().map(|&i| &self.examples[i]).collect();
        Batcher::new(self.pad_id).batch(&items, device)
    }

    fn record(&self, i: usize) -> serde_json::Value {
        serde_json::json!(self.examples[i].ids)
    }
}

/// A split of tokenized examples, owned (what a run holds); batches like [`TextExamples`].
#[derive(Debug, Clone)]
pub struct TextSplit {
    /// The encoded examples.
    pub examples: Vec<Encoded>,
    /// Token id of padding.
    pub pad_id: u32,
}

impl TextSplit {
    /// The borrowed view.
    pub fn view(&self) -> TextExamples<'_> {
        TextExamples::new(&self.examples, self.pad_id)
    }
}

impl Examples for TextSplit {
    type Batch = TextBatch;

    fn len(&self) -> usize {
        self.view().len()
    }

    fn label(&self, i: usize) -> usize {
        self.view().label(i)
    }

    fn size(&self, i: usize) -> usize {
        self.view().size(i)
    }

    fn batch(&self, indices: &[usize], device: &Device) -> TextBatch {
        self.view().batch(indices, device)
    }

    fn record(&self, i: usize) -> serde_json::Value {
        self.view().record(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_follow_the_indices_and_report_sizes() {
        let ex = vec![
            Encoded {
                ids: vec![101, 7, 8, 102],
                label: 1,
            },
            Encoded {
                ids: vec![101, 102],
                label: 0,
            },
        ];
        let t = TextExamples::new(&ex, 0);
        assert_eq!((t.len(), t.size(0), t.size(1), t.label(0)), (2, 4, 2, 1));
        let b = t.batch(&[1, 0], &Device::flex());
        let labels: Vec<i64> = b
            .labels()
            .into_data()
            .convert::<i64>()
            .try_to_vec()
            .unwrap();
        assert_eq!(labels, vec![0, 1]);
        assert_eq!(b.input_ids.dims(), [2, 4]);
        assert_eq!(t.record(1), serde_json::json!([101, 102]));
    }
}
