//! # mopt-distill
//!
//! Knowledge distillation for mopt, generic over the model contracts of `mopt-core`. For any
//! classifier ([`kd`]): a teacher's logits cached once and the KD objective on them. For any
//! [`mopt_core::Tapped`] model on text batches additionally ([`text`]): the KD objective (hard
//! CE + T²-scaled KL or MSE on logits, with α and T schedules), intermediate matches declared as
//! data over the model's taps (hidden states, attention probabilities or scores, embeddings;
//! explicit or uniform layer maps; learned projections where widths differ), a disk cache of
//! the teacher's taps, and the pieces a distillation stage is assembled from. Students made from
//! a teacher's layers are the family's business (BERT's: `mopt_models::bert::student`).
//! Everything is usable from Rust without the CLI; the `distill` stage runs it from a recipe.

#![deny(missing_docs)]
mod cache_file;
pub mod features;
pub mod kd;
pub mod latency;
pub mod loss;
pub mod matching;
pub mod spec;
pub mod student;
pub mod text;
pub mod topk;

pub use features::{MapKdTask, MapLoss, MapMatch, MapStudent};
pub use kd::{KdSettings, KdTask, LogitCache};
pub use loss::soft_loss;
pub use student::DistillModel;
pub use topk::{TeacherRows, TopKRows};
