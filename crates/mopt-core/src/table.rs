//! A model's parameters as named host arrays: what importance criteria read and what pruning
//! slices. Names are the module paths Burn's traversal gives (`bert.encoder.layer.0.attention.
//! self_attn.query.weight`), so any Burn module has a table; [`ParamTable::load_into`] puts a
//! (sliced) table back into a module built from the shrunken config.

use std::collections::BTreeMap;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::prelude::*;
use burn::tensor::Gradients;

/// One parameter: its shape and row-major values.
#[derive(Debug, Clone, PartialEq)]
pub struct Array {
    /// The dimensions, outermost first.
    pub shape: Vec<usize>,
    /// The values, row-major.
    pub data: Vec<f32>,
}

impl Array {
    /// `(outer, len, inner)`: the array seen as `[outer, shape[axis], inner]`.
    fn split(&self, axis: usize) -> (usize, usize, usize) {
        let outer = self.shape[..axis].iter().product();
        let inner = self.shape[axis + 1..].iter().product();
        (outer, self.shape[axis], inner)
    }

    /// The values at `index` along `axis` (every other axis whole), in row-major order.
    ///
    /// # Panics
    /// When `axis` or an index is out of range (a group definition that does not fit the model).
    pub fn slice(&self, axis: usize, index: &[usize]) -> Vec<f32> {
        let (outer, len, inner) = self.split(axis);
        let mut out = Vec::with_capacity(outer * index.len() * inner);
        for o in 0..outer {
            for &i in index {
                assert!(i < len, "index {i} out of range {len} on axis {axis}");
                let start = (o * len + i) * inner;
                out.extend_from_slice(&self.data[start..start + inner]);
            }
        }
        out
    }

    /// Keep only `index` (ascending) along `axis`.
    pub fn keep(&mut self, axis: usize, index: &[usize]) {
        self.data = self.slice(axis, index);
        self.shape[axis] = index.len();
    }
}

/// Named parameters of a module.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParamTable(pub BTreeMap<String, Array>);

fn array<const D: usize>(t: Tensor<D>) -> Array {
    let shape = t.dims().to_vec();
    let data = t
        .into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .expect("f32 tensor");
    Array { shape, data }
}

struct Collect<'a> {
    path: Vec<String>,
    grads: Option<&'a Gradients>,
    out: ParamTable,
}

impl ModuleVisitor for Collect<'_> {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let t = match self.grads {
            None => Some(param.val()),
            Some(g) => param.val().grad(g),
        };
        if let Some(t) = t {
            self.out.0.insert(self.path.join("."), array(t));
        }
    }
}

struct Load<'a> {
    path: Vec<String>,
    table: &'a ParamTable,
    missing: Vec<String>,
}

impl ModuleMapper for Load<'_> {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.pop();
    }
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let name = self.path.join(".");
        let want = param.val().dims();
        match self.table.0.get(&name) {
            Some(a) if a.shape == want => {
                let device = param.val().device();
                Param::from_tensor(Tensor::from_data(
                    TensorData::new(a.data.clone(), want),
                    &device,
                ))
            }
            _ => {
                self.missing.push(name);
                param
            }
        }
    }
}

impl ParamTable {
    /// Every float parameter of `module`.
    pub fn weights<M: Module>(module: &M) -> Self {
        let mut c = Collect {
            path: Vec::new(),
            grads: None,
            out: Self::default(),
        };
        module.visit(&mut c);
        c.out
    }

    /// The gradients of `module`'s parameters from a backward pass (parameters without one are
    /// absent).
    pub fn gradients<M: Module>(module: &M, grads: &Gradients) -> Self {
        let mut c = Collect {
            path: Vec::new(),
            grads: Some(grads),
            out: Self::default(),
        };
        module.visit(&mut c);
        c.out
    }

    /// `self += other` elementwise, parameter by parameter (accumulating gradients).
    pub fn add(&mut self, other: &Self) {
        for (name, b) in &other.0 {
            match self.0.get_mut(name) {
                Some(a) if a.shape == b.shape => {
                    a.data.iter_mut().zip(&b.data).for_each(|(x, y)| *x += y)
                }
                _ => {
                    self.0.insert(name.clone(), b.clone());
                }
            }
        }
    }

    /// The parameter `name`.
    ///
    /// # Panics
    /// When the table has no such parameter (a group definition that does not fit the model).
    pub fn get(&self, name: &str) -> &Array {
        self.0
            .get(name)
            .unwrap_or_else(|| panic!("no parameter `{name}`"))
    }

    /// Put the table's values into `module` (built from the config the table fits). Every
    /// parameter must be present with the module's shape; the names of those that are not are
    /// returned as the error.
    pub fn load_into<M: Module>(&self, module: M) -> Result<M, Vec<String>> {
        let mut l = Load {
            path: Vec::new(),
            table: self,
            missing: Vec::new(),
        };
        let m = module.map(&mut l);
        if l.missing.is_empty() {
            Ok(m)
        } else {
            Err(l.missing)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slicing_follows_the_axis() {
        // [2, 3, 2]: values 0..12.
        let a = Array {
            shape: vec![2, 3, 2],
            data: (0..12).map(|x| x as f32).collect(),
        };
        assert_eq!(a.slice(0, &[1]), vec![6., 7., 8., 9., 10., 11.]);
        assert_eq!(a.slice(1, &[0, 2]), vec![0., 1., 4., 5., 6., 7., 10., 11.]);
        assert_eq!(a.slice(2, &[1]), vec![1., 3., 5., 7., 9., 11.]);
        let mut b = a.clone();
        b.keep(1, &[2]);
        assert_eq!(b.shape, vec![2, 1, 2]);
        assert_eq!(b.data, vec![4., 5., 10., 11.]);
    }
}
