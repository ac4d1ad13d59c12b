//! The book's recipe snippets validate: every ```toml block under `docs/src/` is checked with
//! the code `mopt-train --check` runs first (recipe parsing and validation, every stage parsed
//! by its kind), so the reference cannot drift from the schema. A block with `[run]` is a whole
//! recipe; any other block is merged into a small recipe of its modality (its tables replace
//! the base's, its `[[stage]]` blocks become the stages). Paths are real: the files
//! `datasets/fetch.sh --small` fetches.

use std::path::{Path, PathBuf};

const TEXT_BASE: &str = r#"
[run]
name = "book"

[model]
arch = "bert"
config = "../datasets/data/models/all-MiniLM-L6-v2/config.json"

[tokenizer]
path = "../datasets/data/models/all-MiniLM-L6-v2/tokenizer.json"
max-len = 64

[data]
format = "rotten-tomatoes"
path = "../datasets/data/rotten_tomatoes/rotten_tomatoes_corpus_full.csv.bz2"

[train]
epochs = 3
"#;

const IMAGE_BASE: &str = r#"
[run]
name = "book"

[model]
arch = "resnet"
config = "models/resnet-fmnist.json"

[data]
format = "idx"
train = "../datasets/data/fashion-mnist/train-images-idx3-ubyte.gz"
test = "../datasets/data/fashion-mnist/t10k-images-idx3-ubyte.gz"

[train]
epochs = 3
"#;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// Every markdown file under `dir` (sub-folders included).
fn markdown_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "md") {
                files.push(p);
            }
        }
    }
    files
}

/// Every ```toml block of the markdown files under `dir`: (file, first line, text).
fn toml_blocks(dir: &Path) -> Vec<(PathBuf, usize, String)> {
    let mut out = Vec::new();
    let mut files = markdown_files(dir);
    files.sort();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let mut block: Option<(usize, String)> = None;
        for (i, line) in text.lines().enumerate() {
            match &mut block {
                None if line.trim_start() == "```toml" => block = Some((i + 2, String::new())),
                Some((start, body)) if line.trim_start() == "```" => {
                    out.push((f.clone(), *start, std::mem::take(body)));
                    block = None;
                }
                Some((_, body)) => {
                    body.push_str(line);
                    body.push('\n');
                }
                None => {}
            }
        }
    }
    out
}

/// `snippet` as a whole recipe: itself, or merged into the base of its modality.
fn as_recipe(snippet: &str) -> String {
    let frag: toml::Table = toml::from_str(snippet).unwrap_or_else(|e| panic!("{e}\n{snippet}"));
    if frag.contains_key("run") && frag.contains_key("data") {
        return snippet.to_string();
    }
    let get = |t: &toml::Table, a: &str, b: &str| -> Option<String> {
        Some(t.get(a)?.get(b)?.as_str()?.to_string())
    };
    let image = matches!(
        get(&frag, "data", "format").as_deref(),
        Some("idx" | "pixels-csv")
    ) || matches!(
        get(&frag, "model", "arch").as_deref(),
        Some("resnet" | "cnn")
    );
    let mut base: toml::Table = toml::from_str(if image { IMAGE_BASE } else { TEXT_BASE }).unwrap();
    if frag.contains_key("teacher") {
        base.remove("model");
    }
    for (k, v) in frag {
        base.insert(k, v);
    }
    toml::to_string(&base).unwrap()
}

#[test]
fn every_recipe_snippet_in_the_book_validates() {
    // Relative paths resolve against recipes/, as in the shipped recipes.
    let at = root().join("recipes/book-snippet.toml");
    let blocks = toml_blocks(&root().join("docs/src"));
    assert!(blocks.len() >= 15, "found {} toml blocks", blocks.len());
    let mut failures = Vec::new();
    for (file, line, snippet) in &blocks {
        let recipe = as_recipe(snippet);
        let checked = mopt_recipe::parse(&at, &recipe)
            .map_err(|e| e.to_string())
            .and_then(|r| {
                mopt_stages::Pipeline::from_recipe(r, &mopt_families::builtin())
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            });
        if let Err(e) = checked {
            failures.push(format!("{}:{line}: {e}", file.display()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Relative links of the markdown file `file` whose target does not exist.
fn broken_links(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap();
    let dir = file.parent().unwrap();
    text.split("](")
        .skip(1)
        .filter_map(|part| {
            let target = part.split(')').next().unwrap_or("");
            let path = target.split('#').next().unwrap_or("");
            let local = !path.is_empty() && !path.contains("://");
            (local && !dir.join(path).exists()).then(|| format!("{}: {target}", file.display()))
        })
        .collect()
}

/// The README's links into the book and the repository resolve, and so do the book's.
#[test]
fn readme_and_book_links_resolve() {
    let mut missing = broken_links(&root().join("README.md"));
    for p in markdown_files(&root().join("docs/src")) {
        missing.extend(broken_links(&p));
    }
    assert!(
        missing.is_empty(),
        "links to missing files:\n{}",
        missing.join("\n")
    );
}

/// The book's table of contents is what mdBook builds from: every chapter it lists exists and is
/// listed once, and every chapter under `docs/src` is listed (what `docs/build.sh` would
/// otherwise refuse or silently leave out).
#[test]
fn the_summary_lists_every_chapter_once() {
    let src = root().join("docs/src");
    let summary = std::fs::read_to_string(src.join("SUMMARY.md")).unwrap();
    let mut listed: Vec<String> = Vec::new();
    for part in summary.split("](").skip(1) {
        let target = part.split(')').next().unwrap_or("");
        if target.is_empty() {
            continue; // a draft chapter: a heading without a page
        }
        assert!(
            src.join(target).is_file(),
            "SUMMARY.md lists {target}, which does not exist"
        );
        assert!(
            !listed.contains(&target.to_string()),
            "SUMMARY.md lists {target} twice"
        );
        listed.push(target.to_string());
    }
    for p in markdown_files(&src) {
        let rel = p.strip_prefix(&src).unwrap().to_string_lossy().to_string();
        assert!(
            rel == "SUMMARY.md" || listed.contains(&rel),
            "{rel} is not in SUMMARY.md"
        );
    }
    assert!(listed.len() >= 15, "{listed:?}");
}
