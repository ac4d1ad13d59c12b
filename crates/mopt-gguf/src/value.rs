//! GGUF metadata values: the thirteen value types of the format, arrays included (nested ones
//! too), typed the way the file types them.

use std::fmt;

/// A metadata value's type, by its id in the file (`gguf_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ValueType {
    /// `uint8` (id 0).
    U8,
    /// `int8` (1).
    I8,
    /// `uint16` (2).
    U16,
    /// `int16` (3).
    I16,
    /// `uint32` (4).
    U32,
    /// `int32` (5).
    I32,
    /// `float32` (6).
    F32,
    /// `bool` (7): one byte, 0 or 1.
    Bool,
    /// `string` (8): a u64 byte length, then UTF-8 without a terminator.
    String,
    /// `array` (9): a u32 element type, a u64 count, then the elements.
    Array,
    /// `uint64` (10).
    U64,
    /// `int64` (11).
    I64,
    /// `float64` (12).
    F64,
}

const ORDER: [ValueType; 13] = [
    ValueType::U8,
    ValueType::I8,
    ValueType::U16,
    ValueType::I16,
    ValueType::U32,
    ValueType::I32,
    ValueType::F32,
    ValueType::Bool,
    ValueType::String,
    ValueType::Array,
    ValueType::U64,
    ValueType::I64,
    ValueType::F64,
];

impl ValueType {
    /// The type with this id, or `None`.
    pub fn from_id(id: u32) -> Option<Self> {
        ORDER.get(usize::try_from(id).ok()?).copied()
    }

    /// The id the file stores.
    pub fn id(self) -> u32 {
        ORDER.iter().position(|t| *t == self).unwrap_or(0) as u32
    }

    /// The fewest bytes a value of this type takes in a file (a fixed size, or the headers of a
    /// string or an array): what bounds a count read from the file.
    pub fn min_bytes(self) -> u64 {
        match self {
            Self::U8 | Self::I8 | Self::Bool => 1,
            Self::U16 | Self::I16 => 2,
            Self::U32 | Self::I32 | Self::F32 => 4,
            Self::U64 | Self::I64 | Self::F64 | Self::String => 8,
            Self::Array => 12,
        }
    }

    /// The name errors use (`u32`, `string`).
    pub fn name(self) -> &'static str {
        match self {
            Self::U8 => "u8",
            Self::I8 => "i8",
            Self::U16 => "u16",
            Self::I16 => "i16",
            Self::U32 => "u32",
            Self::I32 => "i32",
            Self::F32 => "f32",
            Self::Bool => "bool",
            Self::String => "string",
            Self::Array => "array",
            Self::U64 => "u64",
            Self::I64 => "i64",
            Self::F64 => "f64",
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `uint8`.
    U8(u8),
    /// `int8`.
    I8(i8),
    /// `uint16`.
    U16(u16),
    /// `int16`.
    I16(i16),
    /// `uint32`.
    U32(u32),
    /// `int32`.
    I32(i32),
    /// `float32`.
    F32(f32),
    /// `bool`.
    Bool(bool),
    /// `string`.
    String(String),
    /// `array`.
    Array(Array),
    /// `uint64`.
    U64(u64),
    /// `int64`.
    I64(i64),
    /// `float64`.
    F64(f64),
}

/// An array value: elements of one type, stored unboxed.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    /// `uint8` elements.
    U8(Vec<u8>),
    /// `int8` elements.
    I8(Vec<i8>),
    /// `uint16` elements.
    U16(Vec<u16>),
    /// `int16` elements.
    I16(Vec<i16>),
    /// `uint32` elements.
    U32(Vec<u32>),
    /// `int32` elements.
    I32(Vec<i32>),
    /// `float32` elements.
    F32(Vec<f32>),
    /// `bool` elements.
    Bool(Vec<bool>),
    /// `string` elements.
    String(Vec<String>),
    /// Nested arrays (each with its own element type).
    Array(Vec<Array>),
    /// `uint64` elements.
    U64(Vec<u64>),
    /// `int64` elements.
    I64(Vec<i64>),
    /// `float64` elements.
    F64(Vec<f64>),
}

impl Value {
    /// The value's type.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// The type as errors name it: `u32`, `array of string`.
    pub fn describe(&self) -> String {
        match self {
            Value::Array(a) => a.describe(),
            v => v.value_type().name().to_string(),
        }
    }
}

impl Array {
    /// The element type.
    pub fn element_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `array of <element type>` (nested arrays say `array of array`).
    pub fn describe(&self) -> String {
        format!("array of {}", self.element_type())
    }
}

macro_rules! from_scalar {
    ($($t:ty => $v:ident),*) => {$(
        impl From<$t> for Value {
            fn from(x: $t) -> Self {
                Value::$v(x)
            }
        }
        impl From<Vec<$t>> for Value {
            fn from(x: Vec<$t>) -> Self {
                Value::Array(Array::$v(x))
            }
        }
    )*};
}

from_scalar!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32,
    bool => Bool, String => String, u64 => U64, i64 => I64, f64 => F64);

impl From<&str> for Value {
    fn from(x: &str) -> Self {
        Value::String(x.to_string())
    }
}

impl From<Array> for Value {
    fn from(x: Array) -> Self {
        Value::Array(x)
    }
}

impl From<&[&str]> for Value {
    fn from(x: &[&str]) -> Self {
        Value::Array(Array::String(x.iter().map(|s| s.to_string()).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_unknown_ids_are_none() {
        for id in 0..13 {
            assert_eq!(ValueType::from_id(id).unwrap().id(), id);
        }
        assert_eq!(ValueType::from_id(13), None);
        assert_eq!(ValueType::from_id(u32::MAX), None);
        assert_eq!(ValueType::from_id(8), Some(ValueType::String));
    }

    #[test]
    fn values_describe_their_type() {
        assert_eq!(Value::from(3u32).describe(), "u32");
        assert_eq!(Value::from(vec![1i32]).describe(), "array of i32");
        assert_eq!(Value::from(&["a", "b"][..]).describe(), "array of string");
        assert_eq!(
            Value::Array(Array::Array(vec![])).describe(),
            "array of array"
        );
    }
}
