//! The trainable distillation module: the student and the projections of its matches.

use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;

/// What the optimizer updates during distillation: the student `M` and the learned projections
/// of width-changing matches. Only `student` is checkpointed or exported.
#[derive(Module, Debug)]
pub struct DistillModel<M> {
    pub student: M,
    pub projections: Vec<Linear>,
}

impl<M> DistillModel<M> {
    pub fn new(student: M, projections: &[(usize, usize)], device: &Device) -> Self {
        Self {
            student,
            projections: projections
                .iter()
                .map(|&(i, o)| LinearConfig::new(i, o).init(device))
                .collect(),
        }
    }
}
