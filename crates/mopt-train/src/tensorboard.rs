//! TensorBoard event files, written synchronously: each scalar is one TFRecord (length, masked
//! CRC-32C of the length, an `Event` protobuf, masked CRC-32C of it) appended to
//! `events.out.tfevents.<time>.<host>.<pid>`. Written here rather than by a crate with a
//! background writer thread, so that a flush means the bytes are in the file (a resumed run cuts
//! the file back to the length a saved state recorded) and a failed write is an error, not a
//! panic on another thread.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// The time field of a new file's name in `dir`: `now`, or one second past the newest event
/// file already there. TensorBoard reads a folder's files in name order; a run resumed within
/// the second it was killed in would otherwise sort by process id, possibly before its own
/// earlier file, and its points would come out of step order (a resume test caught this once
/// runs got fast enough).
fn name_secs(dir: &Path, now: u64) -> u64 {
    let newest = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let rest = name.to_str()?.strip_prefix("events.out.tfevents.")?;
            rest.split('.').next()?.parse::<u64>().ok()
        })
        .max();
    newest.map_or(now, |t| now.max(t + 1))
}

/// One event file being appended to.
pub struct EventWriter {
    file: std::io::BufWriter<File>,
    path: PathBuf,
}

impl EventWriter {
    /// A new event file in `dir`, begun with the file-version event.
    pub fn create(dir: &Path) -> std::io::Result<Self> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "localhost".into());
        let name = format!(
            "events.out.tfevents.{:010}.{host}.{}.0",
            name_secs(dir, now.as_secs()),
            std::process::id()
        );
        let path = dir.join(name);
        let file = std::io::BufWriter::new(File::create(&path)?);
        let mut w = Self { file, path };
        let mut event = Vec::new();
        put_f64(&mut event, 1, now.as_secs_f64());
        put_bytes(&mut event, 3, b"brain.Event:2");
        w.record(&event)?;
        Ok(w)
    }

    /// The file written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Append the scalar `value` under `tag` at `step`.
    pub fn scalar(&mut self, tag: &str, value: f32, step: usize) -> std::io::Result<()> {
        let mut v = Vec::new();
        put_bytes(&mut v, 1, tag.as_bytes());
        v.push(2 << 3 | 5); // simple_value: float, fixed32
        v.extend_from_slice(&value.to_le_bytes());
        let mut summary = Vec::new();
        put_bytes(&mut summary, 1, &v);
        let mut event = Vec::new();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        put_f64(&mut event, 1, now.as_secs_f64());
        put_varint(&mut event, 2 << 3);
        put_varint(&mut event, step as u64);
        put_bytes(&mut event, 5, &summary);
        self.record(&event)
    }

    /// Write what is buffered to the file.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }

    fn record(&mut self, data: &[u8]) -> std::io::Result<()> {
        let len = (data.len() as u64).to_le_bytes();
        self.file.write_all(&len)?;
        self.file.write_all(&masked_crc32c(&len).to_le_bytes())?;
        self.file.write_all(data)?;
        self.file.write_all(&masked_crc32c(data).to_le_bytes())
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A length-delimited field (string, bytes, message).
fn put_bytes(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    put_varint(out, field << 3 | 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// A `double` field (fixed64).
fn put_f64(out: &mut Vec<u8>, field: u64, v: f64) {
    put_varint(out, field << 3 | 1);
    out.extend_from_slice(&v.to_le_bytes());
}

/// CRC-32C (Castagnoli), bit by bit: records are short and written once per log point.
fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// TFRecord's masked CRC.
fn masked_crc32c(data: &[u8]) -> u32 {
    let crc = crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_standard_check_value() {
        // The CRC-32C check value (RFC 3720's test vector "123456789").
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
    }

    /// Files made in the same second still sort in the order they were made.
    #[test]
    fn event_files_sort_in_creation_order() {
        let dir = tempfile::tempdir().unwrap();
        let paths: Vec<PathBuf> = (0..3)
            .map(|_| {
                EventWriter::create(dir.path())
                    .unwrap()
                    .path()
                    .to_path_buf()
            })
            .collect();
        let mut sorted = paths.clone();
        sorted.sort();
        assert_eq!(sorted, paths);
        let secs = |p: &Path| -> u64 {
            let name = p.file_name().unwrap().to_str().unwrap();
            name.split('.').nth(3).unwrap().parse().unwrap()
        };
        assert_eq!(secs(&paths[1]), secs(&paths[0]) + 1);
    }

    #[test]
    fn a_scalar_event_is_one_framed_record() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = EventWriter::create(dir.path()).unwrap();
        w.scalar("train/loss", 0.5, 7).unwrap();
        w.flush().unwrap();
        let bytes = std::fs::read(w.path()).unwrap();
        // Two records: the file version, then the scalar.
        let first = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let second = &bytes[8 + 4 + first + 4..];
        let len = u64::from_le_bytes(second[..8].try_into().unwrap()) as usize;
        assert_eq!(second.len(), 8 + 4 + len + 4);
        let data = &second[12..12 + len];
        assert_eq!(
            u32::from_le_bytes(second[12 + len..].try_into().unwrap()),
            masked_crc32c(data)
        );
        let tag = b"train/loss";
        assert!(data.windows(tag.len()).any(|w| w == tag));
        assert!(data.windows(4).any(|w| w == 0.5f32.to_le_bytes()));
    }
}
