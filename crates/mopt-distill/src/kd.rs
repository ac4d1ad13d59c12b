//! Distillation on logits for any classifier ([`mopt_core::Classifier`]): the teacher's logits
//! for every training example, computed once in eval mode and kept on disk for the next stage
//! or run with the same teacher and examples ([`LogitCache`]), and the objective
//! `L = α·CE(student, labels) + (1−α)·soft(student, teacher; T)` ([`KdTask`]) for mopt's
//! trainer. Intermediate matches need the model's taps ([`crate::text::task`]).

use std::io::{Read, Write};
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn::nn::loss::{CrossEntropyLoss, CrossEntropyLossConfig};
use burn::prelude::*;
use mopt_core::{Checkpoint, Classifier, Examples, Labeled};
use mopt_train::trainer::{Parts, Replica, Task};

use sha2::{Digest, Sha256};

use crate::loss::soft_loss;
use crate::spec::{Schedule, SoftLoss};
use crate::topk::{top_k_soft_loss, TeacherRows, TopKRows};

/// A teacher's logits for every example of a split, in example order: every logit of each
/// row, or (for vocabulary-wide rows) the top-k of each row and its remaining mass
/// ([`crate::topk`]). An example gives one row (a classifier) or several (a language model's
/// window, a row per token); every example of a split gives as many. Clones share the rows.
#[derive(Debug, Clone)]
pub struct LogitCache {
    /// The row width (classes or vocabulary).
    width: usize,
    /// Rows of one example.
    per_example: usize,
    rows: Stored,
}

#[derive(Debug, Clone, PartialEq)]
enum Stored {
    /// `[rows, width]`, row-major.
    Full(Arc<Vec<f32>>),
    /// `[rows, k]` ids and logits, `[rows]` remaining mass.
    TopK {
        k: usize,
        ids: Arc<Vec<u32>>,
        logits: Arc<Vec<f32>>,
        rest: Arc<Vec<f32>>,
    },
}

/// The rows of one batch being written into a cache, in example order.
enum Building {
    Full(Vec<f32>),
    TopK(usize, Vec<u32>, Vec<f32>, Vec<f32>),
}

impl Building {
    fn put(&mut self, row: &[f32], at: usize, width: usize) {
        match self {
            Building::Full(v) => {
                v.resize(v.len().max((at + 1) * width), 0.0);
                v[at * width..(at + 1) * width].copy_from_slice(row);
            }
            Building::TopK(k, ids, logits, rest) => {
                let (i, l, r) = crate::topk::top_k(row, *k);
                ids.resize(ids.len().max((at + 1) * *k), 0);
                logits.resize(logits.len().max((at + 1) * *k), 0.0);
                rest.resize(rest.len().max(at + 1), 0.0);
                ids[at * *k..(at + 1) * *k].copy_from_slice(&i);
                logits[at * *k..(at + 1) * *k].copy_from_slice(&l);
                rest[at] = r;
            }
        }
    }

    fn finish(self) -> Stored {
        match self {
            Building::Full(v) => Stored::Full(Arc::new(v)),
            Building::TopK(k, ids, logits, rest) => Stored::TopK {
                k,
                ids: Arc::new(ids),
                logits: Arc::new(logits),
                rest: Arc::new(rest),
            },
        }
    }
}

impl LogitCache {
    /// Run `teacher` (an inference-device model) over `examples` in batches of `batch_size`,
    /// the examples sorted by [`Examples::size`] (less padding; a stable sort, as evaluation
    /// batches them), the rows kept in example order: every logit, or with `top_k = Some(k)`
    /// the `k` largest of each row and its remaining mass (k at least the width keeps every
    /// logit).
    ///
    /// # Panics
    /// When the teacher's batches do not give the same number of rows for every example (a
    /// [`Classifier`] gives one a row, or a fixed number of rows, an example).
    pub fn compute<C, E>(
        teacher: &C,
        examples: &E,
        (batch_size, top_k): (usize, Option<usize>),
        device: &Device,
    ) -> Self
    where
        C: Classifier,
        E: Examples<Batch = C::Batch>,
    {
        let n = examples.len();
        let teacher = teacher.valid();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| examples.size(i));
        // Written in place, in example order: one copy of the rows, however many examples.
        let (mut width, mut per_example) = (0, 0);
        let mut building: Option<Building> = None;
        for chunk in order.chunks(batch_size.max(1)) {
            let out = teacher.logits(&examples.batch(chunk, device));
            let [rows, w] = out.dims();
            assert!(
                rows % chunk.len() == 0 && (per_example == 0 || rows / chunk.len() == per_example),
                "the teacher gave {rows} rows for {} examples (rows per example must be fixed)",
                chunk.len()
            );
            (width, per_example) = (w, rows / chunk.len());
            let b = building.get_or_insert_with(|| match top_k.filter(|&k| k < w) {
                Some(k) => Building::TopK(k, Vec::new(), Vec::new(), Vec::new()),
                None => Building::Full(Vec::new()),
            });
            let flat: Vec<f32> = out.into_data().convert::<f32>().try_to_vec().expect("f32");
            for (r, row) in flat.chunks(w).enumerate() {
                let (e, within) = (chunk[r / per_example], r % per_example);
                b.put(row, e * per_example + within, w);
            }
        }
        Self {
            width,
            per_example,
            rows: building.unwrap_or(Building::Full(Vec::new())).finish(),
        }
    }

    /// The logits of the teacher checkpoint at `teacher_dir` (loaded as `teacher`) on
    /// `examples`: read from `dir` when an earlier stage or run computed them for the same
    /// teacher bytes, the same examples and the same `top_k`, otherwise
    /// [computed](LogitCache::compute) and saved there (`logits-<sha256>.bin`, written
    /// atomically). `dir = None` keeps them in memory only. Returns the cache and where it was
    /// read from (`None`: computed now).
    pub fn load_or_compute<C, E>(
        teacher: (&Path, &C),
        examples: &E,
        (batch_size, top_k): (usize, Option<usize>),
        device: &Device,
        dir: Option<&Path>,
    ) -> (Self, Option<PathBuf>)
    where
        C: Classifier,
        E: Examples<Batch = C::Batch>,
    {
        let (teacher_dir, teacher) = teacher;
        let file = dir.and_then(|d| {
            let key = logit_cache_key(teacher_dir, examples, top_k).ok()?;
            Some(d.join(format!("logits-{key}.bin")))
        });
        if let Some(f) = file.as_ref().filter(|f| f.exists()) {
            match Self::read(f, examples.len()) {
                Ok(c) => return (c, file),
                Err(why) => eprintln!(
                    "teacher logits cache {} is unusable ({why}): computing the logits again",
                    f.display()
                ),
            }
        }
        let c = Self::compute(teacher, examples, (batch_size, top_k), device);
        if let Some(f) = &file {
            if let Err(e) = c.write(f) {
                eprintln!("warning: teacher logits not cached ({}): {e}", f.display());
            }
        }
        (c, None)
    }

    /// The cache file at `path` if it holds `n` examples' rows and its bytes are the ones
    /// written (a sha256 trailer); otherwise why not. Read in one streamed pass.
    fn read(path: &Path, n: usize) -> Result<Self, String> {
        let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
        let size = file.metadata().map_err(|e| e.to_string())?.len();
        let head_len = LOGIT_MAGIC.len() + 32;
        if size < (head_len + 32) as u64 {
            return Err("truncated".into());
        }
        let mut r = Hashed {
            r: std::io::BufReader::new(file),
            sha: Sha256::new(),
        };
        let head = r.take(head_len)?;
        if &head[..8] != LOGIT_MAGIC {
            return Err("not a mopt logit cache of this version".into());
        }
        let word = |i: usize| u64::from_le_bytes(head[8 + 8 * i..16 + 8 * i].try_into().unwrap());
        let [examples, per_example, width, k] = [0, 1, 2, 3].map(|i| word(i) as usize);
        let rows = examples.saturating_mul(per_example);
        let row_bytes = if k == 0 { 4 * width } else { 8 * k + 4 };
        let body = size - (head_len + 32) as u64;
        if examples != n || (rows as u64).checked_mul(row_bytes as u64) != Some(body) {
            return Err(format!(
                "it holds {examples} examples, {n} expected (or is truncated)"
            ));
        }
        let rows = match k {
            0 => Stored::Full(Arc::new(r.f32s(rows * width)?)),
            k => {
                let (mut ids, mut logits, mut rest) = (Vec::new(), Vec::new(), Vec::new());
                for _ in 0..rows {
                    ids.extend(r.f32s(k)?.into_iter().map(f32::to_bits));
                    logits.extend(r.f32s(k)?);
                    rest.extend(r.f32s(1)?);
                }
                let (ids, logits, rest) = (Arc::new(ids), Arc::new(logits), Arc::new(rest));
                Stored::TopK {
                    k,
                    ids,
                    logits,
                    rest,
                }
            }
        };
        let sum = r.sha.clone().finalize();
        let mut written = [0u8; 32];
        r.r.read_exact(&mut written).map_err(|e| e.to_string())?;
        if sum.as_slice() != written {
            return Err(
                "its sha256 differs from the one written with it: truncated or altered".into(),
            );
        }
        Ok(Self {
            width,
            per_example,
            rows,
        })
    }

    /// Write to `path` through a per-process temporary file and a rename (never half-written),
    /// streamed, with a sha256 trailer over everything before it.
    fn write(&self, path: &Path) -> std::io::Result<()> {
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d)?;
        }
        let tmp = path.with_extension(format!("bin.{}.tmp", std::process::id()));
        let mut w = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        let mut sha = Sha256::new();
        let mut put = |w: &mut std::io::BufWriter<std::fs::File>, b: &[u8]| {
            sha.update(b);
            w.write_all(b)
        };
        put(&mut w, LOGIT_MAGIC)?;
        let k = self.top_k().unwrap_or(0);
        for word in [self.len(), self.per_example, self.width, k] {
            put(&mut w, &(word as u64).to_le_bytes())?;
        }
        match &self.rows {
            Stored::Full(v) => {
                for x in v.iter() {
                    put(&mut w, &x.to_le_bytes())?;
                }
            }
            Stored::TopK {
                k,
                ids,
                logits,
                rest,
            } => {
                for r in 0..rest.len() {
                    for &i in &ids[r * k..(r + 1) * k] {
                        put(&mut w, &i.to_le_bytes())?;
                    }
                    for x in &logits[r * k..(r + 1) * k] {
                        put(&mut w, &x.to_le_bytes())?;
                    }
                    put(&mut w, &rest[r].to_le_bytes())?;
                }
            }
        }
        w.write_all(&sha.finalize())?;
        w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        std::fs::rename(&tmp, path)
    }

    /// Number of examples.
    pub fn len(&self) -> usize {
        let rows = match &self.rows {
            Stored::Full(v) => v.len() / self.width.max(1),
            Stored::TopK { rest, .. } => rest.len(),
        };
        rows / self.per_example.max(1)
    }

    /// Whether it holds no examples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `Some(k)` when each row keeps its `k` largest logits, `None` when it keeps them all.
    pub fn top_k(&self) -> Option<usize> {
        match self.rows {
            Stored::Full(_) => None,
            Stored::TopK { k, .. } => Some(k),
        }
    }

    /// Bytes a row takes (a token's, for a language model): `4·width`, or `8k + 4` for top-k.
    pub fn bytes_per_row(&self) -> usize {
        match self.top_k() {
            None => 4 * self.width,
            Some(k) => 8 * k + 4,
        }
    }

    /// The rows of the examples at `indices`, each example's rows in order.
    ///
    /// # Shapes
    /// - full: `[indices.len() × rows per example, width]`; top-k: `[…, k]` ids and logits,
    ///   `[…, 1]` remaining mass
    pub fn batch(&self, indices: &[usize], device: &Device) -> TeacherRows {
        let pe = self.per_example;
        let rows = indices.len() * pe;
        let spans = || indices.iter().map(move |&i| i * pe..(i + 1) * pe);
        let gather = |v: &[f32], w: usize| -> Vec<f32> {
            spans()
                .flat_map(|s| v[s.start * w..s.end * w].iter().copied())
                .collect()
        };
        match &self.rows {
            Stored::Full(v) => TeacherRows::Full(Tensor::from_data(
                TensorData::new(gather(v, self.width), [rows, self.width]),
                device,
            )),
            Stored::TopK {
                k,
                ids,
                logits,
                rest,
            } => {
                let id: Vec<i64> = spans()
                    .flat_map(|s| ids[s.start * k..s.end * k].iter().map(|&i| i as i64))
                    .collect();
                TeacherRows::from(TopKRows {
                    ids: Tensor::from_data(TensorData::new(id, [rows, *k]), device),
                    logits: Tensor::from_data(
                        TensorData::new(gather(logits, *k), [rows, *k]),
                        device,
                    ),
                    rest: Tensor::from_data(TensorData::new(gather(rest, 1), [rows, 1]), device),
                    width: self.width,
                })
            }
        }
    }
}

/// A reader that hashes what it reads.
struct Hashed<R> {
    r: R,
    sha: Sha256,
}

impl<R: Read> Hashed<R> {
    fn take(&mut self, n: usize) -> Result<Vec<u8>, String> {
        let mut b = vec![0u8; n];
        self.r.read_exact(&mut b).map_err(|e| e.to_string())?;
        self.sha.update(&b);
        Ok(b)
    }

    /// `n` little-endian 4-byte words as f32 (ids travel as their bits).
    fn f32s(&mut self, n: usize) -> Result<Vec<f32>, String> {
        let mut out = Vec::with_capacity(n);
        let mut word4 = [0u8; 4];
        for _ in 0..n {
            self.r.read_exact(&mut word4).map_err(|e| e.to_string())?;
            self.sha.update(word4);
            out.push(f32::from_le_bytes(word4));
        }
        Ok(out)
    }
}

const LOGIT_MAGIC: &[u8; 8] = b"MOPTLC3\n";

/// sha256 over the teacher checkpoint's weights and config, every example's record and `top_k`.
fn logit_cache_key<E: Examples>(
    teacher_dir: &Path,
    examples: &E,
    top_k: Option<usize>,
) -> std::io::Result<String> {
    let mut h = Sha256::new();
    h.update(b"mopt-logit-cache-v1");
    if let Some(k) = top_k {
        h.update(format!("top-k {k}").as_bytes());
    }
    for f in ["model.bpk", "config.json"] {
        h.update(std::fs::read(teacher_dir.join(f))?);
    }
    h.update((examples.len() as u64).to_le_bytes());
    for i in 0..examples.len() {
        h.update(examples.record(i).to_string().as_bytes());
        h.update(b"\n");
    }
    Ok(format!("{:x}", h.finalize()))
}

/// A loss term added to a distillation objective (Rust API), for any family: it receives the
/// student's outputs the objective already computed (its logits rows, and for a tapped model
/// whatever the matches asked for: [`Taps::of_logits`](mopt_core::Taps::of_logits) otherwise)
/// and the batch (`batch.downcast_ref::<TextBatch>()`, `ImageBatch`, `TokenWindows`, … as the
/// family reads), and returns the term to add and named parts to log. The student's objective
/// gets it, not its hard-label twin's.
pub type ExtraTerm =
    Arc<dyn Fn(&mopt_core::Taps, &dyn std::any::Any) -> (Tensor<1>, Parts) + Send + Sync>;

/// `loss` with the caller's `extra` term (if any) on the student's `logits` and `batch` added.
pub fn with_extra_term(
    (loss, mut parts): (Tensor<1>, Parts),
    extra: Option<&ExtraTerm>,
    logits: Tensor<2>,
    batch: &dyn std::any::Any,
) -> (Tensor<1>, Parts) {
    match extra {
        None => (loss, parts),
        Some(term) => {
            let (add, more) = term(&mopt_core::Taps::of_logits(logits), batch);
            parts.extend(more);
            (loss + add, parts)
        }
    }
}

/// The KD settings on logits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KdSettings {
    /// Weight of the hard-label cross-entropy (the soft term gets `1 − alpha`).
    pub alpha: Schedule,
    /// Softmax temperature of the soft term.
    pub temperature: Schedule,
    /// The soft term's loss.
    pub soft_loss: SoftLoss,
}

impl Default for KdSettings {
    /// α = 0.5, T = 4, KL: the usual starting point (Hinton et al.).
    fn default() -> Self {
        Self {
            alpha: Schedule::Constant(0.5),
            temperature: Schedule::Constant(4.0),
            soft_loss: SoftLoss::Kl,
        }
    }
}

/// The KD objective on logits: `α·ce + (1−α)·soft(student, teacher; T)` at `progress` (0 to 1
/// over training), with its logged parts (`ce`, `soft`, `alpha`, `temperature`). `ce` is the
/// hard-label cross-entropy the caller computed on the same student logits.
///
/// # Shapes
/// - student: `[rows, classes]`, teacher: the same rows ([`TeacherRows`]); ce and the loss: `[1]`
pub fn kd_loss(
    ce: Tensor<1>,
    student: Tensor<2>,
    teacher: impl Into<TeacherRows>,
    settings: &KdSettings,
    progress: f64,
) -> (Tensor<1>, Parts) {
    let alpha = settings.alpha.at(progress);
    let temperature = settings.temperature.at(progress);
    let soft = match teacher.into() {
        TeacherRows::Full(t) => soft_loss(student, t, temperature, settings.soft_loss),
        TeacherRows::TopK(t) => top_k_soft_loss(student, t, temperature, settings.soft_loss),
    };
    let ce_v: f32 = ce.clone().into_scalar();
    let soft_v: f32 = soft.clone().into_scalar();
    let loss = ce.mul_scalar(alpha as f32) + soft.mul_scalar((1.0 - alpha) as f32);
    let parts = vec![
        ("ce", ce_v as f64),
        ("soft", soft_v as f64),
        ("alpha", alpha),
        ("temperature", temperature),
    ];
    (loss, parts)
}

/// Distillation of any classifier `C` from a teacher's cached logits on the training split, or
/// (without a teacher, [`KdTask::hard_labels`]) fine-tuning on the labels alone.
pub struct KdTask<C> {
    settings: KdSettings,
    teacher: Option<LogitCache>,
    ce: CrossEntropyLoss,
    extra: Option<ExtraTerm>,
    model: PhantomData<fn() -> C>,
}

impl<C> KdTask<C> {
    /// `teacher`: the teacher's logits on the training split (indices as the trainer draws
    /// them).
    pub fn new(settings: KdSettings, teacher: LogitCache, device: &Device) -> Self {
        Self {
            settings,
            teacher: Some(teacher),
            ce: CrossEntropyLossConfig::new().init(device),
            extra: None,
            model: PhantomData,
        }
    }

    /// Add a loss term of the caller's ([`ExtraTerm`]).
    pub fn with_extra(mut self, term: Option<ExtraTerm>) -> Self {
        self.extra = term;
        self
    }
}

impl<C> KdTask<C> {
    /// Cross-entropy on the labels only (logged as `ce`): the same model and trainer wiring
    /// as with a teacher, for stages whose KD is switched off.
    pub fn hard_labels(device: &Device) -> Self {
        Self {
            settings: KdSettings::default(),
            teacher: None,
            ce: CrossEntropyLossConfig::new().init(device),
            extra: None,
            model: PhantomData,
        }
    }
}

impl<C: Checkpoint<Batch: Labeled>> Task for KdTask<C> {
    type Model = C;
    type Classifier = C;

    fn loss(
        &mut self,
        model: &C,
        b: &C::Batch,
        indices: &[usize],
        progress: f64,
    ) -> (Tensor<1>, Parts) {
        let logits = model.logits(b);
        let ce = self.ce.forward(logits.clone(), b.labels());
        match &self.teacher {
            Some(t) => {
                let teacher = t.batch(indices, &logits.device());
                let kd = kd_loss(ce, logits.clone(), teacher, &self.settings, progress);
                with_extra_term(kd, self.extra.as_ref(), logits, b)
            }
            None => {
                let v: f32 = ce.clone().into_scalar();
                (ce, vec![("ce", v as f64)])
            }
        }
    }

    fn classifier<'a>(&self, model: &'a C) -> &'a C {
        model
    }

    fn replicate(&self, device: &Device) -> Option<Replica<C, C>> {
        Some(Box::new(KdTask::<C> {
            settings: self.settings,
            teacher: self.teacher.clone(),
            ce: CrossEntropyLossConfig::new().init(device),
            extra: self.extra.clone(),
            model: PhantomData,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(width: usize, per_example: usize, v: Vec<f32>) -> LogitCache {
        LogitCache {
            width,
            per_example,
            rows: Stored::Full(Arc::new(v)),
        }
    }

    /// The cache file round-trips exactly; a file for another example count, a truncated or a
    /// foreign file is not read.
    #[test]
    fn cached_logits_round_trip_and_bad_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/logits-x.bin");
        let c = full(3, 1, vec![0.5, -1.25, 3.0, f32::MIN_POSITIVE, 7.0, -0.0]);
        c.write(&path).unwrap();
        let back = LogitCache::read(&path, 2).expect("read");
        assert_eq!((back.width, &back.rows), (3, &c.rows));
        assert!(LogitCache::read(&path, 3)
            .unwrap_err()
            .contains("3 expected"));
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
        let err = LogitCache::read(&path, 2).unwrap_err();
        assert!(err.contains("truncated"), "{err}");
        // One flipped bit in a logit, the length unchanged: caught by the checksum.
        let mut altered = bytes.clone();
        altered[LOGIT_MAGIC.len() + 32 + 5] ^= 0x10;
        std::fs::write(&path, &altered).unwrap();
        assert!(LogitCache::read(&path, 2).unwrap_err().contains("altered"));
        std::fs::write(&path, b"MOPTTC1\n0000000000000000").unwrap();
        assert!(LogitCache::read(&path, 2).is_err(), "another format");
        let names: Vec<_> = std::fs::read_dir(dir.path().join("sub"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["logits-x.bin"], "no temporary file left");
    }

    /// Two examples of two rows each (a language model's windows of two tokens) over a width
    /// of 4: top-2 keeps each row's two largest logits and the rest's mass, round-trips through
    /// its file, and a batch gives each picked example's rows in order.
    #[test]
    fn top_k_rows_per_example_round_trip_and_batch_in_order() {
        let rows = [
            vec![0.0f32, 3.0, 1.0, -1.0],
            vec![2.0, 0.5, 0.0, 4.0],
            vec![1.0, 1.0, 1.0, 1.0],
            vec![-2.0, -1.0, 5.0, 0.0],
        ];
        let mut b = Building::TopK(2, Vec::new(), Vec::new(), Vec::new());
        for (at, r) in rows.iter().enumerate() {
            b.put(r, at, 4);
        }
        let c = LogitCache {
            width: 4,
            per_example: 2,
            rows: b.finish(),
        };
        assert_eq!((c.len(), c.top_k(), c.bytes_per_row()), (2, Some(2), 20));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("logits-k.bin");
        c.write(&path).unwrap();
        let back = LogitCache::read(&path, 2).expect("read");
        assert_eq!((back.per_example, &back.rows), (2, &c.rows));
        let TeacherRows::TopK(t) = back.batch(&[1, 0], &Device::flex()) else {
            panic!("top-k rows");
        };
        let ids: Vec<i64> = t.ids.into_data().convert::<i64>().try_to_vec().unwrap();
        assert_eq!(
            ids,
            [0, 1, 2, 3, 1, 2, 3, 0],
            "example 1's rows, then example 0's"
        );
        let rest: Vec<f32> = t.rest.into_data().try_to_vec().unwrap();
        let want = (2.0 * 1.0f64.exp()).ln() as f32; // row [1, 1, 1, 1] without ids 0 and 1
        assert!((rest[0] - want).abs() < 1e-6, "{rest:?}");
    }
}
