//! The subset of ONNX's protobuf messages mopt writes, declared with `prost` derives.
//!
//! Field numbers follow `onnx.proto` (ONNX IR); only the fields mopt needs are declared, which
//! protobuf allows: readers skip nothing and find every field they require.

use prost::Message;

/// `onnx.TensorProto.DataType` values used here.
pub mod dtype {
    /// 32-bit float.
    pub const FLOAT: i32 = 1;
    /// Unsigned 8-bit integer.
    pub const UINT8: i32 = 2;
    /// Signed 8-bit integer.
    pub const INT8: i32 = 3;
    /// Signed 32-bit integer.
    pub const INT32: i32 = 6;
    /// Signed 64-bit integer.
    pub const INT64: i32 = 7;
}

/// `onnx.AttributeProto.AttributeType` values used here.
pub mod attr_type {
    /// A float attribute.
    pub const FLOAT: i32 = 1;
    /// An integer attribute.
    pub const INT: i32 = 2;
    /// A list of integers.
    pub const INTS: i32 = 7;
}

#[derive(Clone, PartialEq, Message)]
/// `onnx.ModelProto`: a model, its graph and metadata.
pub struct ModelProto {
    #[prost(int64, tag = "1")]
    /// onnx.proto's `ir_version`.
    pub ir_version: i64,
    #[prost(string, tag = "2")]
    /// onnx.proto's `producer_name`.
    pub producer_name: String,
    #[prost(string, tag = "3")]
    /// onnx.proto's `producer_version`.
    pub producer_version: String,
    #[prost(string, tag = "6")]
    /// onnx.proto's `doc_string`.
    pub doc_string: String,
    #[prost(message, optional, tag = "7")]
    /// onnx.proto's `graph`.
    pub graph: Option<GraphProto>,
    #[prost(message, repeated, tag = "8")]
    /// onnx.proto's `opset_import`.
    pub opset_import: Vec<OperatorSetIdProto>,
    #[prost(message, repeated, tag = "14")]
    /// onnx.proto's `metadata_props`.
    pub metadata_props: Vec<StringStringEntryProto>,
}

#[derive(Clone, PartialEq, Message)]
/// `onnx.StringStringEntryProto`: one metadata entry.
pub struct StringStringEntryProto {
    #[prost(string, tag = "1")]
    /// onnx.proto's `key`.
    pub key: String,
    #[prost(string, tag = "2")]
    /// onnx.proto's `value`.
    pub value: String,
}

#[derive(Clone, PartialEq, Message)]
/// `onnx.OperatorSetIdProto`: an opset the model imports.
pub struct OperatorSetIdProto {
    #[prost(string, tag = "1")]
    /// onnx.proto's `domain`.
    pub domain: String,
    #[prost(int64, tag = "2")]
    /// onnx.proto's `version`.
    pub version: i64,
}

#[derive(Clone, PartialEq, Message)]
/// `onnx.GraphProto`: nodes, initializers, inputs and outputs.
pub struct GraphProto {
    #[prost(message, repeated, tag = "1")]
    /// onnx.proto's `node`.
    pub node: Vec<NodeProto>,
    #[prost(string, tag = "2")]
    /// onnx.proto's `name`.
    pub name: String,
    #[prost(message, repeated, tag = "5")]
    /// onnx.proto's `initializer`.
    pub initializer: Vec<TensorProto>,
    #[prost(message, repeated, tag = "11")]
    /// onnx.proto's `input`.
    pub input: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "12")]
    /// onnx.proto's `output`.
    pub output: Vec<ValueInfoProto>,
}

#[derive(Clone, PartialEq, Message)]
/// `onnx.NodeProto`: one operator call.
pub struct NodeProto {
    #[prost(string, repeated, tag = "1")]
    /// onnx.proto's `input`.
    pub input: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    /// onnx.proto's `output`.
    pub output: Vec<String>,
    #[prost(string, tag = "3")]
    /// onnx.proto's `name`.
    pub name: String,
    #[prost(string, tag = "4")]
    /// onnx.proto's `op_type`.
    pub op_type: String,
    #[prost(message, repeated, tag = "5")]
    /// onnx.proto's `attribute`.
    pub attribute: Vec<AttributeProto>,
    #[prost(string, tag = "7")]
    /// onnx.proto's `domain`.
    pub domain: String,
}

#[derive(Clone, PartialEq, Message)]
/// `onnx.AttributeProto`: one attribute of a node (float, int or ints here).
pub struct AttributeProto {
    #[prost(string, tag = "1")]
    /// onnx.proto's `name`.
    pub name: String,
    #[prost(float, tag = "2")]
    /// onnx.proto's `f`.
    pub f: f32,
    #[prost(int64, tag = "3")]
    /// onnx.proto's `i`.
    pub i: i64,
    #[prost(int64, repeated, tag = "8")]
    /// onnx.proto's `ints`.
    pub ints: Vec<i64>,
    #[prost(int32, tag = "20")]
    /// onnx.proto's `type`.
    pub r#type: i32,
}

#[derive(Clone, PartialEq, Message)]
/// `onnx.TensorProto`: an initializer's dims, type and raw little-endian data.
pub struct TensorProto {
    #[prost(int64, repeated, tag = "1")]
    /// onnx.proto's `dims`.
    pub dims: Vec<i64>,
    #[prost(int32, tag = "2")]
    /// onnx.proto's `data_type`.
    pub data_type: i32,
    #[prost(string, tag = "8")]
    /// onnx.proto's `name`.
    pub name: String,
    /// Little-endian element bytes.
    #[prost(bytes = "vec", tag = "9")]
    pub raw_data: Vec<u8>,
}

#[derive(Clone, PartialEq, Message)]
/// `onnx.ValueInfoProto`: a graph input or output's name and type.
pub struct ValueInfoProto {
    #[prost(string, tag = "1")]
    /// onnx.proto's `name`.
    pub name: String,
    #[prost(message, optional, tag = "2")]
    /// onnx.proto's `type`.
    pub r#type: Option<TypeProto>,
}

#[derive(Clone, PartialEq, Message)]
/// `onnx.TypeProto` (tensor types only).
pub struct TypeProto {
    #[prost(message, optional, tag = "1")]
    /// onnx.proto's `tensor_type`.
    pub tensor_type: Option<TensorTypeProto>,
}

/// `onnx.TypeProto.Tensor`.
#[derive(Clone, PartialEq, Message)]
pub struct TensorTypeProto {
    #[prost(int32, tag = "1")]
    /// onnx.proto's `elem_type`.
    pub elem_type: i32,
    #[prost(message, optional, tag = "2")]
    /// onnx.proto's `shape`.
    pub shape: Option<TensorShapeProto>,
}

#[derive(Clone, PartialEq, Message)]
/// `onnx.TensorShapeProto`: dimensions, fixed or symbolic.
pub struct TensorShapeProto {
    #[prost(message, repeated, tag = "1")]
    /// onnx.proto's `dim`.
    pub dim: Vec<Dimension>,
}

/// `onnx.TensorShapeProto.Dimension`: a fixed size or a symbolic name.
#[derive(Clone, PartialEq, Message)]
pub struct Dimension {
    #[prost(oneof = "DimValue", tags = "1, 2")]
    /// onnx.proto's `value`.
    pub value: Option<DimValue>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
/// A dimension's value: fixed, or a symbolic name.
pub enum DimValue {
    #[prost(int64, tag = "1")]
    /// A fixed size.
    Value(i64),
    #[prost(string, tag = "2")]
    /// A symbolic (dynamic) size.
    Param(String),
}

/// A graph dimension: fixed or named (dynamic).
#[derive(Debug, Clone)]
pub enum Dim {
    /// A fixed size.
    Fixed(i64),
    /// A named, dynamic size (`batch`).
    Named(&'static str),
}

/// A tensor value description for graph inputs and outputs.
pub fn value_info(name: &str, elem_type: i32, dims: &[Dim]) -> ValueInfoProto {
    ValueInfoProto {
        name: name.to_string(),
        r#type: Some(TypeProto {
            tensor_type: Some(TensorTypeProto {
                elem_type,
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|d| Dimension {
                            value: Some(match d {
                                Dim::Fixed(v) => DimValue::Value(*v),
                                Dim::Named(n) => DimValue::Param((*n).to_string()),
                            }),
                        })
                        .collect(),
                }),
            }),
        }),
    }
}

/// Opset and IR version of every model mopt writes.
pub const OPSET: i64 = 17;
/// ONNX IR version of every model mopt writes.
pub const IR_VERSION: i64 = 8;

impl ModelProto {
    /// A model around `graph` at opset 17 / IR 8, produced by mopt, with metadata entries.
    pub fn new(graph: GraphProto, doc: &str, metadata: &[(&str, String)]) -> Self {
        ModelProto {
            ir_version: IR_VERSION,
            producer_name: "mopt".into(),
            producer_version: env!("CARGO_PKG_VERSION").into(),
            doc_string: doc.into(),
            graph: Some(graph),
            opset_import: vec![OperatorSetIdProto {
                domain: String::new(),
                version: OPSET,
            }],
            metadata_props: metadata
                .iter()
                .map(|(k, v)| StringStringEntryProto {
                    key: k.to_string(),
                    value: v.clone(),
                })
                .collect(),
        }
    }

    /// The model as protobuf bytes (an `.onnx` file's contents).
    pub fn to_bytes(&self) -> Vec<u8> {
        self.encode_to_vec()
    }
}
