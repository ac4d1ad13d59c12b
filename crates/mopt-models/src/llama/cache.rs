//! The key/value cache of incremental decoding.
//!
//! Each layer keeps the keys (after RoPE) and values of every position seen so far; a forward
//! pass over new tokens computes only their rows and attends over the cached ones, so decoding
//! `n` tokens one at a time gives the logits of one pass over all of them.

use burn::prelude::*;

/// One layer's cached keys and values.
#[derive(Debug, Clone, Default)]
pub struct LayerCache {
    kv: Option<(Tensor<4>, Tensor<4>)>,
}

impl LayerCache {
    /// The cached keys and values, if any.
    ///
    /// # Shapes
    /// - output: (`[batch, kv_heads, len, head_dim]`, the same)
    pub fn get(&self) -> Option<(&Tensor<4>, &Tensor<4>)> {
        self.kv.as_ref().map(|(k, v)| (k, v))
    }

    /// Append new positions and return all of them (cached, then new).
    ///
    /// # Shapes
    /// - keys, values: `[batch, kv_heads, seq, head_dim]`
    /// - output: (`[batch, kv_heads, len + seq, head_dim]`, the same)
    ///
    /// # Panics
    /// When the batch, heads or head width differ from the cached ones.
    pub(crate) fn append(&mut self, keys: Tensor<4>, values: Tensor<4>) -> (Tensor<4>, Tensor<4>) {
        let (k, v) = match self.kv.take() {
            None => (keys, values),
            Some((ck, cv)) => {
                let ([b, h, _, d], [nb, nh, _, nd]) = (ck.dims(), keys.dims());
                assert_eq!(
                    (b, h, d),
                    (nb, nh, nd),
                    "KV cache holds [batch, kv_heads, _, head_dim] = {:?}, new keys are {:?}",
                    [b, h, d],
                    [nb, nh, nd]
                );
                (
                    Tensor::cat(vec![ck, keys], 2),
                    Tensor::cat(vec![cv, values], 2),
                )
            }
        };
        self.kv = Some((k.clone(), v.clone()));
        (k, v)
    }
}

/// Keys and values of every layer for the positions processed so far.
#[derive(Debug, Clone)]
pub struct KvCache {
    layers: Vec<LayerCache>,
    len: usize,
}

impl KvCache {
    /// An empty cache for a model of `num_layers` layers.
    pub fn new(num_layers: usize) -> Self {
        Self {
            layers: vec![LayerCache::default(); num_layers],
            len: 0,
        }
    }

    /// Positions cached (the position of the next token).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Layers it holds.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Layer `i`'s cache.
    pub fn layer(&self, i: usize) -> &LayerCache {
        &self.layers[i]
    }

    /// Forget everything (start a new sequence).
    pub fn clear(&mut self) {
        self.layers.iter_mut().for_each(|l| l.kv = None);
        self.len = 0;
    }

    pub(crate) fn layer_mut(&mut self, i: usize) -> &mut LayerCache {
        &mut self.layers[i]
    }

    /// Count `seq` more positions (after every layer appended them).
    pub(crate) fn advance(&mut self, seq: usize) {
        self.len += seq;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_concatenates_along_positions() {
        let device = Device::flex();
        let mut cache = KvCache::new(2);
        let a = Tensor::<4>::ones([1, 2, 3, 4], &device);
        let b = Tensor::<4>::zeros([1, 2, 1, 4], &device);
        let layer = cache.layer_mut(1);
        layer.append(a.clone(), a);
        let (k, _) = layer.append(b.clone(), b);
        assert_eq!(k.dims(), [1, 2, 4, 4]);
        let k: Vec<f32> = k.into_data().try_to_vec().unwrap();
        assert_eq!((k[0], k[12]), (1.0, 0.0));
        cache.advance(4);
        assert_eq!(cache.len(), 4);
        assert!(cache.layer(0).get().is_none());
        cache.clear();
        assert!(cache.is_empty() && cache.layer(1).get().is_none());
    }
}
