//! # mopt-data
//!
//! Real data for mopt. Text: loaders (Rotten Tomatoes, Orange `.tab`, CSV/TSV/JSONL), a fixed
//! seeded split, label maps, tokenization with the `tokenizers` crate (parallel, cached beside the
//! data) and dynamically padded batches. Images: IDX and CSV-of-pixels loaders, the same seeded
//! split, normalisation by the training split's statistics.

#![deny(missing_docs)]
mod augment;
mod batch;
mod builder;
mod error;
mod examples;
mod image;
mod labels;
mod requests;
mod rng;
mod text;
mod tokenize;
mod tokenizer_spec;
pub mod vocab;
mod windows;

pub use augment::{Augment, Augmentation};
pub use batch::{epoch_order, Batcher, TextBatch};
pub use builder::{ImageRecipe, TextRecipe};
pub use error::DataError;
pub use examples::{TextExamples, TextSplit};
pub use image::{
    idx_labels_path, load_image_splits, read_idx, read_pixels_csv, ImageBatch, ImageShape,
    ImageSplit, ImageSplits, Normalize, RawImages, ReadImages,
};
pub use labels::LabelMap;
pub use requests::{read_requests, Choice, Document, UNCONDITIONED_DOC_ID};
pub use rng::SplitMix64;
pub use text::{
    load_splits, read_delimited, read_jsonl, read_orange_tab, read_rotten_tomatoes, Example,
    ReadText, Splits,
};
pub use tokenize::{encode_splits, Encoded, EncodedSplits, TextTokenizer};
pub use tokenizer_spec::TokenizerSpec;
pub use vocab::VocabPrunable;
pub use windows::{TokenWindows, WindowError, WindowSplit};
