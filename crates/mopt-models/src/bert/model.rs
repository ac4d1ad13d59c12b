//! BERT encoder with a sequence-classification head, written with Burn modules.
//!
//! Struct paths mirror Hugging Face checkpoint keys (`bert.encoder.layer.0.attention.self.query`),
//! except where a key cannot be a Rust field: `self` → `self_attn`, `LayerNorm` → `layer_norm`
//! (see [`crate::bert::weights`] for the remapping). Attention is written out by hand because
//! each layer may hold its own number of heads (pruned models): Q/K/V project to
//! `heads × head_size`, which need not equal `hidden_size`.

use burn::nn::{
    Dropout, DropoutConfig, Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig, Linear,
    LinearConfig,
};
use burn::prelude::*;
use burn::tensor::activation::tanh;
use mopt_kernels::autocast::{self, matmul};
use mopt_kernels::{gelu_as, softmax_biased, GeluKind};
use mopt_quant::node::{LinearQuant, Phase};

use super::config::BertConfig;

/// A linear layer initialised like HF BERT: weights ~ N(0, `initializer_range`), zero bias.
fn dense(d_in: usize, d_out: usize, c: &BertConfig, device: &Device) -> Linear {
    let mut l = LinearConfig::new(d_in, d_out)
        .with_initializer(normal(c))
        .init(device);
    l.bias = l
        .bias
        .map(|_| burn::module::Param::from_tensor(Tensor::zeros([d_out], device)));
    l
}

/// An embedding table initialised like HF BERT: ~ N(0, `initializer_range`). (Burn's default,
/// N(0, 1), leaves rows that AdamW at lr 1e-4 can barely move.)
fn table(n: usize, d: usize, c: &BertConfig, device: &Device) -> Embedding {
    EmbeddingConfig::new(n, d)
        .with_initializer(normal(c))
        .init(device)
}

fn normal(c: &BertConfig) -> burn::nn::Initializer {
    burn::nn::Initializer::Normal {
        mean: 0.0,
        std: c.initializer_range,
    }
}

/// LayerNorm through mopt's fused kernel (forward and backward in one pass each); Burn's
/// `LayerNorm` keeps the parameters (and the checkpoint keys), `eps` comes from the config.
fn norm<const D: usize>(ln: &LayerNorm, eps: f64, x: Tensor<D>) -> Tensor<D> {
    match &ln.beta {
        Some(beta) => mopt_kernels::layer_norm(x, ln.gamma.val(), beta.val(), eps),
        None => ln.forward(x),
    }
}

/// [`norm`] of `x + residual`, the sum and the norm in one pass in inference
/// (`mopt_kernels::add_layer_norm`).
fn add_norm<const D: usize>(
    ln: &LayerNorm,
    eps: f64,
    x: Tensor<D>,
    residual: Tensor<D>,
) -> Tensor<D> {
    match &ln.beta {
        Some(beta) => mopt_kernels::add_layer_norm(x, residual, ln.gamma.val(), beta.val(), eps),
        None => ln.forward(x + residual),
    }
}

/// A linear layer over the last dimension of `[batch, seq, d_in]`, run as one 2-D GEMM over
/// all `batch × seq` rows with mopt's fused linear kernel (bias in the GEMM's output, both
/// backward products on the same GEMM). Burn's `Linear` on a 3-D input broadcasts the weight
/// into a batched matmul, which Flex runs as `batch` small GEMMs that each repack the weight.
/// With quantizers, its input and weight are fake-quantized first (bias in float, as ONNX
/// Runtime's integer kernels keep it).
fn linear(l: &Linear, q: &Option<LinearQuant>, x: Tensor<3>) -> Tensor<3> {
    let [b, s, d] = x.dims();
    let x = linear2(l, q, x.reshape([b * s, d]));
    let n = x.dims()[1];
    x.reshape([b, s, n])
}

/// [`linear`] on `[rows, d_in]`.
fn linear2(l: &Linear, q: &Option<LinearQuant>, x: Tensor<2>) -> Tensor<2> {
    let (x, w) = match q {
        // Each quantizer acts by its phase (calibration keeps the weights' off).
        Some(q) => (q.input.forward(x), q.weight.forward(l.weight.val())),
        None => (x, l.weight.val()),
    };
    match &l.bias {
        Some(bias) => mopt_kernels::linear(x, w, bias.val()),
        None => matmul(x, w),
    }
}

/// Dropout through mopt's fused kernel (one pass each way, mask regenerated in backward);
/// Burn's `Dropout` keeps the probability and the training flag.
fn dropout<const D: usize>(d: &Dropout, x: Tensor<D>) -> Tensor<D> {
    if d.training.is_enabled() {
        mopt_kernels::dropout(x, d.prob)
    } else {
        x
    }
}

/// Added to attention scores at padded key positions (the value ONNX exporters use too).
pub const MASK_BIAS: f32 = -10000.0;

/// What a forward pass should return besides the logits.
#[derive(Debug, Clone, Copy, Default)]
pub struct ForwardOptions {
    /// Collect the embedding output and every layer's output.
    pub hidden_states: bool,
    /// Collect every layer's attention probabilities.
    pub attentions: bool,
    /// Collect every layer's attention scores (`QKᵀ/√d`, before the mask and softmax).
    pub attention_scores: bool,
}

/// Outputs of [`BertForSequenceClassification::forward_with`].
#[derive(Debug, Clone)]
pub struct BertOutputs {
    /// `[batch, num_labels]`
    pub logits: Tensor<2>,
    /// `[batch, seq, hidden]`: the last layer's output.
    pub last_hidden_state: Tensor<3>,
    /// `[batch, hidden]`: tanh(dense(`[CLS]`)).
    pub pooled: Tensor<2>,
    /// Embedding output, then each layer's output (`num_layers + 1` tensors), when requested.
    pub hidden_states: Vec<Tensor<3>>,
    /// `[batch, heads_i, seq, seq]` attention probabilities per layer, when requested.
    pub attentions: Vec<Tensor<4>>,
    /// `[batch, heads_i, seq, seq]` attention scores per layer, when requested.
    pub attention_scores: Vec<Tensor<4>>,
}

#[derive(Module, Debug)]
/// Word, position and token-type embeddings, summed, LayerNorm, dropout.
pub struct BertEmbeddings {
    /// The word table `[vocab, hidden]`.
    pub word_embeddings: Embedding,
    /// The position table.
    pub position_embeddings: Embedding,
    /// The token-type table.
    pub token_type_embeddings: Embedding,
    /// LayerNorm of the sum.
    pub layer_norm: LayerNorm,
    /// Dropout after it.
    pub dropout: Dropout,
    /// LayerNorm epsilon (`layer_norm_eps` of the config).
    pub eps: f64,
    /// A vocabulary-pruned model's row of every token id (`mopt_vocab_map`); rebuilt from the
    /// config, not saved with the weights.
    #[module(skip)]
    pub vocab_map: Option<std::sync::Arc<Vec<i64>>>,
}

/// The word-table row of every token id of a vocabulary-pruned config (`mopt_vocab_map`), as
/// the embeddings gather it.
pub(crate) fn id_rows(c: &BertConfig) -> Option<std::sync::Arc<Vec<i64>>> {
    let map = c.mopt_vocab_map.as_ref()?;
    Some(std::sync::Arc::new(map.iter().map(|&r| r as i64).collect()))
}

impl BertEmbeddings {
    fn new(c: &BertConfig, dropout: f64, device: &Device) -> Self {
        Self {
            word_embeddings: table(c.vocab_size, c.hidden_size, c, device),
            position_embeddings: table(c.max_position_embeddings, c.hidden_size, c, device),
            token_type_embeddings: table(c.type_vocab_size, c.hidden_size, c, device),
            layer_norm: LayerNormConfig::new(c.hidden_size)
                .with_epsilon(c.layer_norm_eps)
                .init(device),
            dropout: DropoutConfig::new(dropout).init(),
            eps: c.layer_norm_eps,
            vocab_map: id_rows(c),
        }
    }

    /// # Shapes
    /// - input_ids, token_type_ids: `[batch, seq]`
    /// - output: `[batch, seq, hidden]`
    pub fn forward(&self, input_ids: Tensor<2, Int>, token_type_ids: Tensor<2, Int>) -> Tensor<3> {
        let [batch, seq] = input_ids.dims();
        let device = input_ids.device();
        let positions = Tensor::<1, Int>::arange(0..seq as i64, &device)
            .reshape([1, seq])
            .expand([batch, seq]);
        let input_ids = match &self.vocab_map {
            Some(map) => {
                let map = Tensor::<1, Int>::from_data(
                    TensorData::new(map.to_vec(), [map.len()]),
                    &device,
                );
                map.select(0, input_ids.reshape([batch * seq]))
                    .reshape([batch, seq])
            }
            None => input_ids,
        };
        let table = |e: &Embedding, ids| mopt_kernels::embedding(e.weight.val(), ids);
        let x = table(&self.word_embeddings, input_ids)
            + table(&self.position_embeddings, positions)
            + table(&self.token_type_embeddings, token_type_ids);
        dropout(&self.dropout, norm(&self.layer_norm, self.eps, x))
    }
}

#[derive(Module, Debug)]
/// Multi-head self-attention: Q, K, V projections and the attention core.
pub struct BertSelfAttention {
    /// Query projection.
    pub query: Linear,
    /// Key projection.
    pub key: Linear,
    /// Value projection.
    pub value: Linear,
    /// The query projection's quantizers, when quantized.
    pub query_quant: Option<LinearQuant>,
    /// The key projection's quantizers.
    pub key_quant: Option<LinearQuant>,
    /// The value projection's quantizers.
    pub value_quant: Option<LinearQuant>,
    /// Dropout on the attention probabilities.
    pub dropout: Dropout,
    /// Heads of this layer.
    pub num_heads: usize,
    /// Width of one head.
    pub head_size: usize,
}

impl BertSelfAttention {
    /// # Shapes
    /// - x: `[batch, seq, hidden]`
    /// - mask_bias: `[batch, 1, 1, seq]` (0 for real tokens, [`MASK_BIAS`] for padding)
    /// - output: (`[batch, seq, heads × head_size]`, scores (when `want_scores`) and
    ///   probabilities `[batch, heads, seq, seq]`)
    pub fn forward(
        &self,
        x: Tensor<3>,
        mask_bias: Tensor<4>,
        want_scores: bool,
    ) -> (Tensor<3>, Option<Tensor<4>>, Tensor<4>) {
        let [batch, seq, _] = x.dims();
        let (h, d) = (self.num_heads, self.head_size);
        let split = |t: Tensor<3>| t.reshape([batch, seq, h, d]).swap_dims(1, 2);
        let q = split(linear(&self.query, &self.query_quant, x.clone()));
        let k = split(linear(&self.key, &self.key_quant, x.clone()));
        let v = split(linear(&self.value, &self.value_quant, x));
        // softmax(QKᵀ/√d + mask) in one pass; the scores themselves only when asked for.
        let raw = matmul(q, k.swap_dims(2, 3));
        let scores = want_scores.then(|| raw.clone().div_scalar((d as f32).sqrt()));
        let probs = softmax_biased(raw, mask_bias, 1.0 / (d as f32).sqrt());
        let ctx = matmul(dropout(&self.dropout, probs.clone()), v);
        (
            ctx.swap_dims(1, 2).reshape([batch, seq, h * d]),
            scores,
            probs,
        )
    }
}

/// Output projection + residual + LayerNorm (used after attention and after the FFN).
#[derive(Module, Debug)]
pub struct BertResidualOutput {
    /// The output projection.
    pub dense: Linear,
    /// Its quantizers, when quantized.
    pub dense_quant: Option<LinearQuant>,
    /// LayerNorm of the residual sum.
    pub layer_norm: LayerNorm,
    /// Dropout before the sum.
    pub dropout: Dropout,
    /// LayerNorm epsilon (`layer_norm_eps` of the config).
    pub eps: f64,
}

impl BertResidualOutput {
    fn new(d_in: usize, c: &BertConfig, dropout: f64, device: &Device) -> Self {
        Self {
            dense: dense(d_in, c.hidden_size, c, device),
            dense_quant: None,
            layer_norm: LayerNormConfig::new(c.hidden_size)
                .with_epsilon(c.layer_norm_eps)
                .init(device),
            dropout: DropoutConfig::new(dropout).init(),
            eps: c.layer_norm_eps,
        }
    }

    /// # Shapes
    /// - x: `[batch, seq, d_in]`, residual: `[batch, seq, hidden]` → `[batch, seq, hidden]`
    pub fn forward(&self, x: Tensor<3>, residual: Tensor<3>) -> Tensor<3> {
        let x = dropout(&self.dropout, linear(&self.dense, &self.dense_quant, x));
        add_norm(&self.layer_norm, self.eps, x, residual)
    }
}

#[derive(Module, Debug)]
/// Self-attention and its output block.
pub struct BertAttention {
    /// The attention.
    pub self_attn: BertSelfAttention,
    /// Its output projection, residual and LayerNorm.
    pub output: BertResidualOutput,
}

#[derive(Module, Debug)]
/// The FFN's first projection (and GELU).
pub struct BertIntermediate {
    /// The projection.
    pub dense: Linear,
    /// Its quantizers, when quantized.
    pub dense_quant: Option<LinearQuant>,
    /// The GELU after it (`hidden_act` of the config; rebuilt from it, not saved).
    #[module(skip)]
    pub act: GeluKind,
}

#[derive(Module, Debug)]
/// One encoder layer: attention, FFN, their residual outputs.
pub struct BertLayer {
    /// The attention block.
    pub attention: BertAttention,
    /// The FFN's first half.
    pub intermediate: BertIntermediate,
    /// The FFN's second projection, residual and LayerNorm.
    pub output: BertResidualOutput,
}

impl BertLayer {
    fn new(
        c: &BertConfig,
        i: usize,
        hidden_dropout: f64,
        attn_dropout: f64,
        device: &Device,
    ) -> Self {
        let (h, d, f) = (c.heads(i), c.head_size(), c.ffn(i));
        let a = h * d;
        Self {
            attention: BertAttention {
                self_attn: BertSelfAttention {
                    query: dense(c.hidden_size, a, c, device),
                    key: dense(c.hidden_size, a, c, device),
                    value: dense(c.hidden_size, a, c, device),
                    query_quant: None,
                    key_quant: None,
                    value_quant: None,
                    dropout: DropoutConfig::new(attn_dropout).init(),
                    num_heads: h,
                    head_size: d,
                },
                output: BertResidualOutput::new(a, c, hidden_dropout, device),
            },
            intermediate: BertIntermediate {
                dense: dense(c.hidden_size, f, c, device),
                dense_quant: None,
                // A config that passed `check` names a known kind.
                act: c.gelu_kind().unwrap_or_default(),
            },
            output: BertResidualOutput::new(f, c, hidden_dropout, device),
        }
    }

    /// # Shapes
    /// - x: `[batch, seq, hidden]`, mask_bias `[batch, 1, 1, seq]`
    /// - output: (`[batch, seq, hidden]`, attention scores (when `want_scores`) and
    ///   probabilities `[batch, heads, seq, seq]`)
    pub fn forward(
        &self,
        x: Tensor<3>,
        mask_bias: Tensor<4>,
        want_scores: bool,
    ) -> (Tensor<3>, Option<Tensor<4>>, Tensor<4>) {
        let (ctx, scores, probs) =
            self.attention
                .self_attn
                .forward(x.clone(), mask_bias, want_scores);
        let attn_out = self.attention.output.forward(ctx, x);
        (self.ffn(attn_out), scores, probs)
    }

    /// The attention block alone: self-attention, output projection, residual and LayerNorm.
    ///
    /// # Shapes
    /// - x: `[batch, seq, hidden]`, mask_bias `[batch, 1, 1, seq]`; output `[batch, seq, hidden]`
    pub fn attention_block(&self, x: Tensor<3>, mask_bias: Tensor<4>) -> Tensor<3> {
        let (ctx, _, _) = self
            .attention
            .self_attn
            .forward(x.clone(), mask_bias, false);
        self.attention.output.forward(ctx, x)
    }

    /// The FFN block alone: up-projection, GELU, down-projection, residual and LayerNorm.
    ///
    /// # Shapes
    /// - x, output: `[batch, seq, hidden]`
    pub fn ffn(&self, x: Tensor<3>) -> Tensor<3> {
        let i = &self.intermediate;
        let inter = gelu_as(i.act, linear(&i.dense, &i.dense_quant, x.clone()));
        self.output.forward(inter, x)
    }
}

#[derive(Module, Debug)]
/// The stack of encoder layers.
pub struct BertEncoder {
    /// The layers, in order.
    pub layer: Vec<BertLayer>,
}

#[derive(Module, Debug)]
/// The pooler: tanh of a projection of the `[CLS]` output.
pub struct BertPooler {
    /// The projection.
    pub dense: Linear,
    /// Its quantizers, when quantized.
    pub dense_quant: Option<LinearQuant>,
}

#[derive(Module, Debug)]
/// Embeddings, encoder and pooler.
pub struct BertModel {
    /// The embeddings.
    pub embeddings: BertEmbeddings,
    /// The encoder.
    pub encoder: BertEncoder,
    /// The pooler.
    pub pooler: BertPooler,
}

/// HF `BertForSequenceClassification`: BERT, pooler, dropout, linear classifier.
#[derive(Module, Debug)]
pub struct BertForSequenceClassification {
    /// The encoder with its embeddings and pooler.
    pub bert: BertModel,
    /// Dropout before the classifier.
    pub dropout: Dropout,
    /// The classifier `[hidden, labels]`.
    pub classifier: Linear,
    /// Its quantizers, when quantized.
    pub classifier_quant: Option<LinearQuant>,
}

impl BertForSequenceClassification {
    /// Random initialisation of the shape `config` describes.
    pub fn new(config: &BertConfig, device: &Device) -> Self {
        let hd = config.hidden_dropout_prob;
        let ad = config.attention_probs_dropout_prob;
        Self {
            bert: BertModel {
                embeddings: BertEmbeddings::new(config, hd, device),
                encoder: BertEncoder {
                    layer: (0..config.num_hidden_layers)
                        .map(|i| BertLayer::new(config, i, hd, ad, device))
                        .collect(),
                },
                pooler: BertPooler {
                    dense: dense(config.hidden_size, config.hidden_size, config, device),
                    dense_quant: None,
                },
            },
            dropout: DropoutConfig::new(hd).init(),
            classifier: dense(config.hidden_size, config.num_labels, config, device),
            classifier_quant: None,
        }
        .with_quantizers(config, Phase::Quantize, device)
    }

    /// Logits only.
    ///
    /// # Shapes
    /// - input_ids, token_type_ids: `[batch, seq]` (Int); attention_mask: `[batch, seq]` (1 = token, 0 = pad)
    /// - output: `[batch, num_labels]`
    pub fn forward(
        &self,
        input_ids: Tensor<2, Int>,
        attention_mask: Tensor<2>,
        token_type_ids: Tensor<2, Int>,
    ) -> Tensor<2> {
        self.forward_with(
            input_ids,
            attention_mask,
            token_type_ids,
            ForwardOptions::default(),
        )
        .logits
    }

    /// Pooler and classifier on the encoder output: (pooled `[batch, hidden]`, logits
    /// `[batch, num_labels]`).
    pub fn head(&self, x: Tensor<3>) -> (Tensor<2>, Tensor<2>) {
        let [batch, _, hidden] = x.dims();
        let cls = x.slice([0..batch, 0..1]).reshape([batch, hidden]);
        // Burn's Linear on 2-D inputs for float f32 heads (as before quantization existed).
        let head = |l: &Linear, q: &Option<LinearQuant>, x: Tensor<2>| match q {
            None if autocast::compute_dtype().is_none() => l.forward(x),
            _ => linear2(l, q, x),
        };
        let p = &self.bert.pooler;
        let pooled = tanh(head(&p.dense, &p.dense_quant, cls));
        let logits = head(
            &self.classifier,
            &self.classifier_quant,
            dropout(&self.dropout, pooled.clone()),
        );
        (pooled, logits)
    }

    /// Full forward pass, collecting what `opts` asks for.
    ///
    /// # Shapes
    /// See [`BertOutputs`].
    pub fn forward_with(
        &self,
        input_ids: Tensor<2, Int>,
        attention_mask: Tensor<2>,
        token_type_ids: Tensor<2, Int>,
        opts: ForwardOptions,
    ) -> BertOutputs {
        let [batch, seq] = input_ids.dims();
        let mask_bias = attention_mask
            .neg()
            .add_scalar(1.0)
            .mul_scalar(MASK_BIAS)
            .reshape([batch, 1, 1, seq]);
        let mut x = self.bert.embeddings.forward(input_ids, token_type_ids);
        let mut hidden_states = Vec::new();
        let mut attentions = Vec::new();
        let mut attention_scores = Vec::new();
        if opts.hidden_states {
            hidden_states.push(x.clone());
        }
        for layer in &self.bert.encoder.layer {
            let (out, scores, probs) = layer.forward(x, mask_bias.clone(), opts.attention_scores);
            x = out;
            attention_scores.extend(scores);
            if opts.hidden_states {
                hidden_states.push(x.clone());
            }
            if opts.attentions {
                attentions.push(probs);
            }
        }
        let (pooled, logits) = self.head(x.clone());
        BertOutputs {
            logits,
            last_hidden_state: x,
            pooled,
            hidden_states,
            attentions,
            attention_scores,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data().try_to_vec().unwrap()
    }

    #[test]
    fn random_init_follows_initializer_range_with_zero_biases() {
        let mut c = BertConfig::tiny(2000, 2);
        c.initializer_range = 0.05;
        let m = BertForSequenceClassification::new(&c, &Device::flex());
        let w = values(m.bert.embeddings.word_embeddings.weight.val());
        let n = w.len() as f64;
        let mean = w.iter().map(|&x| x as f64).sum::<f64>() / n;
        let std = (w.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
        // 64,000 draws: the sample std is within ~1% of 0.05 (Burn's default would give 1.0).
        assert!((std - 0.05).abs() < 0.002, "word-embedding std {std}");
        assert!(mean.abs() < 0.002, "mean {mean}");
        let q = values(
            m.bert.encoder.layer[0]
                .attention
                .self_attn
                .query
                .weight
                .val(),
        );
        let n = q.len() as f64;
        let std = (q.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / n).sqrt();
        assert!((std - 0.05).abs() < 0.01, "query weight std {std}");
        for bias in [
            m.bert.encoder.layer[1].output.dense.bias.as_ref(),
            m.classifier.bias.as_ref(),
        ] {
            let b = values(bias.expect("bias").val());
            assert!(b.iter().all(|&x| x == 0.0), "bias starts at zero: {b:?}");
        }
    }
}
