//! Language-modelling data: fixed-length windows packed from a token stream, each predicting
//! its next token at every position (the rows a language model's
//! [`mopt_core::Classifier::logits`] return: `[batch × len, vocab]`).

use burn::prelude::*;
use mopt_core::{Examples, Labeled};

/// A batch of token windows on a device: the model reads `inputs`, and row `b·len + p` of its
/// logits predicts `targets[b·len + p]`, the token after position `p` of window `b`.
#[derive(Debug, Clone)]
pub struct TokenWindows {
    /// Token ids, `[batch, len]`.
    pub inputs: Tensor<2, Int>,
    /// The next token at every position, `[batch × len]` (row-major over `inputs`).
    pub targets: Tensor<1, Int>,
}

impl Labeled for TokenWindows {
    /// # Shapes
    /// - output: `[batch × len]`
    fn labels(&self) -> Tensor<1, Int> {
        self.targets.clone()
    }
}

/// Why a token stream cannot be packed into windows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    /// A window must hold at least one position.
    #[error("window length 0: a window predicts at least one token; set a length of at least 1")]
    ZeroLength,
    /// Windows must advance.
    #[error("stride 0: windows would repeat forever; set a stride of at least 1")]
    ZeroStride,
}

/// A split of fixed-length windows over one token stream: window `i` holds the `len + 1` ids
/// starting at `i · stride`; its batch row reads the first `len` and predicts the last `len`.
/// The last partial window (fewer than `len + 1` ids left) is dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowSplit {
    tokens: Vec<u32>,
    positions: usize,
    stride: usize,
    count: usize,
}

impl WindowSplit {
    /// Pack `ids` into windows of `len` positions (`len + 1` ids each), one every `stride` ids
    /// (`None`: `len`, so that windows share one id and every id after the first is a target
    /// exactly once). A stream shorter than `len + 1` ids gives an empty split.
    pub fn pack(ids: &[u32], len: usize, stride: Option<usize>) -> Result<Self, WindowError> {
        if len == 0 {
            return Err(WindowError::ZeroLength);
        }
        let stride = stride.unwrap_or(len);
        if stride == 0 {
            return Err(WindowError::ZeroStride);
        }
        let count = match ids.len().checked_sub(len + 1) {
            Some(rest) => rest / stride + 1,
            None => 0,
        };
        let used = if count == 0 {
            0
        } else {
            (count - 1) * stride + len + 1
        };
        Ok(Self {
            tokens: ids[..used].to_vec(),
            positions: len,
            stride,
            count,
        })
    }

    /// Positions a window predicts (its batch row's length).
    pub fn window_len(&self) -> usize {
        self.positions
    }

    /// Ids between the starts of consecutive windows.
    pub fn stride(&self) -> usize {
        self.stride
    }

    /// The `len + 1` ids of window `i`.
    ///
    /// # Panics
    /// When `i` is not below [`Examples::len`].
    pub fn window(&self, i: usize) -> &[u32] {
        assert!(i < self.count, "window {i} of {}", self.count);
        let start = i * self.stride;
        &self.tokens[start..start + self.positions + 1]
    }
}

impl Examples for WindowSplit {
    type Batch = TokenWindows;

    fn len(&self) -> usize {
        self.count
    }

    /// The window's first target (its second id).
    fn label(&self, i: usize) -> usize {
        self.window(i)[1] as usize
    }

    /// Every window has `len` positions.
    fn size(&self, _i: usize) -> usize {
        self.positions
    }

    /// # Shapes
    /// - output: inputs `[indices.len(), len]`, targets `[indices.len() × len]`
    fn batch(&self, indices: &[usize], device: &Device) -> TokenWindows {
        let (b, len) = (indices.len(), self.positions);
        let mut inputs = Vec::with_capacity(b * len);
        let mut targets = Vec::with_capacity(b * len);
        for &i in indices {
            let w = self.window(i);
            inputs.extend(w[..len].iter().map(|&t| t as i64));
            targets.extend(w[1..].iter().map(|&t| t as i64));
        }
        TokenWindows {
            inputs: Tensor::from_data(TensorData::new(inputs, [b, len]), device),
            targets: Tensor::from_data(TensorData::new(targets, [b * len]), device),
        }
    }

    /// The window's `len + 1` ids.
    fn record(&self, i: usize) -> serde_json::Value {
        serde_json::json!(self.window(i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints<const D: usize>(t: Tensor<D, Int>) -> Vec<i64> {
        t.into_data().convert::<i64>().try_to_vec().unwrap()
    }

    #[test]
    fn packs_overlapping_by_one_and_drops_the_partial_tail() {
        let ids: Vec<u32> = (10..20).collect(); // 10 ids
        let s = WindowSplit::pack(&ids, 3, None).unwrap();
        // Starts 0, 3, 6 (ids 10-13, 13-16, 16-19); a fourth would need ids up to index 12.
        assert_eq!(s.len(), 3);
        assert_eq!(s.window(0), &[10, 11, 12, 13]);
        assert_eq!(s.window(1), &[13, 14, 15, 16]);
        assert_eq!(s.window(2), &[16, 17, 18, 19]);
        assert_eq!((s.label(1), s.size(0), s.size(2)), (14, 3, 3));
        assert_eq!(s.record(2), serde_json::json!([16, 17, 18, 19]));
        // 9 ids: the third window would end past the stream.
        assert_eq!(WindowSplit::pack(&ids[..9], 3, None).unwrap().len(), 2);
    }

    #[test]
    fn strides_and_short_streams() {
        let ids: Vec<u32> = (0..8).collect();
        let s = WindowSplit::pack(&ids, 2, Some(1)).unwrap();
        assert_eq!(s.len(), 6);
        assert_eq!(s.window(5), &[5, 6, 7]);
        let s = WindowSplit::pack(&ids, 2, Some(5)).unwrap();
        assert_eq!((s.len(), s.window(1)), (2, &[5u32, 6, 7][..]));
        let short = WindowSplit::pack(&ids[..2], 2, None).unwrap();
        assert!(short.is_empty());
        assert_eq!(
            WindowSplit::pack(&ids, 0, None),
            Err(WindowError::ZeroLength)
        );
        assert_eq!(
            WindowSplit::pack(&ids, 2, Some(0)),
            Err(WindowError::ZeroStride)
        );
    }

    #[test]
    fn batches_shift_targets_by_one_in_index_order() {
        let ids: Vec<u32> = vec![5, 1, 4, 1, 5, 9, 2, 6, 5];
        let s = WindowSplit::pack(&ids, 4, None).unwrap();
        assert_eq!(s.len(), 2);
        let b = s.batch(&[1, 0], &Device::flex());
        assert_eq!(b.inputs.dims(), [2, 4]);
        assert_eq!(ints(b.inputs.clone()), vec![5, 9, 2, 6, 5, 1, 4, 1]);
        assert_eq!(ints(b.labels()), vec![9, 2, 6, 5, 1, 4, 1, 5]);
    }
}
