//! ONNX export: checker, parity with mopt, ONNX Runtime fusion, pruned shapes, QDQ integer kernels.
//! These call Python's `onnx` and `onnxruntime` (requirements-test.txt) and fail without them.

use burn::prelude::*;
use mopt_data::{Encoded, SplitMix64, TextExamples};
use mopt_export::qdq::{ActQuant, QdqMlp, QuantLinear};
use mopt_export::{python, ExportError, ExportOptions, ModelCard};
use mopt_models::bert::{weights, BertConfig, BertForSequenceClassification};

fn samples(n: usize, vocab: u64, seed: u64) -> Vec<Encoded> {
    let mut r = SplitMix64::new(seed);
    (0..n)
        .map(|_| {
            let len = 3 + r.below(20);
            let mut ids = vec![101u32];
            ids.extend((0..len - 2).map(|_| 1000 + (r.next_u64() % (vocab - 1000)) as u32));
            ids.push(102);
            Encoded { ids, label: 0 }
        })
        .collect()
}

/// Export a BERT checkpoint with parity on `samples` (right-padded with [PAD] = 0).
fn export_checkpoint(
    ckpt: &std::path::Path,
    out: &std::path::Path,
    samples: &[Encoded],
    opts: &ExportOptions,
) -> Result<ModelCard, ExportError> {
    let examples = TextExamples::new(samples, 0);
    mopt_export::export_checkpoint::<BertForSequenceClassification, _>(ckpt, out, &examples, opts)
}

/// The device's random generator is shared by the tests running in parallel, and Burn draws a
/// parameter when it is first read: a seeded model is drawn, and its parameters read (saved,
/// calibrated, run), one test at a time, so that a seed gives the same model in every run.
static DRAW: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_draw_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    DRAW.lock().unwrap_or_else(|e| e.into_inner())
}

fn checkpoint(config: &BertConfig, dir: &std::path::Path) {
    let _draw = one_draw_at_a_time();
    Device::flex().seed(5);
    let model = BertForSequenceClassification::new(config, &Device::flex());
    weights::save_checkpoint(&model, config, dir).unwrap();
}

/// A seeded model of `config` saved to `dir/ckpt` and exported to `dir/export` with parity on
/// `n` sentences drawn with `seed`.
fn exported(
    config: &BertConfig,
    dir: &std::path::Path,
    n: usize,
    seed: u64,
) -> Result<ModelCard, ExportError> {
    checkpoint(config, &dir.join("ckpt"));
    export_checkpoint(
        &dir.join("ckpt"),
        &dir.join("export"),
        &samples(n, 30522, seed),
        &opts(),
    )
}

/// The fused graph ONNX Runtime runs agrees with mopt's fake-quantized forward as `model.onnx`
/// must: predictions on 99.5% of the sentences, logits within 0.05.
fn assert_fused_graph_agrees(card: &ModelCard) {
    let fused = card.fused_graph.as_ref().expect("a fused graph");
    assert!(fused["agreement"].as_f64().unwrap() >= 0.995, "{fused}");
    assert!(fused["max_abs_err"].as_f64().unwrap() < 0.05, "{fused}");
}

fn opts() -> ExportOptions {
    ExportOptions {
        tolerance: 1e-4,
        input_notes: mopt_models::bert::onnx::input_notes(64),
        labels: vec!["neg".into(), "pos".into()],
        accuracy: None,
        force: false,
    }
}

#[test]
fn tiny_bert_exports_checks_matches_and_fuses() {
    let tmp = tempfile::tempdir().unwrap();
    let c = BertConfig::tiny(30522, 2);
    let card = exported(&c, tmp.path(), 70, 1).unwrap();
    let out = tmp.path().join("export");
    assert!(
        card.parity.max_abs_err < 1e-4,
        "{}",
        card.parity.max_abs_err
    );
    assert_eq!(card.parity.samples, 70);
    assert_eq!(card.opset, 17);
    assert_eq!(card.labels, vec!["neg", "pos"]);
    assert!(
        card.fused_ops.get("Attention").copied().unwrap_or(0) == 2,
        "attention fused in both layers: {:?}",
        card.fused_ops
    );
    assert!(
        card.fused_ops
            .get("SkipLayerNormalization")
            .copied()
            .unwrap_or(0)
            >= 4,
        "{:?}",
        card.fused_ops
    );
    assert!(
        card.fused_ops.contains_key("BiasGelu")
            || card.fused_ops.contains_key("FastGelu")
            || card.fused_ops.contains_key("Gelu"),
        "{:?}",
        card.fused_ops
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("model-card.json")).unwrap())
            .unwrap();
    assert_eq!(json["inputs"][0]["name"], "input_ids");
    assert_eq!(
        json["inputs"][1]["shape"],
        serde_json::json!(["batch", "sequence"])
    );
    let sha = json["sha256"]["model.onnx"].as_str().unwrap();
    let bytes = std::fs::read(out.join("model.onnx")).unwrap();
    use sha2::Digest;
    assert_eq!(sha, format!("{:x}", sha2::Sha256::digest(&bytes)));
    // A second export into the same folder is refused.
    let again = export_checkpoint(
        &tmp.path().join("ckpt"),
        &out,
        &samples(4, 30522, 2),
        &opts(),
    );
    assert!(matches!(again, Err(ExportError::Invalid(_))));
}

#[test]
fn pruned_bert_with_per_layer_heads_and_ffn_exports_and_matches() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = BertConfig::tiny(30522, 3);
    c.num_hidden_layers = 3;
    c.mopt_layer_heads = Some(vec![4, 1, 3]);
    c.mopt_layer_intermediate_sizes = Some(vec![64, 8, 40]);
    let card = exported(&c, tmp.path(), 40, 3).unwrap();
    assert!(
        card.parity.max_abs_err < 1e-4,
        "{}",
        card.parity.max_abs_err
    );
    assert_eq!(
        card.architecture["heads_per_layer"],
        serde_json::json!([4, 1, 3])
    );
    assert_eq!(
        card.architecture["ffn_per_layer"],
        serde_json::json!([64, 8, 40])
    );
    assert_eq!(card.architecture["layers"], serde_json::json!(3));
}

#[test]
fn bert_with_pruned_hidden_channels_exports_and_matches() {
    // A hidden size that is not heads x head size (hidden channels pruned, heads kept), with
    // one layer fewer: what `mopt_prune` writes for targets = ["hidden", "layers"].
    let tmp = tempfile::tempdir().unwrap();
    let mut c = BertConfig::tiny(30522, 2);
    c.hidden_size = 24;
    c.attention_head_size = Some(8);
    c.num_hidden_layers = 1;
    let card = exported(&c, tmp.path(), 20, 3).unwrap();
    assert!(
        card.parity.max_abs_err < 1e-4,
        "{}",
        card.parity.max_abs_err
    );
    assert_eq!(card.architecture["heads_per_layer"], serde_json::json!([4]));
}

/// A tiny INT8 model: weights per channel (7-bit range), inputs uint8 per tensor, calibrated on
/// `calib` sentences.
fn quantized_checkpoint(dir: &std::path::Path, bits: u32) -> BertConfig {
    quantized_checkpoint_with(dir, bits, "gelu")
}

fn quantized_checkpoint_with(dir: &std::path::Path, bits: u32, act: &str) -> BertConfig {
    use mopt_quant::node::QuantConfig;
    let dev = Device::flex();
    let mut c = BertConfig::tiny(30522, 3);
    c.hidden_act = act.into();
    c.hidden_dropout_prob = 0.0;
    c.attention_probs_dropout_prob = 0.0;
    // Larger weights than BERT's 0.02 so that the logits (and their errors) are not tiny.
    c.initializer_range = 0.3;
    let _draw = one_draw_at_a_time();
    dev.seed(5);
    let float = BertForSequenceClassification::new(&c, &dev);
    let q = QuantConfig::int8(
        bits,
        <BertForSequenceClassification as mopt_core::Quantizable>::linear_paths(&c),
    );
    let calib = samples(64, 30522, 9);
    let (m, unseen) = mopt_models::bert::quant::calibrate(float, &q, &dev, |m| {
        let batcher = mopt_data::Batcher::new(0);
        for chunk in calib.chunks(16) {
            let b = batcher.batch(&chunk.iter().collect::<Vec<_>>(), &dev);
            let _ = m.forward(b.input_ids, b.attention_mask, b.token_type_ids);
        }
    });
    assert!(unseen.is_empty());
    let qc = BertConfig {
        mopt_quant: Some(q),
        ..c
    };
    weights::save_checkpoint(&m, &qc, dir).unwrap();
    qc
}

#[test]
fn int8_bert_exports_as_qdq_runs_on_integer_kernels_and_agrees_with_mopt() {
    let tmp = tempfile::tempdir().unwrap();
    quantized_checkpoint(&tmp.path().join("ckpt"), 7);
    let card = export_checkpoint(
        &tmp.path().join("ckpt"),
        &tmp.path().join("export"),
        &samples(200, 30522, 3),
        &opts(),
    )
    .unwrap();
    eprintln!("{:?} {:?}", card.parity, card.fused_ops);
    assert!(card.parity.agreement >= 0.995, "{:?}", card.parity);
    // Every quantizer snaps both runtimes' activations to the same grid, so the logits agree
    // far more closely than the quantization error (O(1) logits here).
    assert!(card.parity.max_abs_err < 0.05, "{:?}", card.parity);
    let q = card.quantization.as_ref().unwrap();
    let ops = &q["onnxruntime_optimized_ops"];
    // The graph ONNX Runtime runs is mopt's fusion of the QDQ graph (model.fused.onnx): every
    // DQ → MatMul ← DQ with its bias is one integer kernel (2 layers x 6, the pooler and the
    // classifier), each residual sum + LayerNorm one SkipLayerNormalization, each attention core
    // one MultiHeadAttention.
    assert_eq!(ops["MatMulIntegerToFloat"].as_u64(), Some(14), "{ops}");
    assert_eq!(ops["SkipLayerNormalization"].as_u64(), Some(4), "{ops}");
    assert_eq!(ops["MultiHeadAttention"].as_u64(), Some(2), "{ops}");
    assert!(
        ops.get("Transpose").is_none() && ops.get("DequantizeLinear").is_none(),
        "{ops}"
    );
    // Q, K and V share one QuantizeLinear: 2 layers x 4 + pooler + classifier.
    assert_eq!(ops["QuantizeLinear"].as_u64(), Some(10), "{ops}");
    // The fused graph is checked against mopt like model.onnx.
    assert_fused_graph_agrees(&card);
    // INT4 weights have no QDQ export here, and nothing is written.
    let four = tmp.path().join("four");
    quantized_checkpoint(&four, 4);
    let out = tmp.path().join("export4");
    match export_checkpoint(&four, &out, &samples(4, 30522, 3), &opts()) {
        Err(ExportError::Invalid(m)) => assert!(m.contains("INT4"), "{m}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(!out.exists());
}

#[test]
fn tanh_gelu_bert_exports_with_parity_and_runs_fast_gelu_in_the_int8_graph() {
    // Float: the tanh GELU written as plain ONNX ops matches mopt's fused kernel.
    let tmp = tempfile::tempdir().unwrap();
    let mut c = BertConfig::tiny(30522, 2);
    c.hidden_act = "gelu_new".into();
    let card = exported(&c, tmp.path(), 40, 1).unwrap();
    assert!(card.parity.max_abs_err < 1e-4, "{:?}", card.parity);
    // INT8: mopt's fusion runs each layer's GELU as one FastGelu, and still agrees with mopt.
    // Weights as `weight-bits = "auto"` picks them: full 8-bit where the CPU has VNNI, the 7-bit
    // range without (ONNX Runtime's u8·s8 kernels sum pairs of products in int16 there, and
    // full-range weights saturate: 0.93 agreement on an AVX2-only EPYC).
    let ckpt = tmp.path().join("int8");
    let bits = 7 + u32::from(mopt_stages::kinds::quantize::cpu_has_vnni());
    quantized_checkpoint_with(&ckpt, bits, "gelu_new");
    let card = export_checkpoint(
        &ckpt,
        &tmp.path().join("export8"),
        &samples(200, 30522, 3),
        &opts(),
    )
    .unwrap();
    let ops = &card.quantization.as_ref().unwrap()["onnxruntime_optimized_ops"];
    assert_eq!(ops["FastGelu"].as_u64(), Some(2), "{ops}");
    // No erf GELU, and the one Tanh left is the pooler's.
    assert!(ops.get("Gelu").is_none(), "{ops}");
    assert_eq!(ops["Tanh"].as_u64(), Some(1), "{ops}");
    // Every prediction the same; the largest logit difference a little above the other
    // graphs' 0.05 bound with 7-bit weights (0.051 measured on an AVX2-only EPYC, agreement 1.0).
    let fused = card.fused_graph.as_ref().expect("a fused graph");
    assert!(fused["agreement"].as_f64().unwrap() >= 0.995, "{fused}");
    assert!(fused["max_abs_err"].as_f64().unwrap() < 0.07, "{fused}");
}

#[test]
fn int8_embedding_tables_are_gathered_from_int8_and_match_the_snapped_model() {
    use mopt_core::Quantizable;
    let tmp = tempfile::tempdir().unwrap();
    let base = quantized_checkpoint(&tmp.path().join("ckpt"), 7);
    let dev = Device::flex();
    let (mut m, c) = weights::load_checkpoint(&tmp.path().join("ckpt"), &dev).unwrap();
    let mut q = c.mopt_quant.clone().unwrap();
    q.embeddings = BertForSequenceClassification::embedding_paths(&c);
    assert_eq!(
        q.embeddings,
        [
            "bert.embeddings.word_embeddings",
            "bert.embeddings.position_embeddings"
        ]
    );
    m.snap_embeddings(&q);
    let qc = BertConfig {
        mopt_quant: Some(q),
        ..base
    };
    weights::save_checkpoint(&m, &qc, &tmp.path().join("ckpt8")).unwrap();
    let export = |ckpt: &str, out: &str| {
        let (ckpt, out) = (tmp.path().join(ckpt), tmp.path().join(out));
        let card = export_checkpoint(&ckpt, &out, &samples(200, 30522, 3), &opts()).unwrap();
        let bytes = std::fs::metadata(out.join("model.onnx")).unwrap().len() as i64;
        (card, bytes)
    };
    let (card, int8_bytes) = export("ckpt8", "export8");
    let (_, float_bytes) = export("ckpt", "export");
    // The snapped model is what the int8 tables give: agreement as for the other QDQ layers.
    assert!(card.parity.agreement >= 0.995, "{:?}", card.parity);
    assert!(card.parity.max_abs_err < 0.05, "{:?}", card.parity);
    // (30522 + 128) rows x 32: 4 bytes a value become 1, plus a float scale a row.
    let (rows, h) = (30522 + 128, 32);
    // The graph gains a few named nodes (Cast, the scales' Gather, Mul): under 2 KB.
    let saved = float_bytes - int8_bytes;
    let expected = (rows * h * 3 - rows * 4) as i64;
    assert!(
        (expected - 2048..=expected).contains(&saved),
        "{float_bytes} -> {int8_bytes}: {saved} bytes saved, {expected} expected"
    );
}

#[test]
fn parity_gate_rejects_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let c = BertConfig::tiny(30522, 2);
    checkpoint(&c, &tmp.path().join("ckpt"));
    let out = tmp.path().join("export");
    let strict = ExportOptions {
        tolerance: 0.0,
        ..opts()
    };
    match export_checkpoint(
        &tmp.path().join("ckpt"),
        &out,
        &samples(10, 30522, 4),
        &strict,
    ) {
        Err(ExportError::Parity { max_abs_err, .. }) => {
            assert!(max_abs_err > 0.0 && max_abs_err < 1e-4)
        }
        other => panic!("expected a parity failure, got {other:?}"),
    }
    assert!(!out.exists() && !tmp.path().join("export.tmp").exists());
}

#[test]
fn qdq_mlp_runs_on_integer_kernels_and_matches_the_rust_reference() {
    // Power-of-two scales make every product and sum exact in f32, so ONNX Runtime's integer
    // kernels and the Rust reference must agree up to float printing, ties included: the inputs
    // sit on half-steps of the input scale, exercising round-half-to-even. Weights use the 7-bit
    // range (ONNX Runtime's `reduce_range`): its u8·s8 kernels on x86 without VNNI sum pairs of
    // products in int16 (vpmaddubsw), which saturates with full-range int8 weights.
    let mut r = SplitMix64::new(11);
    let mut layer = |d_in: usize, d_out: usize| QuantLinear {
        d_in,
        d_out,
        weight: (0..d_in * d_out)
            .map(|_| (r.below(127) as i32 - 63) as i8)
            .collect(),
        weight_scale: (0..d_out).map(|o| 2f32.powi(-7 - (o % 3) as i32)).collect(),
        bias: (0..d_out)
            .map(|o| (o as f32 - 5.0) * 2f32.powi(-6))
            .collect(),
    };
    let mlp = QdqMlp {
        layers: vec![layer(16, 32), layer(32, 4)],
        acts: vec![
            ActQuant {
                scale: 2f32.powi(-5),
                zero_point: 128,
            },
            ActQuant {
                scale: 2f32.powi(-3),
                zero_point: 100,
            },
            ActQuant {
                scale: 2f32.powi(-4),
                zero_point: 128,
            },
        ],
    };
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("qdq.onnx");
    std::fs::write(&path, mlp.export().to_bytes()).unwrap();
    python::tool(&["check", path.to_str().unwrap()]).unwrap();
    let batch = 8;
    let x: Vec<f32> = (0..batch * 16)
        .map(|i| ((i * 37 % 241) as f32 - 120.0) / 64.0)
        .collect();
    let feed = serde_json::json!([{ "x": x.chunks(16).map(<[f32]>::to_vec).collect::<Vec<_>>() }]);
    let out = python::run(&path, &feed, tmp.path()).unwrap();
    let want = mlp.reference(&x, batch);
    assert_eq!(out[0].values.len(), want.len(), "{:?}", out[0].shape);
    let max = out[0]
        .values
        .iter()
        .zip(&want)
        .map(|(a, b)| (*a as f64 - *b as f64).abs())
        .fold(0.0, f64::max);
    assert!(max < 1e-5, "QDQ in ONNX Runtime vs Rust reference: {max}");
    let spread = want.iter().cloned().fold(0.0f32, |m, v| m.max(v.abs()));
    assert!(spread > 0.5, "outputs are not trivially zero: {spread}");
    let ops = python::ops(
        &python::tool(&[
            "optimized-ops",
            path.to_str().unwrap(),
            tmp.path().join("opt.onnx").to_str().unwrap(),
        ])
        .unwrap(),
    );
    let integer = [
        "QGemm",
        "QLinearMatMul",
        "MatMulInteger",
        "MatMulIntegerToFloat",
        "DynamicQuantizeMatMul",
    ];
    assert!(
        integer.iter().any(|k| ops.contains_key(*k)),
        "no integer matmul after optimisation: {ops:?}"
    );
    eprintln!("optimised QDQ graph op types: {ops:?}");
}

#[test]
fn cnn_with_folded_batch_norm_matches_burn_in_onnx_runtime() {
    use burn::module::RunningState;
    use burn::nn::conv::Conv2dConfig;
    use burn::nn::pool::{AdaptiveAvgPool2dConfig, MaxPool2dConfig};
    use burn::nn::{BatchNormConfig, LinearConfig, PaddingConfig2d};
    use mopt_export::cnn::{export_cnn, CnnLayer};

    let d = Device::flex();
    let _draw = one_draw_at_a_time();
    d.seed(3);
    let conv1 = Conv2dConfig::new([1, 4], [3, 3])
        .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
        .init(&d);
    let conv2 = Conv2dConfig::new([4, 6], [3, 3])
        .with_stride([2, 2])
        .init(&d);
    let stats = |c: usize, base: f32| -> Tensor<1> {
        Tensor::from_floats(
            (0..c)
                .map(|i| base + 0.1 * i as f32)
                .collect::<Vec<_>>()
                .as_slice(),
            &d,
        )
    };
    let mut bn1 = BatchNormConfig::new(4).init(&d);
    bn1.running_mean = RunningState::new(stats(4, -0.2));
    bn1.running_var = RunningState::new(stats(4, 0.5));
    bn1.gamma = burn::module::Param::from_tensor(stats(4, 0.8));
    bn1.beta = burn::module::Param::from_tensor(stats(4, -0.1));
    let mut bn2 = BatchNormConfig::new(6).init(&d);
    bn2.running_mean = RunningState::new(stats(6, 0.3));
    bn2.running_var = RunningState::new(stats(6, 1.5));
    let pool = MaxPool2dConfig::new([2, 2]).with_strides([2, 2]).init();
    let gap = AdaptiveAvgPool2dConfig::new([1, 1]).init();
    let fc = LinearConfig::new(6, 10).init(&d);
    let (bn1, bn2) = (bn1.valid(), bn2.valid());

    // Burn's forward (inference statistics), 28×28 grey images like Fashion-MNIST.
    let batch = 5;
    let x: Vec<f32> = (0..batch * 28 * 28)
        .map(|i| ((i as f32) * 0.013).sin())
        .collect();
    let input = Tensor::<4>::from_data(TensorData::new(x.clone(), [batch, 1, 28, 28]), &d);
    let h = burn::tensor::activation::relu(bn1.forward(conv1.forward(input)));
    let h = pool.forward(h);
    let h = burn::tensor::activation::relu(bn2.forward(conv2.forward(h)));
    let h = gap.forward(h).reshape([batch, 6]);
    let want: Vec<f32> = fc.forward(h).into_data().try_to_vec().unwrap();

    let layers = [
        CnnLayer::Conv {
            conv: &conv1,
            bn: Some(&bn1),
        },
        CnnLayer::Relu,
        CnnLayer::MaxPool(&pool),
        CnnLayer::Conv {
            conv: &conv2,
            bn: Some(&bn2),
        },
        CnnLayer::Relu,
        CnnLayer::GlobalAvgPool,
        CnnLayer::Flatten,
        CnnLayer::Linear(&fc),
    ];
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("cnn.onnx");
    std::fs::write(&path, export_cnn(&layers, 1, 28, 28, 10).to_bytes()).unwrap();
    let checked = python::tool(&["check", path.to_str().unwrap()]).unwrap();
    let ops = python::ops(&checked);
    assert_eq!(ops.get("Conv"), Some(&2));
    assert!(
        !ops.contains_key("BatchNormalization"),
        "BatchNorm is folded: {ops:?}"
    );
    let images: Vec<Vec<Vec<Vec<f32>>>> = x
        .chunks(28 * 28)
        .map(|img| vec![img.chunks(28).map(<[f32]>::to_vec).collect()])
        .collect();
    let out = python::run(&path, &serde_json::json!([{ "image": images }]), tmp.path()).unwrap();
    assert_eq!(out[0].values.len(), want.len(), "{:?}", out[0].shape);
    let max = out[0]
        .values
        .iter()
        .zip(&want)
        .map(|(a, b)| (*a as f64 - *b as f64).abs())
        .fold(0.0, f64::max);
    assert!(max < 1e-4, "ORT vs Burn: {max}");
}
