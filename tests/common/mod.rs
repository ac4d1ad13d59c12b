//! Shared helpers for the integration tests: real data paths and tiny recipes.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `datasets/data` of this checkout; panics with the fix when the data is missing.
pub fn data_dir() -> PathBuf {
    let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("datasets/data");
    let probe = d.join("models/all-MiniLM-L6-v2/model.safetensors");
    assert!(
        probe.is_file(),
        "test data missing ({}): run `datasets/fetch.sh --text` first",
        probe.display()
    );
    d
}

pub fn minilm_dir() -> PathBuf {
    data_dir().join("models/all-MiniLM-L6-v2")
}

pub fn rotten_tomatoes() -> PathBuf {
    data_dir().join("rotten_tomatoes/rotten_tomatoes_corpus_full.csv.bz2")
}

/// A tiny random BERT config (hidden 32, 2 layers, 4 heads, FFN 64) with MiniLM's vocabulary.
pub fn write_tiny_config(dir: &Path) -> PathBuf {
    let cfg = serde_json::json!({
        "vocab_size": 30522, "hidden_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 4, "intermediate_size": 64, "max_position_embeddings": 128,
        "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1
    });
    let p = dir.join("tiny-config.json");
    std::fs::write(&p, serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    p
}

/// A tiny recipe on a slice of real Rotten Tomatoes data, written to `dir/tiny.toml`.
/// `extra` is appended verbatim inside `[train]`. The data file is copied into `dir/data`, so
/// that the caches runs keep beside it (token ids, teacher outputs) belong to this test alone:
/// with reproducible checkpoints, a cache left by another test or an earlier run would
/// otherwise be hit.
pub fn write_tiny_recipe(dir: &Path, name: &str, extra_train: &str) -> PathBuf {
    let cfg = write_tiny_config(dir);
    let data = dir
        .join("data")
        .join(rotten_tomatoes().file_name().unwrap());
    std::fs::create_dir_all(data.parent().unwrap()).unwrap();
    std::fs::copy(rotten_tomatoes(), &data).unwrap();
    let text = format!(
        r#"[run]
name = "{name}"
output-dir = "{out}"
seed = 7

[model]
config = "{cfg}"

[tokenizer]
path = "{vocab}"
max-len = 32

[data]
format = "rotten-tomatoes"
path = "{data}"
max-train = 96
max-eval = 40

[train]
epochs = 2
batch-size = 16
lr = 1e-3
log-every = 2
{extra_train}
"#,
        out = dir.join("runs").display(),
        cfg = cfg.display(),
        vocab = minilm_dir().join("vocab.txt").display(),
        data = data.display(),
    );
    let p = dir.join("tiny.toml");
    std::fs::write(&p, text).unwrap();
    p
}

/// Run the real `mopt-train` binary.
pub fn mopt(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mopt-train"))
        .args(args)
        .output()
        .expect("run mopt-train")
}

/// Parse a JSON file, naming it on failure.
pub fn read_json(p: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
