//! # mopt-export
//!
//! ONNX export written by mopt itself, for any model that implements [`Exportable`] (prost message definitions of the needed `onnx.proto`
//! subset; no generated or copied code): BERT for any per-layer head count and FFN width, in the
//! pattern ONNX Runtime's transformer optimizer fuses; QDQ quantized models; deployment folders
//! with a model card, a parity check and sha256 sums; ONNX Runtime latency benchmarks.

pub mod bert;
pub mod cnn;
pub mod contract;
pub mod error;
pub mod export;
pub mod graph;
pub mod onnx;
pub mod pipeline;
pub mod python;
pub mod qdq;

pub use contract::{parity, tensor_json, write_checked, Exportable, InputSpec, InputType, Parity};
pub use error::ExportError;
pub use export::{export_checkpoint, ExportOptions, ModelCard};
