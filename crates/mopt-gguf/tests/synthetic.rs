//! Round trips through the writer and the reader on small synthetic files: metadata of every
//! type, F32 (exact), F16 (within half precision), Q8_0 (equal to ggml's quantize →
//! dequantize), the tensor table's layout, and the tokenizer built from metadata.

mod common;

use common::{tiny_tokenizer, write_small, Rng};
use mopt_gguf::ggml::{f16_to_f32, f32_to_f16};
use mopt_gguf::{Array, GgmlType, Gguf, GgufError, GgufTokenizer, GgufWriter, Value};

fn write(f: impl FnOnce(&mut GgufWriter)) -> (tempfile::TempDir, Gguf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.gguf");
    let mut w = GgufWriter::new(&path);
    f(&mut w);
    w.write().unwrap();
    let g = Gguf::open(&path).unwrap();
    (dir, g)
}

/// Awkward f32s: zeros, subnormals, extremes, and random values of many magnitudes.
fn awkward(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed);
    let mut v = vec![
        0.0,
        -0.0,
        f32::MIN_POSITIVE,
        1e-45,
        f32::MAX,
        f32::MIN,
        1.0,
        -1.0,
    ];
    while v.len() < n {
        let e = rng.below(40) as i32 - 20;
        v.push(rng.unit() * 2f32.powi(e));
    }
    v.truncate(n);
    v
}

#[test]
fn f32_round_trips_bit_exactly() {
    let x = awkward(96, 1);
    let (_d, g) = write(|w| {
        w.tensor("x", &[32, 3], &x, GgmlType::F32).unwrap();
    });
    let y = g.read_f32("x").unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&y), bits(&x));
}

#[test]
fn f16_round_trips_within_half_precision() {
    let mut rng = Rng(2);
    let x: Vec<f32> = (0..256)
        .map(|_| rng.unit() * 2f32.powi(rng.below(24) as i32 - 12))
        .collect();
    let (_d, g) = write(|w| {
        w.tensor("x", &[16, 16], &x, GgmlType::F16).unwrap();
    });
    let y = g.read_f32("x").unwrap();
    for (a, b) in x.iter().zip(&y) {
        // The nearest half: within half a unit in the last place (2^-11 relative for normal
        // halves, 2^-25 absolute for subnormal ones), and exactly what the conversion gives.
        assert!(
            (a - b).abs() <= (a.abs() * 2f32.powi(-11)).max(2f32.powi(-25)),
            "{a} → {b}"
        );
        assert_eq!(*b, f16_to_f32(f32_to_f16(*a)));
    }
}

/// ggml's `quantize_row_q8_0_ref` then `dequantize_row_q8_0`, written out here on its own.
fn ggml_q8_0_round_trip(x: &[f32]) -> Vec<f32> {
    let mut out = Vec::new();
    for block in x.chunks(32) {
        let amax = block.iter().map(|v| v.abs()).fold(0.0f32, f32::max);
        let d = amax / 127.0;
        let id = if d == 0.0 { 0.0 } else { 1.0 / d };
        let d16 = f16_to_f32(f32_to_f16(d));
        out.extend(
            block
                .iter()
                .map(|v| f32::from((v * id).round() as i8) * d16),
        );
    }
    out
}

#[test]
fn q8_0_round_trips_as_ggml_computes_it() {
    let mut x = awkward(32 * 8, 3);
    x.splice(0..32, [0.0; 32]); // an all-zero block
    x.splice(32..34, [f32::MAX, 1.0]); // a block whose scale is huge (f16 infinity)
    x.splice(64..96, (0..32).map(|j| j as f32 / 2.0)); // halfway cases for the rounding
    let (_d, g) = write(|w| {
        w.tensor("x", &[64, 4], &x, GgmlType::Q8_0).unwrap();
    });
    let y = g.read_f32("x").unwrap();
    let want = ggml_q8_0_round_trip(&x);
    for (i, (a, b)) in y.iter().zip(&want).enumerate() {
        assert!(
            a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
            "element {i}: {a} vs {b}"
        );
    }
    assert!(y[..32].iter().all(|v| *v == 0.0));
    assert_eq!(g.read_raw("x").unwrap().len(), 8 * 34);
}

#[test]
fn metadata_of_every_type_round_trips_in_order() {
    let entries: Vec<(&str, Value)> = vec![
        ("u8", 1u8.into()),
        ("i8", (-2i8).into()),
        ("u16", 3u16.into()),
        ("i16", (-4i16).into()),
        ("u32", 5u32.into()),
        ("i32", (-6i32).into()),
        ("f32", 7.5f32.into()),
        ("bool", true.into()),
        ("string", "ünï 東京".into()),
        ("u64", u64::MAX.into()),
        ("i64", i64::MIN.into()),
        ("f64", std::f64::consts::PI.into()),
        ("empty", Value::Array(Array::F32(vec![]))),
        ("strings", vec!["a".to_string(), String::new()].into()),
        ("i64s", vec![-1i64, 2].into()),
        ("bools", vec![false, true].into()),
        (
            "nested",
            Value::Array(Array::Array(vec![
                Array::Array(vec![Array::I8(vec![-1])]),
                Array::F64(vec![0.5]),
            ])),
        ),
    ];
    let (_d, g) = write(|w| {
        for (k, v) in &entries {
            w.metadata(k, v.clone()).unwrap();
        }
    });
    let read: Vec<(&str, &Value)> = g.metadata().collect();
    assert_eq!(read.len(), entries.len());
    for ((k, v), (rk, rv)) in entries.iter().zip(read) {
        assert_eq!((*k, v), (rk, rv));
    }
    assert_eq!(g.version(), 3);
    assert_eq!(g.get_str_array("strings").unwrap(), ["a", ""]);
}

#[test]
fn the_tensor_table_is_aligned_and_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let g = Gguf::open(write_small(&dir.path().join("s.gguf"))).unwrap();
    let names: Vec<&str> = g.tensors().iter().map(|t| t.name()).collect();
    assert_eq!(names, ["norm", "proj", "embd", "scalar"]);
    assert_eq!(g.alignment(), 32);
    assert_eq!(g.data_start() % 32, 0);
    let proj = g.tensor("proj").unwrap();
    assert_eq!((proj.dims(), proj.shape()), (&[8, 3][..], vec![3, 8]));
    assert_eq!(proj.ggml_type(), GgmlType::F16);
    assert_eq!((proj.offset(), proj.byte_size()), (32, Some(48)));
    let embd = g.tensor("embd").unwrap();
    assert_eq!((embd.offset(), embd.byte_size()), (96, Some(4 * 34)));
    assert_eq!(g.read_f32("scalar").unwrap(), [4.0]);
    assert_eq!(g.tensor("scalar").unwrap().dims(), &[] as &[u64]);
    assert_eq!(g.get_i8("a.i8").unwrap(), -3);
    assert!(g.file_len() >= g.data_start() + 256);
}

#[test]
fn the_tokenizer_merges_bytes_and_matches_control_tokens_whole() {
    let (_d, g) = write(tiny_tokenizer);
    let t = GgufTokenizer::from_gguf(&g).unwrap();
    let ids = t.encode("hello world<|end|>").unwrap();
    // hello, Ġw, o, r, l, d (a byte's token id is the byte), <|end|>
    assert_eq!(ids, [259, 260, 111, 114, 108, 100, 261]);
    assert_eq!(t.decode(&ids).unwrap(), "hello world<|end|>");
    assert_eq!(t.encode("").unwrap(), Vec::<u32>::new());
    // Bytes outside ASCII go through the byte alphabet: é is 0xc3 0xa9.
    assert_eq!(t.encode("é").unwrap(), [0xc3, 0xa9]);
    assert_eq!(t.decode(&t.encode("é\n€").unwrap()).unwrap(), "é\n€");
    assert_eq!(
        (t.bos_id(), t.eos_id(), t.pad_id()),
        (Some(261), Some(261), None)
    );
    assert_eq!(t.vocab_size(), 262);
    assert_eq!(t.token(256), Some("he"));
    let e = t.decode(&[262]).unwrap_err().to_string();
    assert!(
        e.ends_with("tokenizer: decode: id 262 is outside the vocabulary of 262"),
        "{e}"
    );
}

fn tokenizer_error(f: impl FnOnce(&mut GgufWriter)) -> String {
    let (_d, g) = write(f);
    match GgufTokenizer::from_gguf(&g) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_tokenizer_that_is_not_gpt2_or_lacks_tokens_or_merges_is_an_error_naming_the_key() {
    let e = tokenizer_error(|w| {
        w.metadata("tokenizer.ggml.model", "llama").unwrap();
    });
    assert!(
        e.contains("tokenizer: tokenizer.ggml.model: `llama` is not supported (only `gpt2`"),
        "{e}"
    );
    let e = tokenizer_error(|w| {
        w.metadata("tokenizer.ggml.model", "gpt2").unwrap();
        w.metadata("tokenizer.ggml.tokens", vec!["a".to_string()])
            .unwrap();
    });
    assert!(
        e.ends_with("metadata key `tokenizer.ggml.merges` is missing"),
        "{e}"
    );
    let e = tokenizer_error(|w| {
        w.metadata("tokenizer.ggml.model", "gpt2").unwrap();
    });
    assert!(
        e.ends_with("metadata key `tokenizer.ggml.tokens` is missing"),
        "{e}"
    );
    let e = tokenizer_error(|w| {
        w.metadata("tokenizer.ggml.model", "gpt2").unwrap();
        w.metadata("tokenizer.ggml.tokens", vec!["a".to_string()])
            .unwrap();
        w.metadata("tokenizer.ggml.merges", vec!["a b".to_string()])
            .unwrap();
    });
    assert!(e.contains("tokenizer.ggml.merges"), "{e}");
    let e = tokenizer_error(|w| {
        tiny_tokenizer(w);
        w.metadata("tokenizer.ggml.pre", "llama-bpe").unwrap();
    });
    assert!(
        e.contains("tokenizer.ggml.pre: `llama-bpe` splits text"),
        "{e}"
    );
    let e = tokenizer_error(|w| {
        tiny_tokenizer(w);
        w.metadata("tokenizer.ggml.padding_token_id", 999u32)
            .unwrap();
    });
    assert!(
        e.contains("tokenizer.ggml.padding_token_id: id 999 is outside"),
        "{e}"
    );
    let (_d, g) = write(|w| {
        w.metadata("tokenizer.ggml.model", 2u32).unwrap();
    });
    assert!(matches!(
        GgufTokenizer::from_gguf(&g),
        Err(GgufError::WrongType { .. })
    ));
}
