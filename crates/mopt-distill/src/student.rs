//! The trainable distillation module: the student and the projections of its matches.

use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;

/// What the optimizer updates during distillation: the student `M` and the learned projections
/// of width-changing matches. Only `student` is checkpointed or exported.
#[derive(Module, Debug)]
pub struct DistillModel<M> {
    /// The student being distilled.
    pub student: M,
    /// The learned projections, one a width-changing match pair.
    pub projections: Vec<Linear>,
}

impl<M> DistillModel<M> {
    /// `student` with fresh projections of `(d_in, d_out)` each, on `device`.
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
