//! CNN / MLP → ONNX for the image models: Conv with BatchNorm folded in, ReLU, pooling, Gemm.
//!
//! Folding: for output channel `c`, `s = γ_c / √(σ²_c + ε)`, `W'_c = s·W_c`,
//! `b'_c = s·(b_c − μ_c) + β_c` (inference statistics), so the exported graph has no
//! BatchNormalization nodes.

use burn::nn::conv::Conv2d;
use burn::nn::pool::MaxPool2d;
use burn::nn::{BatchNorm, Linear, PaddingConfig2d};
use burn::prelude::*;

use crate::graph::{data, dims};
use crate::graph::{int, ints, GraphBuilder};
use crate::onnx::{dtype, value_info, Dim, ModelProto, ValueInfoProto};

/// One stage of an image model, in order.
pub enum CnnLayer<'a> {
    /// A convolution, optionally followed by a BatchNorm that is folded into it.
    Conv {
        /// The convolution.
        conv: &'a Conv2d,
        /// Its BatchNorm, folded into it.
        bn: Option<&'a BatchNorm>,
    },
    /// ReLU.
    Relu,
    /// Max pooling.
    MaxPool(&'a MaxPool2d),
    /// Average over the whole spatial extent (`AdaptiveAvgPool2d` to 1×1).
    GlobalAvgPool,
    /// `[batch, c, h, w]` → `[batch, c·h·w]`.
    Flatten,
    /// A fully connected layer (`Gemm`).
    Linear(&'a Linear),
}

fn pads(p: &PaddingConfig2d, kernel: [usize; 2], stride: [usize; 2]) -> Vec<i64> {
    match p {
        PaddingConfig2d::Valid => vec![0; 4],
        PaddingConfig2d::Explicit(t, l, b, r) => vec![*t as i64, *l as i64, *b as i64, *r as i64],
        PaddingConfig2d::Same => {
            assert!(
                stride == [1, 1] && kernel[0] % 2 == 1 && kernel[1] % 2 == 1,
                "`Same` padding exports for stride 1 and odd kernels"
            );
            let (ph, pw) = ((kernel[0] / 2) as i64, (kernel[1] / 2) as i64);
            vec![ph, pw, ph, pw]
        }
    }
}

/// Folded conv weights `[out, in/groups, kh, kw]` and bias `[out]`.
pub fn fold_batch_norm(conv: &Conv2d, bn: Option<&BatchNorm>) -> (Vec<f32>, Vec<f32>) {
    let mut w = data(&conv.weight);
    let out = dims(&conv.weight)[0];
    let mut b = conv
        .bias
        .as_ref()
        .map(data)
        .unwrap_or_else(|| vec![0.0; out]);
    if let Some(bn) = bn {
        let v = |t: Tensor<1>| -> Vec<f32> {
            t.into_data().convert::<f32>().try_to_vec().expect("f32")
        };
        let (gamma, beta) = (data(&bn.gamma), data(&bn.beta));
        let (mean, var) = (v(bn.running_mean.value()), v(bn.running_var.value()));
        let per = w.len() / out;
        for c in 0..out {
            let s = gamma[c] / (var[c] + bn.epsilon as f32).sqrt();
            w[c * per..(c + 1) * per].iter_mut().for_each(|x| *x *= s);
            b[c] = s * (b[c] - mean[c]) + beta[c];
        }
    }
    (w, b)
}

/// Export `layers` for inputs `[batch, channels, height, width]` (input `image`, output `logits`).
pub fn export_cnn(
    layers: &[CnnLayer],
    channels: usize,
    height: usize,
    width: usize,
    outputs: usize,
) -> ModelProto {
    let mut g = GraphBuilder::default();
    let mut x = "image".to_string();
    for (i, layer) in layers.iter().enumerate() {
        x = match layer {
            CnnLayer::Conv { conv, bn } => {
                let (w, b) = fold_batch_norm(conv, *bn);
                let wd = dims(&conv.weight);
                let w = g.f32s(&format!("conv{i}.weight"), &wd, &w);
                let b = g.f32s(&format!("conv{i}.bias"), &[wd[0]], &b);
                let attrs = vec![
                    ints(
                        "kernel_shape",
                        &[conv.kernel_size[0] as i64, conv.kernel_size[1] as i64],
                    ),
                    ints("strides", &[conv.stride[0] as i64, conv.stride[1] as i64]),
                    ints(
                        "dilations",
                        &[conv.dilation[0] as i64, conv.dilation[1] as i64],
                    ),
                    ints("pads", &pads(&conv.padding, conv.kernel_size, conv.stride)),
                    int("group", conv.groups as i64),
                ];
                g.op("Conv", &[&x, &w, &b], attrs, &format!("conv{i}"))
            }
            CnnLayer::Relu => g.op("Relu", &[&x], vec![], &format!("relu{i}")),
            CnnLayer::MaxPool(p) => {
                let attrs = vec![
                    ints(
                        "kernel_shape",
                        &[p.kernel_size[0] as i64, p.kernel_size[1] as i64],
                    ),
                    ints("strides", &[p.stride[0] as i64, p.stride[1] as i64]),
                    ints("dilations", &[p.dilation[0] as i64, p.dilation[1] as i64]),
                    ints("pads", &pads(&p.padding, p.kernel_size, p.stride)),
                    int("ceil_mode", i64::from(p.ceil_mode)),
                ];
                g.op("MaxPool", &[&x], attrs, &format!("maxpool{i}"))
            }
            CnnLayer::GlobalAvgPool => g.op("GlobalAveragePool", &[&x], vec![], &format!("gap{i}")),
            CnnLayer::Flatten => g.op(
                "Flatten",
                &[&x],
                vec![int("axis", 1)],
                &format!("flatten{i}"),
            ),
            CnnLayer::Linear(l) => {
                let w = g.f32s(&format!("fc{i}.weight"), &dims(&l.weight), &data(&l.weight));
                let mut inputs = vec![x.clone(), w];
                if let Some(b) = &l.bias {
                    inputs.push(g.f32s(&format!("fc{i}.bias"), &dims(b), &data(b)));
                }
                let refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
                g.op("Gemm", &refs, vec![], &format!("fc{i}"))
            }
        };
    }
    g.op_into("Identity", &[&x], vec![], "logits");
    let (inputs, outputs) = image_io(channels, (height, width), outputs);
    let graph = g.finish("mopt_cnn", inputs, outputs);
    ModelProto::new(graph, "image classifier exported by mopt", &[])
}

/// An image classifier's graph input `image` `[batch, channels, height, width]` and output
/// `logits` `[batch, outputs]`.
pub fn image_io(
    channels: usize,
    (height, width): (usize, usize),
    outputs: usize,
) -> (Vec<ValueInfoProto>, Vec<ValueInfoProto>) {
    let image = value_info(
        "image",
        dtype::FLOAT,
        &[
            Dim::Named("batch"),
            Dim::Fixed(channels as i64),
            Dim::Fixed(height as i64),
            Dim::Fixed(width as i64),
        ],
    );
    let logits = value_info(
        "logits",
        dtype::FLOAT,
        &[Dim::Named("batch"), Dim::Fixed(outputs as i64)],
    );
    (vec![image], vec![logits])
}
