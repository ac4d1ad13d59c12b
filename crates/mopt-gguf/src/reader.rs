//! Reading GGUF files (versions 2 and 3), streamed and validated.
//!
//! [`Gguf::open`] reads the header, the metadata and the tensor table (never the tensor data),
//! checking every count and length against the bytes left in the file before it allocates for
//! it, and every tensor's data range against the file's size. [`Gguf::read_f32`] then reads one
//! tensor's bytes (a seek and one read) and dequantizes them.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::GgufError;
use crate::ggml::{dequantize, GgmlType};
use crate::value::{Array, Value, ValueType};

/// The data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The most dimensions a ggml tensor has (`GGML_MAX_DIMS`).
pub const MAX_DIMS: u32 = 4;
/// How deep arrays may nest (a bound on recursion, far above what any file uses).
const MAX_ARRAY_DEPTH: u32 = 16;
/// The fewest bytes of one metadata entry: key length, value type, a one-byte value.
const MIN_ENTRY_BYTES: u64 = 8 + 4 + 1;
/// The fewest bytes of one tensor-table entry: name length, dimension count, type, offset.
const MIN_TENSOR_BYTES: u64 = 8 + 4 + 4 + 8;

type Result<T> = std::result::Result<T, GgufError>;
/// The metadata in file order, and each key's position in it.
type Metadata = (Vec<(String, Value)>, HashMap<String, usize>);
/// Names the field being read, built only when an error needs it.
type Field<'f> = &'f dyn Fn() -> String;

/// One entry of the tensor table, checked against the file.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    name: String,
    dims: Vec<u64>,
    ggml_type: GgmlType,
    offset: u64,
    n_elements: u64,
    byte_size: Option<u64>,
}

impl TensorInfo {
    /// The tensor's name (`blk.0.attn_q.weight`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The dimensions as GGUF stores them, `ne[0]` first: `ne[0]` is the fastest-varying
    /// (contiguous) one. A matrix of `rows × cols` in row-major order is `[cols, rows]`.
    pub fn dims(&self) -> &[u64] {
        &self.dims
    }

    /// The dimensions slowest-varying first (the GGUF dims reversed): the row-major shape of
    /// what [`Gguf::read_f32`] returns, as PyTorch and Burn write shapes.
    pub fn shape(&self) -> Vec<u64> {
        self.dims.iter().rev().copied().collect()
    }

    /// The ggml type of the stored data.
    pub fn ggml_type(&self) -> GgmlType {
        self.ggml_type
    }

    /// Where the data starts, relative to the data section.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The product of the dimensions.
    pub fn n_elements(&self) -> u64 {
        self.n_elements
    }

    /// Bytes of stored data, or `None` for a ggml type this crate does not know.
    pub fn byte_size(&self) -> Option<u64> {
        self.byte_size
    }
}

/// An open GGUF file: its metadata and tensor table in memory, its tensor data on disk.
#[derive(Debug)]
pub struct Gguf {
    path: PathBuf,
    file: Mutex<File>,
    file_len: u64,
    version: u32,
    metadata: Vec<(String, Value)>,
    keys: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    names: HashMap<String, usize>,
    alignment: u64,
    data_start: u64,
}

impl Gguf {
    /// Open `path` and read its header, metadata and tensor table (not the tensor data).
    ///
    /// # Errors
    ///
    /// [`GgufError::Io`] when the file cannot be read; [`GgufError::NotGguf`] without the magic
    /// bytes; [`GgufError::UnsupportedVersion`] for a version other than 2 or 3;
    /// [`GgufError::Malformed`] for a count, length or type id that does not fit the file, a
    /// duplicate key or tensor name, a bad alignment, or tensor data outside the file; each names
    /// the file and the field.
    pub fn open(path: impl AsRef<Path>) -> Result<Gguf> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| GgufError::io(path, "opening", e))?;
        let file_len = file
            .metadata()
            .map_err(|e| GgufError::io(path, "reading its size", e))?
            .len();
        let mut parser = Parser {
            cur: Cursor {
                inner: BufReader::with_capacity(1 << 16, file),
                pos: 0,
                len: file_len,
            },
            path,
        };
        let (version, n_tensors, n_entries) = parser.header()?;
        let (metadata, keys) = parser.metadata(n_entries)?;
        let raw = parser.tensor_table(n_tensors)?;
        let table_end = parser.cur.pos;
        let alignment = alignment(path, &metadata)?;
        let data_start = table_end.next_multiple_of(alignment);
        let mut tensors = Vec::new();
        let mut names = HashMap::new();
        for t in raw {
            let t = check_tensor(path, t, alignment, data_start, file_len)?;
            if names.insert(t.name.clone(), tensors.len()).is_some() {
                let reason = "the name appears twice in the tensor table";
                return Err(GgufError::malformed(
                    path,
                    format!("tensor `{}`", t.name),
                    reason,
                ));
            }
            tensors.push(t);
        }
        Ok(Gguf {
            path: path.to_path_buf(),
            file: Mutex::new(parser.cur.inner.into_inner()),
            file_len,
            version,
            metadata,
            keys,
            tensors,
            names,
            alignment,
            data_start,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The file's size in bytes.
    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// The data alignment (`general.alignment`, 32 when absent).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Where the data section starts in the file (the end of the tensor table, aligned).
    pub fn data_start(&self) -> u64 {
        self.data_start
    }

    /// The metadata, in file order.
    pub fn metadata(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.metadata.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.keys.get(key).map(|i| &self.metadata[*i].1)
    }

    /// The tensor table, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.names.get(name).map(|i| &self.tensors[*i])
    }

    /// The value of `key`.
    ///
    /// # Errors
    ///
    /// [`GgufError::MissingKey`] when absent.
    pub fn value(&self, key: &str) -> Result<&Value> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            path: self.path.clone(),
            key: key.to_string(),
        })
    }

    fn wrong_type(&self, key: &str, expected: &str, found: &Value) -> GgufError {
        GgufError::WrongType {
            path: self.path.clone(),
            key: key.to_string(),
            expected: expected.to_string(),
            found: found.describe(),
        }
    }
}

macro_rules! scalar_getters {
    ($($fn_name:ident -> $t:ty = $variant:ident, $ty_name:literal;)*) => {
        impl Gguf {$(
            #[doc = concat!("The `", $ty_name, "` value of `key`.")]
            ///
            /// # Errors
            ///
            /// [`GgufError::MissingKey`] when absent; [`GgufError::WrongType`] for a value of
            /// another type (no conversions).
            pub fn $fn_name(&self, key: &str) -> Result<$t> {
                match self.value(key)? {
                    Value::$variant(v) => Ok(*v),
                    other => Err(self.wrong_type(key, $ty_name, other)),
                }
            }
        )*}
    };
}

scalar_getters! {
    get_u8 -> u8 = U8, "u8";
    get_i8 -> i8 = I8, "i8";
    get_u16 -> u16 = U16, "u16";
    get_i16 -> i16 = I16, "i16";
    get_u32 -> u32 = U32, "u32";
    get_i32 -> i32 = I32, "i32";
    get_f32 -> f32 = F32, "f32";
    get_bool -> bool = Bool, "bool";
    get_u64 -> u64 = U64, "u64";
    get_i64 -> i64 = I64, "i64";
    get_f64 -> f64 = F64, "f64";
}

macro_rules! array_getters {
    ($($fn_name:ident -> $t:ty = $variant:ident, $ty_name:literal;)*) => {
        impl Gguf {$(
            #[doc = concat!("The elements of `key`, an array of `", $ty_name, "`.")]
            ///
            /// # Errors
            ///
            /// [`GgufError::MissingKey`] when absent; [`GgufError::WrongType`] for anything else.
            pub fn $fn_name(&self, key: &str) -> Result<&[$t]> {
                match self.value(key)? {
                    Value::Array(Array::$variant(v)) => Ok(v),
                    other => Err(self.wrong_type(key, concat!("array of ", $ty_name), other)),
                }
            }
        )*}
    };
}

array_getters! {
    get_str_array -> String = String, "string";
    get_i32_array -> i32 = I32, "i32";
    get_u32_array -> u32 = U32, "u32";
    get_f32_array -> f32 = F32, "f32";
}

impl Gguf {
    /// The string value of `key`.
    ///
    /// # Errors
    ///
    /// [`GgufError::MissingKey`] when absent; [`GgufError::WrongType`] for a non-string.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        match self.value(key)? {
            Value::String(s) => Ok(s),
            other => Err(self.wrong_type(key, "string", other)),
        }
    }

    /// The array value of `key`, of any element type.
    ///
    /// # Errors
    ///
    /// [`GgufError::MissingKey`] when absent; [`GgufError::WrongType`] for a non-array.
    pub fn get_array(&self, key: &str) -> Result<&Array> {
        match self.value(key)? {
            Value::Array(a) => Ok(a),
            other => Err(self.wrong_type(key, "array", other)),
        }
    }

    /// The tensor named `name`, or an error naming it.
    ///
    /// # Errors
    ///
    /// [`GgufError::MissingTensor`] when absent.
    pub fn tensor_info(&self, name: &str) -> Result<&TensorInfo> {
        self.tensor(name).ok_or_else(|| GgufError::MissingTensor {
            path: self.path.clone(),
            name: name.to_string(),
            count: self.tensors.len(),
        })
    }

    /// The stored bytes of tensor `name`, as they are in the file (a seek and one read).
    ///
    /// # Errors
    ///
    /// [`GgufError::MissingTensor`]; [`GgufError::UnsupportedType`] for a ggml type whose size
    /// this crate does not know; [`GgufError::Io`] when the read fails (the file shrank).
    pub fn read_raw(&self, name: &str) -> Result<Vec<u8>> {
        let t = self.tensor_info(name)?;
        let Some(size) = t.byte_size else {
            return Err(self.unsupported(t));
        };
        self.read_bytes(t, size)
    }

    /// Tensor `name` dequantized to f32, exactly as ggml computes it, in storage order: element
    /// `(i0, i1, i2, i3)` of GGUF dims `[ne0, ne1, ne2, ne3]` is at `i0 + ne0·(i1 + ne1·(i2 +
    /// ne2·i3))`. That is row-major for [`TensorInfo::shape`] (the dims reversed): the token
    /// embedding `token_embd.weight`, dims `[576, 49152]`, comes back as 49,152 rows of 576.
    ///
    /// Only this tensor's bytes are read. Types: F32, F16, BF16, Q8_0, Q4_0, Q4_1.
    ///
    /// # Errors
    ///
    /// [`GgufError::MissingTensor`]; [`GgufError::UnsupportedType`] naming the type and the
    /// tensor for any other type (Q4_K, Q6_K, an unknown id); [`GgufError::Io`] when the read fails.
    pub fn read_f32(&self, name: &str) -> Result<Vec<f32>> {
        let t = self.tensor_info(name)?;
        let size = match t.byte_size {
            Some(size) if t.ggml_type.is_dequantized() => size,
            _ => return Err(self.unsupported(t)),
        };
        let bytes = self.read_bytes(t, size)?;
        dequantize(t.ggml_type, &bytes).map_err(|e| {
            GgufError::malformed(&self.path, format!("tensor `{name}`"), e.to_string())
        })
    }

    fn unsupported(&self, t: &TensorInfo) -> GgufError {
        GgufError::UnsupportedType {
            path: self.path.clone(),
            name: t.name.clone(),
            ggml_type: t.ggml_type,
        }
    }

    fn read_bytes(&self, t: &TensorInfo, size: u64) -> Result<Vec<u8>> {
        let start = self.data_start + t.offset;
        let field = || {
            format!(
                "tensor `{}`: reading {size} bytes at offset {start}",
                t.name
            )
        };
        let n = usize::try_from(size)
            .map_err(|_| GgufError::malformed(&self.path, field(), "too large for this machine"))?;
        let mut file = self
            .file
            .lock()
            .map_err(|_| GgufError::malformed(&self.path, field(), "an earlier read panicked"))?;
        file.seek(SeekFrom::Start(start))
            .map_err(|e| GgufError::io(&self.path, field(), e))?;
        let mut buf = vec![0u8; n];
        file.read_exact(&mut buf)
            .map_err(|e| GgufError::io(&self.path, field(), e))?;
        Ok(buf)
    }
}

/// `general.alignment`, or the default: a power of two.
fn alignment(path: &Path, metadata: &[(String, Value)]) -> Result<u64> {
    const KEY: &str = "general.alignment";
    match metadata.iter().find(|(k, _)| k == KEY).map(|(_, v)| v) {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(Value::U32(a)) if a.is_power_of_two() => Ok(u64::from(*a)),
        Some(Value::U32(a)) => Err(GgufError::malformed(
            path,
            format!("metadata key `{KEY}`"),
            format!("{a} is not a power of two"),
        )),
        Some(other) => Err(GgufError::WrongType {
            path: path.to_path_buf(),
            key: KEY.to_string(),
            expected: "u32".to_string(),
            found: other.describe(),
        }),
    }
}

/// A tensor-table entry as read, before it is checked.
struct RawTensor {
    name: String,
    dims: Vec<u64>,
    ggml_type: GgmlType,
    offset: u64,
}

/// Check one entry: the element count fits u64, the offset is aligned, rows are whole blocks,
/// and the data lies inside the file. Unknown types are kept (their size cannot be checked).
fn check_tensor(
    path: &Path,
    t: RawTensor,
    alignment: u64,
    data_start: u64,
    file_len: u64,
) -> Result<TensorInfo> {
    let field = format!("tensor `{}`", t.name);
    let fail = |reason: String| GgufError::malformed(path, field.clone(), reason);
    let dims = &t.dims;
    let n_elements = dims
        .iter()
        .try_fold(1u64, |n, d| n.checked_mul(*d))
        .ok_or_else(|| fail(format!("dims {dims:?} hold more than 2^64 elements")))?;
    if !t.offset.is_multiple_of(alignment) {
        let reason = format!(
            "offset {} is not a multiple of the alignment {alignment}",
            t.offset
        );
        return Err(fail(reason));
    }
    let byte_size = match t.ggml_type.block() {
        None => None,
        Some((block, _)) => {
            let ne0 = dims.first().copied().unwrap_or(1);
            if !ne0.is_multiple_of(block) {
                let ty = t.ggml_type;
                let reason = format!(
                    "ne[0] = {ne0} is not a whole number of {ty} blocks ({block} elements each)"
                );
                return Err(fail(reason));
            }
            let size = t
                .ggml_type
                .bytes_for(n_elements)
                .ok_or_else(|| fail(format!("{n_elements} elements overflow a byte count")))?;
            let end = data_start
                .checked_add(t.offset)
                .and_then(|s| s.checked_add(size));
            if end.is_none_or(|end| end > file_len) {
                return Err(fail(format!(
                    "offset {} + {size} bytes runs past the end of the file ({file_len} bytes, data section at {data_start})",
                    t.offset
                )));
            }
            Some(size)
        }
    };
    Ok(TensorInfo {
        name: t.name,
        dims: t.dims,
        ggml_type: t.ggml_type,
        offset: t.offset,
        n_elements,
        byte_size,
    })
}

/// Why a read stopped short.
enum Short {
    /// The file ends before `need` more bytes.
    Eof {
        need: u64,
    },
    Io(std::io::Error),
}

/// A reader that knows its position and how many bytes the file has left.
struct Cursor<R> {
    inner: R,
    pos: u64,
    len: u64,
}

impl<R: Read> Cursor<R> {
    fn remaining(&self) -> u64 {
        self.len.saturating_sub(self.pos)
    }

    fn fill(&mut self, buf: &mut [u8]) -> std::result::Result<(), Short> {
        let need = buf.len() as u64;
        if need > self.remaining() {
            return Err(Short::Eof { need });
        }
        self.inner.read_exact(buf).map_err(Short::Io)?;
        self.pos += need;
        Ok(())
    }

    /// `n` bytes; `n` is checked against the bytes left before anything is allocated.
    fn bytes(&mut self, n: u64) -> std::result::Result<Vec<u8>, Short> {
        match usize::try_from(n) {
            Ok(len) if n <= self.remaining() => {
                let mut v = vec![0u8; len];
                self.fill(&mut v)?;
                Ok(v)
            }
            _ => Err(Short::Eof { need: n }),
        }
    }
}

struct Parser<'p> {
    cur: Cursor<BufReader<File>>,
    path: &'p Path,
}

impl Parser<'_> {
    fn fail(&self, field: Field, reason: impl Into<String>) -> GgufError {
        GgufError::malformed(self.path, field(), reason)
    }

    fn short(&self, field: Field, e: Short) -> GgufError {
        match e {
            Short::Eof { need } => self.fail(
                field,
                format!(
                    "needs {need} bytes at offset {} but the file ends at {} bytes",
                    self.cur.pos, self.cur.len
                ),
            ),
            Short::Io(e) => GgufError::io(self.path, field(), e),
        }
    }

    fn fixed<const N: usize>(&mut self, field: Field) -> Result<[u8; N]> {
        let mut b = [0u8; N];
        match self.cur.fill(&mut b) {
            Ok(()) => Ok(b),
            Err(e) => Err(self.short(field, e)),
        }
    }

    fn u32(&mut self, field: Field) -> Result<u32> {
        self.fixed(field).map(u32::from_le_bytes)
    }

    fn u64(&mut self, field: Field) -> Result<u64> {
        self.fixed(field).map(u64::from_le_bytes)
    }

    /// Magic, version, tensor count, metadata count; the counts checked against the file size.
    fn header(&mut self) -> Result<(u32, u64, u64)> {
        let field: Field = &|| "header".to_string();
        if self.cur.len < 4 {
            let reason = format!(
                "the file is {} bytes, too short for a GGUF header",
                self.cur.len
            );
            return Err(self.fail(field, reason));
        }
        let magic: [u8; 4] = self.fixed(field)?;
        if &magic != b"GGUF" {
            return Err(GgufError::NotGguf {
                path: self.path.to_path_buf(),
                found: magic,
            });
        }
        let version = self.u32(field)?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion {
                path: self.path.to_path_buf(),
                version,
            });
        }
        let n_tensors = self.u64(field)?;
        let n_entries = self.u64(field)?;
        let need = n_tensors
            .checked_mul(MIN_TENSOR_BYTES)
            .zip(n_entries.checked_mul(MIN_ENTRY_BYTES))
            .and_then(|(a, b)| a.checked_add(b));
        let left = self.cur.remaining();
        if need.is_none_or(|need| need > left) {
            let reason = format!(
                "{n_tensors} tensors and {n_entries} metadata entries cannot fit in the {left} bytes after the header"
            );
            return Err(self.fail(field, reason));
        }
        Ok((version, n_tensors, n_entries))
    }

    fn metadata(&mut self, count: u64) -> Result<Metadata> {
        let mut entries = Vec::new();
        let mut keys = HashMap::new();
        for i in 0..count {
            let key = self.string(&|| format!("metadata entry {i}: key"))?;
            let field = || format!("metadata key `{key}`");
            let id = self.u32(&field)?;
            let Some(ty) = ValueType::from_id(id) else {
                return Err(self.fail(&field, format!("value type {id} is not a GGUF type (0-12)")));
            };
            let value = self.value(ty, 0, &field)?;
            if keys.contains_key(&key) {
                return Err(self.fail(&field, "the key appears twice"));
            }
            keys.insert(key.clone(), entries.len());
            entries.push((key, value));
        }
        Ok((entries, keys))
    }

    fn tensor_table(&mut self, count: u64) -> Result<Vec<RawTensor>> {
        let mut tensors = Vec::new();
        for i in 0..count {
            let name = self.string(&|| format!("tensor {i}: name"))?;
            let field = || format!("tensor `{name}`");
            let n_dims = self.u32(&field)?;
            if n_dims > MAX_DIMS {
                let reason = format!("{n_dims} dimensions; ggml tensors have at most {MAX_DIMS}");
                return Err(self.fail(&field, reason));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(self.u64(&field)?);
            }
            let ggml_type = GgmlType(self.u32(&field)?);
            let offset = self.u64(&field)?;
            tensors.push(RawTensor {
                name,
                dims,
                ggml_type,
                offset,
            });
        }
        Ok(tensors)
    }

    /// A u64 length, then that many bytes of UTF-8.
    fn string(&mut self, field: Field) -> Result<String> {
        let n = self.u64(field)?;
        let bytes = match self.cur.bytes(n) {
            Ok(b) => b,
            Err(Short::Eof { .. }) => {
                let (pos, len) = (self.cur.pos, self.cur.len);
                let reason = format!(
                    "a string of {n} bytes at offset {pos} runs past the end of the file ({len} bytes)"
                );
                return Err(self.fail(field, reason));
            }
            Err(e) => return Err(self.short(field, e)),
        };
        String::from_utf8(bytes).map_err(|e| self.fail(field, format!("not UTF-8 ({e})")))
    }

    fn bool(&mut self, field: Field) -> Result<bool> {
        match self.fixed::<1>(field)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(self.fail(field, format!("a bool is 0 or 1, not {b}"))),
        }
    }

    fn value(&mut self, ty: ValueType, depth: u32, field: Field) -> Result<Value> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.fixed::<1>(field)?[0]),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.fixed(field)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.fixed(field)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.fixed(field)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.fixed(field)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.fixed(field)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.fixed(field)?)),
            ValueType::Bool => Value::Bool(self.bool(field)?),
            ValueType::String => Value::String(self.string(field)?),
            ValueType::Array => Value::Array(self.array(depth + 1, field)?),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.fixed(field)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.fixed(field)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.fixed(field)?)),
        })
    }

    /// Element type, count (checked against the bytes left), elements.
    fn array(&mut self, depth: u32, field: Field) -> Result<Array> {
        if depth > MAX_ARRAY_DEPTH {
            return Err(self.fail(
                field,
                format!("arrays nested deeper than {MAX_ARRAY_DEPTH}"),
            ));
        }
        let id = self.u32(field)?;
        let Some(elem) = ValueType::from_id(id) else {
            let reason = format!("array element type {id} is not a GGUF type (0-12)");
            return Err(self.fail(field, reason));
        };
        let n = self.u64(field)?;
        let left = self.cur.remaining();
        if n.checked_mul(elem.min_bytes())
            .is_none_or(|need| need > left)
        {
            let reason = format!(
                "an array of {n} {elem} elements cannot fit in the {left} bytes left in the file"
            );
            return Err(self.fail(field, reason));
        }
        // n ≤ the bytes left, so it fits usize wherever the file could be read.
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        Ok(match elem {
            ValueType::U8 => Array::U8(self.numbers(n, field, u8::from_le_bytes)?),
            ValueType::I8 => Array::I8(self.numbers(n, field, i8::from_le_bytes)?),
            ValueType::U16 => Array::U16(self.numbers(n, field, u16::from_le_bytes)?),
            ValueType::I16 => Array::I16(self.numbers(n, field, i16::from_le_bytes)?),
            ValueType::U32 => Array::U32(self.numbers(n, field, u32::from_le_bytes)?),
            ValueType::I32 => Array::I32(self.numbers(n, field, i32::from_le_bytes)?),
            ValueType::F32 => Array::F32(self.numbers(n, field, f32::from_le_bytes)?),
            ValueType::U64 => Array::U64(self.numbers(n, field, u64::from_le_bytes)?),
            ValueType::I64 => Array::I64(self.numbers(n, field, i64::from_le_bytes)?),
            ValueType::F64 => Array::F64(self.numbers(n, field, f64::from_le_bytes)?),
            ValueType::Bool => Array::Bool(self.elements(n, field, |p, f| p.bool(f))?),
            ValueType::String => Array::String(self.elements(n, field, |p, f| p.string(f))?),
            ValueType::Array => {
                Array::Array(self.elements(n, field, |p, f| p.array(depth + 1, f))?)
            }
        })
    }

    /// `n` fixed-size numbers read in one go (`n · N` bytes, already checked).
    fn numbers<T, const N: usize>(
        &mut self,
        n: usize,
        field: Field,
        decode: fn([u8; N]) -> T,
    ) -> Result<Vec<T>> {
        let bytes = match self.cur.bytes(n as u64 * N as u64) {
            Ok(b) => b,
            Err(e) => return Err(self.short(field, e)),
        };
        Ok(bytes
            .chunks_exact(N)
            .map(|c| {
                let mut a = [0u8; N];
                a.copy_from_slice(c);
                decode(a)
            })
            .collect())
    }

    /// `n` variable-size elements; the vector grows as they are read, so a count that passed
    /// the size check but lies costs no more than the bytes really there.
    fn elements<T>(
        &mut self,
        n: usize,
        field: Field,
        mut read: impl FnMut(&mut Self, Field) -> Result<T>,
    ) -> Result<Vec<T>> {
        let mut out = Vec::with_capacity(n.min(1 << 16));
        for i in 0..n {
            out.push(read(self, &|| format!("{}, element {i}", field()))?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GGUF v`version` file of the given metadata entries (already encoded) and tensor table.
    fn file(version: u32, entries: &[Vec<u8>], n_tensors: u64, rest: &[u8]) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(version.to_le_bytes());
        b.extend(n_tensors.to_le_bytes());
        b.extend((entries.len() as u64).to_le_bytes());
        for e in entries {
            b.extend(e);
        }
        b.extend(rest);
        b
    }

    fn string(s: &str) -> Vec<u8> {
        let mut b = (s.len() as u64).to_le_bytes().to_vec();
        b.extend(s.as_bytes());
        b
    }

    fn entry(key: &str, ty: u32, value: &[u8]) -> Vec<u8> {
        let mut b = string(key);
        b.extend(ty.to_le_bytes());
        b.extend(value);
        b
    }

    fn open(bytes: &[u8]) -> (tempfile::TempDir, Result<Gguf>) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.gguf");
        std::fs::write(&p, bytes).unwrap();
        let g = Gguf::open(&p);
        (dir, g)
    }

    fn err(bytes: &[u8]) -> String {
        open(bytes).1.unwrap_err().to_string()
    }

    #[test]
    fn every_scalar_type_and_nested_arrays_are_read_in_v2_and_v3() {
        let mut nested = 9u32.to_le_bytes().to_vec(); // array of arrays
        nested.extend(2u64.to_le_bytes());
        for inner in [[1u8, 2], [3, 4]] {
            nested.extend(0u32.to_le_bytes()); // u8
            nested.extend(2u64.to_le_bytes());
            nested.extend(inner);
        }
        let entries = [
            entry("a.u8", 0, &[7]),
            entry("a.i8", 1, &[0xff]),
            entry("a.u16", 2, &513u16.to_le_bytes()),
            entry("a.i16", 3, &(-2i16).to_le_bytes()),
            entry("a.u32", 4, &70000u32.to_le_bytes()),
            entry("a.i32", 5, &(-70000i32).to_le_bytes()),
            entry("a.f32", 6, &1.5f32.to_le_bytes()),
            entry("a.bool", 7, &[1]),
            entry("a.str", 8, &string("héllo")),
            entry("a.u64", 10, &(1u64 << 40).to_le_bytes()),
            entry("a.i64", 11, &(-1i64 << 40).to_le_bytes()),
            entry("a.f64", 12, &0.25f64.to_le_bytes()),
            entry("a.nested", 9, &nested),
        ];
        for version in [2, 3] {
            let (_d, g) = open(&file(version, &entries, 0, &[]));
            let g = g.unwrap();
            assert_eq!(g.version(), version);
            assert_eq!(g.get_u8("a.u8").unwrap(), 7);
            assert_eq!(g.get_i8("a.i8").unwrap(), -1);
            assert_eq!(g.get_u16("a.u16").unwrap(), 513);
            assert_eq!(g.get_i16("a.i16").unwrap(), -2);
            assert_eq!(g.get_u32("a.u32").unwrap(), 70000);
            assert_eq!(g.get_i32("a.i32").unwrap(), -70000);
            assert_eq!(g.get_f32("a.f32").unwrap(), 1.5);
            assert!(g.get_bool("a.bool").unwrap());
            assert_eq!(g.get_str("a.str").unwrap(), "héllo");
            assert_eq!(g.get_u64("a.u64").unwrap(), 1 << 40);
            assert_eq!(g.get_i64("a.i64").unwrap(), -1 << 40);
            assert_eq!(g.get_f64("a.f64").unwrap(), 0.25);
            let want = Array::Array(vec![Array::U8(vec![1, 2]), Array::U8(vec![3, 4])]);
            assert_eq!(g.get_array("a.nested").unwrap(), &want);
            assert_eq!(g.alignment(), DEFAULT_ALIGNMENT);
            assert_eq!(g.metadata().count(), 13);
        }
    }

    #[test]
    fn wrong_magic_and_versions_are_refused_by_name() {
        let mut b = file(3, &[], 0, &[]);
        b[0] = b'X';
        assert!(err(&b).contains("not a GGUF file"), "{}", err(&b));
        let e = err(&file(1, &[], 0, &[]));
        assert!(e.contains("GGUF version 1 is not supported"), "{e}");
        let e = err(&file(3u32.swap_bytes(), &[], 0, &[]));
        assert!(e.contains("big-endian"), "{e}");
        assert!(err(b"GG").contains("too short"));
    }

    #[test]
    fn counts_and_lengths_are_checked_against_the_file_size() {
        let e = err(&file(3, &[], u64::MAX, &[]));
        assert!(e.contains("cannot fit"), "{e}");
        let mut huge = 8u32.to_le_bytes().to_vec();
        huge.extend((1u64 << 60).to_le_bytes());
        let e = err(&file(3, &[entry("k", 9, &huge)], 0, &[]));
        assert!(
            e.contains("metadata key `k`: an array of 1152921504606846976 string"),
            "{e}"
        );
        let e = err(&file(3, &[entry("k", 8, &u64::MAX.to_le_bytes())], 0, &[]));
        assert!(
            e.contains("metadata key `k`: a string of 18446744073709551615 bytes"),
            "{e}"
        );
        let e = err(&file(3, &[entry("k", 7, &[2])], 0, &[]));
        assert!(e.contains("a bool is 0 or 1, not 2"), "{e}");
        let e = err(&file(3, &[entry("k", 13, &[0; 8])], 0, &[]));
        assert!(e.contains("value type 13 is not a GGUF type"), "{e}");
        let dup = [entry("k", 0, &[1]), entry("k", 0, &[2])];
        assert!(err(&file(3, &dup, 0, &[])).contains("the key appears twice"));
    }

    #[test]
    fn deeply_nested_arrays_are_refused_not_recursed_forever() {
        let mut v = Vec::new();
        for _ in 0..40 {
            v.extend(9u32.to_le_bytes());
            v.extend(1u64.to_le_bytes());
        }
        v.extend(0u32.to_le_bytes());
        v.extend(0u64.to_le_bytes());
        let e = err(&file(3, &[entry("deep", 9, &v)], 0, &[]));
        assert!(e.contains("nested deeper than 16"), "{e}");
    }

    #[test]
    fn alignment_must_be_a_power_of_two_u32() {
        let e = err(&file(
            3,
            &[entry("general.alignment", 4, &24u32.to_le_bytes())],
            0,
            &[],
        ));
        assert!(e.contains("24 is not a power of two"), "{e}");
        let e = err(&file(3, &[entry("general.alignment", 10, &[0; 8])], 0, &[]));
        assert!(e.contains("expected u32, found u64"), "{e}");
        let (_d, g) = open(&file(
            3,
            &[entry("general.alignment", 4, &64u32.to_le_bytes())],
            0,
            &[],
        ));
        assert_eq!(g.unwrap().alignment(), 64);
    }

    fn tensor(name: &str, dims: &[u64], ty: u32, offset: u64) -> Vec<u8> {
        let mut b = string(name);
        b.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            b.extend(d.to_le_bytes());
        }
        b.extend(ty.to_le_bytes());
        b.extend(offset.to_le_bytes());
        b
    }

    #[test]
    fn tensor_tables_are_checked() {
        let with = |tensors: &[Vec<u8>], data: usize| {
            let mut rest: Vec<u8> = tensors.concat();
            let table_end = 24 + rest.len();
            rest.resize(table_end.next_multiple_of(32) - 24 + data, 0);
            file(3, &[], tensors.len() as u64, &rest)
        };
        let ok = with(&[tensor("w", &[4, 2], 0, 0)], 32);
        let (_d, g) = open(&ok);
        let g = g.unwrap();
        assert_eq!(g.tensor("w").unwrap().shape(), [2, 4]);
        assert_eq!(g.read_f32("w").unwrap(), vec![0.0; 8]);
        let e = err(&with(&[tensor("w", &[4, 2], 0, 0)], 31));
        assert!(
            e.contains("tensor `w`: offset 0 + 32 bytes runs past the end of the file"),
            "{e}"
        );
        let e = err(&with(
            &[tensor("w", &[4], 0, 0), tensor("w", &[4], 0, 32)],
            64,
        ));
        assert!(e.contains("tensor `w`: the name appears twice"), "{e}");
        let e = err(&with(&[tensor("w", &[u64::MAX, 2], 0, 0)], 32));
        assert!(e.contains("more than 2^64 elements"), "{e}");
        let e = err(&with(&[tensor("w", &[16], 8, 0)], 64));
        assert!(
            e.contains("ne[0] = 16 is not a whole number of Q8_0 blocks"),
            "{e}"
        );
        let e = err(&with(&[tensor("w", &[4], 0, 4)], 64));
        assert!(
            e.contains("offset 4 is not a multiple of the alignment 32"),
            "{e}"
        );
        let e = err(&with(&[tensor("w", &[1, 1, 1, 1, 1], 0, 0)], 32));
        assert!(e.contains("5 dimensions"), "{e}");
    }

    #[test]
    fn unknown_and_unsupported_types_are_listed_but_refused_by_name() {
        let mut rest = [tensor("k", &[256], 12, 0), tensor("u", &[4], 99, 0)].concat();
        rest.resize((24 + rest.len()).next_multiple_of(32) - 24 + 144, 0);
        let (_d, g) = open(&file(3, &[], 2, &rest));
        let g = g.unwrap();
        assert_eq!(g.tensors().len(), 2);
        let e = g.read_f32("k").unwrap_err().to_string();
        assert!(
            e.contains("tensor `k`: ggml type Q4_K cannot be read"),
            "{e}"
        );
        assert_eq!(g.read_raw("k").unwrap().len(), 144);
        let e = g.read_f32("u").unwrap_err().to_string();
        assert!(
            e.contains("tensor `u`: ggml type unknown ggml type 99 cannot be read"),
            "{e}"
        );
        let e = g.read_f32("nope").unwrap_err().to_string();
        assert!(
            e.contains("tensor `nope` is not in the file (2 tensors)"),
            "{e}"
        );
    }

    #[test]
    fn typed_getters_name_the_key_and_both_types() {
        let (_d, g) = open(&file(3, &[entry("n", 5, &3i32.to_le_bytes())], 0, &[]));
        let g = g.unwrap();
        let e = g.get_u32("n").unwrap_err().to_string();
        assert!(
            e.ends_with("metadata key `n`: expected u32, found i32"),
            "{e}"
        );
        let e = g.get_str_array("n").unwrap_err().to_string();
        assert!(e.ends_with("expected array of string, found i32"), "{e}");
        let e = g.get_u32("gone").unwrap_err().to_string();
        assert!(e.ends_with("metadata key `gone` is missing"), "{e}");
    }
}
