//! The byte-level BPE tokenizer a GGUF file describes (`tokenizer.ggml.model = "gpt2"`), built
//! the way Hugging Face transformers builds it from the same metadata.
//!
//! transformers (`integrations/gguf/gguf_tokenizer_mapping.py`, `byte_level_tokenizer`;
//! `GGUFGPTConverter` on top of `GPT2Converter` in older releases) makes a `tokenizers` BPE model
//! from `tokenizer.ggml.tokens` (id = position) and `tokenizer.ggml.merges` (`"a b"` pairs, best
//! first), no unknown token, a ByteLevel pre-tokenizer without a prefix space (GPT-2's split
//! regex) and a ByteLevel decoder. Tokens marked control (`tokenizer.ggml.token_type` 3, e.g.
//! `<|im_start|>`) are added as special tokens, matched whole in the text; tokens marked
//! user-defined (4) as plain added tokens. This module does the same, so ids match
//! transformers' `AutoTokenizer.from_pretrained(dir, gguf_file=…)` (checked on SmolLM2-135M).
//!
//! llama.cpp may split text differently for some `tokenizer.ggml.pre` values (for `smollm` it
//! isolates each digit first); those transformers maps to a different split regex (`llama-bpe`,
//! `qwen2`, …) are refused here rather than tokenized wrongly.

use std::collections::HashSet;
use std::path::PathBuf;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

use crate::error::GgufError;
use crate::reader::Gguf;
use crate::value::Value;

type Result<T> = std::result::Result<T, GgufError>;

const MODEL: &str = "tokenizer.ggml.model";
const PRE: &str = "tokenizer.ggml.pre";
const TOKENS: &str = "tokenizer.ggml.tokens";
const MERGES: &str = "tokenizer.ggml.merges";
const TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
/// `token_type` of a control token (`LLAMA_TOKEN_TYPE_CONTROL`).
const CONTROL: i32 = 3;
/// `token_type` of a user-defined token.
const USER_DEFINED: i32 = 4;

/// `tokenizer.ggml.pre` values for which transformers replaces GPT-2's split regex with another
/// (`GGUF_PRE_TOKENIZER_SPLITS` in transformers 5.x): not supported here.
const OTHER_SPLITS: &[&str] = &[
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "falcon-h1",
    "pixtral",
    "midm-2.0",
    "lfm2",
    "jina-v5-nano",
    "dbrx",
    "smaug-bpe",
    "tekken",
    "qwen2",
    "deepseek-r1-qwen",
    "kormo",
    "f2llmv2",
    "megrez",
    "qwen35",
    "gpt-4o",
    "llama4",
    "kanana2",
    "talkie",
    "minimax-m2",
];

/// A GGUF file's byte-level BPE tokenizer.
pub struct GgufTokenizer {
    path: PathBuf,
    inner: Tokenizer,
    tokens: Vec<String>,
    bos: Option<u32>,
    eos: Option<u32>,
    pad: Option<u32>,
    unk: Option<u32>,
}

impl std::fmt::Debug for GgufTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufTokenizer")
            .field("path", &self.path)
            .field("vocab_size", &self.tokens.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("pad", &self.pad)
            .finish_non_exhaustive()
    }
}

impl GgufTokenizer {
    /// Build the tokenizer from `gguf`'s `tokenizer.ggml.*` metadata.
    ///
    /// # Errors
    ///
    /// [`GgufError::MissingKey`] or [`GgufError::WrongType`] naming `tokenizer.ggml.model`,
    /// `tokenizer.ggml.tokens` or `tokenizer.ggml.merges` when one is absent or mistyped;
    /// [`GgufError::Tokenizer`] naming the key for a model other than `gpt2`, a pre-tokenizer
    /// that splits differently, an empty vocabulary, a merge that is not two tokens of the
    /// vocabulary, or a special token id outside it.
    pub fn from_gguf(gguf: &Gguf) -> Result<Self> {
        let path = gguf.path();
        let model = gguf.get_str(MODEL)?;
        if model != "gpt2" {
            let reason = format!("`{model}` is not supported (only `gpt2`, byte-level BPE)");
            return Err(GgufError::tokenizer(path, MODEL, reason));
        }
        if let Some(Value::String(pre)) = gguf.get(PRE) {
            if OTHER_SPLITS.contains(&pre.as_str()) {
                let reason = format!(
                    "`{pre}` splits text with its own regex; only GPT-2's split is supported"
                );
                return Err(GgufError::tokenizer(path, PRE, reason));
            }
        }
        let tokens = gguf.get_str_array(TOKENS)?;
        if tokens.is_empty() || u32::try_from(tokens.len()).is_err() {
            let reason = format!("{} tokens (needs 1 to 2^32 - 1)", tokens.len());
            return Err(GgufError::tokenizer(path, TOKENS, reason));
        }
        let vocab = byte_level_vocab(tokens);
        let merges = split_merges(gguf)?;
        let bpe = BPE::builder()
            .vocab_and_merges(vocab.clone(), merges)
            .build()
            .map_err(|e| GgufError::tokenizer(path, MERGES, e.to_string()))?;
        let mut inner = Tokenizer::new(bpe);
        inner
            .with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)))
            .with_decoder(Some(ByteLevelDecoder::default()));
        add_marked_tokens(gguf, &mut inner, tokens, &vocab)?;
        let id = |key: &str| special_id(gguf, key, tokens.len());
        Ok(GgufTokenizer {
            path: path.to_path_buf(),
            bos: id("tokenizer.ggml.bos_token_id")?,
            eos: id("tokenizer.ggml.eos_token_id")?,
            pad: id("tokenizer.ggml.padding_token_id")?,
            unk: id("tokenizer.ggml.unknown_token_id")?,
            tokens: tokens.to_vec(),
            inner,
        })
    }

    /// The ids of `text`, no special tokens added (no BOS). Special tokens written in the text
    /// (`<|im_start|>`) become their ids.
    ///
    /// # Errors
    ///
    /// [`GgufError::Tokenizer`] when the `tokenizers` library fails.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.inner
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| GgufError::tokenizer(&self.path, "encode", e.to_string()))
    }

    /// The text of `ids`, special tokens included (as transformers' `decode` does by default).
    ///
    /// # Errors
    ///
    /// [`GgufError::Tokenizer`] for an id outside the vocabulary or a library failure.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        if let Some(bad) = ids.iter().find(|id| **id as usize >= self.tokens.len()) {
            let reason = format!(
                "id {bad} is outside the vocabulary of {}",
                self.tokens.len()
            );
            return Err(GgufError::tokenizer(&self.path, "decode", reason));
        }
        self.inner
            .decode(ids, false)
            .map_err(|e| GgufError::tokenizer(&self.path, "decode", e.to_string()))
    }

    /// The number of tokens (`tokenizer.ggml.tokens`).
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// Token `id` as the file spells it.
    pub fn token(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// `tokenizer.ggml.bos_token_id`, if present.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// `tokenizer.ggml.eos_token_id`, if present.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// `tokenizer.ggml.padding_token_id`, if present.
    pub fn pad_id(&self) -> Option<u32> {
        self.pad
    }

    /// `tokenizer.ggml.unknown_token_id`, if present.
    pub fn unk_id(&self) -> Option<u32> {
        self.unk
    }
}

/// GPT-2's byte ↔ printable character table (`bytes_to_unicode`): bytes that are printable
/// Latin-1 map to themselves, the others to U+0100 onwards in byte order.
fn byte_chars() -> [char; 256] {
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
    let mut next = 0x100;
    std::array::from_fn(|b| {
        let b = b as u32;
        let c = if printable(b) {
            b
        } else {
            next += 1;
            next - 1
        };
        char::from_u32(c).unwrap_or('\u{fffd}')
    })
}

/// Token → id. A token with a character outside the byte alphabet is respelled as the byte
/// characters of its UTF-8, as transformers does; a repeated token keeps its last id.
fn byte_level_vocab(tokens: &[String]) -> Vocab {
    let chars = byte_chars();
    let alphabet: HashSet<char> = chars.iter().copied().collect();
    tokens
        .iter()
        .enumerate()
        .map(|(id, t)| {
            let spelled = if t.chars().all(|c| alphabet.contains(&c)) {
                t.clone()
            } else {
                t.bytes().map(|b| chars[b as usize]).collect()
            };
            (spelled, id as u32)
        })
        .collect()
}

fn split_merges(gguf: &Gguf) -> Result<Vec<(String, String)>> {
    let merges = gguf.get_str_array(MERGES)?;
    if merges.is_empty() {
        return Err(GgufError::tokenizer(gguf.path(), MERGES, "no merges"));
    }
    merges
        .iter()
        .enumerate()
        .map(|(i, m)| match m.split_once(' ') {
            Some((a, b)) if !a.is_empty() && !b.is_empty() && !b.contains(' ') => {
                Ok((a.to_string(), b.to_string()))
            }
            _ => {
                let reason = format!("merge {i} is `{m}`, not two tokens separated by a space");
                Err(GgufError::tokenizer(gguf.path(), MERGES, reason))
            }
        })
        .collect()
}

/// Add control tokens as special tokens (only those spelled in the byte alphabet: another
/// spelling is a llama.cpp mislabel), then user-defined tokens found in the vocabulary as plain
/// added tokens; both matched whole and unnormalized. Without `token_type`, none.
fn add_marked_tokens(
    gguf: &Gguf,
    inner: &mut Tokenizer,
    tokens: &[String],
    vocab: &Vocab,
) -> Result<()> {
    if gguf.get(TOKEN_TYPE).is_none() {
        return Ok(());
    }
    let types = gguf.get_i32_array(TOKEN_TYPE)?;
    let alphabet: HashSet<char> = byte_chars().into_iter().collect();
    let marked = |kind: i32| tokens.iter().zip(types).filter(move |(_, t)| **t == kind);
    let control: Vec<AddedToken> = marked(CONTROL)
        .filter(|(tok, _)| tok.chars().all(|c| alphabet.contains(&c)))
        .map(|(tok, _)| AddedToken::from(tok.clone(), true).normalized(false))
        .collect();
    let user: Vec<AddedToken> = marked(USER_DEFINED)
        .filter(|(tok, _)| vocab.contains_key(*tok))
        .map(|(tok, _)| AddedToken::from(tok.clone(), false).normalized(false))
        .collect();
    let fail = |e: tokenizers::Error| GgufError::tokenizer(gguf.path(), TOKEN_TYPE, e.to_string());
    inner.add_special_tokens(control).map_err(fail)?;
    inner.add_tokens(user).map_err(fail)?;
    Ok(())
}

/// The u32 id under `key`, checked against the vocabulary; `None` when absent.
fn special_id(gguf: &Gguf, key: &str, vocab_size: usize) -> Result<Option<u32>> {
    if gguf.get(key).is_none() {
        return Ok(None);
    }
    let id = gguf.get_u32(key)?;
    if id as usize >= vocab_size {
        let reason = format!("id {id} is outside the vocabulary of {vocab_size}");
        return Err(GgufError::tokenizer(gguf.path(), key, reason));
    }
    Ok(Some(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_is_gpt2s() {
        let t = byte_chars();
        assert_eq!(t[b'!' as usize], '!');
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[0], 'Ā');
        assert_eq!(t[0xad], 'Ń');
        assert_eq!(t.iter().collect::<HashSet<_>>().len(), 256);
    }

    #[test]
    fn tokens_outside_the_byte_alphabet_are_respelled() {
        // `é` (0xe9) is in the alphabet and stays; `€` is not, so it becomes its UTF-8 bytes' chars.
        let v = byte_level_vocab(&["a".into(), "é".into(), "€".into(), "Ġb".into()]);
        assert_eq!(v.get("a"), Some(&0));
        assert_eq!(v.get("é"), Some(&1));
        assert_eq!(v.get("âĤ¬"), Some(&2));
        assert_eq!(v.get("Ġb"), Some(&3));
    }
}
