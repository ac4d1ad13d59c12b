//! Backward nodes of the fused ops for `Autodiff<Flex, C>` (Burn's autodiff extension points:
//! `Backward`, `OpsKind`, `Gradients`). Each node keeps what its backward reads (the input, or
//! the output for softmax) and computes the gradient with one fused kernel.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{unary, Backward, Ops, OpsKind};
use burn::backend::autodiff::{Autodiff, NodeId};
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::FloatTensor;
use burn::backend::Flex;

use crate::cpu::GeluKind;
use crate::flex;

type Ad<C> = FloatTensor<Autodiff<Flex, C>>;

/// Each gradient computed for a parent that wants one.
fn register<const N: usize>(
    grads: &mut Gradients,
    parents: [Option<NodeId>; N],
    values: [Option<FlexTensor>; N],
) {
    for (id, g) in parents.into_iter().zip(values) {
        if let (Some(id), Some(g)) = (id, g) {
            grads.register::<Flex>(id, g);
        }
    }
}

#[derive(Debug)]
struct GeluBackward(GeluKind);

impl Backward<Flex, 1> for GeluBackward {
    type State = FlexTensor;

    fn backward(self, ops: Ops<FlexTensor, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let x = ops.state;
        let kind = self.0;
        unary::<Flex, _>(ops.parents, ops.node, grads, |g| {
            flex::gelu_backward(&x, g, kind)
        });
    }
}

pub fn gelu<C: CheckpointStrategy>(x: Ad<C>, kind: GeluKind) -> Ad<C> {
    match GeluBackward(kind)
        .prepare::<C>([x.node()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let p = x.primitive().clone();
            prep.finish(p.clone(), flex::gelu(p, kind))
        }
        OpsKind::UnTracked(prep) => prep.finish(flex::gelu(x.into_primitive(), kind)),
    }
}

#[derive(Debug)]
struct SoftmaxBackward;

impl Backward<Flex, 1> for SoftmaxBackward {
    type State = FlexTensor;

    fn backward(self, ops: Ops<FlexTensor, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let y = ops.state;
        unary::<Flex, _>(ops.parents, ops.node, grads, |g| {
            flex::softmax_backward(&y, g)
        });
    }
}

pub fn softmax<C: CheckpointStrategy>(x: Ad<C>) -> Ad<C> {
    match SoftmaxBackward
        .prepare::<C>([x.node()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let y = flex::softmax(x.primitive().clone());
            prep.finish(y.clone(), y)
        }
        OpsKind::UnTracked(prep) => prep.finish(flex::softmax(x.into_primitive())),
    }
}

#[derive(Debug)]
struct SoftmaxBiasedBackward {
    scale: f32,
}

impl Backward<Flex, 1> for SoftmaxBiasedBackward {
    type State = FlexTensor;

    fn backward(self, ops: Ops<FlexTensor, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let y = ops.state;
        unary::<Flex, _>(ops.parents, ops.node, grads, |g| {
            flex::softmax_biased_backward(&y, g, self.scale)
        });
    }
}

/// `softmax(scale·x + bias)`; the bias (an attention mask) carries no gradient.
pub fn softmax_biased<C: CheckpointStrategy>(x: Ad<C>, bias: &FlexTensor, scale: f32) -> Ad<C> {
    let node = SoftmaxBiasedBackward { scale };
    match node.prepare::<C>([x.node()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let y = flex::softmax_biased(x.primitive().clone(), bias, scale);
            prep.finish(y.clone(), y)
        }
        OpsKind::UnTracked(prep) => {
            prep.finish(flex::softmax_biased(x.into_primitive(), bias, scale))
        }
    }
}

#[derive(Debug)]
struct LayerNormBackward {
    eps: f64,
}

impl Backward<Flex, 3> for LayerNormBackward {
    /// (input, gamma)
    type State = (FlexTensor, FlexTensor);

    fn backward(
        self,
        ops: Ops<(FlexTensor, FlexTensor), 3>,
        grads: &mut Gradients,
        _: &mut Checkpointer,
    ) {
        let (x, gamma) = ops.state;
        let g = grads.consume::<Flex>(&ops.node);
        let (dx, dgamma, dbeta) = flex::layer_norm_backward(&x, &gamma, g, self.eps);
        let parents = ops.parents.map(|p| p.map(|n| n.id));
        register(grads, parents, [Some(dx), Some(dgamma), Some(dbeta)]);
    }
}

pub fn layer_norm<C: CheckpointStrategy>(x: Ad<C>, gamma: Ad<C>, beta: Ad<C>, eps: f64) -> Ad<C> {
    let nodes = [x.node(), gamma.node(), beta.node()];
    let op = LayerNormBackward { eps };
    match op.prepare::<C>(nodes).compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let (xp, gp) = (x.primitive().clone(), gamma.primitive().clone());
            let y = flex::layer_norm(xp.clone(), &gp, beta.primitive(), eps);
            prep.finish((xp, gp), y)
        }
        OpsKind::UnTracked(prep) => prep.finish(flex::layer_norm(
            x.into_primitive(),
            gamma.primitive(),
            beta.primitive(),
            eps,
        )),
    }
}

#[derive(Debug)]
struct EmbeddingBackward {
    vocab: usize,
}

impl Backward<Flex, 1> for EmbeddingBackward {
    type State = std::sync::Arc<Vec<usize>>;

    fn backward(
        self,
        ops: Ops<std::sync::Arc<Vec<usize>>, 1>,
        grads: &mut Gradients,
        _: &mut Checkpointer,
    ) {
        let ids = ops.state;
        unary::<Flex, _>(ops.parents, ops.node, grads, |g| {
            flex::embedding_backward(&ids, g, self.vocab)
        });
    }
}

pub fn embedding<C: CheckpointStrategy>(
    table: Ad<C>,
    ids: Vec<usize>,
    batch: usize,
    seq: usize,
) -> Ad<C> {
    let vocab = burn::backend::TensorMetadata::shape(table.primitive())[0];
    let op = EmbeddingBackward { vocab };
    match op.prepare::<C>([table.node()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let y = flex::embedding(table.primitive(), &ids, batch, seq);
            prep.finish(std::sync::Arc::new(ids), y)
        }
        OpsKind::UnTracked(prep) => {
            prep.finish(flex::embedding(table.primitive(), &ids, batch, seq))
        }
    }
}

#[derive(Debug)]
struct BmmBf16Backward;

impl Backward<Flex, 2> for BmmBf16Backward {
    /// (a, b)
    type State = (FlexTensor, FlexTensor);

    fn backward(
        self,
        ops: Ops<(FlexTensor, FlexTensor), 2>,
        grads: &mut Gradients,
        _: &mut Checkpointer,
    ) {
        let (a, b) = ops.state;
        let g = grads.consume::<Flex>(&ops.node);
        let [pa, pb] = ops.parents;
        let (da, db) = flex::bmm_bf16_backward(&a, &b, g, (pa.is_some(), pb.is_some()));
        register(grads, [pa, pb].map(|p| p.map(|n| n.id)), [da, db]);
    }
}

pub fn bmm_bf16<C: CheckpointStrategy>(a: Ad<C>, b: Ad<C>) -> Ad<C> {
    match BmmBf16Backward
        .prepare::<C>([a.node(), b.node()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            // Kept contiguous for the backward (Kᵀ arrives as a transposed view: one copy).
            let ap = flex::contiguous(a.primitive().clone());
            let bp = flex::contiguous(b.primitive().clone());
            let y = flex::bmm_bf16(ap.clone(), bp.clone());
            prep.finish((ap, bp), y)
        }
        OpsKind::UnTracked(prep) => {
            prep.finish(flex::bmm_bf16(a.into_primitive(), b.into_primitive()))
        }
    }
}

/// With `bf16`, the backward products round their operands to bf16 as the forward did.
#[derive(Debug)]
struct LinearBackward {
    bf16: bool,
}

impl Backward<Flex, 3> for LinearBackward {
    /// (input, weight)
    type State = (FlexTensor, FlexTensor);

    fn backward(
        self,
        ops: Ops<(FlexTensor, FlexTensor), 3>,
        grads: &mut Gradients,
        _: &mut Checkpointer,
    ) {
        let (x, w) = ops.state;
        let g = grads.consume::<Flex>(&ops.node);
        let [px, pw, pb] = ops.parents;
        let want = (px.is_some(), pw.is_some(), pb.is_some());
        let (dx, dw, db) = flex::linear_backward(&x, &w, g, want, self.bf16);
        register(grads, [px, pw, pb].map(|p| p.map(|n| n.id)), [dx, dw, db]);
    }
}

pub fn linear<C: CheckpointStrategy>(x: Ad<C>, w: Ad<C>, b: Ad<C>, bf16: bool) -> Ad<C> {
    let nodes = [x.node(), w.node(), b.node()];
    match (LinearBackward { bf16 })
        .prepare::<C>(nodes)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let (xp, wp) = (x.primitive().clone(), w.primitive().clone());
            let y = flex::linear(xp.clone(), &wp, b.primitive(), bf16);
            prep.finish((xp, wp), y)
        }
        OpsKind::UnTracked(prep) => prep.finish(flex::linear(
            x.into_primitive(),
            w.primitive(),
            b.primitive(),
            bf16,
        )),
    }
}

#[derive(Debug)]
struct DropoutBackward {
    seed: u64,
    keep: f32,
}

impl Backward<Flex, 1> for DropoutBackward {
    type State = ();

    fn backward(self, ops: Ops<(), 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        unary::<Flex, _>(ops.parents, ops.node, grads, |g| {
            flex::dropout_backward(g, self.seed, self.keep)
        });
    }
}

pub fn dropout<C: CheckpointStrategy>(x: Ad<C>, seed: u64, keep: f32) -> Ad<C> {
    let op = DropoutBackward { seed, keep };
    match op.prepare::<C>([x.node()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let y = flex::dropout(x.primitive().clone(), seed, keep);
            prep.finish((), y)
        }
        OpsKind::UnTracked(prep) => prep.finish(flex::dropout(x.into_primitive(), seed, keep)),
    }
}

/// Rounding to bf16 or f16 differentiates as a cast there and back: the gradient rounded too.
#[derive(Debug)]
struct RoundHalfBackward {
    f16: bool,
}

impl Backward<Flex, 1> for RoundHalfBackward {
    type State = ();

    fn backward(self, ops: Ops<(), 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        unary::<Flex, _>(ops.parents, ops.node, grads, |g| {
            flex::round_half(g, self.f16)
        });
    }
}

pub fn round_half<C: CheckpointStrategy>(x: Ad<C>, f16: bool) -> Ad<C> {
    let op = RoundHalfBackward { f16 };
    match op.prepare::<C>([x.node()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish((), flex::round_half(x.primitive().clone(), f16)),
        OpsKind::UnTracked(prep) => prep.finish(flex::round_half(x.into_primitive(), f16)),
    }
}

#[derive(Debug)]
struct AttentionBackward {
    shape: crate::cpu::Attn,
}

impl Backward<Flex, 3> for AttentionBackward {
    /// (q, k, v, probabilities)
    type State = (FlexTensor, FlexTensor, FlexTensor, FlexTensor);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (q, k, v, probs) = ops.state;
        let g = grads.consume::<Flex>(&ops.node);
        let (dq, dk, dv) = flex::attention_backward(&q, &k, &v, &probs, g, self.shape);
        let parents = ops.parents.map(|p| p.map(|n| n.id));
        register(grads, parents, [Some(dq), Some(dk), Some(dv)]);
    }
}

pub fn attention<C: CheckpointStrategy>(
    q: Ad<C>,
    k: Ad<C>,
    v: Ad<C>,
    mask: &FlexTensor,
    shape: crate::cpu::Attn,
) -> Ad<C> {
    let nodes = [q.node(), k.node(), v.node()];
    let op = AttentionBackward { shape };
    match op.prepare::<C>(nodes).compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let (qp, kp, vp) = (
                q.primitive().clone(),
                k.primitive().clone(),
                v.primitive().clone(),
            );
            let (ctx, probs) = flex::attention(&qp, &kp, &vp, mask, shape);
            prep.finish((qp, kp, vp, probs), ctx)
        }
        OpsKind::UnTracked(prep) => {
            let (ctx, _) =
                flex::attention(q.primitive(), k.primitive(), v.primitive(), mask, shape);
            prep.finish(ctx)
        }
    }
}

#[derive(Debug)]
struct Conv2dBackward {
    stride: usize,
    pad: usize,
}

impl Backward<Flex, 2> for Conv2dBackward {
    /// (input, weight)
    type State = (FlexTensor, FlexTensor);

    fn backward(
        self,
        ops: Ops<(FlexTensor, FlexTensor), 2>,
        grads: &mut Gradients,
        _: &mut Checkpointer,
    ) {
        let (x, w) = ops.state;
        let g = grads.consume::<Flex>(&ops.node);
        let [px, pw] = ops.parents;
        let want = (px.is_some(), pw.is_some());
        let (dx, dw) = flex::conv2d_backward(&x, &w, g, (self.stride, self.pad), want);
        register(grads, [px, pw].map(|p| p.map(|n| n.id)), [dx, dw]);
    }
}

pub fn conv2d<C: CheckpointStrategy>(x: Ad<C>, w: Ad<C>, stride: usize, pad: usize) -> Ad<C> {
    let op = Conv2dBackward { stride, pad };
    match op
        .prepare::<C>([x.node(), w.node()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let (xp, wp) = (x.primitive().clone(), w.primitive().clone());
            let y = flex::conv2d(xp.clone(), &wp, stride, pad);
            prep.finish((xp, wp), y)
        }
        OpsKind::UnTracked(prep) => {
            prep.finish(flex::conv2d(x.into_primitive(), w.primitive(), stride, pad))
        }
    }
}

/// What a fused BatchNorm's backward keeps: input, gamma and beta, batch mean and variance,
/// whether it ended in ReLU, and its output when a residual was added before the ReLU (the
/// mask; without a residual the backward recomputes it from the input).
type BnState = (
    FlexTensor,
    (FlexTensor, FlexTensor),
    (Vec<f32>, Vec<f32>),
    bool,
    Option<FlexTensor>,
);

/// The fused BatchNorm's gradients for its parents `(x, gamma, beta[, residual])`.
fn batch_norm_grads<const N: usize>(eps: f64, ops: Ops<BnState, N>, grads: &mut Gradients) {
    let (x, (gamma, beta), (mean, var), relu, y) = ops.state;
    let g = grads.consume::<Flex>(&ops.node);
    let want_residual = N == 4 && ops.parents[3].is_some();
    let (dx, dgamma, dbeta, dres) = flex::batch_norm_train_backward(
        (&x, y.as_ref()),
        (&gamma, &beta),
        (&mean, &var),
        eps,
        g,
        (relu, want_residual),
    );
    // N is 3 or 4 (with a residual): the zip stops at the parents there are.
    let mut out = [Some(dx), Some(dgamma), Some(dbeta), dres];
    for (parent, grad) in ops.parents.into_iter().zip(out.iter_mut()) {
        if let (Some(n), Some(g)) = (parent, grad.take()) {
            grads.register::<Flex>(n.id, g);
        }
    }
}

#[derive(Debug)]
struct BatchNormBackward {
    eps: f64,
}

impl Backward<Flex, 3> for BatchNormBackward {
    type State = BnState;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        batch_norm_grads(self.eps, ops, grads);
    }
}

#[derive(Debug)]
struct BatchNormResidualBackward {
    eps: f64,
}

impl Backward<Flex, 4> for BatchNormResidualBackward {
    type State = BnState;

    fn backward(self, ops: Ops<Self::State, 4>, grads: &mut Gradients, _: &mut Checkpointer) {
        batch_norm_grads(self.eps, ops, grads);
    }
}

/// BatchNorm with the batch's statistics, then `+ residual` and ReLU when asked: (y, mean,
/// biased variance).
pub fn batch_norm_train<C: CheckpointStrategy>(
    x: Ad<C>,
    (gamma, beta): (Ad<C>, Ad<C>),
    eps: f64,
    residual: Option<Ad<C>>,
    relu: bool,
) -> (Ad<C>, Vec<f32>, Vec<f32>) {
    let run = |res: Option<&FlexTensor>| {
        flex::batch_norm_train(
            x.primitive().clone(),
            (gamma.primitive(), beta.primitive()),
            eps,
            res,
            relu,
        )
    };
    let keep_output = relu && residual.is_some();
    let state = |y: &FlexTensor, mean: &Vec<f32>, var: &Vec<f32>| {
        let kept = keep_output.then(|| y.clone());
        let xp = x.primitive().clone();
        let gb = (gamma.primitive().clone(), beta.primitive().clone());
        (xp, gb, (mean.clone(), var.clone()), relu, kept)
    };
    match residual {
        None => {
            let op = BatchNormBackward { eps };
            match op
                .prepare::<C>([x.node(), gamma.node(), beta.node()])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => {
                    let (y, mean, var) = run(None);
                    let st = state(&y, &mean, &var);
                    (prep.finish(st, y), mean, var)
                }
                OpsKind::UnTracked(prep) => {
                    let (y, mean, var) = run(None);
                    (prep.finish(y), mean, var)
                }
            }
        }
        Some(r) => {
            let op = BatchNormResidualBackward { eps };
            match op
                .prepare::<C>([x.node(), gamma.node(), beta.node(), r.node()])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => {
                    let (y, mean, var) = run(Some(r.primitive()));
                    let st = state(&y, &mean, &var);
                    (prep.finish(st, y), mean, var)
                }
                OpsKind::UnTracked(prep) => {
                    let (y, mean, var) = run(Some(r.primitive()));
                    (prep.finish(y), mean, var)
                }
            }
        }
    }
}
