//! Housekeeping of the caches runs leave beside their data (`.mopt-cache/` folders): token ids,
//! teacher outputs and teacher logits, keyed by content hashes, so a changed tokenizer, teacher
//! or data set writes new files and the old ones stay until removed here.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::TrainError;

/// The folder name every cache lives in.
pub const CACHE_DIR: &str = ".mopt-cache";

/// What a cache file holds, from its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CacheKind {
    /// Token ids of a data set under one tokenizer and max length (`<key>.json`).
    Tokens,
    /// A text teacher's outputs for distillation (`teacher-<key>.safetensors`; `.bin`: the
    /// format of earlier mopt versions, no longer read).
    Teacher,
    /// A teacher's logits on a data set (`logits-<sha256>.bin`).
    Logits,
    /// Anything else in a cache folder (a write that was interrupted, `*.part`).
    Other,
}

impl CacheKind {
    fn of(name: &str) -> Self {
        if name.ends_with(".part") || name.contains(".part.") {
            CacheKind::Other
        } else if name.starts_with("teacher-") {
            CacheKind::Teacher
        } else if name.starts_with("logits-") {
            CacheKind::Logits
        } else if name.ends_with(".json") {
            CacheKind::Tokens
        } else {
            CacheKind::Other
        }
    }

    /// Its name in listings.
    pub fn label(self) -> &'static str {
        match self {
            CacheKind::Tokens => "tokens",
            CacheKind::Teacher => "teacher",
            CacheKind::Logits => "logits",
            CacheKind::Other => "other",
        }
    }
}

/// One cache file.
#[derive(Debug, Clone)]
pub struct CacheFile {
    /// Where it is.
    pub path: PathBuf,
    /// What it holds.
    pub kind: CacheKind,
    /// Its size in bytes.
    pub bytes: u64,
    /// When it was last written.
    pub modified: SystemTime,
}

/// Every cache file under `roots` (searched recursively for `.mopt-cache` folders), newest
/// first within each folder.
pub fn scan(roots: &[PathBuf]) -> Result<Vec<CacheFile>, TrainError> {
    let mut dirs = Vec::new();
    for root in roots {
        if !root.is_dir() {
            return Err(TrainError::Input(format!(
                "{}: not a folder (give the folders whose {CACHE_DIR}/ caches to list, e.g. datasets/data)",
                root.display()
            )));
        }
        find_cache_dirs(root, &mut dirs)?;
    }
    let mut files = Vec::new();
    for dir in dirs {
        let mut here = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(|e| TrainError::io(&dir, e))? {
            let entry = entry.map_err(|e| TrainError::io(&dir, e))?;
            let meta = entry
                .metadata()
                .map_err(|e| TrainError::io(&entry.path(), e))?;
            if !meta.is_file() {
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            here.push(CacheFile {
                kind: CacheKind::of(&name),
                path: entry.path(),
                bytes: meta.len(),
                modified: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            });
        }
        here.sort_by(|a, b| b.modified.cmp(&a.modified).then(a.path.cmp(&b.path)));
        files.extend(here);
    }
    Ok(files)
}

fn find_cache_dirs(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), TrainError> {
    let mut subdirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| TrainError::io(dir, e))?
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    subdirs.sort();
    for d in subdirs {
        if d.file_name().is_some_and(|n| n == CACHE_DIR) {
            out.push(d);
        } else {
            find_cache_dirs(&d, out)?;
        }
    }
    Ok(())
}

/// Which cache files [`clean`] removes.
#[derive(Debug, Clone, Default)]
pub struct CleanRule {
    /// Only files last written longer ago than this.
    pub older_than: Option<Duration>,
    /// Keep the newest N files of each kind in each cache folder.
    pub keep_latest: usize,
}

/// The files of `files` (as [`scan`] lists them) that `rule` removes; with no rule at all
/// (no age, keep 0) every file.
pub fn select(files: &[CacheFile], rule: &CleanRule, now: SystemTime) -> Vec<CacheFile> {
    let mut seen: std::collections::HashMap<(PathBuf, CacheKind), usize> = Default::default();
    files
        .iter()
        .filter(|f| {
            let folder = f.path.parent().map(Path::to_path_buf).unwrap_or_default();
            let rank = seen.entry((folder, f.kind)).or_insert(0);
            *rank += 1;
            let young = rule
                .older_than
                .is_some_and(|age| now.duration_since(f.modified).unwrap_or_default() < age);
            *rank > rule.keep_latest && !young
        })
        .cloned()
        .collect()
}

/// Remove `files`; returns the bytes freed.
pub fn clean(files: &[CacheFile]) -> Result<u64, TrainError> {
    let mut freed = 0;
    for f in files {
        std::fs::remove_file(&f.path).map_err(|e| TrainError::io(&f.path, e))?;
        freed += f.bytes;
    }
    Ok(freed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(dir: &Path, name: &str, bytes: usize, age_days: u64) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, vec![0u8; bytes]).unwrap();
        let t = SystemTime::now() - Duration::from_secs(age_days * 86_400);
        std::fs::File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_modified(t)
            .unwrap();
        p
    }

    #[test]
    fn lists_by_kind_and_cleans_by_age_and_rank() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = tmp.path().join("data/set-a").join(CACHE_DIR);
        std::fs::create_dir_all(&cache).unwrap();
        touch(&cache, "aaa.json", 10, 30);
        touch(&cache, "bbb.json", 20, 1);
        touch(&cache, "teacher-x.bin", 300, 40);
        touch(&cache, "logits-y.bin", 50, 2);
        touch(&cache, "logits-z.bin", 60, 20);
        std::fs::create_dir_all(tmp.path().join("data/set-b")).unwrap();
        let files = scan(&[tmp.path().join("data")]).unwrap();
        assert_eq!(files.len(), 5);
        assert_eq!(files.iter().map(|f| f.bytes).sum::<u64>(), 440);
        let kinds: Vec<_> = files.iter().map(|f| f.kind.label()).collect();
        assert_eq!(
            kinds,
            ["tokens", "logits", "logits", "tokens", "teacher"],
            "newest first"
        );
        let now = SystemTime::now();
        let old = CleanRule {
            older_than: Some(Duration::from_secs(10 * 86_400)),
            keep_latest: 0,
        };
        let gone: Vec<_> = select(&files, &old, now)
            .iter()
            .map(|f| f.path.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(gone, ["logits-z.bin", "aaa.json", "teacher-x.bin"]);
        let keep_one = CleanRule {
            older_than: None,
            keep_latest: 1,
        };
        let picked = select(&files, &keep_one, now);
        assert_eq!(picked.len(), 2, "the older tokens and logits files");
        assert_eq!(clean(&picked).unwrap(), 70);
        assert_eq!(scan(&[tmp.path().join("data")]).unwrap().len(), 3);
        assert!(scan(&[tmp.path().join("nope")]).is_err());
    }
}
