//! Distillation on text batches: the parts that read token ids (`mopt_data::Encoded`) and batch
//! them (`mopt_data::TextBatch`) for a [`mopt_core::Tapped`] model. The teacher's taps cached per
//! example over its real tokens ([`cache`]), the task that trains a student on them with
//! intermediate matches ([`task`]), the assembly a stage runs ([`pipeline`]), and TinyBERT's
//! data augmentation ([`augment`]). The crate's other modules (KD, losses, top-k, matches,
//! projections, the cache file) know no modality.

pub mod augment;
pub mod cache;
pub mod pipeline;
pub mod task;
