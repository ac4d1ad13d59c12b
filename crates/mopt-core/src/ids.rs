//! Parameter ids. Burn draws a random id for every parameter (and BatchNorm running statistic)
//! and keys optimizer state and gradients by it. A model renumbered in traversal order has the
//! same ids in every process, so optimizer state saved by one matches the model of the next;
//! files are written without ids ([`WithoutIds`]), so the same weights give the same bytes and a
//! model read back keeps the ids it had.

use burn::module::{Module, ModuleMapper, Param};
use burn::prelude::Tensor;
use burn::store::burn_pack::Tensor as PackTensor;
use burn::store::{ModuleAdapter, ModuleContext};

/// A store adapter that writes tensors without their parameter ids (running statistics keep a
/// random id that no mapper can change; a file with ids would differ run to run).
#[derive(Debug, Clone, Copy, Default)]
pub struct WithoutIds;

impl ModuleAdapter for WithoutIds {
    fn adapt(&self, mut tensor: PackTensor, _ctx: ModuleContext<'_>) -> PackTensor {
        tensor.param_id = None;
        tensor
    }

    fn clone_box(&self) -> Box<dyn ModuleAdapter> {
        Box::new(*self)
    }
}

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
