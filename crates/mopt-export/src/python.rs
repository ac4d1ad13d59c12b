//! Calls into Python's `onnx` and `onnxruntime` (the reference runtime) through `ort_tool.py`.

use std::path::Path;
use std::process::Command;

use crate::error::ExportError;

const TOOL: &str = include_str!("../python/ort_tool.py");

/// The Python interpreter: `$MOPT_PYTHON` or `python3`.
pub fn python() -> String {
    std::env::var("MOPT_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Run `ort_tool.py ARGS…` and parse the JSON it prints.
pub fn tool(args: &[&str]) -> Result<serde_json::Value, ExportError> {
    let out = Command::new(python())
        .arg("-c")
        .arg(TOOL)
        .args(args)
        .output()
        .map_err(|e| ExportError::Python(format!("cannot start {}: {e}", python())))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let hint = if err.contains("No module named") {
            " (install the test/export requirements: python3 -m pip install -r requirements-test.txt)"
        } else {
            ""
        };
        return Err(ExportError::Python(format!(
            "ort_tool {}: {}{hint}",
            args.first().unwrap_or(&""),
            err.lines().rev().take(3).collect::<Vec<_>>().join(" | ")
        )));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last().unwrap_or("{}");
    serde_json::from_str(last)
        .map_err(|e| ExportError::Python(format!("bad output from ort_tool: {e}: {last}")))
}

/// Op-type counts from a tool result.
pub fn ops(v: &serde_json::Value) -> std::collections::BTreeMap<String, u64> {
    v["ops"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0)))
                .collect()
        })
        .unwrap_or_default()
}

/// One output of a graph run: its dimensions and values (row-major).
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    /// The dimensions.
    pub shape: Vec<usize>,
    /// The values.
    pub values: Vec<f32>,
}

/// Run a model in ONNX Runtime on a list of feeds; returns the first output of each (passed
/// back as raw f32, not JSON: a language model's logits are millions of values a batch).
pub fn run(
    model: &Path,
    feeds: &serde_json::Value,
    work: &Path,
) -> Result<Vec<Output>, ExportError> {
    let input = work.join("ort-inputs.json");
    let output = work.join("ort-outputs.json");
    let raw = work.join("ort-outputs.json.bin");
    std::fs::write(
        &input,
        serde_json::to_vec(&serde_json::json!({ "feeds": feeds })).expect("json"),
    )
    .map_err(|e| ExportError::Io(input.display().to_string(), e))?;
    tool(&[
        "run",
        &model.display().to_string(),
        &input.display().to_string(),
        &output.display().to_string(),
    ])?;
    let read = |p: &Path| std::fs::read(p).map_err(|e| ExportError::Io(p.display().to_string(), e));
    let meta: serde_json::Value =
        serde_json::from_slice(&read(&output)?).map_err(|e| ExportError::Python(e.to_string()))?;
    let shapes: Vec<Vec<usize>> = serde_json::from_value(meta["shapes"].clone())
        .map_err(|e| ExportError::Python(format!("ort_tool run: {e}")))?;
    let bytes = read(&raw)?;
    for p in [&input, &output, &raw] {
        let _ = std::fs::remove_file(p);
    }
    let mut outs = Vec::new();
    let mut at = 0;
    for shape in shapes {
        let n: usize = shape.iter().product();
        let chunk = bytes.get(at..at + 4 * n).ok_or_else(|| {
            ExportError::Python(format!(
                "ort_tool run: {} output bytes, shapes need more",
                bytes.len()
            ))
        })?;
        at += 4 * n;
        let values = chunk
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        outs.push(Output { shape, values });
    }
    Ok(outs)
}
