//! The teacher cache on disk: a safetensors file read on demand. Four tensors:
//! `logits` `[n, classes]` f32, `lengths` `[n]` i64 (tokens of each example), `offsets` `[n + 1]`
//! i64 and `features` `[total]` f32, where example `i`'s matched features (its hidden states,
//! then attention probabilities, then attention scores, each cropped to its length) are
//! `features[offsets[i]..offsets[i + 1]]`. The header's `__metadata__` says what the features
//! are and holds the sha256 of the data section.
//!
//! Opening reads the header, the logits and the offsets, and streams the data once through
//! sha256 (the page cache, not the process, holds it); a batch then reads only its examples'
//! features with positioned reads. So a distillation run's memory does not grow with the cache
//! (a memory map would do the same, but needs `unsafe`, which this workspace forbids).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// What the cache's features are (the header's metadata).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Header {
    pub num_labels: usize,
    pub hidden_size: usize,
    /// Heads of each matched attention layer (1-based layer → heads).
    pub heads: BTreeMap<usize, usize>,
    /// Hidden states, attention layers, score layers per example (the needs' counts).
    pub counts: [usize; 3],
}

/// An open cache file.
pub(crate) struct CacheFile {
    file: File,
    pub path: PathBuf,
    pub header: Header,
    pub logits: Vec<f32>,
    pub lengths: Vec<usize>,
    offsets: Vec<u64>,
    /// Byte position of `features` in the file.
    features_at: u64,
}

const FORMAT: &str = "mopt-teacher-cache";
const VERSION: &str = "3";

fn bad(m: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, m.into())
}

fn le_f32(v: &[f32]) -> impl Iterator<Item = [u8; 4]> + '_ {
    v.iter().map(|x| x.to_le_bytes())
}

/// Write a cache: `logits` `[n × classes]`, each example's length and its features (the
/// records `features(i)` returns, already cropped). Atomic: a per-process temporary file,
/// flushed, then renamed.
pub(crate) fn write(
    path: &Path,
    header: &Header,
    logits: &[f32],
    lengths: &[usize],
    features: &dyn Fn(usize) -> Vec<f32>,
) -> std::io::Result<()> {
    let n = lengths.len();
    let mut offsets = vec![0u64; n + 1];
    let mut sha = Sha256::new();
    for i in 0..n {
        let f = features(i);
        offsets[i + 1] = offsets[i] + f.len() as u64;
        for b in le_f32(&f) {
            sha.update(b);
        }
    }
    let data_sha256 = framed_sha256(logits, lengths, &offsets, sha);
    let (nl, nx) = (logits.len() as u64 * 4, offsets[n] * 4);
    let (nlen, noff) = (n as u64 * 8, (n as u64 + 1) * 8);
    let tensor = |dtype: &str, shape: Vec<u64>, from: u64, len: u64| json!({ "dtype": dtype, "shape": shape, "data_offsets": [from, from + len] });
    let meta = json!({
        "format": FORMAT,
        "version": VERSION,
        "num_labels": header.num_labels.to_string(),
        "hidden_size": header.hidden_size.to_string(),
        "heads": serde_json::to_string(&header.heads).expect("json"),
        "counts": serde_json::to_string(&header.counts).expect("json"),
        "data_sha256": data_sha256,
    });
    let classes = (logits.len() / n.max(1)) as u64;
    let h = json!({
        "__metadata__": meta,
        "logits": tensor("F32", vec![n as u64, classes], 0, nl),
        "lengths": tensor("I64", vec![n as u64], nl, nlen),
        "offsets": tensor("I64", vec![n as u64 + 1], nl + nlen, noff),
        "features": tensor("F32", vec![offsets[n]], nl + nlen + noff, nx),
    });
    let mut hb = serde_json::to_vec(&h).expect("json");
    // Data 8-byte aligned, as safetensors writers pad: spaces after the JSON.
    while !(8 + hb.len()).is_multiple_of(8) {
        hb.push(b' ');
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("{}.part", std::process::id()));
    {
        let mut w = BufWriter::new(File::create(&tmp)?);
        w.write_all(&(hb.len() as u64).to_le_bytes())?;
        w.write_all(&hb)?;
        for b in le_f32(logits) {
            w.write_all(&b)?;
        }
        for &l in lengths {
            w.write_all(&(l as i64).to_le_bytes())?;
        }
        for &o in &offsets {
            w.write_all(&(o as i64).to_le_bytes())?;
        }
        for i in 0..n {
            for b in le_f32(&features(i)) {
                w.write_all(&b)?;
            }
        }
        w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    }
    std::fs::rename(&tmp, path)
}

impl CacheFile {
    /// Open the cache at `path`: its header, logits, lengths and offsets in memory, its data
    /// section checked against the sha256 written with it (a truncated or altered file is an
    /// error saying so).
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let mut file = File::open(path)?;
        let size = file.metadata()?.len();
        let mut n8 = [0u8; 8];
        file.read_exact(&mut n8)?;
        let hl = u64::from_le_bytes(n8);
        if hl > size.saturating_sub(8) || hl > 100 << 20 {
            return Err(bad("truncated, or not a safetensors file"));
        }
        let mut hb = vec![0u8; hl as usize];
        file.read_exact(&mut hb)?;
        let h: Value = serde_json::from_slice(&hb).map_err(|e| bad(format!("header: {e}")))?;
        let meta = &h["__metadata__"];
        if meta["format"] != FORMAT || meta["version"] != VERSION {
            return Err(bad("not a mopt teacher cache of this version"));
        }
        let data_at = 8 + hl;
        let span = |name: &str| -> std::io::Result<(u64, u64)> {
            let o = &h[name]["data_offsets"];
            match (o[0].as_u64(), o[1].as_u64()) {
                (Some(a), Some(b)) if a <= b && data_at + b <= size => Ok((data_at + a, b - a)),
                _ => Err(bad(format!(
                    "tensor `{name}` missing or past the end (truncated?)"
                ))),
            }
        };
        let (logits_at, nl) = span("logits")?;
        let (lengths_at, nlen) = span("lengths")?;
        let (offsets_at, noff) = span("offsets")?;
        let (features_at, nx) = span("features")?;
        if features_at + nx != size {
            return Err(bad(
                "its length differs from its header's (truncated or extended)",
            ));
        }
        let read = |at: u64, len: u64| -> std::io::Result<Vec<u8>> {
            let mut b = vec![0u8; len as usize];
            read_at(&file, &mut b, at)?;
            Ok(b)
        };
        let logits: Vec<f32> = read(logits_at, nl)?
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        let i64s = |b: Vec<u8>| -> Vec<u64> {
            b.chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")) as u64)
                .collect()
        };
        let lengths: Vec<usize> = i64s(read(lengths_at, nlen)?)
            .into_iter()
            .map(|l| l as usize)
            .collect();
        let offsets = i64s(read(offsets_at, noff)?);
        if offsets.len() != lengths.len() + 1
            || offsets.windows(2).any(|w| w[0] > w[1])
            || offsets.last().copied().unwrap_or(0) * 4 != nx
        {
            return Err(bad("its offsets do not fit its features"));
        }
        // The data section through sha256, streamed: the page cache holds it, not this process.
        let mut sha = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut at = features_at;
        while at < size {
            let len = buf.len().min((size - at) as usize);
            read_at(&file, &mut buf[..len], at)?;
            sha.update(&buf[..len]);
            at += len as u64;
        }
        if meta["data_sha256"].as_str() != Some(&framed_sha256(&logits, &lengths, &offsets, sha)) {
            return Err(bad(
                "its sha256 differs from the one written with it: truncated or altered",
            ));
        }
        let number = |k: &str| -> std::io::Result<usize> {
            meta[k]
                .as_str()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| bad(format!("header: {k}")))
        };
        let parse = |k: &str| meta[k].as_str().unwrap_or("");
        let header = Header {
            num_labels: number("num_labels")?,
            hidden_size: number("hidden_size")?,
            heads: serde_json::from_str(parse("heads")).map_err(|e| bad(format!("heads: {e}")))?,
            counts: serde_json::from_str(parse("counts"))
                .map_err(|e| bad(format!("counts: {e}")))?,
        };
        if logits.len() != lengths.len() * header.num_labels {
            return Err(bad("its logits do not fit its classes"));
        }
        Ok(Self {
            file,
            path: path.to_path_buf(),
            header,
            logits,
            lengths,
            offsets,
            features_at,
        })
    }

    /// Example `i`'s feature record, read from the file.
    pub fn features(&self, i: usize) -> std::io::Result<Vec<f32>> {
        let (a, b) = (self.offsets[i], self.offsets[i + 1]);
        let mut bytes = vec![0u8; ((b - a) * 4) as usize];
        read_at(&self.file, &mut bytes, self.features_at + a * 4)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect())
    }
}

/// The data section's sha256 as the header records it: the logits, lengths and offsets, then
/// the sha256 of the features (hashed while they stream past).
fn framed_sha256(logits: &[f32], lengths: &[usize], offsets: &[u64], features: Sha256) -> String {
    let mut h = Sha256::new();
    le_f32(logits).for_each(|b| h.update(b));
    lengths
        .iter()
        .for_each(|&l| h.update((l as i64).to_le_bytes()));
    offsets
        .iter()
        .for_each(|&o| h.update((o as i64).to_le_bytes()));
    h.update(features.finalize());
    format!("{:x}", h.finalize())
}

#[cfg(unix)]
fn read_at(file: &File, buf: &mut [u8], at: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, at)
}

#[cfg(windows)]
fn read_at(file: &File, mut buf: &mut [u8], mut at: u64) -> std::io::Result<()> {
    while !buf.is_empty() {
        match std::os::windows::fs::FileExt::seek_read(file, buf, at)? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => {
                buf = &mut buf[n..];
                at += n as u64;
            }
        }
    }
    Ok(())
}
