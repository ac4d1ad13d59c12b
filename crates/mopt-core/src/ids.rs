//! Parameter ids in traversal order. Burn draws a random id for every parameter, keys optimizer
//! state and gradients by it, and burnpack files store it: renumbered, the same weights give the
//! same file, and a model read back from one has the ids its optimizer state was saved under.

use burn::module::{Module, ModuleMapper, Param};
use burn::prelude::Tensor;

struct Renumber(u64);

impl ModuleMapper for Renumber {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        self.0 += 1;
        let (_, value, mapper) = param.consume();
        Param::from_mapped_value(self.0.into(), value, mapper)
    }
}

/// `model` with its float parameters numbered 1, 2, … in traversal order (values, gradient
/// requirements and load mappers unchanged).
pub fn renumber_params<M: Module>(model: M) -> M {
    model.map(&mut Renumber(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::module::ModuleVisitor;
    use burn::nn::LinearConfig;

    struct Ids(Vec<u64>);
    impl ModuleVisitor for Ids {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.0.push(param.id.val());
        }
    }

    #[test]
    fn ids_follow_traversal_order_and_values_stay() {
        let device = Default::default();
        let a = LinearConfig::new(3, 2).init(&device);
        let w = a.weight.val().into_data();
        let b = renumber_params(a);
        let mut ids = Ids(Vec::new());
        b.visit(&mut ids);
        assert_eq!(ids.0, [1, 2]);
        assert_eq!(b.weight.val().into_data(), w);
    }
}
