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

/// The first `n` bytes of a play (cut at a line end) as a work of `dir`.
fn excerpt(dir: &Path, play: &str, n: usize) {
    let text = std::fs::read_to_string(data_dir().join("shakespeare").join(play)).unwrap();
    let cut = text[..n].rfind('\n').unwrap();
    std::fs::write(dir.join(play), &text[..cut]).unwrap();
}

/// The language-model tests' recipe (`lm.toml` in `dir`, runs in `dir/runs`): a tiny random
/// Llama (`tiny-llama.json`; `tiny-student.json` beside it, 1 layer) with SmolLM2's vocabulary on
/// three plays' excerpts, two other plays held out, with `stages`.
pub fn write_lm_recipe(dir: &Path, stages: &str) -> PathBuf {
    let works = dir.join("works");
    std::fs::create_dir(&works).unwrap();
    for p in ["hamlet_gut.txt", "macbeth_gut.txt", "othello_gut.txt"] {
        excerpt(&works, p, 12_000);
    }
    let held = dir.join("held");
    std::fs::create_dir(&held).unwrap();
    excerpt(&held, "tempest_gut.txt", 6_000);
    excerpt(&held, "twelfth_night_gut.txt", 6_000);
    // A tiny decoder: 2 layers of 4 query heads sharing 2 key/value heads, SmolLM2's vocabulary.
    let config = dir.join("tiny-llama.json");
    std::fs::write(
        &config,
        r#"{"vocab_size": 49152, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
            "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "tie_word_embeddings": true}"#,
    )
    .unwrap();
    let gguf = data_dir().join("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    let text = format!(
        r#"[run]
name = "lm"
output-dir = "{out}"
seed = 3

[model]
arch = "llama"
config = "{config}"

[tokenizer]
path = "{gguf}"
max-len = 16

[data]
format = "text-files"
train = "{works}"
valid = "{held}/tempest_gut.txt"
test = "{held}/twelfth_night_gut.txt"
max-train = 256
max-eval = 32

[train]
epochs = 2
batch-size = 16
lr = 1e-2
warmup-fraction = 0.0
best-metric = "perplexity"

[evaluation]
golden-samples = 1
latency-runs = 0
{stages}"#,
        out = dir.join("runs").display(),
        config = config.display(),
        gguf = gguf.display(),
        works = works.display(),
        held = held.display(),
    );
    std::fs::write(
        dir.join("tiny-student.json"),
        r#"{"vocab_size": 49152, "hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
            "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "tie_word_embeddings": true}"#,
    )
    .unwrap();
    let p = dir.join("lm.toml");
    std::fs::write(&p, text).unwrap();
    p
}

/// `dir` and everything under it (folders before their contents), sorted.
pub fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        if out[i].is_dir() {
            let mut inner: Vec<PathBuf> = std::fs::read_dir(&out[i])
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            out.append(&mut inner);
        }
        i += 1;
    }
    out.sort();
    out
}

/// The files called `name` under `dir`.
pub fn files_named(dir: &Path, name: &str) -> Vec<PathBuf> {
    tree(dir)
        .into_iter()
        .filter(|p| p.is_file() && p.file_name().is_some_and(|n| n == name))
        .collect()
}
