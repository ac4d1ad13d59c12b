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
//!
//! Writing is streamed too ([`Writer`]): the header and index first, each example's record at
//! its place as the teacher pass produces it, the data's sha256 into the header last, then the
//! rename; the build holds one batch of teacher outputs and the logits.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
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

/// The header's bytes (JSON padded with spaces so that the data is 8-byte aligned, as
/// safetensors writers pad) for `n` examples of `classes` logits and `features` floats.
fn header_bytes(
    header: &Header,
    (n, classes): (usize, usize),
    features: u64,
    data_sha256: &str,
) -> Vec<u8> {
    let (nl, nx) = ((n * classes) as u64 * 4, features * 4);
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
    let h = json!({
        "__metadata__": meta,
        "logits": tensor("F32", vec![n as u64, classes as u64], 0, nl),
        "lengths": tensor("I64", vec![n as u64], nl, nlen),
        "offsets": tensor("I64", vec![n as u64 + 1], nl + nlen, noff),
        "features": tensor("F32", vec![features], nl + nlen + noff, nx),
    });
    let mut hb = serde_json::to_vec(&h).expect("json");
    while !(8 + hb.len()).is_multiple_of(8) {
        hb.push(b' ');
    }
    hb
}

/// The per-process temporary file a cache at `path` is written to before its rename.
pub(crate) fn part_path(path: &Path) -> PathBuf {
    path.with_extension(format!("{}.part", std::process::id()))
}

/// Remove temporary files of builds of the cache at `path` that were killed (their process is
/// gone; each can be as large as the cache). Only where processes can be looked up (Linux).
fn remove_dead_parts(path: &Path) {
    let (Some(dir), Some(stem)) = (path.parent(), path.file_stem().and_then(|s| s.to_str())) else {
        return;
    };
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = name
            .strip_prefix(&format!("{stem}."))
            .and_then(|r| r.strip_suffix(".part"));
        if let Some(pid) = pid.filter(|p| p.bytes().all(|b| b.is_ascii_digit())) {
            if !Path::new("/proc").join(pid).exists() {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// Write a cache held in memory: `logits` `[n × classes]`, each example's length and its
/// features (the records `features(i)` returns, already cropped), through a [`Writer`].
pub(crate) fn write(
    path: &Path,
    header: &Header,
    logits: &[f32],
    lengths: &[usize],
    features: &dyn Fn(usize) -> Vec<f32>,
) -> std::io::Result<()> {
    let n = lengths.len();
    let classes = logits.len() / n.max(1);
    let sizes: Vec<u64> = (0..n).map(|i| features(i).len() as u64).collect();
    let mut w = Writer::create(path, header, classes, lengths.to_vec(), &sizes)?;
    for i in 0..n {
        w.put(i, &logits[i * classes..(i + 1) * classes], &features(i))?;
    }
    w.finish()
}

/// A cache written as it is computed: the header (its sha256 a placeholder of the same
/// length), lengths and offsets first; each example's logits (kept, they are small) and its
/// feature record written at their place as they come, in any order; at the end the data
/// section is read back through sha256, the hash written into the header and the temporary
/// file renamed. A build killed half-way leaves only the temporary file, whose placeholder
/// never verifies; the next build of the same cache removes it. The bytes are those of a
/// cache written from memory.
pub(crate) struct Writer {
    file: File,
    tmp: PathBuf,
    path: PathBuf,
    classes: usize,
    lengths: Vec<usize>,
    offsets: Vec<u64>,
    logits: Vec<f32>,
    written: Vec<bool>,
    /// Byte positions: the logits, the features, the sha256 placeholder in the header.
    logits_at: u64,
    features_at: u64,
    sha_at: u64,
}

const PLACEHOLDER: &str = "????????????????????????????????????????????????????????????????";

impl Writer {
    /// Start the cache at `path` for examples of `lengths` tokens, `classes` logits and feature
    /// records of `sizes` floats each.
    pub fn create(
        path: &Path,
        header: &Header,
        classes: usize,
        lengths: Vec<usize>,
        sizes: &[u64],
    ) -> std::io::Result<Self> {
        let n = lengths.len();
        let mut offsets = vec![0u64; n + 1];
        for i in 0..n {
            offsets[i + 1] = offsets[i] + sizes[i];
        }
        let hb = header_bytes(header, (n, classes), offsets[n], PLACEHOLDER);
        let sha_at = 8 + find(&hb, PLACEHOLDER.as_bytes()).expect("the placeholder") as u64;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        remove_dead_parts(path);
        let tmp = part_path(path);
        // Read back at the end (the data's sha256), so opened for reading too.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        let logits_at = 8 + hb.len() as u64;
        let features_at = logits_at + (n * classes) as u64 * 4 + (2 * n as u64 + 1) * 8;
        file.set_len(features_at + offsets[n] * 4)?;
        let mut head = Vec::with_capacity((features_at - logits_at) as usize + hb.len() + 8);
        head.extend_from_slice(&(hb.len() as u64).to_le_bytes());
        head.extend_from_slice(&hb);
        head.resize(logits_at as usize + n * classes * 4, 0);
        lengths
            .iter()
            .for_each(|&l| head.extend_from_slice(&(l as i64).to_le_bytes()));
        offsets
            .iter()
            .for_each(|&o| head.extend_from_slice(&(o as i64).to_le_bytes()));
        write_at(&file, &head, 0)?;
        Ok(Self {
            file,
            tmp,
            path: path.to_path_buf(),
            classes,
            logits: vec![0.0; n * classes],
            written: vec![false; n],
            lengths,
            offsets,
            logits_at,
            features_at,
            sha_at,
        })
    }

    /// Example `i`'s logits and feature record (cropped to its length).
    pub fn put(&mut self, i: usize, logits: &[f32], record: &[f32]) -> std::io::Result<()> {
        let want = self.offsets[i + 1] - self.offsets[i];
        if logits.len() != self.classes || record.len() as u64 != want {
            return Err(bad(format!(
                "example {i}: {} logits and {} features, the header says {} and {want}",
                logits.len(),
                record.len(),
                self.classes
            )));
        }
        self.logits[i * self.classes..(i + 1) * self.classes].copy_from_slice(logits);
        let bytes: Vec<u8> = le_f32(record).flatten().collect();
        write_at(&self.file, &bytes, self.features_at + self.offsets[i] * 4)?;
        self.written[i] = true;
        Ok(())
    }

    /// The logits and the data's sha256 written, the file flushed and renamed into place.
    pub fn finish(self) -> std::io::Result<()> {
        if let Some(i) = self.written.iter().position(|w| !w) {
            return Err(bad(format!("example {i} was never written")));
        }
        let bytes: Vec<u8> = le_f32(&self.logits).flatten().collect();
        write_at(&self.file, &bytes, self.logits_at)?;
        let size = self.features_at + self.offsets[self.lengths.len()] * 4;
        let sha = hash_span(&self.file, self.features_at, size)?;
        let digest = framed_sha256(&self.logits, &self.lengths, &self.offsets, sha);
        write_at(&self.file, digest.as_bytes(), self.sha_at)?;
        self.file.sync_all()?;
        std::fs::rename(&self.tmp, &self.path)
    }
}

/// Where `needle` first occurs in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The bytes `at..end` of `file` through sha256, streamed (the page cache holds them, not
/// this process).
fn hash_span(file: &File, mut at: u64, end: u64) -> std::io::Result<Sha256> {
    let mut sha = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    while at < end {
        let len = buf.len().min((end - at) as usize);
        read_at(file, &mut buf[..len], at)?;
        sha.update(&buf[..len]);
        at += len as u64;
    }
    Ok(sha)
}

impl CacheFile {
    /// Open the cache at `path`: its header, logits, lengths and offsets in memory, its data
    /// section checked against the sha256 written with it (a truncated or altered file is an
    /// error saying so).
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let mut file = File::open(path)?;
        let size = file.metadata()?.len();
        let (h, data_at) = read_header(&mut file, size)?;
        let meta = &h["__metadata__"];
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
        let lengths: Vec<usize> = i64s(&read(lengths_at, nlen)?)
            .into_iter()
            .map(|l| l as usize)
            .collect();
        let offsets = i64s(&read(offsets_at, noff)?);
        if offsets.len() != lengths.len() + 1
            || offsets.windows(2).any(|w| w[0] > w[1])
            || offsets.last().copied().unwrap_or(0) * 4 != nx
        {
            return Err(bad("its offsets do not fit its features"));
        }
        // The data section through sha256, streamed: the page cache holds it, not this process.
        let sha = hash_span(&file, features_at, size)?;
        if meta["data_sha256"].as_str() != Some(&framed_sha256(&logits, &lengths, &offsets, sha)) {
            return Err(bad(
                "its sha256 differs from the one written with it: truncated or altered",
            ));
        }
        let header = parse_meta(meta)?;
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

/// The JSON header of a cache file of `size` bytes, checked to be a mopt teacher cache of this
/// version, and where its data starts.
fn read_header(file: &mut File, size: u64) -> std::io::Result<(Value, u64)> {
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
    Ok((h, 8 + hl))
}

/// Little-endian i64s (as u64).
fn i64s(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")) as u64)
        .collect()
}

/// The header's `__metadata__` as a [`Header`].
fn parse_meta(meta: &Value) -> std::io::Result<Header> {
    let number = |k: &str| -> std::io::Result<usize> {
        meta[k]
            .as_str()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad(format!("header: {k}")))
    };
    let parse = |k: &str| meta[k].as_str().unwrap_or("");
    Ok(Header {
        num_labels: number("num_labels")?,
        hidden_size: number("hidden_size")?,
        heads: serde_json::from_str(parse("heads")).map_err(|e| bad(format!("heads: {e}")))?,
        counts: serde_json::from_str(parse("counts")).map_err(|e| bad(format!("counts: {e}")))?,
    })
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
fn write_at(file: &File, buf: &[u8], at: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::write_all_at(file, buf, at)
}

#[cfg(windows)]
fn write_at(file: &File, mut buf: &[u8], mut at: u64) -> std::io::Result<()> {
    while !buf.is_empty() {
        match std::os::windows::fs::FileExt::seek_write(file, buf, at)? {
            0 => return Err(std::io::ErrorKind::WriteZero.into()),
            n => {
                buf = &buf[n..];
                at += n as u64;
            }
        }
    }
    Ok(())
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
