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

/// Run a model in ONNX Runtime on a list of feeds; returns the first output of each.
pub fn run(
    model: &Path,
    feeds: &serde_json::Value,
    work: &Path,
) -> Result<Vec<serde_json::Value>, ExportError> {
    let input = work.join("ort-inputs.json");
    let output = work.join("ort-outputs.json");
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
    let v: serde_json::Value = serde_json::from_slice(
        &std::fs::read(&output).map_err(|e| ExportError::Io(output.display().to_string(), e))?,
    )
    .map_err(|e| ExportError::Python(e.to_string()))?;
    let _ = std::fs::remove_file(&input);
    let _ = std::fs::remove_file(&output);
    Ok(v["outputs"].as_array().cloned().unwrap_or_default())
}
