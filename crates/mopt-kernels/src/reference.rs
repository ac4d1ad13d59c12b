//! The plain implementations: Burn's own ops, composed as before the fused kernels. They run on
//! every backend and dtype, and the tests hold the fused kernels to them.

use burn::prelude::*;

pub fn gelu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    burn::tensor::activation::gelu(x)
}

pub fn softmax<const D: usize>(x: Tensor<D>, dim: usize) -> Tensor<D> {
    burn::tensor::activation::softmax(x, dim)
}

pub fn layer_norm<const D: usize>(
    x: Tensor<D>,
    gamma: Tensor<1>,
    beta: Tensor<1>,
    eps: f64,
) -> Tensor<D> {
    burn::tensor::module::layer_norm(x, gamma, Some(beta), eps)
}

pub fn embedding(table: Tensor<2>, ids: Tensor<2, Int>) -> Tensor<3> {
    burn::tensor::module::embedding(table, ids)
}

pub fn linear(x: Tensor<2>, w: Tensor<2>, b: Tensor<1>) -> Tensor<2> {
    x.matmul(w) + b.unsqueeze()
}

pub fn dropout<const D: usize>(x: Tensor<D>, prob: f64) -> Tensor<D> {
    burn::nn::DropoutConfig::new(prob).init().forward(x)
}
