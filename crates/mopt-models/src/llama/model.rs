//! The Llama decoder with its language-model head, written with Burn modules.
//!
//! Struct paths mirror Hugging Face `LlamaForCausalLM` keys (`model.layers.0.self_attn.q_proj`,
//! `model.layers.0.mlp.gate_proj`, `model.norm`, `lm_head`), so a checkpoint loads by walking
//! them. Each layer holds its own query heads, key/value heads and FFN width (pruned models):
//! Q projects to `heads × head_dim`, K and V to `kv_heads × head_dim`, neither tied to
//! `hidden_size`.
//!
//! The pieces, as transformers' `modeling_llama.py` computes them:
//! - RMSNorm: `w · x / √(mean(x²) + ε)` ([`LlamaRmsNorm`]);
//! - rotary embeddings in the "rotate half" layout: frequency `i` of a head rotates the pair
//!   of columns `(i, i + d/2)` by `position · θ^(−2i/d)` ([`RotaryEmbedding`]);
//! - grouped-query attention: query head `j` reads key/value head `j / (heads / kv_heads)`,
//!   scaled by `1/√d`, causally masked ([`LlamaAttention`]);
//! - SwiGLU FFN: `down(silu(gate(x)) · up(x))` ([`LlamaMlp`]);
//! - pre-norm residual blocks ([`LlamaDecoderLayer`]), a final RMSNorm, and a head that reuses
//!   the embedding table when `tie_word_embeddings` ([`LlamaForCausalLM`]).
//!
//! Projections have no biases (Llama's `attention_bias = mlp_bias = false`).
//!
//! Each of a layer's seven projections has an `Option<LinearQuant>` beside it (`q_proj` →
//! `q_proj_quant`; `None`: float), set when the config records a quantization
//! ([`LlamaConfig::mopt_quant`]): the projection then fake-quantizes its input (per tensor) and
//! its weight (per output channel) before the product, as BERT's do (see `super::quant`).

use burn::module::Param;
use burn::nn::{Embedding, EmbeddingConfig, Initializer, Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::activation::silu;
use mopt_core::Quantizable;
use mopt_kernels::autocast::matmul;
use mopt_quant::node::{LinearQuant, Phase};

use super::cache::{KvCache, LayerCache};
use super::config::LlamaConfig;

/// Added to the attention scores of future positions.
pub const MASKED: f32 = f32::NEG_INFINITY;

fn normal(c: &LlamaConfig) -> Initializer {
    Initializer::Normal {
        mean: 0.0,
        std: c.initializer_range,
    }
}

/// A bias-free linear layer initialised like HF Llama: weights ~ N(0, `initializer_range`).
fn dense(d_in: usize, d_out: usize, c: &LlamaConfig, device: &Device) -> Linear {
    LinearConfig::new(d_in, d_out)
        .with_bias(false)
        .with_initializer(normal(c))
        .init(device)
}

/// `x · W` over the last dimension of `[batch, seq, d_in]`, as one 2-D GEMM over all rows
/// (Burn's `Linear` on a 3-D input runs one small GEMM per batch entry). With quantizers `q`,
/// the input and the weight go through them first (and the output after, where the config
/// quantizes it), each acting by its phase: calibration observes the input with the weight's
/// off, a quantized model fake-quantizes both, or runs the product in integers once packed.
///
/// # Shapes
/// - x: `[batch, seq, d_in]`; weight `[d_in, d_out]`; output: `[batch, seq, d_out]`
fn linear(l: &Linear, q: &Option<LinearQuant>, x: Tensor<3>) -> Tensor<3> {
    let [b, s, d] = x.dims();
    let x = x.reshape([b * s, d]);
    // Packed for inference: the product in integers (`Quantizable::with_integer_kernels`).
    let packed = q.as_ref().and_then(|q| q.integer_forward(x.clone()));
    let y = match (packed, q) {
        (Some(y), _) => y,
        (None, Some(q)) => {
            let y = matmul(q.input.forward(x), q.weight.forward(l.weight.val()));
            match &q.output {
                Some(o) => o.forward(y),
                None => y,
            }
        }
        (None, None) => matmul(x, l.weight.val()),
    };
    let n = y.dims()[1];
    y.reshape([b, s, n])
}

/// Root-mean-square normalisation with a learned scale (no mean subtraction, no bias).
#[derive(Module, Debug)]
pub struct LlamaRmsNorm {
    /// The scale `[d]`.
    pub weight: Param<Tensor<1>>,
    /// Added to the mean square (`rms_norm_eps`).
    pub eps: f64,
}

impl LlamaRmsNorm {
    /// A norm over `d` features with unit scale.
    pub fn new(d: usize, eps: f64, device: &Device) -> Self {
        Self {
            weight: Param::from_tensor(Tensor::ones([d], device)),
            eps,
        }
    }

    /// `weight · x · (mean(x²) + eps)^(−½)` over the last dimension.
    ///
    /// # Shapes
    /// - x, output: `[.., d]`
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let inv_rms = x
            .clone()
            .square()
            .mean_dim(D - 1)
            .add_scalar(self.eps)
            .sqrt()
            .recip();
        x * inv_rms * self.weight.val().unsqueeze()
    }
}

/// Rotary position embeddings, HF's "rotate half" layout: the angle of frequency `i` turns the
/// pair of columns `(i, i + d/2)` of every head. (llama.cpp's GGUF files store Q and K rows
/// permuted for its interleaved layout, pairs `(2i, 2i + 1)`; the GGUF loader undoes that.)
#[derive(Module, Debug)]
pub struct RotaryEmbedding {
    /// Width of one head (the rotated width: Llama rotates all of it).
    pub head_dim: usize,
    /// The base `θ` (`rope_theta`).
    pub theta: f64,
}

impl RotaryEmbedding {
    /// Inverse frequencies `θ^(−2i/d)` for `i < d/2`, in f32 as transformers computes them.
    pub fn inv_freq(&self) -> Vec<f32> {
        let d = self.head_dim;
        (0..d / 2)
            .map(|i| 1.0 / (self.theta as f32).powf((2 * i) as f32 / d as f32))
            .collect()
    }

    /// The cosine and sine tables of positions `offset..offset + seq`: row `p`, columns `i` and
    /// `i + d/2` hold `cos`/`sin` of `(offset + p) · inv_freq[i]`.
    ///
    /// # Shapes
    /// - output: (`[seq, head_dim]`, `[seq, head_dim]`)
    pub fn tables(&self, offset: usize, seq: usize, device: &Device) -> (Tensor<2>, Tensor<2>) {
        let (d, inv) = (self.head_dim, self.inv_freq());
        let mut cos = Vec::with_capacity(seq * d);
        let mut sin = Vec::with_capacity(seq * d);
        for p in offset..offset + seq {
            let angles: Vec<f32> = inv.iter().map(|f| p as f32 * f).collect();
            for _half in 0..2 {
                cos.extend(angles.iter().map(|a| a.cos()));
                sin.extend(angles.iter().map(|a| a.sin()));
            }
        }
        let table = |v: Vec<f32>| Tensor::from_data(TensorData::new(v, [seq, d]), device);
        (table(cos), table(sin))
    }

    /// `x · cos + rotate_half(x) · sin`, per head.
    ///
    /// # Shapes
    /// - x: `[batch, heads, seq, head_dim]`; cos, sin: `[seq, head_dim]` → like x
    pub fn apply(x: Tensor<4>, cos: &Tensor<2>, sin: &Tensor<2>) -> Tensor<4> {
        let rotated = rotate_half(x.clone());
        x * cos.clone().unsqueeze() + rotated * sin.clone().unsqueeze()
    }
}

/// `[x₁, x₂] → [−x₂, x₁]` over the halves of the last dimension.
///
/// # Shapes
/// - x, output: `[batch, heads, seq, head_dim]`
pub fn rotate_half(x: Tensor<4>) -> Tensor<4> {
    let half = x.dims()[3] / 2;
    let x1 = x.clone().narrow(3, 0, half);
    let x2 = x.narrow(3, half, half);
    Tensor::cat(vec![x2.neg(), x1], 3)
}

/// The additive causal mask of `seq` queries at positions `total − seq..total` over `total`
/// keys: 0 where the key is at or before the query, [`MASKED`] after it. `None` for a single
/// query (it sees every key).
///
/// # Shapes
/// - output: `[1, 1, seq, total]`
pub fn causal_bias(seq: usize, total: usize, device: &Device) -> Option<Tensor<4>> {
    if seq <= 1 {
        return None;
    }
    let past = total - seq;
    let bias: Vec<f32> = (0..seq)
        .flat_map(|i| (0..total).map(move |j| if j <= past + i { 0.0 } else { MASKED }))
        .collect();
    Some(Tensor::from_data(
        TensorData::new(bias, [1, 1, seq, total]),
        device,
    ))
}

/// Grouped-query self-attention with rotary embeddings.
#[derive(Module, Debug)]
pub struct LlamaAttention {
    /// Query projection `[hidden, heads × head_dim]`.
    pub q_proj: Linear,
    /// Key projection `[hidden, kv_heads × head_dim]`.
    pub k_proj: Linear,
    /// Value projection `[hidden, kv_heads × head_dim]`.
    pub v_proj: Linear,
    /// Output projection `[heads × head_dim, hidden]`.
    pub o_proj: Linear,
    /// The query projection's quantizers, when quantized.
    pub q_proj_quant: Option<LinearQuant>,
    /// The key projection's quantizers, when quantized.
    pub k_proj_quant: Option<LinearQuant>,
    /// The value projection's quantizers, when quantized.
    pub v_proj_quant: Option<LinearQuant>,
    /// The output projection's quantizers, when quantized.
    pub o_proj_quant: Option<LinearQuant>,
    /// Query heads of this layer.
    pub num_heads: usize,
    /// Key/value heads of this layer (`num_heads` is a multiple of it).
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
}

impl LlamaAttention {
    fn new(c: &LlamaConfig, i: usize, device: &Device) -> Self {
        let (h, kv, d) = (c.heads(i), c.kv_heads(i), c.head_dim());
        Self {
            q_proj: dense(c.hidden_size, h * d, c, device),
            k_proj: dense(c.hidden_size, kv * d, c, device),
            v_proj: dense(c.hidden_size, kv * d, c, device),
            o_proj: dense(h * d, c.hidden_size, c, device),
            q_proj_quant: None,
            k_proj_quant: None,
            v_proj_quant: None,
            o_proj_quant: None,
            num_heads: h,
            num_kv_heads: kv,
            head_dim: d,
        }
    }

    /// Attention of `x`'s positions over the cached ones and themselves. With a cache, this
    /// call's keys and values (after RoPE) are appended to it.
    ///
    /// # Shapes
    /// - x: `[batch, seq, hidden]`
    /// - cos, sin: `[seq, head_dim]` (the tables of this call's positions)
    /// - bias: `[1, 1, seq, past + seq]` (the causal mask; `None` for one query)
    /// - output: `[batch, seq, hidden]`
    pub fn forward(
        &self,
        x: Tensor<3>,
        rope: (&Tensor<2>, &Tensor<2>),
        bias: Option<Tensor<4>>,
        cache: Option<&mut LayerCache>,
    ) -> Tensor<3> {
        self.project(self.context(x, rope, bias, cache))
    }

    /// The output projection of the heads' concatenated context.
    ///
    /// # Shapes
    /// - ctx: `[batch, seq, heads × head_dim]`
    /// - output: `[batch, seq, hidden]`
    pub fn project(&self, ctx: Tensor<3>) -> Tensor<3> {
        linear(&self.o_proj, &self.o_proj_quant, ctx)
    }

    /// The attention's heads before the output projection: head `j`'s context in columns
    /// `j·head_dim ..`. Arguments as [`LlamaAttention::forward`].
    ///
    /// # Shapes
    /// - x: `[batch, seq, hidden]`
    /// - output: `[batch, seq, heads × head_dim]`
    pub fn context(
        &self,
        x: Tensor<3>,
        (cos, sin): (&Tensor<2>, &Tensor<2>),
        bias: Option<Tensor<4>>,
        cache: Option<&mut LayerCache>,
    ) -> Tensor<3> {
        let [b, s, _] = x.dims();
        let (h, kv, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let group = h / kv;
        let heads = |t: Tensor<3>, n: usize| t.reshape([b, s, n, d]).swap_dims(1, 2);
        let q = heads(linear(&self.q_proj, &self.q_proj_quant, x.clone()), h);
        let k = heads(linear(&self.k_proj, &self.k_proj_quant, x.clone()), kv);
        let v = heads(linear(&self.v_proj, &self.v_proj_quant, x), kv);
        let q = RotaryEmbedding::apply(q, cos, sin);
        let k = RotaryEmbedding::apply(k, cos, sin);
        let (k, v) = match cache {
            Some(cache) => cache.append(k, v),
            None => (k, v),
        };
        let t = k.dims()[2];
        // Query heads kv·group + j (j < group) share key/value head kv: stack each group's
        // queries as rows of one matrix instead of repeating K and V.
        let q = q.reshape([b, kv, group * s, d]);
        let scores = matmul(q, k.swap_dims(2, 3))
            .reshape([b, h, s, t])
            .mul_scalar(1.0 / (d as f32).sqrt());
        let scores = match bias {
            Some(bias) => scores + bias,
            None => scores,
        };
        let probs = mopt_kernels::softmax(scores, 3).reshape([b, kv, group * s, t]);
        matmul(probs, v)
            .reshape([b, h, s, d])
            .swap_dims(1, 2)
            .reshape([b, s, h * d])
    }
}

/// The SwiGLU feed-forward block.
#[derive(Module, Debug)]
pub struct LlamaMlp {
    /// Gate projection `[hidden, ffn]` (through SiLU).
    pub gate_proj: Linear,
    /// Up projection `[hidden, ffn]`.
    pub up_proj: Linear,
    /// Down projection `[ffn, hidden]`.
    pub down_proj: Linear,
    /// The gate projection's quantizers, when quantized.
    pub gate_proj_quant: Option<LinearQuant>,
    /// The up projection's quantizers, when quantized.
    pub up_proj_quant: Option<LinearQuant>,
    /// The down projection's quantizers, when quantized.
    pub down_proj_quant: Option<LinearQuant>,
}

impl LlamaMlp {
    fn new(c: &LlamaConfig, i: usize, device: &Device) -> Self {
        let (h, f) = (c.hidden_size, c.ffn(i));
        Self {
            gate_proj: dense(h, f, c, device),
            up_proj: dense(h, f, c, device),
            down_proj: dense(f, h, c, device),
            gate_proj_quant: None,
            up_proj_quant: None,
            down_proj_quant: None,
        }
    }

    /// `down(silu(gate(x)) · up(x))`.
    ///
    /// # Shapes
    /// - x, output: `[batch, seq, hidden]`
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        self.down(self.gated(x))
    }

    /// The neurons' values, `silu(gate(x)) · up(x)`.
    ///
    /// # Shapes
    /// - x: `[batch, seq, hidden]`
    /// - output: `[batch, seq, ffn]`
    pub fn gated(&self, x: Tensor<3>) -> Tensor<3> {
        let gate = silu(linear(&self.gate_proj, &self.gate_proj_quant, x.clone()));
        let up = linear(&self.up_proj, &self.up_proj_quant, x);
        gate * up
    }

    /// The down projection of the neurons' values.
    ///
    /// # Shapes
    /// - x: `[batch, seq, ffn]`
    /// - output: `[batch, seq, hidden]`
    pub fn down(&self, x: Tensor<3>) -> Tensor<3> {
        linear(&self.down_proj, &self.down_proj_quant, x)
    }
}

/// One pre-norm decoder layer: `x + attn(norm(x))`, then `h + mlp(norm(h))`.
#[derive(Module, Debug)]
pub struct LlamaDecoderLayer {
    /// The attention.
    pub self_attn: LlamaAttention,
    /// The FFN.
    pub mlp: LlamaMlp,
    /// RMSNorm before the attention.
    pub input_layernorm: LlamaRmsNorm,
    /// RMSNorm before the FFN.
    pub post_attention_layernorm: LlamaRmsNorm,
}

impl LlamaDecoderLayer {
    fn new(c: &LlamaConfig, i: usize, device: &Device) -> Self {
        Self {
            self_attn: LlamaAttention::new(c, i, device),
            mlp: LlamaMlp::new(c, i, device),
            input_layernorm: LlamaRmsNorm::new(c.hidden_size, c.rms_norm_eps, device),
            post_attention_layernorm: LlamaRmsNorm::new(c.hidden_size, c.rms_norm_eps, device),
        }
    }

    /// # Shapes
    /// - x, output: `[batch, seq, hidden]`; rope tables and bias as [`LlamaAttention::forward`]
    pub fn forward(
        &self,
        x: Tensor<3>,
        rope: (&Tensor<2>, &Tensor<2>),
        bias: Option<Tensor<4>>,
        cache: Option<&mut LayerCache>,
    ) -> Tensor<3> {
        let attn =
            self.self_attn
                .forward(self.input_layernorm.forward(x.clone()), rope, bias, cache);
        let h = x + attn;
        let ffn = self
            .mlp
            .forward(self.post_attention_layernorm.forward(h.clone()));
        h + ffn
    }
}

/// The embeddings, the decoder layers and the final norm (HF `LlamaModel`).
#[derive(Module, Debug)]
pub struct LlamaModel {
    /// The token table `[vocab, hidden]`.
    pub embed_tokens: Embedding,
    /// The layers, in order.
    pub layers: Vec<LlamaDecoderLayer>,
    /// The final RMSNorm.
    pub norm: LlamaRmsNorm,
    /// The rotary embedding every layer uses.
    pub rope: RotaryEmbedding,
}

impl LlamaModel {
    /// The final hidden states of `input_ids`, the positions following the cache's (0 without
    /// one). With a cache, every layer's keys and values are appended to it.
    ///
    /// # Shapes
    /// - input_ids: `[batch, seq]`
    /// - output: `[batch, seq, hidden]` (after the final norm)
    ///
    /// # Panics
    /// When the cache was made for another number of layers or another batch size.
    pub fn forward(&self, input_ids: Tensor<2, Int>, mut cache: Option<&mut KvCache>) -> Tensor<3> {
        let [_, seq] = input_ids.dims();
        let device = input_ids.device();
        let past = cache.as_ref().map_or(0, |c| c.len());
        if let Some(c) = &cache {
            assert_eq!(
                c.num_layers(),
                self.layers.len(),
                "the KV cache was made for {} layers, the model has {}",
                c.num_layers(),
                self.layers.len()
            );
        }
        let (cos, sin) = self.rope.tables(past, seq, &device);
        let bias = causal_bias(seq, past + seq, &device);
        let mut x = self.embed_tokens.forward(input_ids);
        for (i, layer) in self.layers.iter().enumerate() {
            let layer_cache = cache.as_deref_mut().map(|c| c.layer_mut(i));
            x = layer.forward(x, (&cos, &sin), bias.clone(), layer_cache);
        }
        if let Some(c) = cache {
            c.advance(seq);
        }
        self.norm.forward(x)
    }
}

/// HF `LlamaForCausalLM`: the decoder and a head onto the vocabulary.
#[derive(Module, Debug)]
pub struct LlamaForCausalLM {
    /// The decoder.
    pub model: LlamaModel,
    /// The head `[hidden, vocab]`; `None` when tied to `model.embed_tokens`.
    pub lm_head: Option<Linear>,
}

impl LlamaForCausalLM {
    /// Random initialisation of the shape `config` describes (weights ~ N(0,
    /// `initializer_range`), norms at one), with quantizers (placeholder scales, phase
    /// `Quantize`) on the projections `config.mopt_quant` lists: what a quantized checkpoint's
    /// weights and scales load into.
    ///
    /// # Panics
    /// When `config.check()` fails.
    pub fn new(config: &LlamaConfig, device: &Device) -> Self {
        if let Err(e) = config.check() {
            panic!("invalid Llama config: {e}");
        }
        let c = config;
        let mut m = Self {
            model: LlamaModel {
                embed_tokens: EmbeddingConfig::new(c.vocab_size, c.hidden_size)
                    .with_initializer(normal(c))
                    .init(device),
                layers: (0..c.num_hidden_layers)
                    .map(|i| LlamaDecoderLayer::new(c, i, device))
                    .collect(),
                norm: LlamaRmsNorm::new(c.hidden_size, c.rms_norm_eps, device),
                rope: RotaryEmbedding {
                    head_dim: c.head_dim(),
                    theta: c.rope_theta,
                },
            },
            lm_head: (!c.tie_word_embeddings)
                .then(|| dense(c.hidden_size, c.vocab_size, c, device)),
        };
        if let Some(q) = &c.mopt_quant {
            m.attach_quantizers(q, Phase::Quantize, device);
        }
        m
    }

    /// Decoder layers.
    pub fn num_layers(&self) -> usize {
        self.model.layers.len()
    }

    /// An empty KV cache for this model.
    pub fn new_cache(&self) -> KvCache {
        KvCache::new(self.num_layers())
    }

    /// Next-token logits at every position of `input_ids`, recomputed from scratch.
    ///
    /// # Shapes
    /// - input_ids: `[batch, seq]`
    /// - output: `[batch, seq, vocab]`
    pub fn forward(&self, input_ids: Tensor<2, Int>) -> Tensor<3> {
        self.head(self.model.forward(input_ids, None))
    }

    /// Next-token logits of `input_ids`, the positions following those in `cache`, whose keys
    /// and values are reused and extended (incremental decoding).
    ///
    /// # Shapes
    /// - input_ids: `[batch, seq]` (the batch the cache was started with)
    /// - output: `[batch, seq, vocab]`
    pub fn forward_cached(&self, input_ids: Tensor<2, Int>, cache: &mut KvCache) -> Tensor<3> {
        self.head(self.model.forward(input_ids, Some(cache)))
    }

    /// The head on final hidden states: `h · Eᵀ` (tied) or `lm_head(h)`; always float (the
    /// head is no quantization slot: see `super::quant`).
    ///
    /// # Shapes
    /// - hidden: `[batch, seq, hidden]`
    /// - output: `[batch, seq, vocab]`
    pub fn head(&self, hidden: Tensor<3>) -> Tensor<3> {
        match &self.lm_head {
            Some(head) => linear(head, &None, hidden),
            None => {
                let [b, s, d] = hidden.dims();
                let table = self.model.embed_tokens.weight.val();
                let vocab = table.dims()[0];
                matmul(hidden.reshape([b * s, d]), table.transpose()).reshape([b, s, vocab])
            }
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
    fn rms_norm_matches_its_formula() {
        let device = Device::flex();
        let mut norm = LlamaRmsNorm::new(4, 1e-5, &device);
        norm.weight = Param::from_tensor(Tensor::from_floats([1.0, 2.0, 0.5, -1.0], &device));
        let x = Tensor::<2>::from_floats([[1.0, -2.0, 3.0, 4.0]], &device);
        let got = values(norm.forward(x));
        let rms = ((1.0f32 + 4.0 + 9.0 + 16.0) / 4.0 + 1e-5).sqrt();
        let want = [1.0 / rms, -4.0 / rms, 1.5 / rms, -4.0 / rms];
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{got:?} vs {want:?}");
        }
    }

    /// RoPE rotates the pair (i, i + d/2) by p·θ^(−2i/d): at position 0 it is the identity,
    /// it keeps each pair's norm, and q·k depends only on the distance between positions.
    #[test]
    fn rope_rotates_half_pairs_by_relative_position() {
        let device = Device::flex();
        let rope = RotaryEmbedding {
            head_dim: 8,
            theta: 100.0,
        };
        let x = Tensor::<4>::random(
            [1, 1, 1, 8],
            burn::tensor::Distribution::Normal(0.0, 1.0),
            &device,
        );
        let y = Tensor::<4>::random(
            [1, 1, 1, 8],
            burn::tensor::Distribution::Normal(0.0, 1.0),
            &device,
        );
        let at = |t: &Tensor<4>, p: usize| {
            let (cos, sin) = rope.tables(p, 1, &device);
            values(RotaryEmbedding::apply(t.clone(), &cos, &sin))
        };
        let x0 = values(x.clone());
        assert_eq!(at(&x, 0), x0);
        let x5 = at(&x, 5);
        // Pair (1, 5) turned by 5·100^(−2/8).
        let a = 5.0f32 * 100f32.powf(-0.25);
        let want = [
            x0[1] * a.cos() - x0[5] * a.sin(),
            x0[5] * a.cos() + x0[1] * a.sin(),
        ];
        assert!((x5[1] - want[0]).abs() < 1e-5 && (x5[5] - want[1]).abs() < 1e-5);
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(p, q)| p * q).sum::<f32>();
        let d1 = dot(&at(&x, 7), &at(&y, 3));
        let d2 = dot(&at(&x, 14), &at(&y, 10));
        assert!((d1 - d2).abs() < 1e-4, "{d1} vs {d2}");
    }

    #[test]
    fn causal_bias_hides_only_later_keys() {
        let device = Device::flex();
        assert!(causal_bias(1, 5, &device).is_none());
        let b = values(causal_bias(2, 4, &device).unwrap());
        // Queries at positions 2 and 3 over keys 0..4.
        assert_eq!(&b[..4], &[0.0, 0.0, 0.0, MASKED]);
        assert_eq!(&b[4..], &[0.0, 0.0, 0.0, 0.0]);
    }
}
