//! Llama decoder language models (SmolLM2, TinyLlama, Llama 2 shapes): the model with per-layer
//! widths that pruning can shrink, a KV cache, a GGUF loader and writer ([`write_gguf`]: a pruned
//! model out to llama.cpp), text generation; the contracts of `mopt-core` (windows of tokens as
//! examples, their next tokens as the labels of every position; checkpoints; the dependency
//! groups of structured pruning: query heads inside their KV group, whole KV groups, FFN
//! channels, hidden channels, layers: [`prune`]; int8 fake-quantization of the seven
//! projections of every layer, the config's `mopt_quant`: `mopt_core::Quantizable`).
//!
//! ```no_run
//! use burn::prelude::*;
//! use mopt_models::llama::{generate, load_gguf, GenerateConfig};
//!
//! let device = Device::flex();
//! let path = std::path::Path::new("datasets/data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
//! let (config, model) = load_gguf(path, &device)?;
//! let gguf = mopt_gguf::Gguf::open(path)?;
//! let tokenizer = mopt_gguf::GgufTokenizer::from_gguf(&gguf)?;
//! let prompt = tokenizer.encode("Shall I compare thee to a summer's day?")?;
//! let eos = config.eos_token_id.into_iter();
//! let new = generate(&model, &prompt, &GenerateConfig::greedy(32).with_stop_tokens(eos));
//! println!("{}", tokenizer.decode(&new)?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod activations;
mod cache;
mod config;
mod family;
pub mod generate;
pub mod gguf;
pub mod gguf_out;
mod model;
pub mod onnx;
pub mod prune;
mod quant;

pub use cache::{KvCache, LayerCache};
pub use config::LlamaConfig;
pub use family::{load_checkpoint, save_checkpoint};
pub use generate::{
    generate, generate_timed, token_ids, GenerateConfig, Generated, Sampler, Sampling,
};
pub use gguf::{config_from_gguf, load_gguf, model_from_gguf};
pub use gguf_out::write_gguf;
pub use model::*;
pub use prune::{Ffn, Heads, Hidden, KvGroups, Layers};
