//! The teacher cache is written as the teacher pass goes: building it for a data set ten times
//! larger takes no more memory (the process's heap, counted by this test's allocator), the
//! file is byte for byte the one a cache built in memory saves, and a build killed half-way
//! leaves nothing a later run could take for a finished cache.
//!
//! One test function: the allocator's peak is the process's, so nothing else runs beside it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use burn::prelude::*;
use mopt_core::Taps;
use mopt_data::Encoded;
use mopt_distill::matching::TeacherNeeds;
use mopt_distill::text::cache::{build_file, compute_with, TeacherCache};

struct Counting;

static NOW: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY (the workspace denies unsafe code; a global allocator cannot be written without it):
// every call is forwarded to the system allocator unchanged; the counters only observe sizes.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let now = NOW.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(now, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        NOW.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Heap bytes at the highest point of `f`, above what was live when it started.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = NOW.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let out = f();
    (out, PEAK.load(Ordering::Relaxed) - base)
}

const HIDDEN: usize = 64;
const HEADS: usize = 4;
const LAYERS: usize = 2;

/// `n` examples of 8 to 40 tokens (a fixed pattern).
fn examples(n: usize) -> Vec<Encoded> {
    (0..n)
        .map(|i| Encoded {
            ids: (0..8 + (i * 7) % 33)
                .map(|t| (t * 31 + i) as u32 % 1000)
                .collect(),
            label: i % 3,
        })
        .collect()
}

/// A stand-in teacher: taps of the right shapes whose values follow the token ids, padded to
/// the batch's longest example.
fn forward(items: &[&Encoded]) -> (Taps, usize) {
    let device = Device::flex();
    let b = items.len();
    let seq = items.iter().map(|e| e.ids.len()).max().unwrap_or(0);
    let id = |r: usize, t: usize| items[r].ids.get(t).copied().unwrap_or(0) as f32;
    let tensor = |dims: Vec<usize>, f: &dyn Fn(&[usize]) -> f32| {
        let n: usize = dims.iter().product();
        let mut idx = vec![0; dims.len()];
        let values: Vec<f32> = (0..n)
            .map(|mut k| {
                for d in (0..dims.len()).rev() {
                    idx[d] = k % dims[d];
                    k /= dims[d];
                }
                f(&idx)
            })
            .collect();
        TensorData::new(values, dims)
    };
    let logits = tensor(vec![b, 3], &|i| id(i[0], 0) * 0.01 + i[1] as f32);
    let hidden = |l: usize| {
        let d = tensor(vec![b, seq, HIDDEN], &|i| {
            id(i[0], i[1]) * 1e-3 + (i[2] + l) as f32
        });
        Tensor::<3>::from_data(d, &device)
    };
    let attention = |l: usize, s: f32| {
        let d = tensor(vec![b, HEADS, seq, seq], &|i| {
            s * (id(i[0], i[2]) - id(i[0], i[3])) + (i[1] + l) as f32
        });
        Tensor::<4>::from_data(d, &device)
    };
    let taps = Taps {
        logits: Tensor::from_data(logits, &device),
        hidden_states: (0..=LAYERS).map(hidden).collect(),
        attentions: (0..LAYERS).map(|l| attention(l, 1e-3)).collect(),
        attention_scores: (0..LAYERS).map(|l| attention(l, 2e-3)).collect(),
    };
    (taps, seq)
}

fn needs() -> TeacherNeeds {
    TeacherNeeds {
        hidden: [1, 2].into_iter().collect(),
        attentions: [2].into_iter().collect(),
        scores: [1].into_iter().collect(),
    }
}

fn parts(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".part"))
        .collect();
    v.sort();
    v
}

#[test]
fn the_cache_build_holds_one_batch_whatever_the_data_size() {
    let dir = tempfile::tempdir().unwrap();
    let needs = needs();
    let build = |n: usize| {
        let ex = examples(n);
        let path = dir.path().join(format!("teacher-{n}.safetensors"));
        let (cache, peak) = peak_of(|| build_file(&ex, &needs, 32, &path, &mut forward).unwrap());
        (cache, peak, std::fs::metadata(&path).unwrap().len())
    };
    // A warm-up build: Burn's and the allocator's first-use buffers are not the cache's.
    build(64);
    let (small, small_peak, small_bytes) = build(300);
    let (large, large_peak, large_bytes) = build(3000);
    assert_eq!((small.len(), large.len()), (300, 3000));
    assert!(
        large_bytes > 9 * small_bytes,
        "{small_bytes} -> {large_bytes}"
    );
    // Held in memory, the larger build would need its whole cache (about 70 MiB) more. Streamed,
    // only the logits (3 floats an example) and the index grow: under 1 MiB here.
    let grown = large_peak.saturating_sub(small_peak);
    assert!(
        grown < 1 << 20,
        "peak {small_peak} -> {large_peak} bytes for a {small_bytes} -> {large_bytes} byte cache"
    );
    // The control: built in memory, the same two data sets do grow by about the cache.
    let in_memory = |n: usize| peak_of(|| compute_with(&examples(n), &needs, 32, &mut forward)).1;
    let (small_mem, large_mem) = (in_memory(300), in_memory(3000));
    eprintln!(
        "peak heap while building: streamed {small_peak} -> {large_peak} bytes, in memory {small_mem} -> {large_mem} bytes, for a {small_bytes} -> {large_bytes} byte cache"
    );
    assert!(
        large_mem - small_mem > (large_bytes - small_bytes) as usize / 2,
        "the measurement sees a cache held in memory"
    );

    // The bytes of a cache built in memory and saved: identical.
    let ex = examples(300);
    let memory = compute_with(&ex, &needs, 32, &mut forward);
    let saved = dir.path().join("saved.safetensors");
    memory.save(&saved).unwrap();
    assert_eq!(
        std::fs::read(&saved).unwrap(),
        std::fs::read(dir.path().join("teacher-300.safetensors")).unwrap()
    );
    let device = Device::flex();
    let (a, b) = (
        memory.batch(&[5, 299], 40, &device),
        small.batch(&[5, 299], 40, &device),
    );
    assert_eq!(
        a.hidden[&2].clone().into_data(),
        b.hidden[&2].clone().into_data()
    );

    // Killed half-way (the teacher fails on its fifth batch): no cache file, and the
    // temporary file never verifies as one.
    let path = dir.path().join("teacher-killed.safetensors");
    let mut calls = 0;
    let mut dying = |items: &[&Encoded]| {
        calls += 1;
        assert!(calls < 5, "the teacher pass is killed");
        forward(items)
    };
    let killed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        build_file(&ex, &needs, 32, &path, &mut dying)
    }));
    assert!(killed.is_err());
    assert!(
        !path.exists(),
        "a half-built cache never takes the cache's name"
    );
    let part = parts(dir.path());
    assert_eq!(part.len(), 1, "{part:?}");
    let err = TeacherCache::load(&dir.path().join(&part[0]), &needs)
        .err()
        .expect("a half-written file is refused")
        .to_string();
    assert!(err.contains("sha256"), "{err}");
    // The next build rebuilds it, and removes the temporary files of dead builds.
    let dead = dir.path().join("teacher-killed.999999999.part");
    std::fs::write(&dead, b"left by a killed process").unwrap();
    let rebuilt = build_file(&ex, &needs, 32, &path, &mut forward).unwrap();
    assert_eq!(rebuilt.len(), 300);
    assert!(!dead.exists(), "a dead build's file is removed");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        std::fs::read(&saved).unwrap(),
        "the rebuilt cache is the complete one"
    );
    // This process's own temporary file from the killed build is reused, then renamed.
    assert_eq!(parts(dir.path()), Vec::<String>::new());
}
