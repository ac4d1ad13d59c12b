//! BERT → ONNX, in the node pattern ONNX Runtime's transformer optimizer fuses.
//!
//! Q, K and V are three MatMul+Add on the same input, reshaped with constant `[0, 0, heads,
//! head_size]` and transposed (`[0,2,1,3]` for Q and V, `[0,2,3,1]` for K); scores are
//! MatMul → Div(√d) → Add(mask) → Softmax, the mask being `(1 − mask) · −10000` built by
//! Unsqueeze → Unsqueeze → Cast → Sub → Mul; GELU is Div(√2) → Erf → Add(1) → Mul(x) → Mul(0.5)
//! (its tanh approximation: x³ → ·0.044715 → +x → ·√(2/π) → Tanh → Add(1) → Mul(x) → Mul(0.5));
//! residual Add + LayerNormalization. Burn's Linear weight is `[in, out]`, which MatMul takes as is.
//! Each layer uses its own head count and FFN width, so pruned models export unchanged.
//!
//! A quantized model exports as QDQ: each quantized linear layer's input goes through
//! `QuantizeLinear → DequantizeLinear` with its trained per-tensor scale and zero point, its
//! weight is stored as int8 `[in, out]` with a per-output-channel `DequantizeLinear` (axis 1),
//! the bias stays float. ONNX Runtime's QDQ transformer turns `DQ(x), DQ(W) → MatMul` into
//! integer kernels (`MatMulIntegerToFloat`); LayerNorm, softmax, GELU stay float, as in mopt.
//! Embedding tables the quantization lists ([`QuantConfig::embeddings`]) are stored as int8
//! with one scale per row and gathered as `Cast(Gather(int8)) · Gather(scale)`.

use super::quant::{POSITION_EMBEDDINGS, WORD_EMBEDDINGS};
use super::{BertConfig, BertForSequenceClassification, MASK_BIAS};
use burn::module::Param;
use burn::nn::{LayerNorm, Linear};
use burn::prelude::*;
use mopt_quant::fake::quantize_rows;
use mopt_quant::node::LinearQuant;

use mopt_data::TextBatch;
use mopt_export::contract::OrtFusion;
use mopt_export::graph::{data, dims, float, int, ints, GraphBuilder};
use mopt_export::onnx::{dtype, value_info, Dim, ModelProto};
use mopt_export::qdq::{linear, QdqCache};
use mopt_export::{tensor_json, ExportError, Exportable, InputSpec, InputType};
use mopt_quant::node::QuantConfig;
use serde_json::{Map, Value};

/// Graph input names.
pub const INPUTS: [&str; 3] = ["input_ids", "attention_mask", "token_type_ids"];
use mopt_export::export::OUTPUT;
use mopt_kernels::GeluKind;

fn layer_norm(g: &mut GraphBuilder, x: &str, ln: &LayerNorm, eps: f64, name: &str) -> String {
    let gamma = g.f32s(
        &format!("{name}.weight"),
        &dims(&ln.gamma),
        &data(&ln.gamma),
    );
    let beta = match &ln.beta {
        Some(b) => g.f32s(&format!("{name}.bias"), &dims(b), &data(b)),
        None => {
            let n = dims(&ln.gamma)[0];
            g.f32s(&format!("{name}.bias"), &[n], &vec![0.0; n])
        }
    };
    g.op(
        "LayerNormalization",
        &[x, &gamma, &beta],
        vec![int("axis", -1), float("epsilon", eps as f32)],
        &format!("{name}.out"),
    )
}

/// GELU's tanh approximation as plain ONNX ops, `x/2 · (1 + tanh(√(2/π) (x + 0.044715 x³)))`,
/// named `{name}.*` so that the INT8 fusion finds it (and writes ONNX Runtime's `FastGelu`).
fn gelu_tanh(g: &mut GraphBuilder, x: &str, name: &str) -> String {
    let cubic = g.scalar("const_gelu_cubic", 0.044_715);
    let k = g.scalar("const_sqrt_2_over_pi", (2.0 / std::f32::consts::PI).sqrt());
    let one = g.scalar("const_one", 1.0);
    let half = g.scalar("const_half", 0.5);
    let x2 = g.op("Mul", &[x, x], vec![], &format!("{name}.square"));
    let x3 = g.op("Mul", &[&x2, x], vec![], &format!("{name}.cube"));
    let c = g.op("Mul", &[&x3, &cubic], vec![], &format!("{name}.cubic"));
    let inner = g.op("Add", &[x, &c], vec![], &format!("{name}.inner"));
    let u = g.op("Mul", &[&inner, &k], vec![], &format!("{name}.scaled"));
    let t = g.op("Tanh", &[&u], vec![], &format!("{name}.tanh"));
    let a = g.op("Add", &[&t, &one], vec![], &format!("{name}.add"));
    let m = g.op("Mul", &[x, &a], vec![], &format!("{name}.mul"));
    g.op("Mul", &[&m, &half], vec![], &format!("{name}.out"))
}

fn gelu(g: &mut GraphBuilder, x: &str, name: &str) -> String {
    let sqrt2 = g.scalar("const_sqrt2", std::f32::consts::SQRT_2);
    let one = g.scalar("const_one", 1.0);
    let half = g.scalar("const_half", 0.5);
    let d = g.op("Div", &[x, &sqrt2], vec![], &format!("{name}.div"));
    let e = g.op("Erf", &[&d], vec![], &format!("{name}.erf"));
    let a = g.op("Add", &[&e, &one], vec![], &format!("{name}.add"));
    let m = g.op("Mul", &[x, &a], vec![], &format!("{name}.mul"));
    g.op("Mul", &[&m, &half], vec![], &format!("{name}.out"))
}

/// `Gather` from an embedding table; an int8 table (`int8`) is stored as int8 with one scale per
/// row and gathered as `Cast(Gather(table)) · Gather(scales)`.
fn embedding(
    g: &mut GraphBuilder,
    weight: &Param<Tensor<2>>,
    ids: &str,
    name: &str,
    int8: bool,
) -> String {
    let axis0 = || vec![int("axis", 0)];
    let shape = dims(weight);
    if !int8 {
        let w = g.f32s(&format!("{name}.weight"), &shape, &data(weight));
        return g.op("Gather", &[&w, ids], axis0(), &format!("{name}.out"));
    }
    let (q, scales) = quantize_rows(&data(weight), shape[1]);
    let w = g.i8s(&format!("{name}.weight_quantized"), &shape, &q);
    let s = g.f32s(&format!("{name}.weight_scale"), &[shape[0], 1], &scales);
    let rows = g.op("Gather", &[&w, ids], axis0(), &format!("{name}.gather_q"));
    let to_float = vec![int("to", dtype::FLOAT as i64)];
    let rows = g.op("Cast", &[&rows], to_float, &format!("{name}.cast"));
    let s = g.op(
        "Gather",
        &[&s, ids],
        axis0(),
        &format!("{name}.gather_scale"),
    );
    g.op("Mul", &[&rows, &s], vec![], &format!("{name}.out"))
}

/// The graph being written: the builder and the shared QDQ inputs.
struct Writer {
    g: GraphBuilder,
    cache: QdqCache,
    /// The embedding tables written as int8 ([`QuantConfig::embeddings`]).
    int8_tables: Vec<String>,
    /// A pruned vocabulary's row of every id (`mopt_vocab_map`).
    vocab_map: Option<Vec<u32>>,
}

impl Writer {
    /// A linear layer (QDQ when `quant` is set), named `name`.
    fn linear(&mut self, x: &str, l: &Linear, quant: &Option<LinearQuant>, name: &str) -> String {
        linear(&mut self.g, x, l, quant, name, &mut self.cache)
    }

    /// Word + position (0..seq) + token-type embeddings, then LayerNorm.
    fn embeddings(&mut self, model: &BertForSequenceClassification, eps: f64) -> String {
        let int8 = |path: &str| self.int8_tables.iter().any(|t| t == path);
        let (int8_words, int8_positions) = (int8(WORD_EMBEDDINGS), int8(POSITION_EMBEDDINGS));
        let g = &mut self.g;
        let (ids, types) = (INPUTS[0], INPUTS[2]);
        let emb = &model.bert.embeddings;
        // A pruned vocabulary: every id to its row (a dropped token to [UNK]'s).
        let rows = match &self.vocab_map {
            Some(map) => {
                let map: Vec<i32> = map.iter().map(|&r| r as i32).collect();
                let m = g.i32s("bert.embeddings.vocab_map", &[map.len()], &map);
                g.op("Gather", &[&m, ids], vec![int("axis", 0)], "word_rows")
            }
            None => ids.to_string(),
        };
        let words = embedding(
            g,
            &emb.word_embeddings.weight,
            &rows,
            WORD_EMBEDDINGS,
            int8_words,
        );
        let shape = g.op("Shape", &[ids], vec![], "ids_shape");
        let one_idx = g.i64s("const_index_1", &[], &[1]);
        let seq = g.op(
            "Gather",
            &[&shape, &one_idx],
            vec![int("axis", 0)],
            "seq_len",
        );
        let zero = g.i64s("const_i64_0", &[], &[0]);
        let step = g.i64s("const_i64_1", &[], &[1]);
        let positions = g.op("Range", &[&zero, &seq, &step], vec![], "position_ids");
        let axes0 = g.shape("const_axes_0", &[0]);
        let positions = g.op(
            "Unsqueeze",
            &[&positions, &axes0],
            vec![],
            "position_ids_2d",
        );
        let pos = embedding(
            g,
            &emb.position_embeddings.weight,
            &positions,
            POSITION_EMBEDDINGS,
            int8_positions,
        );
        let tt = embedding(
            g,
            &emb.token_type_embeddings.weight,
            types,
            "bert.embeddings.token_type_embeddings",
            false,
        );
        let sum = g.op("Add", &[&words, &pos], vec![], "emb_add");
        let sum = g.op("Add", &[&sum, &tt], vec![], "emb_add");
        layer_norm(g, &sum, &emb.layer_norm, eps, "bert.embeddings.LayerNorm")
    }

    /// The additive attention mask `(1 − mask) · MASK_BIAS`, `[batch, 1, 1, seq]`.
    fn mask_bias(&mut self) -> String {
        let g = &mut self.g;
        let axes1 = g.shape("const_axes_1", &[1]);
        let axes2 = g.shape("const_axes_2", &[2]);
        let m = g.op("Unsqueeze", &[INPUTS[1], &axes1], vec![], "mask_u1");
        let m = g.op("Unsqueeze", &[&m, &axes2], vec![], "mask_u2");
        let m = g.op(
            "Cast",
            &[&m],
            vec![int("to", dtype::FLOAT as i64)],
            "mask_f",
        );
        let one = g.scalar("const_one", 1.0);
        let m = g.op("Sub", &[&one, &m], vec![], "mask_inv");
        let big = g.scalar("const_mask_bias", MASK_BIAS);
        g.op("Mul", &[&m, &big], vec![], "mask_bias")
    }

    /// Self-attention of layer `p` on `x` (before the output projection): the context,
    /// `[batch, seq, heads · head_size]`.
    fn attention(&mut self, layer: &super::BertLayer, p: &str, x: &str, mask_bias: &str) -> String {
        let sa = &layer.attention.self_attn;
        let (h, d) = (sa.num_heads as i64, sa.head_size as i64);
        let split = self.g.shape(&format!("const_split_{h}_{d}"), &[0, 0, h, d]);
        let merge = self
            .g
            .shape(&format!("const_merge_{}", h * d), &[0, 0, h * d]);
        let q = self.linear(
            x,
            &sa.query,
            &sa.query_quant,
            &format!("{p}.attention.self.query"),
        );
        let k = self.linear(
            x,
            &sa.key,
            &sa.key_quant,
            &format!("{p}.attention.self.key"),
        );
        let v = self.linear(
            x,
            &sa.value,
            &sa.value_quant,
            &format!("{p}.attention.self.value"),
        );
        let g = &mut self.g;
        let q = g.op("Reshape", &[&q, &split], vec![], "q_heads");
        let q = g.op("Transpose", &[&q], vec![ints("perm", &[0, 2, 1, 3])], "q_t");
        let k = g.op("Reshape", &[&k, &split], vec![], "k_heads");
        let k = g.op("Transpose", &[&k], vec![ints("perm", &[0, 2, 3, 1])], "k_t");
        let v = g.op("Reshape", &[&v, &split], vec![], "v_heads");
        let v = g.op("Transpose", &[&v], vec![ints("perm", &[0, 2, 1, 3])], "v_t");
        let scores = g.op("MatMul", &[&q, &k], vec![], "scores");
        let scale = g.scalar(&format!("const_sqrt_{d}"), (d as f32).sqrt());
        let scores = g.op("Div", &[&scores, &scale], vec![], "scores_scaled");
        let scores = g.op("Add", &[&scores, mask_bias], vec![], "scores_masked");
        let probs = g.op("Softmax", &[&scores], vec![int("axis", 3)], "probs");
        let ctx = g.op("MatMul", &[&probs, &v], vec![], "context");
        let ctx = g.op(
            "Transpose",
            &[&ctx],
            vec![ints("perm", &[0, 2, 1, 3])],
            "context_t",
        );
        g.op("Reshape", &[&ctx, &merge], vec![], "context_merged")
    }

    /// Encoder layer `i` on `x`: attention, residual + LayerNorm, FFN, residual + LayerNorm.
    fn layer(
        &mut self,
        layer: &super::BertLayer,
        i: usize,
        x: &str,
        mask_bias: &str,
        eps: f64,
    ) -> String {
        let p = format!("bert.encoder.layer.{i}");
        let ctx = self.attention(layer, &p, x, mask_bias);
        let out = &layer.attention.output;
        let y = self.linear(
            &ctx,
            &out.dense,
            &out.dense_quant,
            &format!("{p}.attention.output.dense"),
        );
        let y = self.g.op("Add", &[&y, x], vec![], "attn_residual");
        let attn = layer_norm(
            &mut self.g,
            &y,
            &out.layer_norm,
            eps,
            &format!("{p}.attention.output.LayerNorm"),
        );
        let (it, o) = (&layer.intermediate, &layer.output);
        let f = self.linear(
            &attn,
            &it.dense,
            &it.dense_quant,
            &format!("{p}.intermediate.dense"),
        );
        let f = match it.act {
            GeluKind::Erf => gelu(&mut self.g, &f, &format!("{p}.gelu")),
            GeluKind::Tanh => gelu_tanh(&mut self.g, &f, &format!("{p}.gelu")),
        };
        let y = self.linear(&f, &o.dense, &o.dense_quant, &format!("{p}.output.dense"));
        let y = self.g.op("Add", &[&y, &attn], vec![], "ffn_residual");
        layer_norm(
            &mut self.g,
            &y,
            &o.layer_norm,
            eps,
            &format!("{p}.output.LayerNorm"),
        )
    }

    /// Pooler on `[CLS]`, then the classifier: the logits.
    fn head(&mut self, model: &BertForSequenceClassification, x: &str) -> String {
        let cls_idx = self.g.i64s("const_cls_index", &[], &[0]);
        let cls = self
            .g
            .op("Gather", &[x, &cls_idx], vec![int("axis", 1)], "cls");
        let pooler = &model.bert.pooler;
        let pooled = self.linear(
            &cls,
            &pooler.dense,
            &pooler.dense_quant,
            "bert.pooler.dense",
        );
        let pooled = self.g.op("Tanh", &[&pooled], vec![], "pooled");
        self.linear(
            &pooled,
            &model.classifier,
            &model.classifier_quant,
            "classifier",
        )
    }
}

/// Export `model` (inference device) with the shape `config` describes.
pub fn export_bert(
    model: &BertForSequenceClassification,
    config: &BertConfig,
    metadata: &[(&str, String)],
) -> ModelProto {
    let mut w = Writer {
        g: GraphBuilder::default(),
        cache: QdqCache::new(),
        int8_tables: config
            .mopt_quant
            .as_ref()
            .map_or(Vec::new(), |q| q.embeddings.clone()),
        vocab_map: config.mopt_vocab_map.clone(),
    };
    let eps = config.layer_norm_eps;
    let mut x = w.embeddings(model, eps);
    let mask_bias = w.mask_bias();
    for (i, layer) in model.bert.encoder.layer.iter().enumerate() {
        x = w.layer(layer, i, &x, &mask_bias, eps);
    }
    let logits = w.head(model, &x);
    w.g.op_into("Identity", &[&logits], vec![], OUTPUT);
    let io = |n: &str| {
        value_info(
            n,
            dtype::INT64,
            &[Dim::Named("batch"), Dim::Named("sequence")],
        )
    };
    let graph = w.g.finish(
        "mopt_bert",
        INPUTS.iter().map(|n| io(n)).collect(),
        vec![value_info(
            OUTPUT,
            dtype::FLOAT,
            &[Dim::Named("batch"), Dim::Fixed(config.num_labels as i64)],
        )],
    );
    ModelProto::new(graph, "BERT sequence classifier exported by mopt", metadata)
}

/// The model card's note on inputs: how a deployment pads and truncates.
pub fn input_notes(max_len: usize) -> String {
    format!(
        "right padding with id 0 ([PAD]); attention_mask 1 for tokens and 0 for padding; token_type_ids all 0; [CLS] … [SEP], truncated at {max_len} tokens"
    )
}

impl Exportable for BertForSequenceClassification {
    fn inputs(_: &BertConfig) -> Vec<InputSpec> {
        INPUTS
            .iter()
            .map(|n| InputSpec {
                name: n.to_string(),
                dtype: InputType::Int64,
                dims: vec![Dim::Named("batch"), Dim::Named("sequence")],
            })
            .collect()
    }

    fn onnx(&self, config: &BertConfig) -> Result<ModelProto, ExportError> {
        Ok(export_bert(
            self,
            config,
            &[("mopt_version", env!("CARGO_PKG_VERSION").to_string())],
        ))
    }

    fn feed(b: &TextBatch) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert(INPUTS[0].into(), tensor_json(b.input_ids.to_data()));
        m.insert(INPUTS[1].into(), tensor_json(b.attention_mask.to_data()));
        m.insert(INPUTS[2].into(), tensor_json(b.token_type_ids.to_data()));
        m
    }

    fn card_facts(c: &BertConfig) -> Map<String, Value> {
        let n = c.num_hidden_layers;
        let mut m = Map::new();
        m.insert("layers".into(), n.into());
        let heads: Vec<usize> = (0..n).map(|i| c.heads(i)).collect();
        m.insert("heads_per_layer".into(), heads.into());
        let ffn: Vec<usize> = (0..n).map(|i| c.ffn(i)).collect();
        m.insert("ffn_per_layer".into(), ffn.into());
        if c.mopt_vocab_map.is_some() {
            // A pruned vocabulary: the tokenizer's ids, the rows kept, the rest read [UNK].
            m.insert(
                "vocabulary".into(),
                serde_json::json!({ "token_ids": c.input_vocab(), "rows_kept": c.vocab_size }),
            );
        }
        m
    }

    fn quantization(c: &BertConfig) -> Option<QuantConfig> {
        c.mopt_quant.clone()
    }

    /// Heads and hidden size when every layer has `num_attention_heads` heads spanning the
    /// hidden size; 0 and 0 (the optimizer reads them off the graph) for pruned shapes.
    fn ort_fusion(c: &BertConfig) -> Option<OrtFusion> {
        let uniform =
            c.mopt_layer_heads.is_none() && c.num_attention_heads * c.head_size() == c.hidden_size;
        let (heads, hidden) = if uniform {
            (c.num_attention_heads, c.hidden_size)
        } else {
            (0, 0)
        };
        Some(OrtFusion {
            model_type: "bert",
            heads,
            hidden,
        })
    }
}
