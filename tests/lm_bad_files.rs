//! Damaged files in a language-model recipe, fed to the real binary: a GGUF file cut short,
//! with another magic, an unsupported version, a tensor's data past the end of the file, a
//! tensor of an unknown ggml type, metadata that contradicts the tensors, a tokenizer without
//! merges, and a training work that is not UTF-8. Each run (not `--check`) must exit 2, name
//! the file (once) and the field at fault (key, tensor, header, byte offset), and leave no run
//! folder. The damage is done to the bytes of one valid file: a tiny random Llama of the
//! recipe's own config with SmolLM2's tokenizer, written by `write_gguf`, which serves as the
//! `[model] config` (a GGUF model) or as the `[tokenizer] path` (its `tokenizer.*` keys).
//! Never-panicking on every truncation and on random flips is `mopt-gguf`'s
//! `tests/robustness.rs`; here it is what the user sees.

mod common;

use std::path::{Path, PathBuf};

use burn::prelude::*;
use common::{data_dir, mopt, stderr, write_lm_recipe};
use mopt_gguf::{GgmlType, Gguf};
use mopt_models::llama::{write_gguf, LlamaConfig, LlamaForCausalLM};

/// SmolLM2's file, the recipe's tokenizer.
fn smollm2() -> PathBuf {
    data_dir().join("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// The valid file the cases damage: the recipe's tiny Llama (2 layers, hidden 32, vocabulary
/// 49,152) with random weights in Q8_0 (norms F32) and SmolLM2's tokenizer keys.
fn write_model(dir: &Path) -> PathBuf {
    write_lm_recipe(dir, "");
    let config = LlamaConfig::from_file(&dir.join("tiny-llama.json")).unwrap();
    let dev = Device::flex();
    dev.seed(5);
    let model = LlamaForCausalLM::new(&config, &dev);
    let source = Gguf::open(smollm2()).unwrap();
    let path = dir.join("good.gguf");
    write_gguf(&model, &config, source.metadata(), &path, GgmlType::Q8_0).unwrap();
    path
}

/// Where the bytes after the GGUF string `s` (its u64 length, then its bytes) start.
fn after_string(bytes: &[u8], s: &str) -> usize {
    let mut needle = (s.len() as u64).to_le_bytes().to_vec();
    needle.extend(s.as_bytes());
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("`{s}` is not in the file"));
    at + needle.len()
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

/// Where tensor `name`'s ggml type id and (the u64 after it) data offset are in the table,
/// checked against what the reader makes of the valid file.
fn tensor_type_at(bytes: &[u8], good: &Gguf, name: &str) -> usize {
    let p = after_string(bytes, name);
    let n_dims = u32_at(bytes, p) as usize;
    let at = p + 4 + 8 * n_dims;
    let info = good.tensor_info(name).unwrap();
    assert_eq!(n_dims, info.dims().len(), "{name}");
    assert_eq!(u32_at(bytes, at), info.ggml_type().0, "{name}");
    assert_eq!(u64_at(bytes, at + 4), info.offset(), "{name}");
    at
}

/// Which role the damaged file plays in the recipe.
#[derive(Clone, Copy, Debug)]
enum Role {
    /// `[model] config`.
    Model,
    /// `[tokenizer] path`.
    Tokenizer,
}

/// One bad input: `bytes`, the valid file damaged, written as `file` in the case's folder and
/// put in `role`; the message must name the file and hold every needle.
struct Case {
    name: &'static str,
    role: Role,
    file: &'static str,
    bytes: Vec<u8>,
    needles: Vec<String>,
}

fn cases(good: &[u8], g: &Gguf) -> Vec<Case> {
    let with = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = good.to_vec();
        f(&mut b);
        b
    };
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let len = good.len() as u64;
    // Cut inside the tokens array: the reader knows before reading them that they cannot fit.
    let tokens_cut = after_string(good, "tokenizer.ggml.tokens") + 1000;
    // Cut 100 bytes short: the last tensor in the data section loses its end.
    let last = g
        .tensors()
        .iter()
        .max_by_key(|t| t.offset())
        .unwrap()
        .name()
        .to_string();
    assert!(g.data_start() + g.tensor_info(&last).unwrap().offset() < len - 100);
    let embd_type = tensor_type_at(good, g, "token_embd.weight");
    let norm_type = tensor_type_at(good, g, "output_norm.weight");
    let beyond = len.next_multiple_of(g.alignment());
    // `llama.embedding_length`: its u32 type id (4), then the value, 32.
    let hidden = after_string(good, "llama.embedding_length");
    assert_eq!((u32_at(good, hidden), u32_at(good, hidden + 4)), (4, 32));
    let merges = after_string(good, "tokenizer.ggml.merges") - "merges".len();
    let magic = |b: &mut Vec<u8>| b[..4].copy_from_slice(b"GGUL");
    let version = |b: &mut Vec<u8>| b[4..8].copy_from_slice(&4u32.to_le_bytes());
    let case = |name, role, file, bytes, needles| Case {
        name,
        role,
        file,
        bytes,
        needles,
    };
    use Role::{Model, Tokenizer};
    vec![
        case(
            "tokenizer cut inside its tokens",
            Tokenizer,
            "cut.gguf",
            good[..tokens_cut].to_vec(),
            s(&["metadata key `tokenizer.ggml.tokens`", "cannot fit"]),
        ),
        case(
            "model cut inside its last tensor",
            Model,
            "cut.gguf",
            good[..good.len() - 100].to_vec(),
            vec![
                format!("tensor `{last}`"),
                "past the end of the file".into(),
            ],
        ),
        case(
            "tokenizer with another magic",
            Tokenizer,
            "magic.gguf",
            with(&magic),
            s(&["not a GGUF file", "magic bytes `GGUF`"]),
        ),
        case(
            "model with another magic",
            Model,
            "magic.gguf",
            with(&magic),
            s(&["not a GGUF file", "magic bytes `GGUF`"]),
        ),
        case(
            "tokenizer of GGUF version 4",
            Tokenizer,
            "v4.gguf",
            with(&version),
            s(&["header", "GGUF version 4 is not supported"]),
        ),
        case(
            "model of GGUF version 4",
            Model,
            "v4.gguf",
            with(&version),
            s(&["header", "GGUF version 4 is not supported"]),
        ),
        case(
            "tokenizer file with a tensor offset past the end",
            Tokenizer,
            "offset.gguf",
            with(&|b| b[norm_type + 4..norm_type + 12].copy_from_slice(&beyond.to_le_bytes())),
            vec![
                "tensor `output_norm.weight`".into(),
                format!("offset {beyond}"),
                "past the end of the file".into(),
            ],
        ),
        case(
            "model with a tensor offset past the end",
            Model,
            "offset.gguf",
            with(&|b| b[embd_type + 4..embd_type + 12].copy_from_slice(&beyond.to_le_bytes())),
            vec![
                "tensor `token_embd.weight`".into(),
                format!("offset {beyond}"),
                "past the end of the file".into(),
            ],
        ),
        case(
            "model with a tensor of an unknown ggml type",
            Model,
            "type.gguf",
            with(&|b| b[embd_type..embd_type + 4].copy_from_slice(&99u32.to_le_bytes())),
            s(&["tensor `token_embd.weight`", "unknown ggml type 99"]),
        ),
        case(
            "model whose hidden size contradicts its embedding table",
            Model,
            "hidden.gguf",
            with(&|b| b[hidden + 4..hidden + 8].copy_from_slice(&48u32.to_le_bytes())),
            s(&["llama.embedding_length", "token_embd.weight", "48"]),
        ),
        case(
            "tokenizer without merges",
            Tokenizer,
            "merges.gguf",
            // Renamed in place (`…merges` to `…mergez`): the file stays valid.
            with(&|b| b[merges..merges + 6].copy_from_slice(b"mergez")),
            s(&["tokenizer.ggml.merges", "missing"]),
        ),
    ]
}

/// The recipe of `dir` (a fresh folder) with `role` played by `file`.
fn recipe_with(dir: &Path, role: Role, file: &Path) -> PathBuf {
    let recipe = write_lm_recipe(dir, "");
    let text = std::fs::read_to_string(&recipe).unwrap();
    let from = match role {
        Role::Model => dir.join("tiny-llama.json"),
        Role::Tokenizer => smollm2(),
    };
    let from = from.display().to_string();
    assert_eq!(text.matches(&from).count(), 1, "{from} in the recipe");
    std::fs::write(&recipe, text.replace(&from, &file.display().to_string())).unwrap();
    recipe
}

/// Entries left in the recipe's output folder.
fn runs_left(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("runs"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Run `recipe`; `None` when it exits 2, its message names `path` (once) and holds every
/// needle, and no run folder is left; otherwise what went wrong.
fn refused(name: &str, recipe: &Path, path: &Path, needles: &[String]) -> Option<String> {
    let out = mopt(&[recipe.to_str().unwrap()]);
    let err = stderr(&out);
    // The message: from `error:` to the end (the fix on the lines after it).
    let message = err
        .find("error:")
        .map_or(err.as_str(), |at| &err[at..])
        .trim_end();
    println!("{name}: {message}");
    let mut wrong = Vec::new();
    if out.status.code() != Some(2) {
        wrong.push(format!("exit {:?}", out.status.code()));
    }
    let path = path.display().to_string();
    match message.matches(path.as_str()).count() {
        1 => {}
        n => wrong.push(format!("the message names the file {n} times")),
    }
    for n in needles {
        if !message.contains(n.as_str()) {
            wrong.push(format!("message lacks `{n}`"));
        }
    }
    let left = runs_left(recipe.parent().unwrap());
    if left > 0 {
        wrong.push(format!("{left} entries left in runs/"));
    }
    (!wrong.is_empty()).then(|| format!("- {name}: {} | stderr: {message}", wrong.join("; ")))
}

#[test]
fn damaged_gguf_files_exit_2_name_the_file_and_field_and_leave_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let good_path = write_model(&mkdir(tmp.path().join("good")));
    let good = std::fs::read(&good_path).unwrap();
    let g = Gguf::open(&good_path).unwrap();

    // The valid file passes in either role (so the damage is what each case is refused for).
    for role in [Role::Model, Role::Tokenizer] {
        let dir = mkdir(tmp.path().join(format!("good-{role:?}")));
        let recipe = recipe_with(&dir, role, &good_path);
        let out = mopt(&[recipe.to_str().unwrap(), "--check"]);
        assert_eq!(out.status.code(), Some(0), "{role:?}: {}", stderr(&out));
    }

    let cases = cases(&good, &g);
    let failures: Vec<String> = cases
        .iter()
        .enumerate()
        .filter_map(|(i, c)| {
            let dir = mkdir(tmp.path().join(format!("case-{i}")));
            let file = dir.join(c.file);
            std::fs::write(&file, &c.bytes).unwrap();
            let recipe = recipe_with(&dir, c.role, &file);
            refused(c.name, &recipe, &file, &c.needles)
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn a_training_work_that_is_not_utf8_exits_2_naming_it_and_the_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = write_lm_recipe(tmp.path(), "");
    // Latin-1, as an old download might be: `é` is the single byte 0xe9 at offset 11.
    let bad = tmp.path().join("works/zz_latin1.txt");
    std::fs::write(&bad, b"To be, or n\xe9t to be, that is the question\n").unwrap();
    let needles = ["not UTF-8".to_string(), "offset 11".to_string()];
    if let Some(wrong) = refused("non-UTF-8 work", &recipe, &bad, &needles) {
        panic!("{wrong}");
    }
}

/// The folder `p`, created.
fn mkdir(p: PathBuf) -> PathBuf {
    std::fs::create_dir(&p).unwrap();
    p
}
