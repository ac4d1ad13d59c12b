//! Checkpoint manifests: `manifest.json` beside a checkpoint's files holds the sha256 of each, so
//! that a truncated or altered file is caught when it is read, with a message naming it, instead
//! of loading into a model that computes garbage.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

/// The manifest's file name.
pub const MANIFEST: &str = "manifest.json";

/// sha256 of the file at `path`, hex.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(format!("{:x}", h.finalize()))
}

/// Write `dir/manifest.json` with the sha256 of every file in `dir` (not in sub-folders).
pub fn write(dir: &Path) -> std::io::Result<()> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().to_string();
        if entry.file_type()?.is_file() && name != MANIFEST {
            files.insert(name, sha256_file(&entry.path())?);
        }
    }
    let text = serde_json::to_string_pretty(&serde_json::json!({ "sha256": files })).expect("json");
    std::fs::write(dir.join(MANIFEST), text)
}

/// Check the file at `path` against the manifest of its folder: `Ok` when the folder has no
/// manifest (an older checkpoint) or the manifest does not list the file; an error saying what
/// differs otherwise.
pub fn verify(path: &Path) -> Result<(), String> {
    let Some(dir) = path.parent() else {
        return Ok(());
    };
    let Ok(text) = std::fs::read_to_string(dir.join(MANIFEST)) else {
        return Ok(());
    };
    let manifest: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("{} is not valid JSON ({e})", dir.join(MANIFEST).display()))?;
    let name = path.file_name().map(|n| n.to_string_lossy().to_string());
    let Some(want) = name.and_then(|n| manifest["sha256"][&n].as_str().map(str::to_string)) else {
        return Ok(());
    };
    let got = sha256_file(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if got != want {
        return Err(format!(
            "{} is corrupt: its sha256 differs from the one {} recorded when it was written (truncated or altered since)",
            path.display(),
            MANIFEST
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_or_truncated_file_is_caught_and_others_pass() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("model.bpk"), dir.path().join("config.json"));
        std::fs::write(&a, b"weights").unwrap();
        std::fs::write(&b, b"{}").unwrap();
        assert!(verify(&a).is_ok(), "no manifest yet: nothing to check");
        write(dir.path()).unwrap();
        assert!(verify(&a).is_ok() && verify(&b).is_ok());
        std::fs::write(&a, b"weightz").unwrap();
        let e = verify(&a).unwrap_err();
        assert!(e.contains("model.bpk is corrupt"), "{e}");
        std::fs::write(&a, b"weigh").unwrap();
        assert!(verify(&a).is_err(), "truncated");
        std::fs::write(dir.path().join("other.txt"), b"x").unwrap();
        assert!(verify(&dir.path().join("other.txt")).is_ok(), "not listed");
    }
}
