//! # mopt-train
//!
//! Training for mopt, composed from Burn: Burn's AdamW and LR schedulers, its gradient
//! accumulator and module stores; mopt adds global-norm clipping, seeded data order, per-epoch
//! validation with best-checkpoint selection, `metrics.jsonl` + TensorBoard logging, progress
//! display, the LR range test and `--check` plans. The backend is picked in [`backend`].

#![deny(missing_docs)]
pub mod amp;
pub mod backend;
pub mod cache;
mod checkpoint;
pub mod clip;
mod error;
mod eval;
pub mod logging;
pub mod lr_find;
pub mod memory;
pub mod metrics;
pub mod parallel;
#[cfg(feature = "remote")]
pub mod remote;
pub mod rundir;
pub mod schedule;
pub mod setup;
mod state;
pub mod step;
mod task;
pub mod tensorboard;
pub mod trainer;
pub mod watch;

pub use backend::DeviceSpec;
pub use error::TrainError;
