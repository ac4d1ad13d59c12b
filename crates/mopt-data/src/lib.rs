//! # mopt-data
//!
//! Real text-classification data for mopt: loaders (Rotten Tomatoes, Orange `.tab`, CSV/TSV/JSONL),
//! a fixed seeded split, label maps, tokenization with the `tokenizers` crate (parallel, cached
//! beside the data) and dynamically padded batches.

mod batch;
mod error;
mod examples;
mod labels;
mod rng;
mod text;
mod tokenize;

pub use batch::{epoch_order, Batcher, TextBatch};
pub use error::DataError;
pub use examples::TextExamples;
pub use labels::LabelMap;
pub use rng::SplitMix64;
pub use text::{load_splits, Example, Splits};
pub use tokenize::{encode_splits, Encoded, EncodedSplits, TextTokenizer};
