//! Shared by the integration tests: a small valid GGUF, a seeded PRNG, the real file's path.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use mopt_gguf::{Array, GgmlType, GgufWriter, Value};

/// SplitMix64: a seeded generator, so every case can be replayed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in `[-1, 1)`.
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// The 256 characters of GPT-2's byte alphabet, in byte order.
pub fn byte_chars() -> Vec<String> {
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
    let mut next = 0x100;
    (0..256u32)
        .map(|b| {
            let c = if printable(b) {
                b
            } else {
                next += 1;
                next - 1
            };
            char::from_u32(c).unwrap().to_string()
        })
        .collect()
}

/// A tiny byte-level BPE vocabulary: the 256 byte characters (ids 0-255), then `he`, `ll`,
/// `hell`, `hello`, `Ġw` (256-260) and the control token `<|end|>` (261).
pub fn tiny_tokenizer(w: &mut GgufWriter) {
    let mut tokens = byte_chars();
    tokens.extend(["he", "ll", "hell", "hello", "Ġw", "<|end|>"].map(String::from));
    let mut types = vec![1i32; tokens.len()];
    types[261] = 3;
    let merges = ["h e", "l l", "he ll", "hell o", "Ġ w"]
        .map(String::from)
        .to_vec();
    w.metadata("tokenizer.ggml.model", "gpt2").unwrap();
    w.metadata("tokenizer.ggml.tokens", tokens).unwrap();
    w.metadata("tokenizer.ggml.token_type", types).unwrap();
    w.metadata("tokenizer.ggml.merges", merges).unwrap();
    w.metadata("tokenizer.ggml.bos_token_id", 261u32).unwrap();
    w.metadata("tokenizer.ggml.eos_token_id", 261u32).unwrap();
}

/// Write the small valid file the robustness and round-trip tests start from: metadata of
/// every type, a tiny tokenizer, and tensors in F32, F16 and Q8_0.
pub fn write_small(path: &Path) -> PathBuf {
    let mut rng = Rng(7);
    let mut w = GgufWriter::new(path);
    w.metadata("general.architecture", "llama").unwrap();
    w.metadata("llama.block_count", 2u32).unwrap();
    w.metadata("a.i8", -3i8).unwrap();
    w.metadata("a.f64", 0.125f64).unwrap();
    w.metadata("a.bools", vec![true, false]).unwrap();
    let nested = Array::Array(vec![
        Array::U16(vec![1, 2]),
        Array::String(vec!["x".into()]),
    ]);
    w.metadata("a.nested", Value::Array(nested)).unwrap();
    tiny_tokenizer(&mut w);
    let mut values = |n: usize| (0..n).map(|_| rng.unit()).collect::<Vec<f32>>();
    w.tensor("norm", &[8], &values(8), GgmlType::F32).unwrap();
    w.tensor("proj", &[8, 3], &values(24), GgmlType::F16)
        .unwrap();
    w.tensor("embd", &[64, 2], &values(128), GgmlType::Q8_0)
        .unwrap();
    w.tensor("scalar", &[], &[4.0], GgmlType::F32).unwrap();
    w.write().unwrap();
    path.to_path_buf()
}

/// The real SmolLM2 file; fails (never skips) with the command that fetches it.
pub fn smollm2() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../datasets/data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.is_file(),
        "test data missing ({}): run `datasets/fetch.sh --small` first",
        p.display()
    );
    p
}

/// A fixture under `tests/fixtures/`, parsed.
pub fn fixture(name: &str) -> serde_json::Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}
