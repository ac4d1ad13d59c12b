//! Quantized export as QDQ: int8 weights with per-channel `DequantizeLinear`, activations through
//! per-tensor uint8 `QuantizeLinear`/`DequantizeLinear`, and a Rust reference that quantizes with
//! the same rounding (half to even) as ONNX.

use std::collections::HashMap;

use mopt_quant::fake::{fake_quant_value, quantize};
use mopt_quant::FakeQuant;

use burn::nn::Linear;
use mopt_quant::node::LinearQuant;

use crate::graph::{data, dims, int, GraphBuilder};
use crate::onnx::{dtype, value_info, Dim, ModelProto};

/// Quantized activations already in a graph: (tensor, scale bits, zero point) → its DQ output.
/// Layers reading the same tensor with the same parameters (Q, K and V; a convolution and the
/// residual `Add` beside it) share one `QuantizeLinear → DequantizeLinear`.
pub type QdqCache = HashMap<(String, u32, i32), String>;

/// `QuantizeLinear → DequantizeLinear` of `x` with the per-tensor quantizer `q`'s parameters;
/// nodes and initializers named `{prefix}_scale`, `{prefix}_zero_point`, `{prefix}_q`,
/// `{prefix}_dq`. Returns the dequantized tensor.
pub fn qdq_activation(
    g: &mut GraphBuilder,
    x: &str,
    q: &FakeQuant,
    prefix: &str,
    cache: &mut QdqCache,
) -> String {
    let p = q.qparams();
    let key = (x.to_string(), p.scale[0].to_bits(), p.zero_point[0]);
    if let Some(dq) = cache.get(&key) {
        return dq.clone();
    }
    let s = g.f32s(&format!("{prefix}_scale"), &[], &p.scale);
    let z = if q.qmin < 0 {
        g.i8s(
            &format!("{prefix}_zero_point"),
            &[],
            &[p.zero_point[0] as i8],
        )
    } else {
        g.u8s(
            &format!("{prefix}_zero_point"),
            &[],
            &[p.zero_point[0] as u8],
        )
    };
    let xq = g.op(
        "QuantizeLinear",
        &[x, &s, &z],
        vec![],
        &format!("{prefix}_q"),
    );
    let dq = g.op(
        "DequantizeLinear",
        &[&xq, &s, &z],
        vec![],
        &format!("{prefix}_dq"),
    );
    cache.insert(key, dq.clone());
    dq
}

/// A linear layer `x · W (+ b)` named `name` (Burn's weight `[in, out]`, which MatMul takes as
/// is). With quantizers `q` it is QDQ: the input through `QuantizeLinear → DequantizeLinear`
/// with its per-tensor scale and zero point (shared through `cache` by layers reading the same
/// tensor alike), the weight int8 with a per-output-channel `DequantizeLinear`, the bias
/// float, and the output through Q/DQ where the layer quantizes it. Returns the output.
pub fn linear(
    g: &mut GraphBuilder,
    x: &str,
    l: &Linear,
    q: &Option<LinearQuant>,
    name: &str,
    cache: &mut QdqCache,
) -> String {
    let (x, w) = match q {
        Some(q) => (
            qdq_activation(g, x, &q.input, &format!("{name}.input"), cache),
            dq_weight(g, name, &dims(&l.weight), &data(&l.weight), &q.weight),
        ),
        None => (
            x.to_string(),
            g.f32s(
                &format!("{name}.weight"),
                &dims(&l.weight),
                &data(&l.weight),
            ),
        ),
    };
    let y = g.op("MatMul", &[&x, &w], vec![], &format!("{name}.matmul"));
    let y = match &l.bias {
        Some(b) => {
            let b = g.f32s(&format!("{name}.bias"), &dims(b), &data(b));
            g.op("Add", &[&y, &b], vec![], &format!("{name}.add"))
        }
        None => y,
    };
    match q.as_ref().and_then(|q| q.output.as_ref()) {
        Some(o) => qdq_activation(g, &y, o, &format!("{name}.output"), cache),
        None => y,
    }
}

/// A weight of shape `dims` stored as int8 (quantized by `q`, per channel on its axis or per
/// tensor) with its `DequantizeLinear`; initializers `{name}.weight_quantized`,
/// `{name}.weight_scale`, `{name}.weight_zero_point`. Returns the dequantized weight.
pub fn dq_weight(
    g: &mut GraphBuilder,
    name: &str,
    dims: &[usize],
    values: &[f32],
    q: &FakeQuant,
) -> String {
    let p = q.qparams();
    let n = p.scale.len();
    let axis = q.axis.filter(|&a| n > 1 && dims[a] == n);
    let inner: usize = axis.map_or(1, |a| dims[a + 1..].iter().product());
    let w: Vec<i8> = values
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let c = if axis.is_some() { (i / inner) % n } else { 0 };
            quantize(v, p.scale[c], p.zero_point[c], q.qmin, q.qmax) as i8
        })
        .collect();
    let wq = g.i8s(&format!("{name}.weight_quantized"), dims, &w);
    let shape: &[usize] = if axis.is_some() { &[n] } else { &[] };
    let s = g.f32s(
        &format!("{name}.weight_scale"),
        shape,
        &p.scale[..shape.iter().product()],
    );
    let zp: Vec<i8> = p.zero_point.iter().map(|&z| z as i8).collect();
    let z = g.i8s(
        &format!("{name}.weight_zero_point"),
        shape,
        &zp[..shape.iter().product()],
    );
    let attrs = axis.map_or(vec![], |a| vec![int("axis", a as i64)]);
    g.op(
        "DequantizeLinear",
        &[&wq, &s, &z],
        attrs,
        &format!("{name}.weight_dq"),
    )
}

/// A bias stored as int32 at scale `input_scale · weight_scale[c]` (zero point 0) with its
/// `DequantizeLinear`, the form ONNX Runtime folds into `QLinearConv`; initializers
/// `{name}.bias_quantized`, `{name}.bias_scale`, `{name}.bias_zero_point`.
pub fn dq_bias(
    g: &mut GraphBuilder,
    name: &str,
    bias: &[f32],
    input: &FakeQuant,
    weight: &FakeQuant,
) -> String {
    let s_in = input.qparams().scale[0];
    let ws = weight.qparams().scale;
    let scales: Vec<f32> = (0..bias.len())
        .map(|c| s_in * ws[if ws.len() == 1 { 0 } else { c }])
        .collect();
    let bq: Vec<i32> = bias
        .iter()
        .zip(&scales)
        .map(|(b, s)| quantize(*b, *s, 0, i32::MIN, i32::MAX))
        .collect();
    let n = bias.len();
    let b = g.i32s(&format!("{name}.bias_quantized"), &[n], &bq);
    let s = g.f32s(&format!("{name}.bias_scale"), &[n], &scales);
    let z = g.i32s(&format!("{name}.bias_zero_point"), &[n], &vec![0; n]);
    g.op(
        "DequantizeLinear",
        &[&b, &s, &z],
        vec![int("axis", 0)],
        &format!("{name}.bias_dq"),
    )
}

/// One quantized linear layer: `y = x · dq(W) + b`, `W` int8 `[in, out]` with a scale per output.
#[derive(Debug, Clone)]
pub struct QuantLinear {
    /// Inputs.
    pub d_in: usize,
    /// Outputs.
    pub d_out: usize,
    /// int8 weights `[d_in, d_out]`.
    pub weight: Vec<i8>,
    /// A scale per output.
    pub weight_scale: Vec<f32>,
    /// Float bias (stored as int32 at the input·weight scale).
    pub bias: Vec<f32>,
}

/// Per-tensor uint8 activation quantization.
#[derive(Debug, Clone, Copy)]
pub struct ActQuant {
    /// Scale.
    pub scale: f32,
    /// Zero point.
    pub zero_point: u8,
}

/// An MLP in QDQ form, the layout ONNX Runtime turns into integer kernels:
/// `Q/DQ(x) → Gemm(DQ(W int8, per channel), DQ(b int32)) → Q/DQ → ReLU → Q/DQ → … → Gemm → Q/DQ → y`.
#[derive(Debug, Clone)]
pub struct QdqMlp {
    /// The layers, in order.
    pub layers: Vec<QuantLinear>,
    /// `layers.len() + 1` quantizers: the input, then each layer's output.
    pub acts: Vec<ActQuant>,
}

/// `dq(q(x))` with uint8 saturation: mopt-quant's ONNX-exact rounding (half to even).
pub fn fake_quant(x: f32, a: ActQuant) -> f32 {
    fake_quant_value(x, a.scale, a.zero_point as i32, 0, 255)
}

impl QuantLinear {
    /// Bias as int32 at scale `input_scale · weight_scale[o]` (zero point 0), as QDQ requires.
    pub fn bias_q(&self, input_scale: f32) -> Vec<i32> {
        self.bias
            .iter()
            .zip(&self.weight_scale)
            .map(|(b, ws)| quantize(*b, input_scale * ws, 0, i32::MIN, i32::MAX))
            .collect()
    }
}

impl QdqMlp {
    /// Rust reference forward pass (same quantization points and rounding), `x` `[batch, d_in]`.
    pub fn reference(&self, x: &[f32], batch: usize) -> Vec<f32> {
        let mut h: Vec<f32> = x.iter().map(|&v| fake_quant(v, self.acts[0])).collect();
        for (li, l) in self.layers.iter().enumerate() {
            let (a_in, a_out) = (self.acts[li], self.acts[li + 1]);
            let bq = l.bias_q(a_in.scale);
            let mut y = vec![0f32; batch * l.d_out];
            for b in 0..batch {
                for o in 0..l.d_out {
                    let mut acc = 0f32;
                    for i in 0..l.d_in {
                        acc += h[b * l.d_in + i]
                            * (l.weight[i * l.d_out + o] as f32 * l.weight_scale[o]);
                    }
                    let v =
                        fake_quant(acc + bq[o] as f32 * (a_in.scale * l.weight_scale[o]), a_out);
                    y[b * l.d_out + o] = if li + 1 < self.layers.len() {
                        fake_quant(v.max(0.0), a_out)
                    } else {
                        v
                    };
                }
            }
            h = y;
        }
        h
    }

    fn qdq(g: &mut GraphBuilder, x: &str, a: ActQuant, name: &str) -> String {
        let s = g.f32s(&format!("{name}.scale"), &[], &[a.scale]);
        let zp = g.u8s(&format!("{name}.zero_point"), &[], &[a.zero_point]);
        let q = g.op(
            "QuantizeLinear",
            &[x, &s, &zp],
            vec![],
            &format!("{name}_q"),
        );
        g.op(
            "DequantizeLinear",
            &[&q, &s, &zp],
            vec![],
            &format!("{name}_dq"),
        )
    }

    /// The QDQ ONNX model: input `x` `[batch, d_in]`, output `y` `[batch, d_out]`.
    pub fn export(&self) -> ModelProto {
        let mut g = GraphBuilder::default();
        let mut x = Self::qdq(&mut g, "x", self.acts[0], "act0");
        for (i, l) in self.layers.iter().enumerate() {
            let (a_in, a_out) = (self.acts[i], self.acts[i + 1]);
            let w = g.i8s(&format!("fc{i}.weight_q"), &[l.d_in, l.d_out], &l.weight);
            let ws = g.f32s(&format!("fc{i}.weight_scale"), &[l.d_out], &l.weight_scale);
            let wz = g.i8s(
                &format!("fc{i}.weight_zero_point"),
                &[l.d_out],
                &vec![0; l.d_out],
            );
            let wdq = g.op(
                "DequantizeLinear",
                &[&w, &ws, &wz],
                vec![int("axis", 1)],
                &format!("fc{i}_w"),
            );
            let b = g.i32s(&format!("fc{i}.bias_q"), &[l.d_out], &l.bias_q(a_in.scale));
            let bs: Vec<f32> = l.weight_scale.iter().map(|ws| a_in.scale * ws).collect();
            let bs = g.f32s(&format!("fc{i}.bias_scale"), &[l.d_out], &bs);
            let bz = g.i32s(
                &format!("fc{i}.bias_zero_point"),
                &[l.d_out],
                &vec![0; l.d_out],
            );
            let bdq = g.op(
                "DequantizeLinear",
                &[&b, &bs, &bz],
                vec![int("axis", 0)],
                &format!("fc{i}_b"),
            );
            let y = g.op("Gemm", &[&x, &wdq, &bdq], vec![], &format!("fc{i}_gemm"));
            let y = Self::qdq(&mut g, &y, a_out, &format!("act{}", i + 1));
            x = if i + 1 < self.layers.len() {
                let r = g.op("Relu", &[&y], vec![], &format!("relu{i}"));
                Self::qdq(&mut g, &r, a_out, &format!("act{}_relu", i + 1))
            } else {
                y
            };
        }
        g.op_into("Identity", &[&x], vec![], "y");
        let d_in = self.layers[0].d_in as i64;
        let d_out = self.layers.last().expect("layers").d_out as i64;
        let graph = g.finish(
            "mopt_qdq_mlp",
            vec![value_info(
                "x",
                dtype::FLOAT,
                &[Dim::Named("batch"), Dim::Fixed(d_in)],
            )],
            vec![value_info(
                "y",
                dtype::FLOAT,
                &[Dim::Named("batch"), Dim::Fixed(d_out)],
            )],
        );
        ModelProto::new(graph, "QDQ-quantized MLP exported by mopt", &[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_half_to_even_and_saturates() {
        let unit = ActQuant {
            scale: 1.0,
            zero_point: 128,
        };
        for (x, want) in [
            (0.5, 0.0),
            (1.5, 2.0),
            (2.5, 2.0),
            (-0.5, 0.0),
            (-1.5, -2.0),
            (1.4, 1.0),
        ] {
            assert_eq!(fake_quant(x, unit), want, "{x}");
        }
        let q = QuantLinear {
            d_in: 1,
            d_out: 1,
            weight: vec![1],
            weight_scale: vec![0.5],
            bias: vec![0.25],
        };
        // 0.25 / (0.5 · 0.5) = 1; 0.375 / 0.25 = 1.5 rounds to 2.
        assert_eq!(q.bias_q(0.5), vec![1]);
        assert_eq!(
            QuantLinear {
                bias: vec![0.375],
                ..q
            }
            .bias_q(0.5),
            vec![2]
        );
        let a = ActQuant {
            scale: 0.1,
            zero_point: 128,
        };
        assert!(
            (fake_quant(0.25, a) - 0.2).abs() < 1e-6,
            "0.25/0.1 = 2.5 -> 2"
        );
        assert!(
            (fake_quant(100.0, a) - 12.7).abs() < 1e-5,
            "saturates at 255"
        );
        assert!(
            (fake_quant(-100.0, a) + 12.8).abs() < 1e-5,
            "saturates at 0"
        );
    }
}
