//! The resumable training state of a fit: `state/` in its run folder, written atomically every
//! `[train] state-every` optimizer steps and at every epoch's end, the one before it kept as
//! `state.prev/`. It holds the weights (`model.bpk`), the optimizer's moments
//! (`optimizer.bpk`) and where training stands (`position.json`: epoch, micro-batch, counters,
//! best epoch, the logs' lengths), with a `manifest.json` of their sha256. Everything else a
//! step depends on is a pure function of the run's seed and the position: the data order and
//! augmentation of an epoch, the dropout seeds of a micro-batch, the LR schedule. So a run
//! killed at any moment and resumed finishes with the same bytes as one never interrupted.

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::store::{BurnpackStore, ModuleSnapshot};
use serde::{Deserialize, Serialize};

use crate::checkpoint::write_folder;
use crate::error::TrainError;
use crate::logging::LogPosition;
use crate::metrics::EvalMetrics;
use crate::step::{Stepper, StepperState};
use crate::trainer::EpochRecord;

/// The state folder's name in a run folder.
pub(crate) const STATE: &str = "state";
/// The previous state's.
pub(crate) const PREVIOUS: &str = "state.prev";

/// What a state must agree with to be resumed: the same data size, schedule and seed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Fingerprint {
    pub seed: u64,
    pub train_examples: usize,
    pub micro_per_epoch: usize,
    pub total_steps: usize,
    pub params: usize,
}

/// Running sums of an epoch at an optimizer-step boundary.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct EpochSums {
    /// Micro-batches of the epoch consumed.
    pub micro: usize,
    /// Optimizer-step boundaries passed (applied or skipped).
    pub boundaries: usize,
    /// Optimizer steps applied in the epoch.
    pub steps: usize,
    pub loss_sum: f64,
    pub loss_n: usize,
    /// The log window's sums since the last train log point.
    pub window: WindowSums,
}

/// The logged quantities' sums since the last log point.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct WindowSums {
    pub loss: f64,
    pub components: Vec<(String, f64)>,
    pub n: usize,
    pub samples: usize,
}

/// `position.json`: where a fit stands.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Position {
    pub fingerprint: Fingerprint,
    /// The epoch in progress (0-based; `epochs` when all are done).
    pub epoch: usize,
    pub sums: EpochSums,
    /// Optimizer steps applied.
    pub step: usize,
    pub stepper: StepperState,
    pub train_time: f64,
    pub train_samples: usize,
    /// Wall time of the fit before this state.
    pub wall_s: f64,
    pub best: Option<(usize, EvalMetrics)>,
    pub epochs: Vec<EpochRecord>,
    pub logs: LogPosition,
}

/// Save `model`, the optimizer's state and `position` as `run_dir/state` (the previous state
/// becomes `state.prev`).
pub(crate) fn save<M: Module>(
    run_dir: &Path,
    model: &M,
    stepper: &Stepper,
    position: &Position,
) -> Result<(), TrainError> {
    let previous = run_dir.join(PREVIOUS);
    write_folder(&run_dir.join(STATE), Some(&previous), |tmp| {
        let weights = tmp.join("model.bpk");
        let mut store = BurnpackStore::from_file(&weights)
            .auto_extension(false)
            .with_to_adapter(mopt_core::WithoutIds);
        // `valid()` first: BatchNorm's running statistics hold their latest update per thread
        // until they are synced.
        model
            .valid()
            .save_into(&mut store)
            .map_err(|e| failed(&weights, e))?;
        let optimizer = tmp.join("optimizer.bpk");
        stepper
            .save_optimizer(&optimizer)
            .map_err(|e| failed(&optimizer, e))?;
        let path = tmp.join("position.json");
        let text = serde_json::to_string_pretty(position).expect("json");
        std::fs::write(&path, text).map_err(|e| TrainError::io(&path, e))
    })
}

fn failed(path: &Path, e: impl std::fmt::Display) -> TrainError {
    TrainError::from_message(path, &e.to_string())
}

/// A state restored: the model, the stepper and the position.
pub(crate) type Restored<M> = (M, Stepper, Position);

/// The newest state of `run_dir` that verifies and agrees with `fingerprint`, loaded into
/// `model` and `stepper`; `Ok(Err(..))` gives them back when none does (each state passed over
/// is named with the reason on stderr).
pub(crate) fn load<M: Module>(
    run_dir: &Path,
    model: M,
    stepper: Stepper,
    fingerprint: &Fingerprint,
) -> Result<Result<Restored<M>, (M, Stepper)>, TrainError> {
    for dir in [run_dir.join(STATE), run_dir.join(PREVIOUS)] {
        if !dir.join("position.json").exists() {
            continue;
        }
        match try_load(&dir, model.clone(), fingerprint)? {
            Ok((model, position)) => {
                let optimizer = dir.join("optimizer.bpk");
                let stepper = stepper
                    .restore(&position.stepper, &optimizer)
                    .map_err(|e| failed(&optimizer, e))?;
                return Ok(Ok((model, stepper, position)));
            }
            Err(why) => eprintln!("warning: training state {} not used: {why}", dir.display()),
        }
    }
    Ok(Err((model, stepper)))
}

/// The state in `dir` loaded into `model` with its position, or why it cannot be used (a
/// missing or corrupt file, another run's shape). Every file is checked against the manifest
/// before any is read, the optimizer's included.
fn try_load<M: Module>(
    dir: &Path,
    mut model: M,
    want: &Fingerprint,
) -> Result<Result<(M, Position), String>, TrainError> {
    let files: Vec<PathBuf> = ["position.json", "model.bpk", "optimizer.bpk"]
        .iter()
        .map(|f| dir.join(f))
        .collect();
    if !dir.join(mopt_core::manifest::MANIFEST).is_file() {
        return Ok(Err("it has no manifest.json (an unfinished write)".into()));
    }
    for f in &files {
        if !f.is_file() {
            return Ok(Err(format!("{} is missing", f.display())));
        }
        if let Err(why) = mopt_core::manifest::verify(f) {
            return Ok(Err(why));
        }
    }
    let text = std::fs::read_to_string(&files[0]).map_err(|e| TrainError::io(&files[0], e))?;
    let position: Position = match serde_json::from_str(&text) {
        Ok(p) => p,
        Err(e) => return Ok(Err(format!("{}: {e}", files[0].display()))),
    };
    if position.fingerprint != *want {
        return Ok(Err(format!(
            "it was saved for another run shape ({:?}, now {want:?})",
            position.fingerprint
        )));
    }
    let mut store = BurnpackStore::from_file(&files[1]).auto_extension(false);
    if let Err(e) = model.load_from(&mut store) {
        return Ok(Err(format!("{}: {e}", files[1].display())));
    }
    Ok(Ok((model, position)))
}

/// Remove the states of `run_dir` (a fit that finished, or one starting afresh).
pub(crate) fn clear(run_dir: &Path) -> Result<(), TrainError> {
    for name in [STATE, PREVIOUS, "state.tmp"] {
        let dir = run_dir.join(name);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| TrainError::io(&dir, e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// A resumed fit reads its running sums back from `position.json`: every f64 must come back
    /// bit for bit (serde_json's default parser is off by an ulp on some 17-digit values, which
    /// made a resumed epoch's mean loss differ in its last digit; its `float_roundtrip` feature
    /// is on).
    #[test]
    fn running_sums_survive_json_bit_for_bit() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut off = 0;
        for i in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Sums of losses: positive values of every magnitude from 1e-3 to 1e5.
            let v = (x >> 11) as f64 / (1u64 << 53) as f64 * 10f64.powi(i % 9 - 3);
            let back: f64 = serde_json::from_str(&serde_json::to_string(&v).unwrap()).unwrap();
            off += usize::from(back.to_bits() != v.to_bits());
        }
        assert_eq!(off, 0, "{off} of 200000 values changed through JSON");
    }
}
