//! Every error message and hint names things that exist: each Rust path written in backticks
//! inside a string literal of the workspace's code (`mopt_data::VocabPrunable`,
//! `kinds::prune::capability`) resolves to a module and an item of that crate, and each file
//! of the repository it names (`docs/src/stages/`, `recipes/distill_bert.toml`) is there. A
//! hint that sends the user to something that was renamed or never existed fails here.

use std::path::{Path, PathBuf};

/// The tracked folders a hint may name files in (fetched data is not checked).
const TRACKED: [&str; 6] = [
    "docs/",
    "recipes/",
    "examples/",
    "crates/",
    "benches/",
    "tests/",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The string literals of Rust source `src` (comments, chars and lifetimes skipped; raw strings
/// included), up to its `#[cfg(test)]` module.
fn literals(src: &str) -> Vec<String> {
    let src = src.split("#[cfg(test)]").next().unwrap_or("");
    let c: Vec<char> = src.chars().collect();
    let (mut i, mut out) = (0, Vec::new());
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    while i < c.len() {
        let next = c.get(i + 1).copied();
        match c[i] {
            '/' if next == Some('/') => {
                while i < c.len() && c[i] != '\n' {
                    i += 1;
                }
            }
            '/' if next == Some('*') => {
                i += 2;
                while i + 1 < c.len() && !(c[i] == '*' && c[i + 1] == '/') {
                    i += 1;
                }
                i += 2;
            }
            '\'' if next == Some('\\') => {
                // Past the backslash and the escaped character (`'\''`, `'\n'`, `'\u{..}'`).
                i += 3;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            }
            '\'' if c.get(i + 2) == Some(&'\'') => i += 3,
            'r' if (next == Some('"') || next == Some('#')) && (i == 0 || !ident(c[i - 1])) => {
                let hashes = c[i + 1..].iter().take_while(|&&h| h == '#').count();
                if c.get(i + 1 + hashes) != Some(&'"') {
                    i += 1;
                    continue;
                }
                let start = i + 2 + hashes;
                let mut j = start;
                while j < c.len()
                    && !(c[j] == '"' && c[j + 1..].iter().take(hashes).all(|&h| h == '#'))
                {
                    j += 1;
                }
                out.push(c[start..j.min(c.len())].iter().collect());
                i = j + 1 + hashes;
            }
            '"' => {
                let start = i + 1;
                i += 1;
                while i < c.len() && c[i] != '"' {
                    i += if c[i] == '\\' { 2 } else { 1 };
                }
                out.push(c[start..i.min(c.len())].iter().collect());
                i += 1;
            }
            _ => i += 1,
        }
    }
    out
}

/// The names `src` defines (items, modules) or re-exports (`pub use`).
fn defines(src: &str, name: &str) -> bool {
    let words: Vec<&str> = src
        .split(|ch: char| !(ch.is_alphanumeric() || ch == '_'))
        .filter(|w| !w.is_empty())
        .collect();
    let items = [
        "fn", "struct", "trait", "enum", "type", "const", "static", "mod",
    ];
    let defined = words
        .windows(2)
        .any(|w| items.contains(&w[0]) && w[1] == name);
    let reexported = src
        .split("pub use ")
        .skip(1)
        .any(|s| s.split(';').next().unwrap_or("").contains(name));
    defined || reexported
}

/// Whether `segs` (after the crate) names a module path and an item of the crate at `src_dir`.
fn resolves(src_dir: &Path, segs: &[&str]) -> bool {
    let (mut file, mut dir) = (src_dir.join("lib.rs"), src_dir.to_path_buf());
    for (k, seg) in segs.iter().enumerate() {
        let (as_file, as_dir) = (dir.join(format!("{seg}.rs")), dir.join(seg).join("mod.rs"));
        if as_file.is_file() || as_dir.is_file() {
            file = if as_file.is_file() { as_file } else { as_dir };
            dir = dir.join(seg);
            continue;
        }
        let here = std::fs::read_to_string(&file).unwrap_or_default();
        if !defines(&here, seg) {
            return false;
        }
        // `Trait::method`: the associated item is defined in the crate too.
        return segs[k + 1..].iter().all(|m| crate_defines(src_dir, m));
    }
    true
}

fn crate_defines(dir: &Path, name: &str) -> bool {
    std::fs::read_dir(dir).unwrap().any(|e| {
        let p = e.unwrap().path();
        if p.is_dir() {
            crate_defines(&p, name)
        } else {
            p.extension().is_some_and(|x| x == "rs")
                && defines(&std::fs::read_to_string(&p).unwrap(), name)
        }
    })
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// What a backticked span names, if it checks it: a crate-rooted or stage-kind path, or a
/// tracked file or folder of the repository. `None` when it is unresolved.
fn dangling(span: &str) -> Option<String> {
    let path: String = span
        .chars()
        .take_while(|ch| ch.is_alphanumeric() || matches!(ch, '_' | ':' | '/' | '.' | '-'))
        .collect();
    let path = path.trim_end_matches(['.', ':']);
    if TRACKED.iter().any(|t| path.starts_with(t)) || path == "datasets/fetch.sh" {
        return (!repo().join(path).exists()).then(|| path.to_string());
    }
    let segs: Vec<&str> = path.split("::").collect();
    if segs.len() < 2 || path.contains('/') {
        return None;
    }
    let (src, rest) = match segs[0] {
        "kinds" => (repo().join("crates/mopt-stages/src"), &segs[..]),
        c if c.starts_with("mopt_") => (
            repo().join("crates").join(c.replace('_', "-")).join("src"),
            &segs[1..],
        ),
        _ => return None,
    };
    (!src.is_dir() || !resolves(&src, rest)).then(|| path.to_string())
}

/// Whether [`dangling`] checks `span` (a crate-rooted or stage-kind path, or a tracked file).
fn checks(span: &str) -> bool {
    span.starts_with("kinds::")
        || span.starts_with("mopt_")
        || span.starts_with("datasets/fetch.sh")
        || TRACKED.iter().any(|t| span.starts_with(t))
}

#[test]
fn every_hint_names_what_exists() {
    let mut files = Vec::new();
    rust_files(&repo().join("crates"), &mut files);
    rust_files(&repo().join("src"), &mut files);
    // Library and binary code only (tests name missing things on purpose), judged by the path
    // inside the repository.
    let root = repo();
    files.retain(|f| {
        let inside = f.strip_prefix(&root).unwrap_or(f);
        inside.components().any(|c| c.as_os_str() == "src")
    });
    let (mut spans, mut resolved, mut missing) = (0, 0, Vec::new());
    for f in &files {
        for lit in literals(&std::fs::read_to_string(f).unwrap()) {
            for span in lit.split('`').skip(1).step_by(2) {
                spans += 1;
                match dangling(span) {
                    Some(p) => missing.push(format!("{}: `{p}`", f.display())),
                    None if checks(span) => resolved += 1,
                    None => {}
                }
            }
        }
    }
    assert!(
        spans > 300,
        "only {spans} backticked spans: the scan broke?"
    );
    assert!(
        resolved >= 10,
        "only {resolved} paths and files resolved: the scan broke?"
    );
    assert!(missing.is_empty(), "names nothing:\n{}", missing.join("\n"));
}

#[test]
fn the_scan_sees_literals_and_catches_what_is_missing() {
    let src = "let c = '\"'; let q = ['\\'', '\"']; // \"not this\"\nlet s = r#\"raw `a`\"#; err(\"use `mopt_core::NoSuchThing`\")";
    assert_eq!(
        literals(src),
        vec!["raw `a`", "use `mopt_core::NoSuchThing`"]
    );
    assert_eq!(
        dangling("mopt_core::NoSuchThing"),
        Some("mopt_core::NoSuchThing".into())
    );
    assert_eq!(
        dangling("kinds::kd_student::capability::<M>()"),
        Some("kinds::kd_student::capability".into())
    );
    assert_eq!(dangling("kinds::prune::capability::<M>()"), None);
    assert_eq!(dangling("mopt_core::prune::Prunable"), None);
    assert_eq!(dangling("mopt_data::VocabPrunable"), None);
    assert_eq!(
        dangling("docs/src/no-such-chapter.md"),
        Some("docs/src/no-such-chapter.md".into())
    );
    assert_eq!(dangling("recipes/distill_bert.toml"), None);
}
