//! Llama → ONNX (opset 17), as two graphs a deployment chains for generation:
//!
//! - `model.onnx` (prefill): `input_ids` `[batch, sequence]` → `logits` `[batch, sequence,
//!   vocab]` and every layer's keys and values after RoPE, `present.{i}.key` / `.value`
//!   `[batch, kv_heads_i, sequence, head_dim]`;
//! - `decoder_with_past.onnx` (decode): the same plus `past_key_values.{i}.key` / `.value`
//!   `[batch, kv_heads_i, past_sequence, head_dim]`; the new tokens sit at positions
//!   `past_sequence..`, attend to the past and causally to each other, and the presents are
//!   the past with the new keys and values appended.
//!
//! The arithmetic is the model's (`super::model`): RMSNorm as `x · (√(mean(x²) + ε))⁻¹ · w`;
//! RoPE in the rotate-half layout with angles `position · inv_freq` computed in f32; grouped
//! query attention with the queries of a KV group stacked as rows of one product (no repeated
//! keys), scaled by `1/√d`, an additive causal mask of `−∞`, softmax; SwiGLU as
//! `gate · sigmoid(gate) · up`; the tied head reads the embedding table through a `Transpose`
//! (stored once). Each layer keeps its own head, KV-head and FFN counts, so pruned models
//! export as they are. A quantized model's seven projections a layer are QDQ
//! ([`mopt_export::qdq::linear`]): int8 weights with per-channel scales, inputs through
//! Q/DQ with their calibrated per-tensor scale. No attention mask input: every sequence of a
//! batch is whole (no padding), as the training windows are.

use std::path::Path;

use burn::prelude::*;
use mopt_data::TokenWindows;
use mopt_export::export::OUTPUT;
use mopt_export::graph::{data, dims, int, ints, GraphBuilder};
use mopt_export::onnx::{dtype, value_info, Dim, ModelProto};
use mopt_export::qdq::{linear, QdqCache};
use mopt_export::{tensor_json, ExportError, Exportable, InputSpec, InputType, QdqParity};
use mopt_quant::node::QuantConfig;
use serde_json::{json, Map, Value};

use super::config::LlamaConfig;
use super::model::{LlamaDecoderLayer, LlamaForCausalLM, LlamaRmsNorm};

/// The decode graph's file name, beside `model.onnx`.
pub const DECODER_WITH_PAST: &str = "decoder_with_past.onnx";

/// The token ids input.
pub const INPUT_IDS: &str = "input_ids";

/// Layer `i`'s cache input of `kind` (`key`, `value`).
pub fn past_name(i: usize, kind: &str) -> String {
    format!("past_key_values.{i}.{kind}")
}

/// Layer `i`'s cache output of `kind`.
pub fn present_name(i: usize, kind: &str) -> String {
    format!("present.{i}.{kind}")
}

struct Writer {
    g: GraphBuilder,
    cache: QdqCache,
}

/// Positions, rotary tables and the causal mask of the new tokens.
struct Frame {
    cos: String,
    sin: String,
    mask: String,
}

impl Writer {
    fn rms(&mut self, x: &str, n: &LlamaRmsNorm, name: &str) -> String {
        let g = &mut self.g;
        let eps = g.scalar(&format!("{name}.eps"), n.eps as f32);
        let w = g.f32s(
            &format!("{name}.weight"),
            &dims(&n.weight),
            &data(&n.weight),
        );
        let sq = g.op("Mul", &[x, x], vec![], &format!("{name}.square"));
        let ms = g.op(
            "ReduceMean",
            &[&sq],
            vec![ints("axes", &[-1]), int("keepdims", 1)],
            &format!("{name}.mean"),
        );
        let a = g.op("Add", &[&ms, &eps], vec![], &format!("{name}.add"));
        let r = g.op("Sqrt", &[&a], vec![], &format!("{name}.sqrt"));
        let inv = g.op("Reciprocal", &[&r], vec![], &format!("{name}.inv"));
        let y = g.op("Mul", &[x, &inv], vec![], &format!("{name}.scaled"));
        g.op("Mul", &[&y, &w], vec![], &format!("{name}.out"))
    }

    /// The positions `past..past + seq` (`past` from layer 0's cache input, else 0), their
    /// cosine and sine tables `[seq, head_dim]` and the additive causal mask `[seq, past + seq]`.
    fn frame(&mut self, model: &LlamaForCausalLM, with_past: bool) -> Frame {
        let g = &mut self.g;
        let i1 = g.i64s("const_index_1", &[], &[1]);
        let (zero, one) = (
            g.i64s("const_i64_0", &[], &[0]),
            g.i64s("const_i64_1", &[], &[1]),
        );
        let ids_shape = g.op("Shape", &[INPUT_IDS], vec![], "ids_shape");
        let seq = g.op(
            "Gather",
            &[&ids_shape, &i1],
            vec![int("axis", 0)],
            "seq_len",
        );
        let past = match with_past {
            true => {
                let i2 = g.i64s("const_index_2", &[], &[2]);
                let s = g.op("Shape", &[&past_name(0, "key")], vec![], "past_shape");
                g.op("Gather", &[&s, &i2], vec![int("axis", 0)], "past_len")
            }
            false => zero.clone(),
        };
        let total = g.op("Add", &[&past, &seq], vec![], "total_len");
        let pos = g.op("Range", &[&past, &total, &one], vec![], "positions");
        let keys = g.op("Range", &[&zero, &total, &one], vec![], "key_positions");
        let (axes0, axes1) = (g.shape("const_axes_0", &[0]), g.shape("const_axes_1", &[1]));
        let pos_col = g.op("Unsqueeze", &[&pos, &axes1], vec![], "positions_col");
        let keys_row = g.op("Unsqueeze", &[&keys, &axes0], vec![], "key_positions_row");
        let future = g.op("Greater", &[&keys_row, &pos_col], vec![], "future");
        let masked = g.scalar("const_masked", super::model::MASKED);
        let open = g.scalar("const_zero", 0.0);
        let mask = g.op("Where", &[&future, &masked, &open], vec![], "causal_mask");
        let inv = model.model.rope.inv_freq();
        let inv = g.f32s("rope.inv_freq", &[1, inv.len()], &inv);
        let posf = g.op(
            "Cast",
            &[&pos_col],
            vec![int("to", dtype::FLOAT as i64)],
            "positions_f32",
        );
        let angles = g.op("Mul", &[&posf, &inv], vec![], "rope.angles");
        let mut table = |op: &str| {
            let t = g.op(op, &[&angles], vec![], &format!("rope.{op}"));
            g.op(
                "Concat",
                &[&t, &t],
                vec![int("axis", 1)],
                &format!("rope.{op}_table"),
            )
        };
        let (cos, sin) = (table("Cos"), table("Sin"));
        Frame { cos, sin, mask }
    }

    /// `x · cos + rotate_half(x) · sin` on `[batch, heads, seq, head_dim]`.
    fn rope(&mut self, x: &str, f: &Frame, d: usize, name: &str) -> String {
        let g = &mut self.g;
        let axes = g.shape("const_axes_3", &[3]);
        let (s0, s1, s2) = (
            g.shape("const_start_0", &[0]),
            g.shape(&format!("const_half_{d}"), &[(d / 2) as i64]),
            g.shape(&format!("const_end_{d}"), &[d as i64]),
        );
        let x1 = g.op(
            "Slice",
            &[x, &s0, &s1, &axes],
            vec![],
            &format!("{name}.x1"),
        );
        let x2 = g.op(
            "Slice",
            &[x, &s1, &s2, &axes],
            vec![],
            &format!("{name}.x2"),
        );
        let n2 = g.op("Neg", &[&x2], vec![], &format!("{name}.neg"));
        let rot = g.op(
            "Concat",
            &[&n2, &x1],
            vec![int("axis", 3)],
            &format!("{name}.rot"),
        );
        let a = g.op("Mul", &[x, &f.cos], vec![], &format!("{name}.cos"));
        let b = g.op("Mul", &[&rot, &f.sin], vec![], &format!("{name}.sin"));
        g.op("Add", &[&a, &b], vec![], &format!("{name}.out"))
    }

    /// `[batch, seq, n·d]` → `[batch, n, seq, d]`.
    fn heads(&mut self, x: &str, n: usize, d: usize, name: &str) -> String {
        let g = &mut self.g;
        let s = g.shape(
            &format!("const_shape_heads_{n}_{d}"),
            &[0, 0, n as i64, d as i64],
        );
        let r = g.op("Reshape", &[x, &s], vec![], &format!("{name}.split"));
        g.op(
            "Transpose",
            &[&r],
            vec![ints("perm", &[0, 2, 1, 3])],
            &format!("{name}.heads"),
        )
    }

    fn layer(&mut self, l: &LlamaDecoderLayer, i: usize, x: &str, f: &Frame, past: bool) -> String {
        let p = format!("model.layers.{i}");
        let a = &l.self_attn;
        let (h, kv, d) = (a.num_heads, a.num_kv_heads, a.head_dim);
        let hn = self.rms(x, &l.input_layernorm, &format!("{p}.input_layernorm"));
        let sa = format!("{p}.self_attn");
        let q = self.linear_named(&hn, &a.q_proj, &a.q_proj_quant, &format!("{sa}.q_proj"));
        let k = self.linear_named(&hn, &a.k_proj, &a.k_proj_quant, &format!("{sa}.k_proj"));
        let v = self.linear_named(&hn, &a.v_proj, &a.v_proj_quant, &format!("{sa}.v_proj"));
        let q = self.heads(&q, h, d, &format!("{p}.q"));
        let k = self.heads(&k, kv, d, &format!("{p}.k"));
        let v = self.heads(&v, kv, d, &format!("{p}.v"));
        let q = self.rope(&q, f, d, &format!("{p}.q_rope"));
        let k = self.rope(&k, f, d, &format!("{p}.k_rope"));
        let g = &mut self.g;
        for (t, kind) in [(&k, "key"), (&v, "value")] {
            let out = present_name(i, kind);
            match past {
                true => g.op_into(
                    "Concat",
                    &[&past_name(i, kind), t],
                    vec![int("axis", 2)],
                    &out,
                ),
                false => g.op_into("Identity", &[t], vec![], &out),
            }
        }
        let (k, v) = (present_name(i, "key"), present_name(i, "value"));
        let stacked = g.shape(
            &format!("const_shape_kv_{kv}_{d}"),
            &[0, kv as i64, -1, d as i64],
        );
        let q = g.op("Reshape", &[&q, &stacked], vec![], &format!("{p}.q_groups"));
        let kt = g.op(
            "Transpose",
            &[&k],
            vec![ints("perm", &[0, 1, 3, 2])],
            &format!("{p}.kt"),
        );
        let scores = g.op("MatMul", &[&q, &kt], vec![], &format!("{p}.scores"));
        let by_head = g.shape(&format!("const_shape_scores_{h}"), &[0, h as i64, -1, 0]);
        let scores = g.op(
            "Reshape",
            &[&scores, &by_head],
            vec![],
            &format!("{p}.scores_heads"),
        );
        let scale = g.scalar(&format!("const_scale_{d}"), 1.0 / (d as f32).sqrt());
        let scores = g.op("Mul", &[&scores, &scale], vec![], &format!("{p}.scaled"));
        let scores = g.op("Add", &[&scores, &f.mask], vec![], &format!("{p}.masked"));
        let probs = g.op(
            "Softmax",
            &[&scores],
            vec![int("axis", -1)],
            &format!("{p}.probs"),
        );
        let by_group = g.shape(&format!("const_shape_probs_{kv}"), &[0, kv as i64, -1, 0]);
        let probs = g.op(
            "Reshape",
            &[&probs, &by_group],
            vec![],
            &format!("{p}.probs_groups"),
        );
        let ctx = g.op("MatMul", &[&probs, &v], vec![], &format!("{p}.ctx"));
        let per_head = g.shape(
            &format!("const_shape_ctx_{h}_{d}"),
            &[0, h as i64, -1, d as i64],
        );
        let ctx = g.op(
            "Reshape",
            &[&ctx, &per_head],
            vec![],
            &format!("{p}.ctx_heads"),
        );
        let ctx = g.op(
            "Transpose",
            &[&ctx],
            vec![ints("perm", &[0, 2, 1, 3])],
            &format!("{p}.ctx_t"),
        );
        let merged = g.shape(
            &format!("const_shape_merge_{}", h * d),
            &[0, 0, (h * d) as i64],
        );
        let ctx = g.op(
            "Reshape",
            &[&ctx, &merged],
            vec![],
            &format!("{p}.ctx_merged"),
        );
        let o = self.linear_named(
            &ctx,
            &a.o_proj,
            &a.o_proj_quant,
            &format!("{p}.self_attn.o_proj"),
        );
        let x = self
            .g
            .op("Add", &[x, &o], vec![], &format!("{p}.attn_residual"));
        let m = &l.mlp;
        let hn = self.rms(
            &x,
            &l.post_attention_layernorm,
            &format!("{p}.post_attention_layernorm"),
        );
        let gate = self.linear_named(
            &hn,
            &m.gate_proj,
            &m.gate_proj_quant,
            &format!("{p}.mlp.gate_proj"),
        );
        let up = self.linear_named(
            &hn,
            &m.up_proj,
            &m.up_proj_quant,
            &format!("{p}.mlp.up_proj"),
        );
        let g = &mut self.g;
        let sig = g.op("Sigmoid", &[&gate], vec![], &format!("{p}.mlp.sigmoid"));
        let silu = g.op("Mul", &[&gate, &sig], vec![], &format!("{p}.mlp.silu"));
        let prod = g.op("Mul", &[&silu, &up], vec![], &format!("{p}.mlp.prod"));
        let down = self.linear_named(
            &prod,
            &m.down_proj,
            &m.down_proj_quant,
            &format!("{p}.mlp.down_proj"),
        );
        self.g.op("Add", &[&x, &down], vec![], &format!("{p}.out"))
    }

    fn linear_named(
        &mut self,
        x: &str,
        l: &burn::nn::Linear,
        q: &Option<mopt_quant::node::LinearQuant>,
        name: &str,
    ) -> String {
        linear(&mut self.g, x, l, q, name, &mut self.cache)
    }

    /// The final norm and the head (the embedding table's transpose when tied).
    fn head(&mut self, model: &LlamaForCausalLM, x: &str, table: &str) {
        let xn = self.rms(x, &model.model.norm, "model.norm");
        let logits = match &model.lm_head {
            Some(head) => self.linear_named(&xn, head, &None, "lm_head"),
            None => {
                let g = &mut self.g;
                let t = g.op(
                    "Transpose",
                    &[table],
                    vec![ints("perm", &[1, 0])],
                    "lm_head.tied",
                );
                g.op("MatMul", &[&xn, &t], vec![], "lm_head.matmul")
            }
        };
        self.g.op_into("Identity", &[&logits], vec![], OUTPUT);
    }
}

/// The prefill graph (`with_past = false`) or the decode graph of `model` (config `c`).
pub fn export_llama(model: &LlamaForCausalLM, c: &LlamaConfig, with_past: bool) -> ModelProto {
    let mut w = Writer {
        g: GraphBuilder::default(),
        cache: QdqCache::new(),
    };
    let emb = &model.model.embed_tokens.weight;
    let table =
        w.g.f32s("model.embed_tokens.weight", &dims(emb), &data(emb));
    let mut x = w.g.op(
        "Gather",
        &[&table, INPUT_IDS],
        vec![int("axis", 0)],
        "embeddings",
    );
    let frame = w.frame(model, with_past);
    for (i, layer) in model.model.layers.iter().enumerate() {
        x = w.layer(layer, i, &x, &frame, with_past);
    }
    w.head(model, &x, &table);
    let cache_io = |name: String, i: usize, len: &'static str| {
        let dims = [
            Dim::Named("batch"),
            Dim::Fixed(c.kv_heads(i) as i64),
            Dim::Named(len),
            Dim::Fixed(c.head_dim() as i64),
        ];
        value_info(&name, dtype::FLOAT, &dims)
    };
    let mut inputs = vec![value_info(
        INPUT_IDS,
        dtype::INT64,
        &[Dim::Named("batch"), Dim::Named("sequence")],
    )];
    let mut outputs = vec![value_info(
        OUTPUT,
        dtype::FLOAT,
        &[
            Dim::Named("batch"),
            Dim::Named("sequence"),
            Dim::Fixed(c.vocab_size as i64),
        ],
    )];
    for i in 0..c.num_hidden_layers {
        for kind in ["key", "value"] {
            if with_past {
                inputs.push(cache_io(past_name(i, kind), i, "past_sequence"));
            }
            outputs.push(cache_io(present_name(i, kind), i, "total_sequence"));
        }
    }
    let (name, doc) = match with_past {
        true => (
            "mopt_llama_decoder_with_past",
            "Llama decoder step with past key/values, exported by mopt",
        ),
        false => (
            "mopt_llama",
            "Llama causal LM (prefill: logits and key/values), exported by mopt",
        ),
    };
    let graph = w.g.finish(name, inputs, outputs);
    ModelProto::new(
        graph,
        doc,
        &[("mopt_version", env!("CARGO_PKG_VERSION").to_string())],
    )
}

impl Exportable for LlamaForCausalLM {
    fn inputs(_: &LlamaConfig) -> Vec<InputSpec> {
        vec![InputSpec {
            name: INPUT_IDS.into(),
            dtype: InputType::Int64,
            dims: vec![Dim::Named("batch"), Dim::Named("sequence")],
        }]
    }

    fn outputs(c: &LlamaConfig) -> Vec<Dim> {
        vec![
            Dim::Named("batch"),
            Dim::Named("sequence"),
            Dim::Fixed(c.vocab_size as i64),
        ]
    }

    fn onnx(&self, config: &LlamaConfig) -> Result<ModelProto, ExportError> {
        Ok(export_llama(self, config, false))
    }

    fn feed(b: &TokenWindows) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert(INPUT_IDS.into(), tensor_json(b.inputs.to_data()));
        m
    }

    fn card_facts(c: &LlamaConfig) -> Map<String, Value> {
        let n = c.num_hidden_layers;
        let per = |f: &dyn Fn(usize) -> usize| Value::from((0..n).map(f).collect::<Vec<_>>());
        let mut m = Map::new();
        m.insert("layers".into(), n.into());
        m.insert("hidden".into(), c.hidden_size.into());
        m.insert("head_dim".into(), c.head_dim().into());
        m.insert("heads_per_layer".into(), per(&|i| c.heads(i)));
        m.insert("kv_heads_per_layer".into(), per(&|i| c.kv_heads(i)));
        m.insert("ffn_per_layer".into(), per(&|i| c.ffn(i)));
        m.insert("vocabulary".into(), c.vocab_size.into());
        m.insert("tie_word_embeddings".into(), c.tie_word_embeddings.into());
        m
    }

    fn quantization(c: &LlamaConfig) -> Option<QuantConfig> {
        c.mopt_quant.clone()
    }

    /// Next-token distributions, not argmaxes: two exact runs of one int8 decoder pick
    /// different near-tied tokens (see [`QdqParity::MaxMeanKl`]).
    fn qdq_parity() -> QdqParity {
        QdqParity::MaxMeanKl(mopt_export::export::QDQ_MAX_MEAN_KL)
    }

    /// A single request and a small server batch.
    fn bench_batches() -> Vec<usize> {
        vec![1, 8]
    }

    /// The decode graph beside `model.onnx`, checked by [`check_decoding`].
    fn write_extra(
        &self,
        config: &LlamaConfig,
        dir: &Path,
        batch: &TokenWindows,
    ) -> Result<Option<Value>, ExportError> {
        let path = dir.join(DECODER_WITH_PAST);
        mopt_export::write_checked(&export_llama(self, config, true), &path)?;
        let decoding = check_decoding(self, dir, batch)?;
        Ok(Some(
            json!({ "decoder_with_past": DECODER_WITH_PAST, "decoding": decoding }),
        ))
    }
}

/// Prompt tokens and new tokens of the decoding check.
const PROMPT: usize = 16;
const NEW_TOKENS: usize = 8;
/// The decoding check's logit tolerance, relative to the largest logit.
pub const DECODE_TOLERANCE: f64 = 1e-4;

/// Greedy decoding in ONNX Runtime (`model.onnx` on a prompt of the first window's first
/// tokens, then `decoder_with_past.onnx` a token at a time) against the model's logits at the
/// same positions (one full forward over the prompt and the tokens ONNX Runtime chose): the
/// tokens must be the model's greedy choices and every step's logits within the float
/// tolerance scaled to the logits' size. Returns what the card records.
pub fn check_decoding(
    model: &LlamaForCausalLM,
    dir: &Path,
    batch: &TokenWindows,
) -> Result<Value, ExportError> {
    let ids: Vec<i64> = batch
        .inputs
        .to_data()
        .convert::<i64>()
        .try_to_vec()
        .expect("ids");
    let len = batch.inputs.dims()[1];
    let prompt: Vec<i64> = ids[..PROMPT.min(len)].to_vec();
    let out = mopt_export::python::tool(&[
        "decode",
        &dir.join("model.onnx").display().to_string(),
        &dir.join(DECODER_WITH_PAST).display().to_string(),
        &serde_json::to_string(&prompt).expect("json"),
        &NEW_TOKENS.to_string(),
    ])?;
    let tokens: Vec<i64> = serde_json::from_value(out["tokens"].clone())
        .map_err(|e| ExportError::Python(format!("decode: {e}")))?;
    let steps: Vec<Vec<f64>> = serde_json::from_value(out["logits"].clone())
        .map_err(|e| ExportError::Python(format!("decode: {e}")))?;
    let all: Vec<i64> = prompt.iter().chain(&tokens).copied().collect();
    let device = batch.inputs.device();
    let input = Tensor::<2, Int>::from_data(TensorData::new(all.clone(), [1, all.len()]), &device);
    let ours = model.forward(input);
    let vocab = ours.dims()[2];
    let ours: Vec<f32> = ours.into_data().try_to_vec().expect("f32");
    let (mut max_err, mut max_logit, mut same) = (0f64, 0f64, 0usize);
    for (s, theirs) in steps.iter().enumerate() {
        let row = &ours[(prompt.len() - 1 + s) * vocab..][..vocab];
        for (a, b) in row.iter().zip(theirs) {
            max_err = max_err.max((*a as f64 - b).abs());
            max_logit = max_logit.max((*a as f64).abs());
        }
        let greedy = mopt_export::contract::argmax(row.iter().map(|&x| x as f64)) as i64;
        same += usize::from(greedy == tokens[s]);
    }
    let rel = max_err / max_logit.max(1e-12);
    // A float graph reproduces the model: the same greedy tokens, logits within the float
    // tolerance relative to their size. A QDQ graph is recorded (its rounding may differ).
    if !mopt_core::Quantizable::is_quantized(model)
        && (same < tokens.len() || rel.is_nan() || rel > DECODE_TOLERANCE)
    {
        return Err(ExportError::Invalid(format!(
            "{}: greedy decoding in ONNX Runtime differs from mopt's: {same} of {} tokens equal, logits within {rel:.2e} of their size (tolerance {DECODE_TOLERANCE:e})",
            dir.join(DECODER_WITH_PAST).display(),
            tokens.len()
        )));
    }
    Ok(json!({
        "prompt_tokens": prompt.len(),
        "new_tokens": tokens.len(),
        "greedy_agreement": same as f64 / tokens.len().max(1) as f64,
        "max_abs_err": max_err,
        "max_rel_err": rel,
        "tolerance_rel": DECODE_TOLERANCE,
        "ort_prompt_ms": out["prompt_ms"],
        "ort_decode_ms_per_token": out["decode_ms"],
    }))
}
