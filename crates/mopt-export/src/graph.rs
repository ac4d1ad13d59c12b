//! A small ONNX graph builder: unique value names, nodes, initializers.

use burn::module::Param;
use burn::prelude::*;

use crate::onnx::{
    attr_type, dtype, AttributeProto, GraphProto, NodeProto, TensorProto, ValueInfoProto,
};

/// A parameter's values, as f32 (initializers).
pub fn data<const D: usize>(p: &Param<Tensor<D>>) -> Vec<f32> {
    p.val()
        .into_data()
        .convert::<f32>()
        .try_to_vec()
        .expect("f32 parameter")
}

/// A parameter's dimensions.
pub fn dims<const D: usize>(p: &Param<Tensor<D>>) -> Vec<usize> {
    p.val().dims().to_vec()
}

/// Builds a [`GraphProto`] node by node.
#[derive(Default)]
pub struct GraphBuilder {
    nodes: Vec<NodeProto>,
    inits: Vec<TensorProto>,
    next: usize,
}

/// An integer attribute.
pub fn int(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        i: v,
        r#type: attr_type::INT,
        ..Default::default()
    }
}

/// An integer-list attribute.
pub fn ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        ints: v.to_vec(),
        r#type: attr_type::INTS,
        ..Default::default()
    }
}

/// A float attribute.
pub fn float(name: &str, v: f32) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        f: v,
        r#type: attr_type::FLOAT,
        ..Default::default()
    }
}

impl GraphBuilder {
    /// A fresh value name with a readable stem.
    pub fn fresh(&mut self, stem: &str) -> String {
        self.next += 1;
        format!("{stem}_{}", self.next)
    }

    /// Add a node with one output; returns the output's name.
    pub fn op(
        &mut self,
        op_type: &str,
        inputs: &[&str],
        attrs: Vec<AttributeProto>,
        stem: &str,
    ) -> String {
        let out = self.fresh(stem);
        self.op_into(op_type, inputs, attrs, &out);
        out
    }

    /// Add a node writing to the given output name.
    pub fn op_into(
        &mut self,
        op_type: &str,
        inputs: &[&str],
        attrs: Vec<AttributeProto>,
        output: &str,
    ) {
        let name = format!("{op_type}_{}", self.nodes.len());
        self.nodes.push(NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![output.to_string()],
            name,
            op_type: op_type.to_string(),
            attribute: attrs,
            domain: String::new(),
        });
    }

    fn init(&mut self, name: &str, data_type: i32, dims: &[usize], raw: Vec<u8>) -> String {
        self.inits.push(TensorProto {
            dims: dims.iter().map(|&d| d as i64).collect(),
            data_type,
            name: name.to_string(),
            raw_data: raw,
        });
        name.to_string()
    }

    /// An f32 initializer `name` of `dims`; returns its name.
    pub fn f32s(&mut self, name: &str, dims: &[usize], v: &[f32]) -> String {
        assert_eq!(
            dims.iter().product::<usize>(),
            v.len(),
            "{name}: shape/data mismatch"
        );
        self.init(
            name,
            dtype::FLOAT,
            dims,
            v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        )
    }

    /// An i64 initializer `name` of `dims`; returns its name.
    pub fn i64s(&mut self, name: &str, dims: &[usize], v: &[i64]) -> String {
        self.init(
            name,
            dtype::INT64,
            dims,
            v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        )
    }

    /// An i32 initializer `name` of `dims`; returns its name.
    pub fn i32s(&mut self, name: &str, dims: &[usize], v: &[i32]) -> String {
        self.init(
            name,
            dtype::INT32,
            dims,
            v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        )
    }

    /// An i8 initializer `name` of `dims`; returns its name.
    pub fn i8s(&mut self, name: &str, dims: &[usize], v: &[i8]) -> String {
        self.init(
            name,
            dtype::INT8,
            dims,
            v.iter().map(|&x| x as u8).collect(),
        )
    }

    /// A u8 initializer `name` of `dims`; returns its name.
    pub fn u8s(&mut self, name: &str, dims: &[usize], v: &[u8]) -> String {
        self.init(name, dtype::UINT8, dims, v.to_vec())
    }

    /// A scalar f32 constant (shared by name).
    pub fn scalar(&mut self, name: &str, v: f32) -> String {
        if self.inits.iter().any(|t| t.name == name) {
            return name.to_string();
        }
        self.f32s(name, &[], &[v])
    }

    /// A 1-D int64 constant (shared by name).
    pub fn shape(&mut self, name: &str, v: &[i64]) -> String {
        if self.inits.iter().any(|t| t.name == name) {
            return name.to_string();
        }
        self.i64s(name, &[v.len()], v)
    }

    /// The graph `name` with these inputs and outputs, its nodes and initializers.
    pub fn finish(
        self,
        name: &str,
        inputs: Vec<ValueInfoProto>,
        outputs: Vec<ValueInfoProto>,
    ) -> GraphProto {
        GraphProto {
            node: self.nodes,
            name: name.into(),
            initializer: self.inits,
            input: inputs,
            output: outputs,
        }
    }
}
