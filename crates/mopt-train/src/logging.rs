//! Run logging: `metrics.jsonl`, TensorBoard event files, and a progress display (indicatif bars
//! on a terminal, plain periodic lines otherwise).

use std::fs::File;
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};
use tensorboard_rs::summary_writer::SummaryWriter;

use crate::error::TrainError;

/// Writes every metric to `metrics.jsonl` and TensorBoard (`events/`).
pub struct RunLogger {
    jsonl: File,
    tb: SummaryWriter,
}

impl RunLogger {
    /// A writer of `metrics.jsonl` and TensorBoard events in `run_dir`.
    pub fn create(run_dir: &Path) -> Result<Self, TrainError> {
        let path = run_dir.join("metrics.jsonl");
        let jsonl = File::create(&path).map_err(|e| TrainError::io(&path, e))?;
        let events = run_dir.join("events");
        std::fs::create_dir_all(&events).map_err(|e| TrainError::io(&events, e))?;
        Ok(Self {
            jsonl,
            tb: SummaryWriter::new(&events),
        })
    }

    /// Log `scalars` under `split/…` at `step` (TensorBoard tag `split/name`) and one JSON line
    /// `{"split": …, "step": …, name: value, …, extra…}`.
    pub fn log(&mut self, split: &str, step: usize, scalars: &[(&str, f64)], extra: Value) {
        let mut obj = json!({ "split": split, "step": step });
        for (name, v) in scalars {
            obj[*name] = json!(v);
            self.tb
                .add_scalar(&format!("{split}/{name}"), *v as f32, step);
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
        self.tb.flush();
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
