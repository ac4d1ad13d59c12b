//! BERT for sequence classification.

mod config;
mod model;
pub mod quant;
pub mod weights;

pub use config::BertConfig;
pub use model::*;
