//! The kernels on Burn Flex tensors (f32, any layout: non-contiguous inputs are copied once).

use burn::backend::flex::FlexTensor;
use burn::backend::TensorMetadata;
use burn::tensor::{DType, Shape, TensorData};

use crate::cpu::{self, GeluKind};
use crate::gemm::View;

pub(crate) fn contiguous(t: FlexTensor) -> FlexTensor {
    if t.as_slice::<f32>().is_some() {
        t
    } else {
        t.to_contiguous()
    }
}

fn make(data: Vec<f32>, shape: Shape) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(data, shape))
}

fn f32s(t: &FlexTensor) -> &[f32] {
    t.as_slice::<f32>().expect("contiguous f32 tensor")
}

/// `x`'s values, writable, when `x` (contiguous) is uniquely owned and fills its buffer.
fn owned_values(x: &mut FlexTensor) -> Option<&mut [f32]> {
    let n = x.shape().num_elements();
    if x.layout().start_offset() != 0 {
        return None;
    }
    x.try_storage_mut::<f32>().filter(|s| s.len() == n)
}

/// Run `f` on `g`'s values in place when `g` is uniquely owned and contiguous, on a copy
/// otherwise.
fn in_place(g: FlexTensor, f: impl FnOnce(&mut [f32])) -> FlexTensor {
    let mut g = contiguous(g);
    if let Some(s) = owned_values(&mut g) {
        f(s);
        return g;
    }
    let mut v = f32s(&g).to_vec();
    f(&mut v);
    make(v, g.shape())
}

/// A map over `x`'s values: `in_place` on them when `x` is uniquely owned and contiguous (an
/// inference pass's intermediate: no output to allocate and zero), else `fresh(values, out)`
/// into a new buffer (under autodiff the input is kept for the backward pass).
fn in_place_or(
    x: FlexTensor,
    in_place: impl FnOnce(&mut [f32]),
    fresh: impl FnOnce(&[f32], &mut [f32]),
) -> FlexTensor {
    let mut x = contiguous(x);
    if let Some(s) = owned_values(&mut x) {
        in_place(s);
        return x;
    }
    let shape = x.shape();
    let mut out = cpu::zeros(shape.num_elements());
    fresh(f32s(&x), &mut out);
    make(out, shape)
}

/// The values of `t` as one contiguous slice (borrowed when possible).
pub fn f32s_contiguous(t: &FlexTensor) -> std::borrow::Cow<'_, [f32]> {
    match t.as_slice::<f32>() {
        Some(s) => std::borrow::Cow::Borrowed(s),
        None => std::borrow::Cow::Owned(f32s(&t.to_contiguous()).to_vec()),
    }
}

pub fn scale(x: FlexTensor, factor: f32) -> FlexTensor {
    in_place(x, |v| cpu::scale(v, factor))
}

fn last_dim(t: &FlexTensor) -> usize {
    let s = t.shape();
    s[s.num_dims() - 1]
}

pub fn gelu(x: FlexTensor, kind: GeluKind) -> FlexTensor {
    in_place_or(
        x,
        |v| cpu::gelu_in_place(v, kind),
        |x, o| cpu::gelu(x, o, kind),
    )
}

pub fn gelu_backward(x: &FlexTensor, g: FlexTensor, kind: GeluKind) -> FlexTensor {
    let x = contiguous(x.clone());
    in_place(g, |g| cpu::gelu_backward(f32s(&x), g, kind))
}

pub fn softmax(x: FlexTensor) -> FlexTensor {
    let n = last_dim(&x);
    in_place_or(
        x,
        |v| cpu::softmax_in_place(v, n),
        |x, o| cpu::softmax(x, o, n),
    )
}

pub fn softmax_backward(y: &FlexTensor, g: FlexTensor) -> FlexTensor {
    let y = contiguous(y.clone());
    let n = last_dim(&y);
    in_place(g, |g| cpu::softmax_backward(f32s(&y), g, n))
}

/// `softmax(scale·x + bias)` over the last dimension, `bias` `[batch, 1, 1, n]` for `x`
/// `[batch, heads, rows, n]` ([`cpu::softmax_biased`]).
pub fn softmax_biased(x: FlexTensor, bias: &FlexTensor, scale: f32) -> FlexTensor {
    let bias = contiguous(bias.clone());
    let (n, b) = (last_dim(&x), f32s(&bias));
    let shape = x.shape();
    // Rows of x per bias row (heads · rows for an attention mask).
    let bias = (b, (shape.num_elements() / b.len().max(1)).max(1));
    in_place_or(
        x,
        |v| cpu::softmax_biased(None, v, bias, scale, n),
        |x, o| cpu::softmax_biased(Some(x), o, bias, scale, n),
    )
}

/// (dx) of [`softmax_biased`] from its output `y`.
pub fn softmax_biased_backward(y: &FlexTensor, g: FlexTensor, scale: f32) -> FlexTensor {
    let y = contiguous(y.clone());
    let n = last_dim(&y);
    in_place(g, |g| cpu::softmax_backward_scaled(f32s(&y), g, n, scale))
}

pub fn layer_norm(x: FlexTensor, gamma: &FlexTensor, beta: &FlexTensor, eps: f64) -> FlexTensor {
    let (gamma, beta) = (contiguous(gamma.clone()), contiguous(beta.clone()));
    let (g, b, eps) = (f32s(&gamma), f32s(&beta), eps as f32);
    in_place_or(
        x,
        |v| cpu::layer_norm_in_place(v, g, b, eps),
        |x, o| cpu::layer_norm(x, g, b, eps, o),
    )
}

/// `layer_norm(x + r)` in one pass ([`cpu::add_layer_norm`]), in place when `x` is unshared.
pub fn add_layer_norm(
    x: FlexTensor,
    r: &FlexTensor,
    (gamma, beta): (&FlexTensor, &FlexTensor),
    eps: f64,
) -> FlexTensor {
    let (r, gamma, beta) = (
        contiguous(r.clone()),
        contiguous(gamma.clone()),
        contiguous(beta.clone()),
    );
    let (r, gb, eps) = (f32s(&r), (f32s(&gamma), f32s(&beta)), eps as f32);
    in_place_or(
        x,
        |v| cpu::add_layer_norm(None, v, r, gb, eps),
        |x, o| cpu::add_layer_norm(Some(x), o, r, gb, eps),
    )
}

/// (dx, dgamma, dbeta)
pub fn layer_norm_backward(
    x: &FlexTensor,
    gamma: &FlexTensor,
    g: FlexTensor,
    eps: f64,
) -> (FlexTensor, FlexTensor, FlexTensor) {
    let (x, gamma) = (contiguous(x.clone()), contiguous(gamma.clone()));
    let mut sums = (Vec::new(), Vec::new());
    let dx = in_place(g, |g| {
        sums = cpu::layer_norm_backward(f32s(&x), f32s(&gamma), g, eps as f32)
    });
    let n = gamma.shape();
    (dx, make(sums.0, n.clone()), make(sums.1, n))
}

/// Token ids as indices (any integer dtype Flex stores).
pub fn indices(ids: &FlexTensor) -> Vec<usize> {
    let ids = if ids.layout().is_contiguous() && ids.layout().start_offset() == 0 {
        ids.clone()
    } else {
        ids.to_contiguous()
    };
    match ids.dtype() {
        DType::I64 => ids.storage::<i64>().iter().map(|&i| i as usize).collect(),
        DType::I32 => ids.storage::<i32>().iter().map(|&i| i as usize).collect(),
        DType::U32 => ids.storage::<u32>().iter().map(|&i| i as usize).collect(),
        DType::U64 => ids.storage::<u64>().iter().map(|&i| i as usize).collect(),
        other => panic!("embedding ids of dtype {other:?} are not supported"),
    }
}

/// `[batch, seq]` ids into `[batch, seq, hidden]` rows of `table`.
pub fn embedding(table: &FlexTensor, ids: &[usize], batch: usize, seq: usize) -> FlexTensor {
    let table = contiguous(table.clone());
    let [vocab, n] = table.shape().dims();
    if let Some(&bad) = ids.iter().find(|&&i| i >= vocab) {
        panic!("token id {bad} is outside the embedding table of {vocab} rows");
    }
    let mut out = vec![0.0f32; ids.len() * n];
    cpu::embedding(f32s(&table), ids, n, &mut out);
    make(out, Shape::from(vec![batch, seq, n]))
}

pub fn embedding_backward(ids: &[usize], g: FlexTensor, vocab: usize) -> FlexTensor {
    let g = contiguous(g);
    let n = last_dim(&g);
    make(
        cpu::embedding_backward(ids, f32s(&g), vocab, n),
        Shape::from(vec![vocab, n]),
    )
}

/// `x · w + b`, x: `[m, k]`, w: `[k, n]`, b: `[n]` (the product on bf16-rounded operands with
/// `bf16`).
pub fn linear(x: FlexTensor, w: &FlexTensor, b: &FlexTensor, bf16: bool) -> FlexTensor {
    let (x, w, b) = (contiguous(x), contiguous(w.clone()), contiguous(b.clone()));
    let [m, k] = x.shape().dims();
    let n = w.shape()[1];
    make(
        cpu::linear(f32s(&x), f32s(&w), f32s(&b), (m, k, n), bf16),
        Shape::from(vec![m, n]),
    )
}

/// `a · b` for a `[1, k]` `a` and a `[k, n]` `b` read in place where its rows or its columns
/// are contiguous (a linear layer's weight, a transposed embedding), on [`crate::gemv`];
/// `None` for any other layout of `b`.
pub fn matvec(a: FlexTensor, b: &FlexTensor) -> Option<FlexTensor> {
    let [k, n] = b.shape().dims();
    let strides = b.layout().strides();
    if a.shape().dims::<2>() != [1, k] || strides.iter().any(|&s| s < 0) {
        return None;
    }
    let bv = View {
        data: b.storage::<f32>(),
        offset: b.layout().start_offset(),
        rows: k,
        cols: n,
        rs: strides[0] as usize,
        cs: strides[1] as usize,
    };
    let a = contiguous(a);
    let av = View::row_major(f32s(&a), 1, k);
    if !crate::gemv::takes(&av, &bv) {
        return None;
    }
    let mut out = cpu::zeros(n);
    crate::gemv::sgemv(&av, &bv, &mut out);
    Some(make(out, Shape::from(vec![1, n])))
}

/// (dx, dw, db), each when its flag is set.
pub fn linear_backward(
    x: &FlexTensor,
    w: &FlexTensor,
    g: FlexTensor,
    want: (bool, bool, bool),
    bf16: bool,
) -> (Option<FlexTensor>, Option<FlexTensor>, Option<FlexTensor>) {
    let (x, w, g) = (contiguous(x.clone()), contiguous(w.clone()), contiguous(g));
    let [m, k] = x.shape().dims();
    let n = w.shape()[1];
    let (dx, dw, db) = cpu::linear_backward(f32s(&x), f32s(&w), f32s(&g), (m, k, n), want, bf16);
    (
        dx.map(|v| make(v, Shape::from(vec![m, k]))),
        dw.map(|v| make(v, Shape::from(vec![k, n]))),
        db.map(|v| make(v, Shape::from(vec![n]))),
    )
}

/// Batched `a · b` on bf16-rounded operands, f32 sums: a `[.., m, k]`, b `[.., k, n]` with the
/// same leading dimensions → `[.., m, n]` ([`crate::bf16::gemm_batched`]).
pub fn bmm_bf16(a: FlexTensor, b: FlexTensor) -> FlexTensor {
    let (a, b) = (contiguous(a), contiguous(b));
    let (batch, m, k, n) = bmm_dims(&a, &b);
    let (av, bv) = (f32s(&a), f32s(&b));
    let mut out = cpu::zeros(batch * m * n);
    let views = |i: usize| (item(av, i, (m, k)), item(bv, i, (k, n)));
    crate::bf16::gemm_batched(batch, views, &mut out, (m, n));
    let mut shape: Vec<usize> = (0..a.shape().num_dims()).map(|d| a.shape()[d]).collect();
    *shape.last_mut().expect("rank >= 2") = n;
    make(out, Shape::from(shape))
}

/// (dA = G·Bᵀ, dB = Aᵀ·G) of [`bmm_bf16`], each product on bf16-rounded operands.
pub fn bmm_bf16_backward(
    a: &FlexTensor,
    b: &FlexTensor,
    g: FlexTensor,
    (want_a, want_b): (bool, bool),
) -> (Option<FlexTensor>, Option<FlexTensor>) {
    let (a, b, g) = (contiguous(a.clone()), contiguous(b.clone()), contiguous(g));
    let (batch, m, k, n) = bmm_dims(&a, &b);
    let (av, bv, gv) = (f32s(&a), f32s(&b), f32s(&g));
    let da = want_a.then(|| {
        let mut out = cpu::zeros(batch * m * k);
        let views = |i: usize| (item(gv, i, (m, n)), item(bv, i, (k, n)).t());
        crate::bf16::gemm_batched(batch, views, &mut out, (m, k));
        make(out, a.shape())
    });
    let db = want_b.then(|| {
        let mut out = cpu::zeros(batch * k * n);
        let views = |i: usize| (item(av, i, (m, k)).t(), item(gv, i, (m, n)));
        crate::bf16::gemm_batched(batch, views, &mut out, (k, n));
        make(out, b.shape())
    });
    (da, db)
}

/// Matrix `i` of a contiguous batch of row-major `rows × cols` matrices.
fn item(data: &[f32], i: usize, (rows, cols): (usize, usize)) -> View<'_> {
    View::row_major(&data[i * rows * cols..(i + 1) * rows * cols], rows, cols)
}

/// (batch, m, k, n) of `a [.., m, k] · b [.., k, n]`.
fn bmm_dims(a: &FlexTensor, b: &FlexTensor) -> (usize, usize, usize, usize) {
    let (sa, sb) = (a.shape(), b.shape());
    let d = sa.num_dims();
    let (m, k, n) = (sa[d - 2], sa[d - 1], sb[d - 1]);
    (sa.num_elements() / (m * k).max(1), m, k, n)
}

/// `x` rounded to bf16 (`f16`: to f16), kept in f32 ([`cpu::round_bf16`], [`cpu::round_f16`]).
pub fn round_half(x: FlexTensor, f16: bool) -> FlexTensor {
    in_place(x, if f16 { cpu::round_f16 } else { cpu::round_bf16 })
}

pub fn dropout(x: FlexTensor, seed: u64, keep: f32) -> FlexTensor {
    let x = contiguous(x);
    let mut out = cpu::zeros(x.shape().num_elements());
    cpu::dropout(f32s(&x), &mut out, seed, keep);
    make(out, x.shape())
}

pub fn dropout_backward(g: FlexTensor, seed: u64, keep: f32) -> FlexTensor {
    in_place(g, |g| cpu::dropout_backward(g, seed, keep))
}

/// Attention core (see `cpu::attention`): q, k, v `[b·s, h·d]`, mask `[b, s]` → (ctx, probs).
pub fn attention(
    q: &FlexTensor,
    k: &FlexTensor,
    v: &FlexTensor,
    mask: &FlexTensor,
    a: cpu::Attn,
) -> (FlexTensor, FlexTensor) {
    let c = |t: &FlexTensor| contiguous(t.clone());
    let (q, k, v, mask) = (c(q), c(k), c(v), c(mask));
    let (ctx, probs) = cpu::attention(f32s(&q), f32s(&k), f32s(&v), f32s(&mask), a);
    (
        make(ctx, q.shape()),
        make(probs, Shape::from(vec![a.batch, a.heads, a.seq, a.seq])),
    )
}

/// (dq, dk, dv)
pub fn attention_backward(
    q: &FlexTensor,
    k: &FlexTensor,
    v: &FlexTensor,
    probs: &FlexTensor,
    g: FlexTensor,
    a: cpu::Attn,
) -> (FlexTensor, FlexTensor, FlexTensor) {
    let c = |t: &FlexTensor| contiguous(t.clone());
    let (q, k, v, probs, g) = (c(q), c(k), c(v), c(probs), contiguous(g));
    let (dq, dk, dv) =
        cpu::attention_backward(f32s(&q), f32s(&k), f32s(&v), f32s(&probs), f32s(&g), a);
    let shape = q.shape();
    (
        make(dq, shape.clone()),
        make(dk, shape.clone()),
        make(dv, shape),
    )
}

/// A convolution's geometry from `x: [batch, C, H, W]` and `w: [O, C, k, k]`.
pub fn conv_shape(
    x: &FlexTensor,
    w: &FlexTensor,
    stride: usize,
    pad: usize,
) -> crate::conv::ConvShape {
    let [batch, channels, height, width] = x.shape().dims();
    let [out_channels, _, kernel, _] = w.shape().dims();
    crate::conv::ConvShape {
        batch,
        channels,
        height,
        width,
        out_channels,
        kernel,
        stride,
        pad,
    }
}

/// `conv(x, w)` (no bias), NCHW.
pub fn conv2d(x: FlexTensor, w: &FlexTensor, stride: usize, pad: usize) -> FlexTensor {
    let (x, w) = (contiguous(x), contiguous(w.clone()));
    let s = conv_shape(&x, &w, stride, pad);
    let (oh, ow) = s.out_hw();
    make(
        crate::conv::conv2d(f32s(&x), f32s(&w), &s),
        Shape::from(vec![s.batch, s.out_channels, oh, ow]),
    )
}

/// Inference `max(bn(conv(x, w)) (+ residual), 0 if relu)` with the running statistics
/// `params = [gamma, beta, mean, var]`, written by the convolution as it stores its output:
/// equal bit for bit to [`conv2d`] then [`batch_norm_eval`].
pub fn conv2d_bn_eval(
    (x, w): (FlexTensor, &FlexTensor),
    (stride, pad): (usize, usize),
    params: [&FlexTensor; 4],
    eps: f64,
    (residual, relu): (Option<&FlexTensor>, bool),
) -> FlexTensor {
    let (x, w) = (contiguous(x), contiguous(w.clone()));
    let s = conv_shape(&x, &w, stride, pad);
    let [gamma, beta, mean, var] = params.map(|p| contiguous(p.clone()));
    let residual = residual.map(|r| contiguous(r.clone()));
    let coef = crate::batchnorm::coefficients(
        (f32s(&gamma), f32s(&beta)),
        (f32s(&mean), f32s(&var)),
        eps as f32,
        s.out_channels,
    );
    let then = crate::conv::Epilogue {
        coef: &coef,
        residual: residual.as_ref().map(f32s),
        floor: if relu { 0.0 } else { f32::NEG_INFINITY },
    };
    let (oh, ow) = s.out_hw();
    make(
        crate::conv::conv2d_then(f32s(&x), f32s(&w), &s, Some(&then)),
        Shape::from(vec![s.batch, s.out_channels, oh, ow]),
    )
}

/// (dx, dw), each when its flag is set.
pub fn conv2d_backward(
    x: &FlexTensor,
    w: &FlexTensor,
    g: FlexTensor,
    (stride, pad): (usize, usize),
    want: (bool, bool),
) -> (Option<FlexTensor>, Option<FlexTensor>) {
    let (x, w, g) = (contiguous(x.clone()), contiguous(w.clone()), contiguous(g));
    let s = conv_shape(&x, &w, stride, pad);
    let (dx, dw) = crate::conv::conv2d_backward(f32s(&x), f32s(&w), f32s(&g), &s, want);
    (
        dx.map(|v| make(v, x.shape())),
        dw.map(|v| make(v, w.shape())),
    )
}

fn bn_shape(x: &FlexTensor) -> crate::batchnorm::BnShape {
    let s = x.shape();
    crate::batchnorm::BnShape {
        batch: s[0],
        channels: s[1],
        plane: s.num_elements() / (s[0] * s[1]).max(1),
    }
}

/// (y, mean, biased variance) of BatchNorm with the batch's statistics, followed by
/// `+ residual` and ReLU as `epilogue` asks (`residual` given exactly when it asks for one).
pub fn batch_norm_train(
    x: FlexTensor,
    (gamma, beta): (&FlexTensor, &FlexTensor),
    eps: f64,
    residual: Option<&FlexTensor>,
    relu: bool,
) -> (FlexTensor, Vec<f32>, Vec<f32>) {
    let (x, gamma, beta) = (
        contiguous(x),
        contiguous(gamma.clone()),
        contiguous(beta.clone()),
    );
    let residual = residual.map(|r| contiguous(r.clone()));
    let s = bn_shape(&x);
    let (y, mean, var) = crate::batchnorm::forward_fused(
        f32s(&x),
        (f32s(&gamma), f32s(&beta)),
        eps as f32,
        (residual.as_ref().map(f32s), relu),
        &s,
    );
    (make(y, x.shape()), mean, var)
}

/// BatchNorm with given statistics (inference), then `+ residual` and ReLU when asked: one pass.
pub fn batch_norm_eval(
    x: FlexTensor,
    params: [&FlexTensor; 4],
    eps: f64,
    residual: Option<&FlexTensor>,
    relu: bool,
) -> FlexTensor {
    let x = contiguous(x);
    let [gamma, beta, mean, var] = params.map(|p| contiguous(p.clone()));
    let residual = residual.map(|r| contiguous(r.clone()));
    let y = crate::batchnorm::normalize(
        f32s(&x),
        (f32s(&gamma), f32s(&beta)),
        (f32s(&mean), f32s(&var)),
        eps as f32,
        (residual.as_ref().map(f32s), relu),
        &bn_shape(&x),
    );
    make(y, x.shape())
}

/// (dx, dgamma, dbeta, d residual) of [`batch_norm_train`]. With `relu`, the gradient is
/// masked by `y` (its output, kept when a residual was added before the ReLU) or by the sign
/// of the pre-activation recomputed from `x` (no residual: `y` not kept). `g` is worked on in
/// place when this holds it alone: it becomes the residual's (masked) gradient when one is
/// wanted, `dx` otherwise.
pub fn batch_norm_train_backward(
    (x, y): (&FlexTensor, Option<&FlexTensor>),
    (gamma, beta): (&FlexTensor, &FlexTensor),
    stats: (&[f32], &[f32]),
    eps: f64,
    g: FlexTensor,
    (relu, want_residual): (bool, bool),
) -> (FlexTensor, FlexTensor, FlexTensor, Option<FlexTensor>) {
    use crate::batchnorm::Mask;
    let (x, gamma, beta) = (
        contiguous(x.clone()),
        contiguous(gamma.clone()),
        contiguous(beta.clone()),
    );
    let y = y.map(|y| contiguous(y.clone()));
    let s = bn_shape(&x);
    let mask = match (&y, relu) {
        (Some(y), _) => Mask::Output(f32s(y)),
        (None, true) => Mask::Input,
        (None, false) => Mask::None,
    };
    let mut out = None;
    let g = in_place(g, |g| {
        out = Some(crate::batchnorm::backward(
            f32s(&x),
            (f32s(&gamma), f32s(&beta)),
            stats,
            eps as f32,
            (g, mask, want_residual),
            &s,
        ));
    });
    let (dx, dgamma, dbeta) = out.expect("the backward ran");
    let c = gamma.shape();
    let (dx, dres) = match dx {
        Some(dx) => (make(dx, x.shape()), Some(g)),
        None => (g, None),
    };
    (dx, make(dgamma, c.clone()), make(dbeta, c), dres)
}
