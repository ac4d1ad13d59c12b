//! # mopt-export
//!
//! ONNX export written by mopt itself, for any model that implements [`Exportable`] (prost
//! message definitions of the needed `onnx.proto` subset; no generated or copied code): a graph
//! builder, QDQ helpers, deployment folders with a model card, a parity check in ONNX Runtime
//! and sha256 sums, ONNX Runtime latency benchmarks. The graphs themselves are written by each
//! model family (BERT's in `mopt_models::bert::onnx`).

#![deny(missing_docs)]
pub mod cnn;
pub mod contract;
pub mod error;
pub mod export;
pub mod graph;
pub mod onnx;
pub mod python;
pub mod qdq;

pub use contract::{
    kl_of_logits, parity, tensor_json, write_checked, Exportable, InputSpec, InputType, OrtFusion,
    Parity, QdqParity,
};
pub use error::ExportError;
pub use export::{
    bench_feeds, export_checkpoint, ort_latency_interleaved, BenchModel, ExportOptions, ModelCard,
    FUSED, LATENCY_METHOD,
};
