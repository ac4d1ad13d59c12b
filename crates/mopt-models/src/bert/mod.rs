//! BERT for sequence classification.

mod config;
mod family;
pub mod keys;
mod model;
pub mod onnx;
pub mod prune;
pub mod quant;
pub mod setup;
pub mod student;
mod vocab;
pub mod weights;

pub use config::BertConfig;
pub use keys::{Activation, BertModel, BertModelKeys};
pub use model::*;
