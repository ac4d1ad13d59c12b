//! The plain implementations: Burn's own ops, composed as before the fused kernels. They run on
//! every backend and dtype, and the tests hold the fused kernels to them.

use burn::prelude::*;

/// GELU (erf form), Burn's.
pub fn gelu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    burn::tensor::activation::gelu(x)
}

/// GELU's tanh approximation, Burn's.
pub fn gelu_tanh<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    burn::tensor::activation::gelu_approximate(x)
}

/// Softmax along `dim`, Burn's.
pub fn softmax<const D: usize>(x: Tensor<D>, dim: usize) -> Tensor<D> {
    burn::tensor::activation::softmax(x, dim)
}

/// `softmax(scale·x + bias, 3)`, Burn's ops (`bias` broadcast over heads and rows).
pub fn softmax_biased(x: Tensor<4>, bias: Tensor<4>, scale: f32) -> Tensor<4> {
    softmax(x.mul_scalar(scale) + bias, 3)
}

/// LayerNorm over the last axis, Burn's.
pub fn layer_norm<const D: usize>(
    x: Tensor<D>,
    gamma: Tensor<1>,
    beta: Tensor<1>,
    eps: f64,
) -> Tensor<D> {
    burn::tensor::module::layer_norm(x, gamma, Some(beta), eps)
}

/// Embedding lookup: `[batch, seq]` ids into `[batch, seq, width]` rows of `table`.
pub fn embedding(table: Tensor<2>, ids: Tensor<2, Int>) -> Tensor<3> {
    burn::tensor::module::embedding(table, ids)
}

/// `x · w + b` with Burn's matmul.
pub fn linear(x: Tensor<2>, w: Tensor<2>, b: Tensor<1>) -> Tensor<2> {
    x.matmul(w) + b.unsqueeze()
}

/// Burn's convolution (no bias, symmetric padding, groups 1).
pub fn conv2d(x: Tensor<4>, w: Tensor<4>, stride: usize, pad: usize) -> Tensor<4> {
    burn::tensor::module::conv2d(
        x,
        w,
        None,
        burn::tensor::ops::ConvOptions::new([stride, stride], [pad, pad], [1, 1], 1),
    )
}

/// Dropout with probability `prob`, Burn's (identity outside autodiff).
pub fn dropout<const D: usize>(x: Tensor<D>, prob: f64) -> Tensor<D> {
    burn::nn::DropoutConfig::new(prob).init().forward(x)
}

/// The attention core composed of Burn ops (head split, QKᵀ/√d + mask, softmax, dropout, ·V,
/// merge); dropout through [`crate::dropout_seeded`] when a seed is given.
pub fn attention(
    q: Tensor<3>,
    k: Tensor<3>,
    v: Tensor<3>,
    mask_bias: Tensor<2>,
    heads: usize,
    dropout: f64,
    seed: Option<u64>,
) -> Tensor<3> {
    let [b, s, w] = q.dims();
    let d = w / heads;
    let split = |t: Tensor<3>| t.reshape([b, s, heads, d]).swap_dims(1, 2);
    let scores = split(q)
        .matmul(split(k).swap_dims(2, 3))
        .div_scalar((d as f32).sqrt());
    let probs = softmax(scores + mask_bias.reshape([b, 1, 1, s]), 3);
    let probs = match seed {
        Some(seed) if dropout > 0.0 => crate::dropout_seeded(probs, dropout, seed),
        _ => probs,
    };
    probs.matmul(split(v)).swap_dims(1, 2).reshape([b, s, w])
}
