//! The crate's modules are layered: no module reaches, through its `crate::` / `super::` paths,
//! a module that reaches it back. The stage kinds never name a family: the families live in
//! crates above this one (`mopt-families`, a user's own), which Cargo keeps from being reached
//! from here, and register the capabilities the kinds declare.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module path (`kinds::prune`, `family`, `` for the crate root) → its source, tests cut off.
fn modules(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).expect("src readable") {
            let p: PathBuf = e.expect("entry").path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            if p.extension().and_then(|x| x.to_str()) != Some("rs") {
                continue;
            }
            let rel = p.strip_prefix(root).expect("under src").with_extension("");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
                parts.pop();
            }
            let text = std::fs::read_to_string(&p).expect("source readable");
            let code = text.split("#[cfg(test)]").next().unwrap_or("");
            let code: String = code
                .lines()
                .map(|l| l.split("//").next().unwrap_or(""))
                .collect::<Vec<_>>()
                .join("\n");
            out.insert(parts.join("::"), code);
        }
    }
    out
}

/// The longest module that `path` (`crate::kinds::prune::CanPrune`, `super::Family`) names,
/// seen from the module `from`.
fn target(path: &[&str], from: &str, names: &BTreeSet<String>) -> Option<String> {
    let mut base: Vec<&str> = if from.is_empty() {
        Vec::new()
    } else {
        from.split("::").collect()
    };
    let mut segs = path;
    match segs.first() {
        Some(&"crate") => base.clear(),
        Some(&"super") => {
            while segs.first() == Some(&"super") {
                base.pop();
                segs = &segs[1..];
            }
            return longest(&base, segs, names);
        }
        _ => return None,
    }
    longest(&base, &segs[1..], names)
}

fn longest(base: &[&str], segs: &[&str], names: &BTreeSet<String>) -> Option<String> {
    (0..=segs.len())
        .rev()
        .map(|i| [base, &segs[..i]].concat().join("::"))
        .find(|c| !c.is_empty() && names.contains(c))
}

/// Paths written in `code`: `crate::a::b` and `super::a`, with `use crate::{a, b::c}` groups
/// expanded one level.
fn paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes: Vec<char> = code.chars().collect();
    let word = |c: char| c.is_alphanumeric() || c == '_' || c == ':';
    let mut i = 0;
    while i < bytes.len() {
        if (i == 0 || !word(bytes[i - 1])) && word(bytes[i]) {
            let start = i;
            while i < bytes.len() && word(bytes[i]) {
                i += 1;
            }
            let token: String = bytes[start..i].iter().collect();
            let segs: Vec<String> = token
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            if matches!(segs.first().map(String::as_str), Some("crate" | "super")) {
                if token.ends_with("::") && bytes.get(i) == Some(&'{') {
                    let end = (i..bytes.len()).find(|&j| bytes[j] == '}').unwrap_or(i);
                    let inner: String = bytes[i + 1..end].iter().collect();
                    for item in inner.split(',') {
                        let mut s = segs.clone();
                        s.extend(item.trim().split("::").map(|x| x.trim().to_string()));
                        out.push(s);
                    }
                }
                out.push(segs);
            }
        } else {
            i += 1;
        }
    }
    out
}

#[test]
fn no_module_reaches_one_that_reaches_it_back() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mods = modules(&src);
    let names: BTreeSet<String> = mods.keys().cloned().collect();
    let mut graph: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for (m, code) in &mods {
        let deps = graph.entry(m).or_default();
        for p in paths(code) {
            let segs: Vec<&str> = p.iter().map(String::as_str).collect();
            if let Some(t) = target(&segs, m, &names) {
                // A module's own children and ancestors are its parts, not its neighbours.
                if t != *m && !m.starts_with(&format!("{t}::")) {
                    deps.insert(t);
                }
            }
        }
    }
    // The edges the layering rests on are seen at all (the parser works).
    assert!(
        graph["kinds::prune"].contains("family"),
        "{:?}",
        graph["kinds::prune"]
    );
    assert!(
        graph["registry"].contains("family"),
        "{:?}",
        graph["registry"]
    );
    // Every module's reach; a module in its own reach is in a circle.
    let reach = |start: &str| {
        let mut seen = BTreeSet::new();
        let mut todo: Vec<String> = graph[start].iter().cloned().collect();
        while let Some(n) = todo.pop() {
            if seen.insert(n.clone()) {
                todo.extend(graph.get(n.as_str()).into_iter().flatten().cloned());
            }
        }
        seen
    };
    let circles: Vec<String> = graph
        .keys()
        .filter(|m| !m.is_empty() && reach(m).contains(**m))
        .map(|m| m.to_string())
        .collect();
    assert!(circles.is_empty(), "modules in a circle: {circles:?}");
    // No family lives in this crate: only the trait and its entry (`family`).
    let families: Vec<&String> = names.iter().filter(|m| m.starts_with("family::")).collect();
    assert!(
        families.is_empty(),
        "family modules in mopt-stages: {families:?}"
    );
}
