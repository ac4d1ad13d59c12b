//! Distillation on logits for any classifier ([`mopt_core::Classifier`]): the teacher's logits
//! for every training example, computed once in eval mode and kept on disk for the next stage
//! or run with the same teacher and examples ([`LogitCache`]), and the objective
//! `L = α·CE(student, labels) + (1−α)·soft(student, teacher; T)` ([`KdTask`]) for mopt's
//! trainer. Intermediate matches need the model's taps ([`crate::task`]).

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

/// A teacher's logits for every example of a split, in example order. Clones share them.
#[derive(Debug, Clone)]
pub struct LogitCache {
    num_labels: usize,
    /// `[examples, num_labels]`, row-major.
    logits: Arc<Vec<f32>>,
}

impl LogitCache {
    /// Run `teacher` (an inference-device model) over `examples` in batches of `batch_size`,
    /// the examples sorted by [`Examples::size`] (less padding; a stable sort, as evaluation
    /// batches them), the logits kept in example order.
    pub fn compute<C, E>(teacher: &C, examples: &E, batch_size: usize, device: &Device) -> Self
    where
        C: Classifier,
        E: Examples<Batch = C::Batch>,
    {
        let n = examples.len();
        let teacher = teacher.valid();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| examples.size(i));
        // Written in place, in example order: one copy of the logits, however many examples.
        let mut logits: Vec<f32> = Vec::new();
        let mut num_labels = 0;
        for chunk in order.chunks(batch_size.max(1)) {
            let out = teacher.logits(&examples.batch(chunk, device));
            num_labels = out.dims()[1];
            logits.resize(n * num_labels, 0.0);
            let flat: Vec<f32> = out.into_data().convert::<f32>().try_to_vec().expect("f32");
            for (r, &i) in chunk.iter().enumerate() {
                logits[i * num_labels..(i + 1) * num_labels]
                    .copy_from_slice(&flat[r * num_labels..(r + 1) * num_labels]);
            }
        }
        Self {
            num_labels,
            logits: Arc::new(logits),
        }
    }

    /// The logits of the teacher checkpoint at `teacher_dir` (loaded as `teacher`) on
    /// `examples`: read from `dir` when an earlier stage or run computed them for the same
    /// teacher bytes and the same examples, otherwise [computed](LogitCache::compute) and
    /// saved there (`logits-<sha256>.bin`, written atomically). `dir = None` keeps them in
    /// memory only. Returns the cache and where it was read from (`None`: computed now).
    pub fn load_or_compute<C, E>(
        teacher_dir: &Path,
        teacher: &C,
        examples: &E,
        batch_size: usize,
        device: &Device,
        dir: Option<&Path>,
    ) -> (Self, Option<PathBuf>)
    where
        C: Classifier,
        E: Examples<Batch = C::Batch>,
    {
        let file = dir.and_then(|d| {
            let key = logit_cache_key(teacher_dir, examples).ok()?;
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
        let c = Self::compute(teacher, examples, batch_size, device);
        if let Some(f) = &file {
            if let Err(e) = c.write(f) {
                eprintln!("warning: teacher logits not cached ({}): {e}", f.display());
            }
        }
        (c, None)
    }

    /// The cache file at `path` if it holds `n` examples' logits and its bytes are the ones
    /// written (a sha256 trailer); otherwise why not. Read in one streamed pass.
    fn read(path: &Path, n: usize) -> Result<Self, String> {
        let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
        let size = file.metadata().map_err(|e| e.to_string())?.len();
        let head_len = LOGIT_MAGIC.len() + 16;
        if size < (head_len + 32) as u64 {
            return Err("truncated".into());
        }
        let mut r = std::io::BufReader::new(file);
        let mut sha = Sha256::new();
        let mut head = vec![0u8; head_len];
        r.read_exact(&mut head).map_err(|e| e.to_string())?;
        if &head[..8] != LOGIT_MAGIC {
            return Err("not a mopt logit cache of this version".into());
        }
        sha.update(&head);
        let word = |i: usize| u64::from_le_bytes(head[8 + 8 * i..16 + 8 * i].try_into().unwrap());
        let (rows, num_labels) = (word(0) as usize, word(1) as usize);
        let body = size - (head_len + 32) as u64;
        if rows != n || body != 4 * (rows * num_labels) as u64 {
            return Err(format!(
                "it holds {rows} examples, {n} expected (or is truncated)"
            ));
        }
        let mut logits = Vec::with_capacity(rows * num_labels);
        let mut word4 = [0u8; 4];
        for _ in 0..rows * num_labels {
            r.read_exact(&mut word4).map_err(|e| e.to_string())?;
            sha.update(word4);
            logits.push(f32::from_le_bytes(word4));
        }
        let mut sum = [0u8; 32];
        r.read_exact(&mut sum).map_err(|e| e.to_string())?;
        if sha.finalize().as_slice() != sum {
            return Err(
                "its sha256 differs from the one written with it: truncated or altered".into(),
            );
        }
        Ok(Self {
            num_labels,
            logits: Arc::new(logits),
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
        put(&mut w, &(self.len() as u64).to_le_bytes())?;
        put(&mut w, &(self.num_labels as u64).to_le_bytes())?;
        for v in self.logits.iter() {
            put(&mut w, &v.to_le_bytes())?;
        }
        w.write_all(&sha.finalize())?;
        w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        std::fs::rename(&tmp, path)
    }

    /// Number of examples.
    pub fn len(&self) -> usize {
        self.logits.len() / self.num_labels.max(1)
    }

    /// Whether it holds no examples.
    pub fn is_empty(&self) -> bool {
        self.logits.is_empty()
    }

    /// The logits of example `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.logits[i * self.num_labels..(i + 1) * self.num_labels]
    }

    /// The logits of the examples at `indices`.
    ///
    /// # Shapes
    /// - output: `[indices.len(), num_labels]`
    pub fn batch(&self, indices: &[usize], device: &Device) -> Tensor<2> {
        let rows: Vec<f32> = indices.iter().flat_map(|&i| self.row(i)).copied().collect();
        Tensor::from_data(
            TensorData::new(rows, [indices.len(), self.num_labels]),
            device,
        )
    }
}

const LOGIT_MAGIC: &[u8; 8] = b"MOPTLC2\n";

/// sha256 over the teacher checkpoint's weights and config and every example's record.
fn logit_cache_key<E: Examples>(teacher_dir: &Path, examples: &E) -> std::io::Result<String> {
    let mut h = Sha256::new();
    h.update(b"mopt-logit-cache-v1");
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
/// - student, teacher: `[batch, classes]`; ce and the loss: `[1]`
pub fn kd_loss(
    ce: Tensor<1>,
    student: Tensor<2>,
    teacher: Tensor<2>,
    settings: &KdSettings,
    progress: f64,
) -> (Tensor<1>, Parts) {
    let alpha = settings.alpha.at(progress);
    let temperature = settings.temperature.at(progress);
    let soft = soft_loss(student, teacher, temperature, settings.soft_loss);
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
            model: PhantomData,
        }
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
                kd_loss(ce, logits, teacher, &self.settings, progress)
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
            model: PhantomData,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cache file round-trips exactly; a file for another example count, a truncated or a
    /// foreign file is not read.
    #[test]
    fn cached_logits_round_trip_and_bad_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/logits-x.bin");
        let c = LogitCache {
            num_labels: 3,
            logits: Arc::new(vec![0.5, -1.25, 3.0, f32::MIN_POSITIVE, 7.0, -0.0]),
        };
        c.write(&path).unwrap();
        let back = LogitCache::read(&path, 2).expect("read");
        assert_eq!((back.num_labels, &*back.logits), (3, &*c.logits));
        assert!(LogitCache::read(&path, 3)
            .unwrap_err()
            .contains("3 expected"));
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
        let err = LogitCache::read(&path, 2).unwrap_err();
        assert!(err.contains("truncated"), "{err}");
        // One flipped bit in a logit, the length unchanged: caught by the checksum.
        let mut altered = bytes.clone();
        altered[LOGIT_MAGIC.len() + 16 + 5] ^= 0x10;
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
}
