//! Wall time across invocations. A run killed in the middle of a stage and continued with
//! `--resume` spends that stage's time in two processes; the stage's record and the run's report
//! state the sum. A [`Clock`] keeps the seconds counted so far in a small JSON file, rewritten
//! every few seconds by a background thread (atomically: a kill leaves the last whole value), so
//! the next invocation starts counting from there. The files live in the run folder's `clocks/`,
//! never inside a checkpoint folder.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::record::{read_json, write_json_atomic};

/// How often a running clock writes its file.
pub const PERIOD: Duration = Duration::from_secs(10);

#[derive(Serialize, Deserialize)]
struct Saved {
    /// Seconds counted so far, over every invocation.
    wall_time_s: f64,
}

/// Seconds counted by earlier invocations in `file`: 0 when it is missing or unreadable (a
/// damaged clock loses time, never the run).
pub fn counted(file: &Path) -> f64 {
    read_json::<Saved>(file)
        .map(|s| s.wall_time_s)
        .filter(|s| s.is_finite() && *s >= 0.0)
        .unwrap_or(0.0)
}

/// A running wall clock that starts from `before` seconds and keeps `file` current.
pub struct Clock {
    before: f64,
    t0: Instant,
    file: PathBuf,
    stop: Option<Sender<()>>,
    writer: Option<JoinHandle<()>>,
    finished: bool,
}

impl Clock {
    /// Start counting from `before` seconds, writing `file` every `period` (its folder is made).
    /// A clock that cannot write its file still counts: only a later `--resume` loses time.
    pub fn start(file: PathBuf, before: f64, period: Duration) -> Self {
        let t0 = Instant::now();
        if let Some(parent) = file.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        let (stop, rx) = mpsc::channel::<()>();
        let path = file.clone();
        let writer = std::thread::spawn(move || loop {
            match rx.recv_timeout(period) {
                Err(RecvTimeoutError::Timeout) => save(&path, before + t0.elapsed().as_secs_f64()),
                _ => return,
            }
        });
        Self {
            before,
            t0,
            file,
            stop: Some(stop),
            writer: Some(writer),
            finished: false,
        }
    }

    /// Resume the clock in `file` (its counted seconds) or, when `resume` is false, start one
    /// from zero.
    pub fn resume_or_start(file: PathBuf, resume: bool) -> Self {
        let before = if resume { counted(&file) } else { 0.0 };
        Self::start(file, before, PERIOD)
    }

    /// Seconds counted so far, earlier invocations included.
    pub fn elapsed_s(&self) -> f64 {
        self.before + self.t0.elapsed().as_secs_f64()
    }

    /// Stop counting for good: the file is removed (the count now lives in a finished record),
    /// so that a stage run again later starts from zero.
    pub fn finish(mut self) {
        self.stop_writer();
        self.finished = true;
        let _ = std::fs::remove_file(&self.file);
    }

    fn stop_writer(&mut self) {
        drop(self.stop.take());
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

fn save(file: &Path, seconds: f64) {
    let _ = write_json_atomic(
        file,
        &Saved {
            wall_time_s: seconds,
        },
    );
}

impl Drop for Clock {
    /// Stops the writer and, unless [`Clock::finish`]ed, writes the final count (a stage that
    /// failed and is run again counts on).
    fn drop(&mut self) {
        self.stop_writer();
        if !self.finished {
            save(&self.file, self.elapsed_s());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_invocation_counts_on_from_the_first() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("clocks/01-distill.json");
        let first = Clock::start(file.clone(), 0.0, Duration::from_millis(5));
        std::thread::sleep(Duration::from_millis(60));
        // The writer keeps the file current while the clock runs (what a kill leaves).
        let mid = counted(&file);
        assert!(mid > 0.02 && mid <= first.elapsed_s(), "{mid}");
        drop(first);
        let done = counted(&file);
        assert!(done >= 0.06, "{done}");

        let second = Clock::resume_or_start(file.clone(), true);
        assert!(second.elapsed_s() >= done && second.elapsed_s() < done + 1.0);
        drop(second);
        let fresh = Clock::resume_or_start(file.clone(), false);
        assert!(fresh.elapsed_s() < 0.05, "{}", fresh.elapsed_s());
        // Finished, the clock leaves no file: a later run of the same stage counts from zero.
        fresh.finish();
        assert!(!file.exists());
        assert!(Clock::resume_or_start(file, true).elapsed_s() < 0.05);
    }

    #[test]
    fn a_damaged_or_missing_clock_counts_from_zero() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("run.json");
        assert_eq!(counted(&file), 0.0);
        for bad in [
            "",
            "{",
            "{\"wall_time_s\": -3}",
            "{\"wall_time_s\": \"x\"}",
            "\u{0}\u{1}",
        ] {
            std::fs::write(&file, bad).unwrap();
            assert_eq!(counted(&file), 0.0, "{bad:?}");
        }
        std::fs::write(&file, "{\"wall_time_s\": 1234.5}").unwrap();
        assert_eq!(counted(&file), 1234.5);
    }
}
