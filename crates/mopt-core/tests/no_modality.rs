//! The generic core knows no model family and no modality: no name of BERT's or of text (token
//! ids, tokenizers, text batches, a vocabulary, heads' and FFN limits) in the code of
//! `mopt-core`, `mopt-recipe` (the recipe's grammar: a data format's keys and sections are the
//! format's), `mopt-prune`, `mopt-quant`, or `mopt-distill` outside its `text` module. Text
//! lives with the text data (`mopt-data`) and the text families; a family's limits with its group
//! kinds. Comments and `#[cfg(test)]` modules may name examples; code may not.

use std::path::{Path, PathBuf};

/// Words no generic code names (lowercase; matched in lowercase code).
const TEXT_OR_BERT: &[&str] = &[
    "bert",
    "textbatch",
    "encoded",
    "batcher",
    "tokeniz",
    "wordpiece",
    "vocab",
    "sentence",
    "min_heads",
    "ffn_multiple",
    "hidden_multiple",
];

/// Every `.rs` file under `dir`, but the folders named in `skip`.
fn sources(dir: &Path, skip: &[&str], out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("src readable") {
        let p = e.expect("entry").path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if p.is_dir() {
            if !skip.contains(&name.as_str()) {
                sources(&p, skip, out);
            }
        } else if name.ends_with(".rs") {
            out.push(p);
        }
    }
}

/// The code of `text`: up to its tests, without comments, lowercase.
fn code(text: &str) -> String {
    let before_tests = text.split("#[cfg(test)]").next().unwrap_or("");
    before_tests
        .lines()
        .map(|l| l.split("//").next().unwrap_or("").to_lowercase())
        .collect::<Vec<_>>()
        .join("\n")
}

/// `(file:line, word)` of every word of [`TEXT_OR_BERT`] in the code of `files`.
fn offences(files: &[PathBuf]) -> Vec<String> {
    let mut found = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f).expect("source readable");
        for (i, line) in code(&text).lines().enumerate() {
            for w in TEXT_OR_BERT.iter().filter(|w| line.contains(*w)) {
                found.push(format!("{}:{}: `{w}`", f.display(), i + 1));
            }
        }
    }
    found
}

#[test]
fn the_generic_crates_name_no_family_and_no_modality() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for (krate, skip) in [
        ("mopt-core", &[][..]),
        ("mopt-recipe", &[]),
        ("mopt-prune", &[]),
        ("mopt-quant", &[]),
        ("mopt-distill", &["text"]),
    ] {
        sources(&crates.join(krate).join("src"), skip, &mut files);
    }
    assert!(files.len() > 40, "{} files: the crates moved?", files.len());
    let found = offences(&files);
    assert!(
        found.is_empty(),
        "text or BERT in generic code:\n{}",
        found.join("\n")
    );
}

/// The check finds what it looks for: the text module of mopt-distill names text batches.
#[test]
fn the_check_sees_text_where_it_is() {
    let text = Path::new(env!("CARGO_MANIFEST_DIR")).join("../mopt-distill/src/text");
    let mut files = Vec::new();
    sources(&text, &[], &mut files);
    let found = offences(&files);
    assert!(found.iter().any(|f| f.contains("`textbatch`")), "{found:?}");
    // And skips comments: this line's `TextBatch` is not code.
    assert!(code("let x = 1; // TextBatch").trim() == "let x = 1;");
}
