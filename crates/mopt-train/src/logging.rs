//! Run logging: `metrics.jsonl`, TensorBoard event files, and a progress display (indicatif bars
//! on a terminal, plain periodic lines otherwise).

use std::fs::File;
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::error::TrainError;
use crate::tensorboard::EventWriter;

/// Writes every metric to `metrics.jsonl` and TensorBoard (`events/`).
pub struct RunLogger {
    jsonl: File,
    tb: EventWriter,
}

/// How far the logs had been written when a training state was saved: `metrics.jsonl`'s length
/// and each TensorBoard event file's, so that a resumed run cuts what came after and neither
/// duplicates nor misses a step.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LogPosition {
    /// Bytes of `metrics.jsonl`.
    pub metrics: u64,
    /// Event files (names in `events/`) and their bytes.
    pub events: Vec<(String, u64)>,
}

impl RunLogger {
    /// A writer of `metrics.jsonl` and TensorBoard events in `run_dir`.
    pub fn create(run_dir: &Path) -> Result<Self, TrainError> {
        Self::reopen(run_dir, &LogPosition::default())
    }

    /// Continue the logs of `run_dir` from `at` (from nothing: [`create`](Self::create)): both files cut back to where they were, event
    /// files begun since removed, new points appended (TensorBoard reads a new event file after
    /// the old ones).
    pub fn reopen(run_dir: &Path, at: &LogPosition) -> Result<Self, TrainError> {
        let path = run_dir.join("metrics.jsonl");
        let cut = |p: &Path, len: u64| -> Result<File, TrainError> {
            let f = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(p)
                .map_err(|e| TrainError::io(p, e))?;
            f.set_len(len).map_err(|e| TrainError::io(p, e))?;
            Ok(f)
        };
        let jsonl = cut(&path, at.metrics)?;
        let events = run_dir.join("events");
        std::fs::create_dir_all(&events).map_err(|e| TrainError::io(&events, e))?;
        for entry in std::fs::read_dir(&events).map_err(|e| TrainError::io(&events, e))? {
            let p = entry.map_err(|e| TrainError::io(&events, e))?.path();
            let name = p.file_name().map(|n| n.to_string_lossy().to_string());
            match at.events.iter().find(|(n, _)| Some(n) == name.as_ref()) {
                Some((_, len)) => drop(cut(&p, *len)?),
                None => std::fs::remove_file(&p).map_err(|e| TrainError::io(&p, e))?,
            }
        }
        let tb = EventWriter::create(&events).map_err(|e| TrainError::io(&events, e))?;
        Ok(Self { jsonl, tb })
    }

    /// Flush both files and say how long they are.
    pub fn position(&mut self, run_dir: &Path) -> Result<LogPosition, TrainError> {
        self.flush();
        let len = |p: &Path| {
            std::fs::metadata(p)
                .map(|m| m.len())
                .map_err(|e| TrainError::io(p, e))
        };
        let metrics = len(&run_dir.join("metrics.jsonl"))?;
        let dir = run_dir.join("events");
        let mut events = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(|e| TrainError::io(&dir, e))? {
            let p = entry.map_err(|e| TrainError::io(&dir, e))?.path();
            let name = p.file_name().map(|n| n.to_string_lossy().to_string());
            events.push((name.unwrap_or_default(), len(&p)?));
        }
        events.sort();
        Ok(LogPosition { metrics, events })
    }

    /// Log `scalars` under `split/…` at `step` (TensorBoard tag `split/name`) and one JSON line
    /// `{"split": …, "step": …, name: value, …, extra…}`.
    pub fn log(&mut self, split: &str, step: usize, scalars: &[(&str, f64)], extra: Value) {
        let mut obj = json!({ "split": split, "step": step });
        for (name, v) in scalars {
            obj[*name] = json!(v);
            let written = self.tb.scalar(&format!("{split}/{name}"), *v as f32, step);
            if let Err(e) = written {
                eprintln!(
                    "warning: cannot append to {}: {e}",
                    self.tb.path().display()
                );
            }
        }
        if let Value::Object(m) = extra {
            for (k, v) in m {
                obj[k] = v;
            }
        }
        // metrics.jsonl is the record of the run: a failed write is reported but not fatal.
        if let Err(e) = writeln!(self.jsonl, "{obj}") {
            eprintln!("warning: cannot append to metrics.jsonl: {e}");
        }
    }

    /// Flush both files.
    pub fn flush(&mut self) {
        if let Err(e) = self.tb.flush() {
            eprintln!("warning: cannot write {}: {e}", self.tb.path().display());
        }
        let _ = self.jsonl.flush();
    }
}

/// Progress of a loop over `total` steps.
pub struct Progress {
    bar: Option<ProgressBar>,
    label: String,
    total: u64,
    start: Instant,
    last_line: Instant,
}

impl Progress {
    /// A progress display `label` over `total` steps.
    pub fn new(label: &str, total: usize) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let pb = ProgressBar::new(total as u64);
            pb.set_style(
                ProgressStyle::with_template(
                    "{prefix:>12} [{bar:30}] {pos}/{len} {msg} [{elapsed_precise} < {eta_precise}]",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            pb.set_prefix(label.to_string());
            pb
        });
        Self {
            bar,
            label: label.to_string(),
            total: total as u64,
            start: Instant::now(),
            last_line: Instant::now(),
        }
    }

    /// Advance to `pos` with a status message; without a terminal, print a line at most every 10 s.
    pub fn update(&mut self, pos: usize, msg: &str) {
        match &self.bar {
            Some(b) => {
                b.set_position(pos as u64);
                b.set_message(msg.to_string());
            }
            None => {
                let done = pos as u64 >= self.total;
                if self.last_line.elapsed().as_secs_f64() >= 10.0 || done {
                    self.last_line = Instant::now();
                    let el = self.start.elapsed().as_secs_f64();
                    let eta = if pos > 0 {
                        el / pos as f64 * (self.total as f64 - pos as f64)
                    } else {
                        0.0
                    };
                    eprintln!(
                        "{} {pos}/{} {msg} elapsed {el:.0}s eta {eta:.0}s",
                        self.label, self.total
                    );
                }
            }
        }
    }

    /// End the display with `msg`.
    pub fn finish(self, msg: &str) {
        match self.bar {
            Some(b) => b.finish_with_message(msg.to_string()),
            None => eprintln!(
                "{} done: {msg} ({:.1}s)",
                self.label,
                self.start.elapsed().as_secs_f64()
            ),
        }
    }
}
