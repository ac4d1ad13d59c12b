//! `mopt-train eval`: zero-shot scoring of a language model on request files in the suite's
//! format, end to end with SmolLM2-135M's GGUF (`datasets/fetch.sh --small`), and its bad
//! inputs refused before any model loads.

mod common;

use std::io::Write;
use std::path::Path;

use common::{data_dir, mopt, read_json, stderr};

/// A request line of the suite's format.
fn line(doc: u64, idx: usize, label: usize, context: &str, continuation: &str) -> String {
    serde_json::json!({
        "request_type": "loglikelihood",
        "doc": {},
        "request": {"context": context, "continuation": continuation},
        "idx": idx,
        "doc_id": doc,
        "label": label,
    })
    .to_string()
}

/// `lines` as the gzip file `dir/<task>.jsonl.gz`.
fn write_task(dir: &Path, task: &str, lines: &[String]) {
    let f = std::fs::File::create(dir.join(format!("{task}.jsonl.gz"))).unwrap();
    let mut gz = flate2::write::GzEncoder::new(f, flate2::Compression::default());
    gz.write_all(lines.join("\n").as_bytes()).unwrap();
    gz.finish().unwrap();
}

fn smollm2() -> String {
    data_dir()
        .join("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
        .display()
        .to_string()
}

#[test]
fn a_language_model_answers_plain_questions_and_the_numbers_add_up() {
    let dir = tempfile::tempdir().unwrap();
    // Three documents a 135M model answers (the gold continuation is the sensible one), one it
    // cannot tell (both choices are the same text: a tie goes to the first, the gold is the
    // second), and a single-continuation document for bits per byte.
    let q = |doc, gold, ctx: &str, a: &str, b: &str| {
        vec![line(doc, 0, gold, ctx, a), line(doc, 1, gold, ctx, b)]
    };
    let lines = [
        q(
            0,
            0,
            "The capital of France is",
            " Paris",
            " a green banana",
        ),
        q(
            1,
            1,
            "Question: What do bees make?\nAnswer:",
            " bricks",
            " honey",
        ),
        q(2, 0, "One, two, three, four,", " five", " purple"),
        q(3, 1, "The word is", " same", " same"),
    ]
    .concat();
    write_task(dir.path(), "arc_easy", &lines);
    write_task(
        dir.path(),
        "lambada",
        &[line(0, 0, 0, "Once upon a", " time")],
    );
    let json = dir.path().join("eval.json");
    let out = mopt(&[
        "eval",
        &smollm2(),
        "--tasks",
        "arc_easy,lambada",
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("| arc_easy | 4 | 75.00 ± 25.00 |"),
        "{stdout}"
    );
    let r = read_json(&json);
    let arc = &r["tasks"][0];
    assert_eq!(arc["documents"], 4);
    assert_eq!(arc["acc"]["mean"], 0.75);
    assert_eq!(arc["chance"], 0.5);
    let lambada = &r["tasks"][1];
    assert!(lambada["acc"].is_null());
    // " time" after "Once upon a" is the model's first choice (its greedy token): well under the
    // 3.1 bits a byte of a uniform guess over 49,152 tokens for 5 bytes (measured: 0.56).
    let bpb = lambada["bits_per_byte"]["mean"].as_f64().unwrap();
    assert!(bpb > 0.0 && bpb < 1.0, "{bpb}");
}

#[test]
fn unknown_tasks_and_damaged_files_exit_2_before_a_model_loads() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let out = mopt(&["eval", &smollm2(), "--tasks", "mmlu", "--data-dir", d]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("unknown task `mmlu`"),
        "{}",
        stderr(&out)
    );
    let out = mopt(&["eval", &smollm2(), "--tasks", "piqa", "--data-dir", d]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("fetch.sh --lm-eval"),
        "{}",
        stderr(&out)
    );
    write_task(
        dir.path(),
        "piqa",
        &[line(0, 0, 0, "a", " b"), "{\"request_type\": ".into()],
    );
    let out = mopt(&["eval", &smollm2(), "--tasks", "piqa", "--data-dir", d]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("piqa.jsonl.gz") && err.contains("line 2"),
        "{err}"
    );
    assert!(
        !err.contains("loading"),
        "no model loads for a bad file: {err}"
    );
}
