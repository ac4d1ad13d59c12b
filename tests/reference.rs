//! The real all-MiniLM-L6-v2 checkpoint reproduces the transformers reference activations.

mod common;

use burn::prelude::*;
use mopt_data::TextTokenizer;
use mopt_models::bert::{weights, BertConfig, BertForSequenceClassification, ForwardOptions};

fn load() -> BertForSequenceClassification {
    let dir = common::minilm_dir();
    let config = BertConfig::from_file(&dir.join("config.json")).unwrap();
    let mut model = BertForSequenceClassification::new(&config, &Device::flex());
    let report =
        weights::load_hf_safetensors(&mut model, &dir.join("model.safetensors"), true).unwrap();
    // 5 embedding tensors + 16 per layer x 6 + pooler 2 = 103; classifier is fresh.
    assert_eq!(report.applied, 103);
    let mut fresh = report.fresh.clone();
    fresh.sort();
    assert_eq!(fresh, vec!["classifier.bias", "classifier.weight"]);
    assert_eq!(
        report.skipped.len(),
        1,
        "position_ids skipped: {:?}",
        report.skipped
    );
    model.valid()
}

fn ids_tensor(rows: &[Vec<u32>]) -> (Tensor<2, Int>, Tensor<2>, Tensor<2, Int>) {
    let d = Device::flex();
    let seq = rows.iter().map(Vec::len).max().unwrap();
    let mut ids = vec![0i64; rows.len() * seq];
    let mut mask = vec![0f32; rows.len() * seq];
    for (r, row) in rows.iter().enumerate() {
        for (c, &t) in row.iter().enumerate() {
            ids[r * seq + c] = t as i64;
            mask[r * seq + c] = 1.0;
        }
    }
    (
        Tensor::from_data(TensorData::new(ids, [rows.len(), seq]), &d),
        Tensor::from_data(TensorData::new(mask, [rows.len(), seq]), &d),
        Tensor::zeros([rows.len(), seq], &d),
    )
}

fn first5(t: Tensor<3>, row: usize) -> Vec<f32> {
    let v: Vec<f32> = t
        .slice([row..row + 1, 0..1, 0..5])
        .into_data()
        .try_to_vec()
        .unwrap();
    v
}

#[test]
fn minilm_matches_transformers_reference() {
    let dir = common::minilm_dir();
    let tok = TextTokenizer::from_file(&dir.join("tokenizer.json"), 128, true).unwrap();
    let ids = tok.encode("the movie was great").unwrap();
    assert_eq!(ids, vec![101, 1996, 3185, 2001, 2307, 102]);
    // vocab.txt with BERT's normalizer gives the same ids.
    let tok_vocab = TextTokenizer::from_file(&dir.join("vocab.txt"), 128, true).unwrap();
    assert_eq!(tok_vocab.encode("The movie was GREAT").unwrap(), ids);

    let model = load();
    let (i, m, t) = ids_tensor(std::slice::from_ref(&ids));
    let out = model.forward_with(
        i,
        m,
        t,
        ForwardOptions {
            hidden_states: true,
            attentions: true,
            attention_scores: false,
        },
    );
    let cls = first5(out.last_hidden_state.clone(), 0);
    let want = [-0.149688, -0.117503, 0.104433, -0.131272, -0.197488];
    for (g, w) in cls.iter().zip(want) {
        assert!(
            (g - w).abs() < 1e-4,
            "last hidden [CLS] {cls:?} vs {want:?}"
        );
    }
    let sum: f32 = out.last_hidden_state.clone().sum().into_scalar();
    assert!((sum - 27.118343).abs() < 1e-2, "sum {sum}");
    let emb = first5(out.hidden_states[0].clone(), 0);
    let want = [-0.176567, -0.048236, 0.037698, -0.015718, 0.006323];
    for (g, w) in emb.iter().zip(want) {
        assert!((g - w).abs() < 1e-4, "embedding [CLS] {emb:?} vs {want:?}");
    }
    let pooled: Vec<f32> = out
        .pooled
        .slice([0..1, 0..5])
        .into_data()
        .try_to_vec()
        .unwrap();
    let want = [-0.070114, 0.034234, 0.036967, 0.047976, -0.061488];
    for (g, w) in pooled.iter().zip(want) {
        assert!((g - w).abs() < 1e-4, "pooler {pooled:?} vs {want:?}");
    }
    assert_eq!(out.hidden_states.len(), 7);
    assert_eq!(out.attentions.len(), 6);
    assert_eq!(out.attentions[0].dims(), [1, 12, 6, 6]);
    // Attention rows are distributions.
    let row_sums: Vec<f32> = out.attentions[3]
        .clone()
        .sum_dim(3)
        .into_data()
        .try_to_vec()
        .unwrap();
    assert!(row_sums.iter().all(|s| (s - 1.0).abs() < 1e-5));

    // Padding: the same sentence in a batch with a longer one gives the same [CLS] vector.
    let longer = tok
        .encode("a much longer sentence about a movie that was not great at all")
        .unwrap();
    let (i2, m2, t2) = ids_tensor(&[ids.clone(), longer]);
    let padded = model.forward_with(i2, m2, t2, ForwardOptions::default());
    let a: Vec<f32> = out
        .last_hidden_state
        .slice([0..1, 0..1])
        .into_data()
        .try_to_vec()
        .unwrap();
    let b: Vec<f32> = padded
        .last_hidden_state
        .slice([0..1, 0..1])
        .into_data()
        .try_to_vec()
        .unwrap();
    let max = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    assert!(max < 1e-5, "padded vs unpadded [CLS] differ by {max}");
}

#[test]
fn hf_round_trip_and_burn_checkpoint_reproduce_logits() {
    let model = load();
    let dir = common::minilm_dir();
    let mut config = BertConfig::from_file(&dir.join("config.json")).unwrap();
    config.num_labels = 2;
    let tmp = tempfile::tempdir().unwrap();
    let (i, m, t) = ids_tensor(&[vec![101, 1996, 3185, 2001, 2307, 102], vec![101, 2307, 102]]);
    let want: Vec<f32> = model
        .forward(i.clone(), m.clone(), t.clone())
        .into_data()
        .try_to_vec()
        .unwrap();

    weights::save_checkpoint(&model, &config, &tmp.path().join("ckpt")).unwrap();
    let (reloaded, cfg2) =
        weights::load_checkpoint(&tmp.path().join("ckpt"), &Device::flex()).unwrap();
    assert_eq!(cfg2, config);
    let got: Vec<f32> = reloaded
        .valid()
        .forward(i.clone(), m.clone(), t.clone())
        .into_data()
        .try_to_vec()
        .unwrap();
    assert_eq!(got, want, "burnpack round trip is exact");

    weights::save_hf(&model, &config, &tmp.path().join("hf")).unwrap();
    let mut again = BertForSequenceClassification::new(&config, &Device::flex());
    let report =
        weights::load_hf_safetensors(&mut again, &tmp.path().join("hf/model.safetensors"), false)
            .unwrap();
    assert_eq!(
        report.applied, 105,
        "HF export carries every tensor, head included"
    );
    let got: Vec<f32> = again
        .valid()
        .forward(i, m, t)
        .into_data()
        .try_to_vec()
        .unwrap();
    assert_eq!(got, want, "HF safetensors round trip is exact");
}

#[test]
fn missing_head_is_an_error_unless_allowed() {
    let dir = common::minilm_dir();
    let config = BertConfig::from_file(&dir.join("config.json")).unwrap();
    let mut model = BertForSequenceClassification::new(&config, &Device::flex());
    let err = weights::load_hf_safetensors(&mut model, &dir.join("model.safetensors"), false)
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("no classification head") && msg.contains("allow-fresh-head"),
        "{msg}"
    );

    let mut wrong = config.clone();
    wrong.intermediate_size = 1000;
    let mut model = BertForSequenceClassification::new(&wrong, &Device::flex());
    let err =
        weights::load_hf_safetensors(&mut model, &dir.join("model.safetensors"), true).unwrap_err();
    assert!(err.to_string().contains("do not fit the model"), "{err}");
}

#[test]
fn pruned_shapes_build_and_run() {
    // Per-layer heads and FFN widths as pruning will produce them.
    let mut c = BertConfig::tiny(200, 3);
    c.mopt_layer_heads = Some(vec![4, 1]);
    c.mopt_layer_intermediate_sizes = Some(vec![64, 8]);
    let d = Device::flex();
    let model = BertForSequenceClassification::new(&c, &d).valid();
    assert_eq!(
        model.bert.encoder.layer[1]
            .attention
            .self_attn
            .query
            .weight
            .dims(),
        [32, 8]
    );
    assert_eq!(
        model.bert.encoder.layer[1].intermediate.dense.weight.dims(),
        [32, 8]
    );
    let (i, m, t) = ids_tensor(&[vec![1, 2, 3, 4]]);
    let out = model.forward_with(
        i,
        m,
        t,
        ForwardOptions {
            hidden_states: false,
            attentions: true,
            attention_scores: true,
        },
    );
    assert_eq!(out.logits.dims(), [1, 3]);
    assert_eq!(out.attentions[1].dims(), [1, 1, 4, 4]);
    assert_eq!(out.attention_scores[1].dims(), [1, 1, 4, 4]);
    // Probabilities are the softmax of the scores (no padding here).
    let p: Vec<f32> = burn::tensor::activation::softmax(out.attention_scores[0].clone(), 3)
        .into_data()
        .try_to_vec()
        .unwrap();
    let q: Vec<f32> = out.attentions[0].clone().into_data().try_to_vec().unwrap();
    assert!(p.iter().zip(&q).all(|(a, b)| (a - b).abs() < 1e-6));
    assert_eq!(model.num_params(), c.num_params());
}
