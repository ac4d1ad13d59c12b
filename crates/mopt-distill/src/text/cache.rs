//! Teacher-output cache: the teacher's logits (and the hidden states / attention the matches
//! read) for every training example, computed once and stored on disk, keyed by the teacher
//! checkpoint, the token ids and the features. Any change to them gives a new key.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use burn::prelude::*;
use mopt_core::{Tapped, Taps};
use mopt_data::{Batcher, Encoded, TextBatch};
use sha2::{Digest, Sha256};

use crate::cache_file::{self, CacheFile, Header};
use crate::matching::{TeacherBatch, TeacherNeeds};

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
    store: Store,
    /// Loaded from disk rather than computed.
    pub hit: bool,
    /// Seconds spent in teacher forward passes (0 on a hit).
    pub build_s: f64,
    /// Number of examples the teacher ran on in this process.
    pub teacher_forwards: usize,
    /// The cache file read or written, if any.
    pub file: Option<PathBuf>,
}

/// Where the outputs are: just computed, in memory; or in the cache file, read per batch.
#[derive(Clone)]
enum Store {
    Memory(Arc<Vec<ExampleOutputs>>),
    File(Arc<CacheFile>),
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

/// One batch through the teacher (inference device, no gradients): its taps and its padded
/// length.
fn teacher_forward<'a, M: Tapped<Batch = TextBatch>>(
    teacher: &'a M,
    needs: &'a TeacherNeeds,
    batcher: &'a Batcher,
    device: &'a Device,
) -> impl FnMut(&[&Encoded]) -> (Taps, usize) + 'a {
    move |items| {
        let b = batcher.batch(items, device);
        let seq = b.input_ids.dims()[1];
        (teacher.forward_taps(&b, needs.request()), seq)
    }
}

/// A batch's taps and its padded length, from whatever computes them.
pub type Forward<'a> = dyn FnMut(&[&Encoded]) -> (Taps, usize) + 'a;

/// Where each example's outputs go as its batch finishes: its index and outputs, with the
/// shapes met so far.
type Sink<'a> = dyn FnMut(&Shapes, usize, ExampleOutputs) -> std::io::Result<()> + 'a;

/// The teacher pass: `forward` over `examples` in length-sorted batches of `batch_size`, each
/// example's outputs (cropped to its length) handed to `sink` as its batch finishes.
fn teacher_pass(
    examples: &[Encoded],
    needs: &TeacherNeeds,
    batch_size: usize,
    forward: &mut Forward,
    sink: &mut Sink,
) -> std::io::Result<Shapes> {
    let mut order: Vec<usize> = (0..examples.len()).collect();
    order.sort_by_key(|&i| examples[i].ids.len());
    let mut shapes = Shapes::default();
    let batch_size = batch_size.max(1);
    let n_batches = examples.len().div_ceil(batch_size);
    let mut progress = mopt_train::logging::Progress::new("teacher pass", n_batches);
    let mut done = 0;
    for (bi, chunk) in order.chunks(batch_size).enumerate() {
        done += chunk.len();
        progress.update(bi + 1, &format!("{done} examples"));
        let items: Vec<&Encoded> = chunk.iter().map(|&i| &examples[i]).collect();
        let (o, seq) = forward(&items);
        let lens: Vec<usize> = items.iter().map(|e| e.ids.len()).collect();
        for (r, e) in split_batch(o, needs, &lens, seq, &mut shapes)
            .into_iter()
            .enumerate()
        {
            sink(&shapes, chunk[r], e)?;
        }
    }
    progress.finish("teacher outputs computed");
    Ok(shapes)
}

/// Run the teacher over `examples` in length-sorted batches, the outputs kept in memory (see
/// [`compute_to_file`] for a cache whose build holds one batch).
pub fn compute<M: Tapped<Batch = TextBatch>>(
    teacher: &M,
    examples: &[Encoded],
    needs: &TeacherNeeds,
    batcher: &Batcher,
    batch_size: usize,
    device: &Device,
) -> TeacherCache {
    let mut forward = teacher_forward(teacher, needs, batcher, device);
    compute_with(examples, needs, batch_size, &mut forward)
}

/// [`compute`] over any `forward` (a batch's taps and padded length).
pub fn compute_with(
    examples: &[Encoded],
    needs: &TeacherNeeds,
    batch_size: usize,
    forward: &mut Forward,
) -> TeacherCache {
    let start = Instant::now();
    let mut out: Vec<Option<ExampleOutputs>> = vec![None; examples.len()];
    let mut keep = |_: &Shapes, i: usize, e: ExampleOutputs| {
        out[i] = Some(e);
        Ok(())
    };
    let shapes = teacher_pass(examples, needs, batch_size, forward, &mut keep)
        .expect("a memory sink does not fail");
    TeacherCache {
        needs: needs.clone(),
        num_labels: shapes.num_labels,
        hidden_size: shapes.hidden_size,
        heads: shapes.heads,
        store: Store::Memory(Arc::new(
            out.into_iter()
                .map(|e| e.expect("every example computed"))
                .collect(),
        )),
        hit: false,
        build_s: start.elapsed().as_secs_f64(),
        teacher_forwards: examples.len(),
        file: None,
    }
}

/// Run the teacher over `examples` into the cache file `path`, written as the pass goes, and
/// open it (verified): the build holds one batch of outputs and the logits, whatever the data
/// set's size, and training reads the file batch by batch. The file is the one
/// [`TeacherCache::save`] writes for the same outputs, byte for byte.
pub fn compute_to_file<M: Tapped<Batch = TextBatch>>(
    teacher: &M,
    examples: &[Encoded],
    needs: &TeacherNeeds,
    (batcher, batch_size): (&Batcher, usize),
    device: &Device,
    path: &Path,
) -> std::io::Result<TeacherCache> {
    let mut forward = teacher_forward(teacher, needs, batcher, device);
    build_file(examples, needs, batch_size, path, &mut forward)
}

/// [`compute_to_file`] over any `forward` (a batch's taps and padded length): the teacher pass
/// streamed into the cache at `path`. A pass that fails or is killed leaves no file at `path`
/// (only a temporary file that never verifies, removed by the next build).
pub fn build_file(
    examples: &[Encoded],
    needs: &TeacherNeeds,
    batch_size: usize,
    path: &Path,
    forward: &mut Forward,
) -> std::io::Result<TeacherCache> {
    let start = Instant::now();
    let lengths: Vec<usize> = examples.iter().map(|e| e.ids.len()).collect();
    let mut writer: Option<cache_file::Writer> = None;
    let mut put = |shapes: &Shapes, i: usize, e: ExampleOutputs| {
        if writer.is_none() {
            let sizes: Vec<u64> = lengths
                .iter()
                .map(|&l| shapes.record_len(needs, l))
                .collect();
            let header = shapes.header(needs);
            let w = cache_file::Writer::create(
                path,
                &header,
                shapes.num_labels,
                lengths.clone(),
                &sizes,
            )?;
            writer = Some(w);
        }
        writer
            .as_mut()
            .expect("created")
            .put(i, &e.logits, &e.record())
    };
    let written =
        teacher_pass(examples, needs, batch_size, forward, &mut put).and_then(
            |shapes| match writer {
                Some(w) => w.finish(),
                None => cache_file::write(path, &shapes.header(needs), &[], &[], &|_| Vec::new()),
            },
        );
    if let Err(e) = written {
        // A failed write (a full disk) leaves no temporary file the size of the cache behind.
        let _ = std::fs::remove_file(cache_file::part_path(path));
        return Err(e);
    }
    Ok(TeacherCache {
        build_s: start.elapsed().as_secs_f64(),
        teacher_forwards: examples.len(),
        hit: false,
        ..TeacherCache::load(path, needs)?
    })
}

/// Shapes met while computing: classes, hidden width, heads per (1-based) layer.
#[derive(Default)]
struct Shapes {
    num_labels: usize,
    hidden_size: usize,
    heads: BTreeMap<usize, usize>,
}

impl Shapes {
    /// Floats in the feature record of an example of `len` tokens.
    fn record_len(&self, needs: &TeacherNeeds, len: usize) -> u64 {
        let hidden = needs.hidden.len() * len * self.hidden_size;
        let maps = needs.attentions.iter().chain(&needs.scores);
        let attention: usize = maps.map(|l| self.heads[l] * len * len).sum();
        (hidden + attention) as u64
    }

    /// The cache file's header.
    fn header(&self, needs: &TeacherNeeds) -> Header {
        Header {
            num_labels: self.num_labels,
            hidden_size: self.hidden_size,
            heads: self.heads.clone(),
            counts: counts(needs),
        }
    }
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

impl ExampleOutputs {
    /// The features as the cache file stores them: hidden states, attentions, scores.
    fn record(&self) -> Vec<f32> {
        let parts = self
            .hidden
            .iter()
            .chain(&self.attentions)
            .chain(&self.scores);
        parts.flatten().copied().collect()
    }
}

impl TeacherCache {
    /// Write the cache as safetensors, atomically: `logits` `[n, classes]`, `lengths` `[n]`,
    /// `offsets` `[n + 1]` and `features` (each example's matched features, cropped to its
    /// length, at `features[offsets[i]..offsets[i + 1]]`), the data's sha256 in the header.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let n = self.len();
        let lengths: Vec<usize> = (0..n).map(|i| self.example(i).len).collect();
        let logits: Vec<f32> = (0..n)
            .flat_map(|i| self.example(i).logits.clone())
            .collect();
        let header = Header {
            num_labels: self.num_labels,
            hidden_size: self.hidden_size,
            heads: self.heads.clone(),
            counts: counts(&self.needs),
        };
        cache_file::write(path, &header, &logits, &lengths, &|i| {
            self.example(i).record()
        })
    }

    /// Open a cache written by [`save`](Self::save) for the same `needs`: its bytes must be the
    /// ones written (a sha256 in its header), so a truncated or altered file is an error. The
    /// features stay in the file and each batch reads its own.
    pub fn load(path: &Path, needs: &TeacherNeeds) -> std::io::Result<Self> {
        let f = CacheFile::open(path)?;
        if f.header.counts != counts(needs) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "it holds other features than the matches read",
            ));
        }
        Ok(Self {
            needs: needs.clone(),
            num_labels: f.header.num_labels,
            hidden_size: f.header.hidden_size,
            heads: f.header.heads.clone(),
            store: Store::File(Arc::new(f)),
            hit: true,
            build_s: 0.0,
            teacher_forwards: 0,
            file: Some(path.to_path_buf()),
        })
    }

    /// Example `i`'s outputs (read from the file when it is file-backed).
    fn example(&self, i: usize) -> Cow<'_, ExampleOutputs> {
        match &self.store {
            Store::Memory(m) => Cow::Borrowed(&m[i]),
            Store::File(f) => {
                let record = f.features(i).unwrap_or_else(|e| {
                    panic!("teacher cache {} could not be read: {e}", f.path.display())
                });
                Cow::Owned(self.split(i, f, record))
            }
        }
    }

    /// Example `i`'s record cut back into its features.
    fn split(&self, i: usize, f: &CacheFile, record: Vec<f32>) -> ExampleOutputs {
        let len = f.lengths[i];
        let c = self.num_labels;
        let mut at = 0;
        let mut take = |n: usize| {
            let v = record[at..at + n].to_vec();
            at += n;
            v
        };
        let hidden = (0..self.needs.hidden.len())
            .map(|_| take(len * self.hidden_size))
            .collect();
        let mut attn = |set: &std::collections::BTreeSet<usize>| {
            set.iter()
                .map(|l| take(self.heads[l] * len * len))
                .collect::<Vec<_>>()
        };
        let attentions = attn(&self.needs.attentions);
        let scores = attn(&self.needs.scores);
        ExampleOutputs {
            len,
            logits: f.logits[i * c..(i + 1) * c].to_vec(),
            hidden,
            attentions,
            scores,
        }
    }

    /// The teacher's logits of example `i`.
    pub fn logits(&self, i: usize) -> Vec<f32> {
        let c = self.num_labels;
        match &self.store {
            Store::Memory(m) => m[i].logits.clone(),
            Store::File(f) => f.logits[i * c..(i + 1) * c].to_vec(),
        }
    }

    /// Number of examples.
    pub fn len(&self) -> usize {
        match &self.store {
            Store::Memory(m) => m.len(),
            Store::File(f) => f.lengths.len(),
        }
    }

    /// Whether it holds no examples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
            match &self.store {
                Store::Memory(m) => logits.extend_from_slice(&m[i].logits),
                Store::File(f) => logits.extend_from_slice(&f.logits[i * c..(i + 1) * c]),
            }
        }
        // Each example read once (from the file, when file-backed) for all its features.
        let wanted =
            !needs.hidden.is_empty() || !needs.attentions.is_empty() || !needs.scores.is_empty();
        let examples: Vec<Cow<ExampleOutputs>> = if wanted {
            indices.iter().map(|&i| self.example(i)).collect()
        } else {
            Vec::new()
        };
        let h = self.hidden_size;
        let hidden = needs
            .hidden
            .iter()
            .enumerate()
            .map(|(k, &idx)| {
                let mut v = vec![0f32; b * seq * h];
                for (r, e) in examples.iter().enumerate() {
                    let src = &e.hidden[k];
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
                    for (r, e) in examples.iter().enumerate() {
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

/// Matched hidden states, attention layers and score layers (a cache holds exactly these).
fn counts(needs: &TeacherNeeds) -> [usize; 3] {
    [
        needs.hidden.len(),
        needs.attentions.len(),
        needs.scores.len(),
    ]
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

    fn example_cache() -> (TeacherCache, TeacherNeeds) {
        let needs = TeacherNeeds {
            hidden: [1].into_iter().collect(),
            attentions: [2].into_iter().collect(),
            ..Default::default()
        };
        let ex = |len: usize, base: f32| ExampleOutputs {
            len,
            logits: vec![base, -base],
            hidden: vec![(0..len * 3).map(|k| base + k as f32).collect()],
            attentions: vec![(0..2 * len * len).map(|k| base * 0.5 + k as f32).collect()],
            scores: Vec::new(),
        };
        let cache = TeacherCache {
            needs: needs.clone(),
            num_labels: 2,
            hidden_size: 3,
            heads: [(2, 2)].into_iter().collect(),
            store: Store::Memory(Arc::new(vec![ex(2, 0.5), ex(3, -1.25), ex(1, 7.0)])),
            hit: false,
            build_s: 0.0,
            teacher_forwards: 3,
            file: None,
        };
        (cache, needs)
    }

    /// A cache round-trips exactly through its file, which any safetensors reader opens; a
    /// truncated or altered file (one bit of one feature) is refused with the reason, never
    /// read as features.
    #[test]
    fn teacher_cache_round_trips_and_corruption_is_caught() {
        let (cache, needs) = example_cache();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("teacher-x.safetensors");
        cache.save(&path).unwrap();
        let back = TeacherCache::load(&path, &needs).unwrap();
        assert!(matches!(back.store, Store::File(_)), "read from the file");
        assert_eq!(back.len(), 3);
        for i in 0..3 {
            assert_eq!(*back.example(i), *cache.example(i), "example {i}");
        }
        // Batches from memory and from the file are the same tensors.
        let device = Default::default();
        let (a, b) = (
            cache.batch(&[2, 0], 4, &device),
            back.batch(&[2, 0], 4, &device),
        );
        assert_eq!(a.logits.into_data(), b.logits.into_data());
        assert_eq!(
            a.hidden[&1].clone().into_data(),
            b.hidden[&1].clone().into_data()
        );
        assert_eq!(
            a.attentions[&2].clone().into_data(),
            b.attentions[&2].clone().into_data()
        );
        // A standard safetensors file.
        let bytes = std::fs::read(&path).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(st.tensor("logits").unwrap().shape(), [3, 2]);
        let lens = st.tensor("lengths").unwrap();
        assert_eq!(
            lens.data(),
            [2i64, 3, 1]
                .iter()
                .flat_map(|l| l.to_le_bytes())
                .collect::<Vec<u8>>()
        );
        // Features: 2·3 + 2·2·2, 3·3 + 2·3·3, 1·3 + 2·1·1 floats.
        assert_eq!(st.tensor("features").unwrap().shape(), [14 + 27 + 5]);
        let mut altered = bytes.clone();
        let at = bytes.len() - 4;
        altered[at] ^= 0x01;
        std::fs::write(&path, &altered).unwrap();
        let err = TeacherCache::load(&path, &needs).err().unwrap().to_string();
        assert!(err.contains("altered"), "{err}");
        std::fs::write(&path, &bytes[..bytes.len() - 10]).unwrap();
        let err = TeacherCache::load(&path, &needs).err().unwrap().to_string();
        assert!(err.contains("truncated"), "{err}");
        let other = TeacherNeeds::default();
        std::fs::write(&path, &bytes).unwrap();
        assert!(TeacherCache::load(&path, &other).is_err(), "other features");
    }
}
