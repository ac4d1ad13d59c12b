//! Teacher-output cache: the teacher's logits (and the hidden states / attention the matches
//! read) for every training example, computed once and stored on disk, keyed by the teacher
//! checkpoint, the token ids and the features. Any change to them gives a new key.

use std::collections::BTreeMap;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use burn::prelude::*;
use mopt_core::{Tapped, Taps};
use mopt_data::{Batcher, Encoded, TextBatch};
use sha2::{Digest, Sha256};

use crate::matching::{TeacherBatch, TeacherNeeds};

const MAGIC: &[u8; 8] = b"MOPTTC2\n";

/// Teacher features of one example, unpadded (`len` tokens).
#[derive(Debug, Clone, PartialEq)]
struct ExampleOutputs {
    len: usize,
    logits: Vec<f32>,
    /// `[len, hidden]` per needed hidden index (in `needs.hidden` order).
    hidden: Vec<Vec<f32>>,
    /// `[heads, len, len]` per needed attention layer.
    attentions: Vec<Vec<f32>>,
    scores: Vec<Vec<f32>>,
}

/// Teacher outputs for a whole data split. Clones share the outputs (data-parallel replicas
/// read one copy).
#[derive(Clone)]
pub struct TeacherCache {
    needs: TeacherNeeds,
    num_labels: usize,
    hidden_size: usize,
    /// Heads of each needed attention layer (1-based layer → heads).
    heads: BTreeMap<usize, usize>,
    examples: Arc<Vec<ExampleOutputs>>,
    /// Loaded from disk rather than computed.
    pub hit: bool,
    /// Seconds spent in teacher forward passes (0 on a hit).
    pub build_s: f64,
    /// Number of examples the teacher ran on in this process.
    pub teacher_forwards: usize,
    /// The cache file read or written, if any.
    pub file: Option<PathBuf>,
}

/// Cache key of a teacher checkpoint folder, the examples and the features.
pub fn cache_key(
    teacher_dir: &Path,
    examples: &[Encoded],
    needs: &TeacherNeeds,
) -> std::io::Result<String> {
    let mut h = Sha256::new();
    h.update(b"mopt-teacher-cache-v1");
    for f in ["model.bpk", "config.json"] {
        h.update(std::fs::read(teacher_dir.join(f))?);
    }
    h.update(format!("{needs:?}").as_bytes());
    h.update((examples.len() as u64).to_le_bytes());
    for e in examples {
        h.update((e.ids.len() as u32).to_le_bytes());
        for id in &e.ids {
            h.update(id.to_le_bytes());
        }
    }
    Ok(format!("{:x}", h.finalize())[..24].to_string())
}

fn rows(data: Vec<f32>, b: usize, per: usize) -> Vec<Vec<f32>> {
    (0..b)
        .map(|i| data[i * per..(i + 1) * per].to_vec())
        .collect()
}

/// Run the teacher (inference device, no gradients) over `examples` in length-sorted batches.
pub fn compute<M: Tapped<Batch = TextBatch>>(
    teacher: &M,
    examples: &[Encoded],
    needs: &TeacherNeeds,
    batcher: &Batcher,
    batch_size: usize,
    device: &Device,
) -> TeacherCache {
    let start = Instant::now();
    let mut order: Vec<usize> = (0..examples.len()).collect();
    order.sort_by_key(|&i| examples[i].ids.len());
    let mut out: Vec<Option<ExampleOutputs>> = vec![None; examples.len()];
    let mut shapes = Shapes::default();
    let n_batches = examples.len().div_ceil(batch_size.max(1));
    let mut progress = mopt_train::logging::Progress::new("teacher pass", n_batches);
    let mut done = 0;
    for (bi, chunk) in order.chunks(batch_size).enumerate() {
        done += chunk.len();
        progress.update(bi + 1, &format!("{done} examples"));
        let items: Vec<&Encoded> = chunk.iter().map(|&i| &examples[i]).collect();
        let b = batcher.batch(&items, device);
        let seq = b.input_ids.dims()[1];
        let o = teacher.forward_taps(&b, needs.request());
        let lens: Vec<usize> = items.iter().map(|e| e.ids.len()).collect();
        for (r, e) in split_batch(o, needs, &lens, seq, &mut shapes)
            .into_iter()
            .enumerate()
        {
            out[chunk[r]] = Some(e);
        }
    }
    progress.finish("teacher outputs computed");
    TeacherCache {
        needs: needs.clone(),
        num_labels: shapes.num_labels,
        hidden_size: shapes.hidden_size,
        heads: shapes.heads,
        examples: Arc::new(
            out.into_iter()
                .map(|e| e.expect("every example computed"))
                .collect(),
        ),
        hit: false,
        build_s: start.elapsed().as_secs_f64(),
        teacher_forwards: examples.len(),
        file: None,
    }
}

/// Shapes met while computing: classes, hidden width, heads per (1-based) layer.
#[derive(Default)]
struct Shapes {
    num_labels: usize,
    hidden_size: usize,
    heads: BTreeMap<usize, usize>,
}

/// One batch's teacher outputs `o` (padded to `seq`), per example, cropped to its `lens[r]`
/// tokens.
fn split_batch(
    o: Taps,
    needs: &TeacherNeeds,
    lens: &[usize],
    seq: usize,
    shapes: &mut Shapes,
) -> Vec<ExampleOutputs> {
    let bsz = lens.len();
    shapes.num_labels = o.logits.dims()[1];
    let logits = rows(
        o.logits.into_data().try_to_vec().expect("f32"),
        bsz,
        shapes.num_labels,
    );
    let hidden: Vec<Vec<Vec<f32>>> = needs
        .hidden
        .iter()
        .map(|&k| {
            let t = o.hidden_states[k].clone();
            shapes.hidden_size = t.dims()[2];
            let per = seq * shapes.hidden_size;
            rows(t.into_data().try_to_vec().expect("f32"), bsz, per)
        })
        .collect();
    let mut attn = |set: &std::collections::BTreeSet<usize>, src: &[Tensor<4>]| {
        set.iter()
            .map(|&l| {
                let t = src[l - 1].clone();
                let h = t.dims()[1];
                shapes.heads.insert(l, h);
                rows(t.into_data().try_to_vec().expect("f32"), bsz, h * seq * seq)
            })
            .collect::<Vec<Vec<Vec<f32>>>>()
    };
    let attentions = attn(&needs.attentions, &o.attentions);
    let scores = attn(&needs.scores, &o.attention_scores);
    let hidden_size = shapes.hidden_size;
    (0..bsz)
        .map(|r| {
            let len = lens[r];
            let crop_h = |v: &Vec<f32>| v[..len * hidden_size].to_vec();
            let crop_a = |v: &Vec<f32>| {
                let h = v.len() / (seq * seq);
                let mut c = Vec::with_capacity(h * len * len);
                for k in 0..h {
                    for q in 0..len {
                        let off = (k * seq + q) * seq;
                        c.extend_from_slice(&v[off..off + len]);
                    }
                }
                c
            };
            ExampleOutputs {
                len,
                logits: logits[r].clone(),
                hidden: hidden.iter().map(|h| crop_h(&h[r])).collect(),
                attentions: attentions.iter().map(|a| crop_a(&a[r])).collect(),
                scores: scores.iter().map(|a| crop_a(&a[r])).collect(),
            }
        })
        .collect()
}

fn put_f32s(w: &mut impl Write, v: &[f32]) -> std::io::Result<()> {
    w.write_all(&(v.len() as u64).to_le_bytes())?;
    for x in v {
        w.write_all(&x.to_le_bytes())?;
    }
    Ok(())
}

fn get_u64(r: &mut impl Read) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

/// A length-prefixed array of f32, refused when it claims more than the `limit` bytes the
/// file holds (a damaged length must not ask for an absurd allocation).
fn get_f32s(r: &mut impl Read, limit: u64) -> std::io::Result<Vec<f32>> {
    let n = get_u64(r)?;
    if n.saturating_mul(4) > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "an array longer than the file",
        ));
    }
    let mut bytes = vec![0u8; n as usize * 4];
    r.read_exact(&mut bytes)?;
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// A writer or reader that hashes what passes through it (the cache's sha256 trailer).
struct Hashing<T> {
    inner: T,
    sha: Sha256,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.sha.update(&buf[..n]);
        Ok(n)
    }
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.sha.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

impl TeacherCache {
    /// Write the cache atomically (temporary file, then rename), with a sha256 trailer over
    /// everything before it.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        // A per-process temporary name: concurrent runs never write the same file.
        let tmp = path.with_extension(format!("{}.part", std::process::id()));
        {
            let mut w = Hashing {
                inner: BufWriter::new(std::fs::File::create(&tmp)?),
                sha: Sha256::new(),
            };
            w.write_all(MAGIC)?;
            let header = serde_json::json!({
                "num_labels": self.num_labels,
                "hidden_size": self.hidden_size,
                "heads": self.heads.iter().map(|(k, v)| (k.to_string(), v)).collect::<BTreeMap<_, _>>(),
                "examples": self.examples.len(),
                "counts": [self.needs.hidden.len(), self.needs.attentions.len(), self.needs.scores.len()],
            });
            let hb = serde_json::to_vec(&header).expect("json");
            w.write_all(&(hb.len() as u64).to_le_bytes())?;
            w.write_all(&hb)?;
            for e in self.examples.iter() {
                w.write_all(&(e.len as u64).to_le_bytes())?;
                put_f32s(&mut w, &e.logits)?;
                for v in e.hidden.iter().chain(&e.attentions).chain(&e.scores) {
                    put_f32s(&mut w, v)?;
                }
            }
            let sum = w.sha.finalize();
            w.inner.write_all(&sum)?;
            w.inner.flush()?;
        }
        std::fs::rename(&tmp, path)
    }

    /// Read a cache written by [`save`](Self::save) for the same `needs`; its bytes must be
    /// the ones written (the sha256 trailer), so a truncated or altered file is an error.
    pub fn load(path: &Path, needs: &TeacherNeeds) -> std::io::Result<Self> {
        let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
        // One streaming pass: parse while hashing, then compare with the trailer.
        let len = std::fs::metadata(path)?.len();
        let data_len = len.checked_sub(32).ok_or_else(|| bad("truncated"))?;
        let file = BufReader::new(std::fs::File::open(path)?);
        let mut r = Hashing {
            inner: file.take(data_len),
            sha: Sha256::new(),
        };
        let mut magic = [0u8; 8];
        r.read_exact(&mut magic)?;
        if &magic != MAGIC {
            return Err(bad("not a mopt teacher cache of this version"));
        }
        let hl = get_u64(&mut r)?;
        if hl > data_len {
            return Err(bad("a header longer than the file"));
        }
        let mut hb = vec![0u8; hl as usize];
        r.read_exact(&mut hb)?;
        let header: serde_json::Value =
            serde_json::from_slice(&hb).map_err(|e| bad(&e.to_string()))?;
        let n = header["examples"].as_u64().ok_or_else(|| bad("header"))? as usize;
        let heads: BTreeMap<usize, usize> = header["heads"]
            .as_object()
            .ok_or_else(|| bad("header"))?
            .iter()
            .map(|(k, v)| (k.parse().unwrap_or(0), v.as_u64().unwrap_or(0) as usize))
            .collect();
        let (nh, na, ns) = (
            needs.hidden.len(),
            needs.attentions.len(),
            needs.scores.len(),
        );
        let mut examples = Vec::with_capacity(n);
        for _ in 0..n {
            let len = get_u64(&mut r)? as usize;
            let logits = get_f32s(&mut r, data_len)?;
            let mut read = |k: usize| {
                (0..k)
                    .map(|_| get_f32s(&mut r, data_len))
                    .collect::<std::io::Result<Vec<_>>>()
            };
            let hidden = read(nh)?;
            let attentions = read(na)?;
            let scores = read(ns)?;
            examples.push(ExampleOutputs {
                len,
                logits,
                hidden,
                attentions,
                scores,
            });
        }
        // Everything up to the trailer must have been read and hash to it.
        if std::io::copy(&mut r, &mut std::io::sink())? != 0 {
            return Err(bad("bytes past the last example"));
        }
        let mut sum = [0u8; 32];
        r.inner.into_inner().read_exact(&mut sum)?;
        if r.sha.finalize().as_slice() != sum {
            return Err(bad(
                "its sha256 differs from the one written with it: truncated or altered",
            ));
        }
        Ok(Self {
            needs: needs.clone(),
            num_labels: header["num_labels"].as_u64().unwrap_or(0) as usize,
            hidden_size: header["hidden_size"].as_u64().unwrap_or(0) as usize,
            heads,
            examples: Arc::new(examples),
            hit: true,
            build_s: 0.0,
            teacher_forwards: 0,
            file: Some(path.to_path_buf()),
        })
    }

    /// Number of examples.
    pub fn len(&self) -> usize {
        self.examples.len()
    }

    /// Whether it holds no examples.
    pub fn is_empty(&self) -> bool {
        self.examples.is_empty()
    }

    /// Teacher features of the examples at `indices`, zero-padded to `seq` tokens, on `device`.
    pub fn batch(&self, indices: &[usize], seq: usize, device: &Device) -> TeacherBatch {
        self.batch_with(indices, seq, device, true)
    }

    /// Like [`TeacherCache::batch`]; with `features = false` only the logits (no match is active).
    pub fn batch_with(
        &self,
        indices: &[usize],
        seq: usize,
        device: &Device,
        features: bool,
    ) -> TeacherBatch {
        let empty = TeacherNeeds::default();
        let needs = if features { &self.needs } else { &empty };
        let b = indices.len();
        let c = self.num_labels;
        let mut logits = Vec::with_capacity(b * c);
        for &i in indices {
            logits.extend_from_slice(&self.examples[i].logits);
        }
        let h = self.hidden_size;
        let hidden = needs
            .hidden
            .iter()
            .enumerate()
            .map(|(k, &idx)| {
                let mut v = vec![0f32; b * seq * h];
                for (r, &i) in indices.iter().enumerate() {
                    let src = &self.examples[i].hidden[k];
                    v[r * seq * h..r * seq * h + src.len()].copy_from_slice(src);
                }
                (
                    idx,
                    Tensor::<3>::from_data(TensorData::new(v, [b, seq, h]), device),
                )
            })
            .collect();
        let attn = |set: &std::collections::BTreeSet<usize>,
                    pick: fn(&ExampleOutputs) -> &Vec<Vec<f32>>|
         -> BTreeMap<usize, Tensor<4>> {
            set.iter()
                .enumerate()
                .map(|(k, &layer)| {
                    let heads = self.heads[&layer];
                    let mut v = vec![0f32; b * heads * seq * seq];
                    for (r, &i) in indices.iter().enumerate() {
                        let e = &self.examples[i];
                        let src = &pick(e)[k];
                        for hd in 0..heads {
                            for q in 0..e.len {
                                let dst = ((r * heads + hd) * seq + q) * seq;
                                let s = (hd * e.len + q) * e.len;
                                v[dst..dst + e.len].copy_from_slice(&src[s..s + e.len]);
                            }
                        }
                    }
                    (
                        layer,
                        Tensor::<4>::from_data(TensorData::new(v, [b, heads, seq, seq]), device),
                    )
                })
                .collect()
        };
        TeacherBatch {
            logits: Tensor::from_data(TensorData::new(logits, [b, c]), device),
            hidden,
            attentions: attn(&needs.attentions, |e| &e.attentions),
            scores: attn(&needs.scores, |e| &e.scores),
            word_rows: None,
        }
    }
}

/// Teacher features of a batch straight from the teacher (no cache).
pub fn live_batch<M: Tapped<Batch = TextBatch>>(
    teacher: &M,
    items: &[&Encoded],
    needs: &TeacherNeeds,
    batcher: &Batcher,
    device: &Device,
) -> TeacherBatch {
    let b = batcher.batch(items, device);
    let o = teacher.forward_taps(&b, needs.request());
    TeacherBatch {
        logits: o.logits,
        hidden: needs
            .hidden
            .iter()
            .map(|&k| (k, o.hidden_states[k].clone()))
            .collect(),
        attentions: needs
            .attentions
            .iter()
            .map(|&l| (l, o.attentions[l - 1].clone()))
            .collect(),
        scores: needs
            .scores
            .iter()
            .map(|&l| (l, o.attention_scores[l - 1].clone()))
            .collect(),
        word_rows: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache round-trips exactly; a truncated or altered file (one bit of one hidden state)
    /// is refused with the reason, never read as features.
    #[test]
    fn teacher_cache_round_trips_and_corruption_is_caught() {
        let needs = TeacherNeeds {
            hidden: [1].into_iter().collect(),
            ..Default::default()
        };
        let cache = TeacherCache {
            needs: needs.clone(),
            num_labels: 2,
            hidden_size: 3,
            heads: BTreeMap::new(),
            examples: Arc::new(vec![ExampleOutputs {
                len: 2,
                logits: vec![0.5, -1.0],
                hidden: vec![vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]],
                attentions: Vec::new(),
                scores: Vec::new(),
            }]),
            hit: false,
            build_s: 0.0,
            teacher_forwards: 1,
            file: None,
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("teacher-x.bin");
        cache.save(&path).unwrap();
        let back = TeacherCache::load(&path, &needs).unwrap();
        assert_eq!(back.examples, cache.examples);
        let bytes = std::fs::read(&path).unwrap();
        let mut altered = bytes.clone();
        let at = bytes.len() - 32 - 4;
        altered[at] ^= 0x01;
        std::fs::write(&path, &altered).unwrap();
        let err = TeacherCache::load(&path, &needs).err().unwrap().to_string();
        assert!(err.contains("altered"), "{err}");
        std::fs::write(&path, &bytes[..bytes.len() - 10]).unwrap();
        assert!(TeacherCache::load(&path, &needs).is_err(), "truncated");
    }
}
