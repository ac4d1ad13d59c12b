//! # mopt-gguf
//!
//! Read and write [GGUF](https://github.com/ggml-org/ggml/blob/master/docs/gguf.md), the file
//! format of llama.cpp and ggml: one file holding a model's configuration, its tokenizer and its
//! (often quantized) weights. This crate is what mopt's decoder LMs load checkpoints such as
//! SmolLM2-135M-Instruct (`datasets/fetch.sh --small`) from.
//!
//! ## The format
//!
//! Everything little-endian:
//!
//! 1. header: the magic `GGUF`, a u32 version (2 and 3 are read; 3 is written), a u64 tensor
//!    count, a u64 metadata entry count;
//! 2. metadata: per entry a string key, a u32 value type and the value — u8, i8, u16, i16, u32,
//!    i32, f32, bool, string (u64 length + UTF-8), array (u32 element type + u64 count +
//!    elements, arrays of arrays included), u64, i64, f64 ([`Value`]);
//! 3. tensor table: per tensor a string name, a u32 dimension count (≤ 4), u64 dims, a u32 ggml
//!    type ([`GgmlType`]) and a u64 offset into the data section;
//! 4. padding to `general.alignment` (32 by default), then the data section, each tensor at its
//!    (aligned) offset.
//!
//! **Dimension order**: GGUF lists dims fastest-varying first (`ne[0]` is contiguous). A
//! PyTorch weight of shape `[out, in]` is stored with dims `[in, out]`;
//! [`TensorInfo::shape`] gives the reversed, row-major shape.
//!
//! ## What is supported
//!
//! - Reading ([`Gguf`]): streamed (header, metadata and table read once; each tensor read with
//!   a seek and one read when asked for), and validated before anything is trusted: counts and
//!   lengths are bounded by the bytes left in the file before anything is allocated for them,
//!   dims must not overflow, tensor data must lie inside the file, duplicate keys and tensor
//!   names are refused, arrays nest at most 16 deep. Bad input is an error naming the file and
//!   the field ([`GgufError`]), never a panic.
//! - Dequantization ([`Gguf::read_f32`], [`ggml::dequantize`]) of F32, F16, BF16, Q8_0, Q4_0 and
//!   Q4_1, bit-exact with ggml's reference code; other types (the k-quants Q4_K, Q6_K, …, the
//!   i-quants) are listed in the table and refused by name when read.
//! - Writing ([`GgufWriter`]): GGUF v3, every metadata type, tensors as F32, F16 or Q8_0
//!   (quantized as ggml's `quantize_row_q8_0_ref`), aligned, atomically.
//! - Tokenizer ([`GgufTokenizer`]): the byte-level BPE (`tokenizer.ggml.model = "gpt2"`) built
//!   as Hugging Face transformers builds it from the same metadata.
//!
//! ## Example
//!
//! ```no_run
//! use mopt_gguf::{Gguf, GgufTokenizer};
//!
//! let gguf = Gguf::open("datasets/data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let hidden = gguf.get_u32("llama.embedding_length")?; // 576
//! let embd = gguf.tensor_info("token_embd.weight")?; // dims [576, 49152], Q8_0
//! assert_eq!(embd.shape(), [49152, u64::from(hidden)]);
//! let table = gguf.read_f32("token_embd.weight")?; // 49,152 rows of 576, dequantized
//! let row_of_token_42 = &table[42 * 576..43 * 576];
//!
//! let tokenizer = GgufTokenizer::from_gguf(&gguf)?;
//! let ids = tokenizer.encode("To be, or not to be, that is the question:")?;
//! assert_eq!(tokenizer.decode(&ids)?, "To be, or not to be, that is the question:");
//! # let _ = row_of_token_42;
//! # Ok::<(), mopt_gguf::GgufError>(())
//! ```

#![deny(missing_docs)]

pub mod error;
pub mod ggml;
pub mod reader;
pub mod tokenizer;
pub mod value;
pub mod writer;

pub use error::GgufError;
pub use ggml::GgmlType;
pub use reader::{Gguf, TensorInfo};
pub use tokenizer::GgufTokenizer;
pub use value::{Array, Value, ValueType};
pub use writer::GgufWriter;
