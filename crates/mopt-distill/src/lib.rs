//! # mopt-distill
//!
//! Knowledge distillation for mopt. For any classifier ([`kd`]): a teacher's logits cached
//! once and the KD objective on them. For BERT additionally: the KD objective (hard CE + T²-scaled KL or MSE on logits,
//! with α and T schedules), intermediate matches declared as data (hidden states, attention
//! probabilities or scores, embeddings; explicit or uniform layer maps; learned projections where
//! widths differ), student initialisation from teacher layers, a disk cache of teacher outputs,
//! and the pieces a distillation stage is assembled from. Everything is usable from Rust without
//! the CLI; the `distill` stage kind of `mopt_stages` runs it from a recipe.

pub mod cache;
pub mod kd;
pub mod latency;
pub mod loss;
pub mod matching;
pub mod pipeline;
pub mod spec;
pub mod student;
pub mod task;

pub use kd::{KdSettings, KdTask, LogitCache};
pub use loss::soft_loss;
pub use pipeline::CacheSummary;
pub use student::DistillModel;
pub use task::{DistillTask, TeacherSource};
