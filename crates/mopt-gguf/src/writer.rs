//! Writing GGUF v3 files: metadata of every value type, tensors stored as F32, F16 or Q8_0
//! (quantized as ggml does), each tensor's data aligned, the file written atomically (a
//! temporary file beside it, synced, then renamed over it).

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::GgufError;
use crate::ggml::{quantize, GgmlType};
use crate::reader::{DEFAULT_ALIGNMENT, MAX_DIMS};
use crate::value::{Array, Value};

type Result<T> = std::result::Result<T, GgufError>;

/// The longest tensor name ggml accepts, in bytes (`GGML_MAX_NAME` is 64 with the terminator).
pub const MAX_NAME_BYTES: usize = 63;
/// How deep arrays may nest (what the reader accepts).
const MAX_ARRAY_DEPTH: usize = 16;

struct Pending {
    name: String,
    dims: Vec<u64>,
    ggml_type: GgmlType,
    data: Vec<u8>,
}

/// Collects metadata and tensors, then writes one GGUF v3 file.
///
/// Nothing touches the disk before [`GgufWriter::write`]; every error names the destination.
///
/// ```
/// use mopt_gguf::{GgmlType, Gguf, GgufWriter};
/// let dir = std::env::temp_dir().join(format!("mopt-gguf-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let path = dir.join("tiny.gguf");
/// let mut w = GgufWriter::new(&path);
/// w.metadata("general.architecture", "llama")?
///     .tensor("w", &[32, 2], &vec![0.5; 64], GgmlType::Q8_0)?;
/// w.write()?;
/// // Q8_0 keeps its scale as an f16: 127 · f16(0.5 / 127) = 0.49997
/// let back = Gguf::open(&path)?.read_f32("w")?;
/// assert!(back.iter().all(|v| (v - 0.5).abs() < 1e-4));
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct GgufWriter {
    path: PathBuf,
    metadata: Vec<(String, Value)>,
    keys: HashSet<String>,
    tensors: Vec<Pending>,
    names: HashSet<String>,
    alignment: u64,
}

impl GgufWriter {
    /// A writer for `path` (created or replaced by [`GgufWriter::write`]).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        GgufWriter {
            path: path.into(),
            metadata: Vec::new(),
            keys: HashSet::new(),
            tensors: Vec::new(),
            names: HashSet::new(),
            alignment: DEFAULT_ALIGNMENT,
        }
    }

    fn invalid(&self, field: String, reason: impl Into<String>) -> GgufError {
        GgufError::InvalidInput {
            path: self.path.clone(),
            field,
            reason: reason.into(),
        }
    }

    /// Add metadata `key` = `value` (written in the order added). `general.alignment` (a u32
    /// power of two) sets the data alignment; 32 without it.
    ///
    /// # Errors
    ///
    /// [`GgufError::InvalidInput`] for a key given twice, a bad `general.alignment`, or arrays
    /// nested deeper than 16.
    pub fn metadata(&mut self, key: &str, value: impl Into<Value>) -> Result<&mut Self> {
        let value = value.into();
        let field = format!("metadata key `{key}`");
        if self.keys.contains(key) {
            return Err(self.invalid(field, "given twice"));
        }
        if key == "general.alignment" {
            match value {
                Value::U32(a) if a.is_power_of_two() => self.alignment = u64::from(a),
                _ => {
                    let reason = format!("must be a u32 power of two, not {value:?}");
                    return Err(self.invalid(field, reason));
                }
            }
        }
        if let Value::Array(a) = &value {
            if depth(a) > MAX_ARRAY_DEPTH {
                let reason = format!("arrays nested deeper than {MAX_ARRAY_DEPTH}");
                return Err(self.invalid(field, reason));
            }
        }
        self.keys.insert(key.to_string());
        self.metadata.push((key.to_string(), value));
        Ok(self)
    }

    /// Add tensor `name` of GGUF dims `dims` (`ne[0]` first, the fastest-varying) holding
    /// `values` in storage order, stored as `ggml_type`: F32 (exact), F16 (nearest, ties to
    /// even) or Q8_0 (ggml's `quantize_row_q8_0_ref`).
    ///
    /// # Errors
    ///
    /// [`GgufError::InvalidInput`] for a name given twice or longer than 63 bytes, more than 4
    /// dims, a value count other than the dims' product, another type, or a Q8_0 tensor whose
    /// `ne[0]` is not a multiple of 32.
    pub fn tensor(
        &mut self,
        name: &str,
        dims: &[u64],
        values: &[f32],
        ggml_type: GgmlType,
    ) -> Result<&mut Self> {
        let field = format!("tensor `{name}`");
        let fail = |reason: String| Err(self.invalid(field.clone(), reason));
        if self.names.contains(name) {
            return fail("given twice".to_string());
        }
        if name.len() > MAX_NAME_BYTES {
            return fail(format!(
                "the name is {} bytes; ggml allows {MAX_NAME_BYTES}",
                name.len()
            ));
        }
        if dims.len() > MAX_DIMS as usize {
            return fail(format!("{} dims; ggml allows {MAX_DIMS}", dims.len()));
        }
        let n = dims.iter().try_fold(1u64, |n, d| n.checked_mul(*d));
        if n != Some(values.len() as u64) {
            return fail(format!("{} values for dims {dims:?}", values.len()));
        }
        let ne0 = dims.first().copied().unwrap_or(1);
        if ggml_type == GgmlType::Q8_0 && !ne0.is_multiple_of(32) {
            return fail(format!(
                "Q8_0 needs ne[0] to be a multiple of 32, not {ne0}"
            ));
        }
        let data = match quantize(ggml_type, values) {
            Ok(data) => data,
            Err(e) => return fail(e.to_string()),
        };
        self.names.insert(name.to_string());
        self.tensors.push(Pending {
            name: name.to_string(),
            dims: dims.to_vec(),
            ggml_type,
            data,
        });
        Ok(self)
    }

    /// Write the file: to `<path>.tmp`, synced, then renamed over `path`. On failure the
    /// temporary file is removed and `path` is left as it was.
    ///
    /// # Errors
    ///
    /// [`GgufError::Io`] when the file cannot be created, written or renamed.
    pub fn write(&self) -> Result<()> {
        let tmp = PathBuf::from(format!("{}.tmp", self.path.display()));
        let result = self.write_to(&tmp).and_then(|()| {
            std::fs::rename(&tmp, &self.path)
                .map_err(|e| GgufError::io(&self.path, "renaming the temporary file over it", e))
        });
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }

    fn write_to(&self, tmp: &Path) -> Result<()> {
        let io = |what: &str| {
            let what = what.to_string();
            move |e| GgufError::io(tmp, what, e)
        };
        let file = File::create(tmp).map_err(io("creating"))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(&self.head())
            .map_err(io("writing the header"))?;
        for t in &self.tensors {
            let padding = padding(t.data.len() as u64, self.alignment);
            out.write_all(&t.data)
                .and_then(|()| out.write_all(&vec![0u8; padding]))
                .map_err(io(&format!("writing tensor `{}`", t.name)))?;
        }
        let file = out
            .into_inner()
            .map_err(|e| GgufError::io(tmp, "flushing", e.into_error()))?;
        file.sync_all().map_err(io("syncing"))
    }

    /// Header, metadata and tensor table, padded to the alignment.
    fn head(&self) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend((self.tensors.len() as u64).to_le_bytes());
        b.extend((self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_str(&mut b, key);
            b.extend(value.value_type().id().to_le_bytes());
            put_value(&mut b, value);
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            put_str(&mut b, &t.name);
            b.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                b.extend(d.to_le_bytes());
            }
            b.extend(t.ggml_type.0.to_le_bytes());
            b.extend(offset.to_le_bytes());
            offset = (offset + t.data.len() as u64).next_multiple_of(self.alignment);
        }
        b.resize(b.len() + padding(b.len() as u64, self.alignment), 0);
        b
    }
}

fn padding(len: u64, alignment: u64) -> usize {
    (len.next_multiple_of(alignment) - len) as usize
}

fn depth(a: &Array) -> usize {
    match a {
        Array::Array(v) => 1 + v.iter().map(depth).max().unwrap_or(0),
        _ => 1,
    }
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend((s.len() as u64).to_le_bytes());
    b.extend(s.as_bytes());
}

fn put_value(b: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => b.push(*x),
        Value::I8(x) => b.extend(x.to_le_bytes()),
        Value::U16(x) => b.extend(x.to_le_bytes()),
        Value::I16(x) => b.extend(x.to_le_bytes()),
        Value::U32(x) => b.extend(x.to_le_bytes()),
        Value::I32(x) => b.extend(x.to_le_bytes()),
        Value::F32(x) => b.extend(x.to_le_bytes()),
        Value::Bool(x) => b.push(u8::from(*x)),
        Value::String(s) => put_str(b, s),
        Value::Array(a) => put_array(b, a),
        Value::U64(x) => b.extend(x.to_le_bytes()),
        Value::I64(x) => b.extend(x.to_le_bytes()),
        Value::F64(x) => b.extend(x.to_le_bytes()),
    }
}

fn put_array(b: &mut Vec<u8>, a: &Array) {
    b.extend(a.element_type().id().to_le_bytes());
    b.extend((a.len() as u64).to_le_bytes());
    macro_rules! numbers {
        ($v:expr) => {
            $v.iter().for_each(|x| b.extend(x.to_le_bytes()))
        };
    }
    match a {
        Array::U8(v) => b.extend(v),
        Array::I8(v) => numbers!(v),
        Array::U16(v) => numbers!(v),
        Array::I16(v) => numbers!(v),
        Array::U32(v) => numbers!(v),
        Array::I32(v) => numbers!(v),
        Array::F32(v) => numbers!(v),
        Array::Bool(v) => b.extend(v.iter().map(|x| u8::from(*x))),
        Array::String(v) => v.iter().for_each(|s| put_str(b, s)),
        Array::Array(v) => v.iter().for_each(|inner| put_array(b, inner)),
        Array::U64(v) => numbers!(v),
        Array::I64(v) => numbers!(v),
        Array::F64(v) => numbers!(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Gguf;

    #[test]
    fn bad_input_is_refused_naming_the_file_and_field() {
        let mut w = GgufWriter::new("/x/out.gguf");
        w.tensor("a", &[32], &[0.0; 32], GgmlType::Q8_0).unwrap();
        let e = |r: Result<&mut GgufWriter>| r.err().unwrap().to_string();
        let msg = e(w.tensor("a", &[1], &[0.0], GgmlType::F32));
        assert_eq!(msg, "/x/out.gguf: writing tensor `a`: given twice");
        let msg = e(w.tensor("b", &[2, 2], &[0.0; 3], GgmlType::F32));
        assert!(msg.ends_with("3 values for dims [2, 2]"), "{msg}");
        let msg = e(w.tensor("c", &[16, 2], &[0.0; 32], GgmlType::Q8_0));
        assert!(msg.contains("multiple of 32, not 16"), "{msg}");
        let msg = e(w.tensor("d", &[32], &[0.0; 32], GgmlType::Q4_1));
        assert!(msg.contains("Q4_1 is not supported"), "{msg}");
        let msg = e(w.tensor(&"n".repeat(64), &[1], &[0.0], GgmlType::F32));
        assert!(msg.contains("64 bytes"), "{msg}");
        let msg = e(w.metadata("general.alignment", 24u32));
        assert!(msg.contains("power of two"), "{msg}");
        w.metadata("k", 1u8).unwrap();
        assert!(e(w.metadata("k", 2u8)).ends_with("metadata key `k`: given twice"));
    }

    #[test]
    fn a_failed_write_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing-dir").join("out.gguf");
        let e = GgufWriter::new(&path).write().unwrap_err().to_string();
        assert!(e.contains("out.gguf.tmp: creating"), "{e}");
        // A directory in the way of the rename: the temporary file is cleaned up.
        let path = dir.path().join("taken");
        std::fs::create_dir_all(path.join("inside")).unwrap();
        assert!(GgufWriter::new(&path).write().is_err());
        assert!(!dir.path().join("taken.tmp").exists());
    }

    #[test]
    fn alignment_pads_the_data_section_and_every_tensor() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.gguf");
        let mut w = GgufWriter::new(&path);
        w.metadata("general.alignment", 64u32).unwrap();
        w.tensor("a", &[3], &[1.0, 2.0, 3.0], GgmlType::F32)
            .unwrap();
        w.tensor("b", &[2], &[4.0, 5.0], GgmlType::F16).unwrap();
        w.write().unwrap();
        let g = Gguf::open(&path).unwrap();
        assert_eq!(g.alignment(), 64);
        assert_eq!(g.data_start() % 64, 0);
        assert_eq!(g.tensor("b").unwrap().offset(), 64);
        assert_eq!(g.file_len(), g.data_start() + 128);
        assert_eq!(g.read_f32("b").unwrap(), [4.0, 5.0]);
    }
}
