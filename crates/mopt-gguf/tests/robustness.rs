//! Damaged files never panic: every truncation and a few hundred seeded random byte flips of a
//! small valid file, each opened and every tensor read (and the tokenizer built), give `Ok` or
//! `Err`. A failing case prints its seed or length so it can be replayed.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use common::{write_small, Rng};
use mopt_gguf::{Gguf, GgufTokenizer};

/// Open `path` and use everything in it; `Ok(())` only if all of it succeeded.
fn use_all(path: &Path) -> Result<(), String> {
    let g = Gguf::open(path).map_err(|e| e.to_string())?;
    let mut first_err = None;
    for t in g.tensors() {
        let raw = g.read_raw(t.name());
        let values = g.read_f32(t.name());
        if let (Ok(values), Ok(_)) = (&values, &raw) {
            assert_eq!(values.len() as u64, t.n_elements());
        }
        first_err = first_err.or(values.err().map(|e| e.to_string()));
    }
    let _ = GgufTokenizer::from_gguf(&g).map(|t| t.encode("hello world<|end|> é"));
    first_err.map_or(Ok(()), Err)
}

/// Run `use_all` on `bytes`, turning a panic into a test failure that names `case`.
fn check(dir: &Path, bytes: &[u8], case: &str) -> Result<(), String> {
    let path = dir.join("case.gguf");
    std::fs::write(&path, bytes).unwrap();
    match catch_unwind(AssertUnwindSafe(|| use_all(&path))) {
        Ok(result) => result,
        Err(_) => panic!("{case}: reading the damaged file panicked"),
    }
}

#[test]
fn every_truncation_is_an_error_or_keeps_all_tensor_data() {
    let dir = tempfile::tempdir().unwrap();
    let full = std::fs::read(write_small(&dir.path().join("small.gguf"))).unwrap();
    let g = Gguf::open(dir.path().join("small.gguf")).unwrap();
    let data_end = g
        .tensors()
        .iter()
        .map(|t| g.data_start() + t.offset() + t.byte_size().unwrap())
        .max()
        .unwrap();
    assert!(use_all(&dir.path().join("small.gguf")).is_ok());
    for len in 0..full.len() {
        let result = check(
            dir.path(),
            &full[..len],
            &format!("truncated to {len} bytes"),
        );
        if (len as u64) < data_end {
            assert!(
                result.is_err(),
                "truncated to {len} bytes (data ends at {data_end}): opened"
            );
        }
    }
}

#[test]
fn random_byte_flips_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let full = std::fs::read(write_small(&dir.path().join("small.gguf"))).unwrap();
    let g = Gguf::open(dir.path().join("small.gguf")).unwrap();
    let head = g.data_start() as usize;
    let (mut ok, mut err) = (0, 0);
    for seed in 0..400u64 {
        let mut rng = Rng(seed);
        let mut bytes = full.clone();
        for _ in 0..1 + rng.below(4) {
            // Three flips in four land in the header, metadata and tensor table, where the
            // structure is; the rest anywhere.
            let span = if rng.below(4) < 3 { head } else { bytes.len() };
            let at = rng.below(span as u64) as usize;
            bytes[at] = match rng.below(3) {
                0 => bytes[at] ^ (1 << rng.below(8)),
                1 => 0xff,
                _ => rng.next_u64() as u8,
            };
        }
        match check(dir.path(), &bytes, &format!("flip seed {seed}")) {
            Ok(()) => ok += 1,
            Err(_) => err += 1,
        }
    }
    // Both outcomes occur: flips in tensor data still read, flips in lengths are refused.
    assert!(ok > 0 && err > 0, "{ok} ok, {err} errors");
}
