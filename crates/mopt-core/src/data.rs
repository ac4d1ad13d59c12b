//! Data the algorithms read: a split of examples that batches itself.

use burn::prelude::*;

/// A batch that carries its labels.
pub trait Labeled {
    /// The class index of every row of the model's logits (a classifier's: one an example;
    /// a language model's: the next token at every position).
    ///
    /// # Shapes
    /// - output: `[rows]` (`[batch]` for a classifier)
    fn labels(&self) -> Tensor<1, Int>;
}

/// One split of a data set (train, validation, test, a golden subset): examples by index, each
/// with a label, batched on a device. The trainer draws its own order of indices; evaluation
/// groups examples of similar [`size`](Examples::size) to pad less.
pub trait Examples: Sync {
    /// What the model's forward pass reads.
    type Batch: Labeled + Clone + Send + 'static;

    /// Number of examples.
    fn len(&self) -> usize;

    /// Whether the split has no examples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The class index of example `i`.
    fn label(&self, i: usize) -> usize;

    /// A cost key of example `i` (a text's token count); evaluation batches examples sorted by
    /// it. Examples of one shape return the same value (the default).
    fn size(&self, _i: usize) -> usize {
        0
    }

    /// The examples at `indices`, in that order, as one batch on `device`.
    fn batch(&self, indices: &[usize], device: &Device) -> Self::Batch;

    /// Example `i` as the golden reference records it (a text's token ids).
    fn record(&self, i: usize) -> serde_json::Value;
}

/// A borrowed split is a split (a run hands the algorithms `&dyn Examples<Batch = …>`).
impl<E: Examples + ?Sized> Examples for &E {
    type Batch = E::Batch;

    fn len(&self) -> usize {
        (**self).len()
    }

    fn label(&self, i: usize) -> usize {
        (**self).label(i)
    }

    fn size(&self, i: usize) -> usize {
        (**self).size(i)
    }

    fn batch(&self, indices: &[usize], device: &Device) -> Self::Batch {
        (**self).batch(indices, device)
    }

    fn record(&self, i: usize) -> serde_json::Value {
        (**self).record(i)
    }
}
