//! The baseline analysis: where a model's parameters, FLOPs and forward time go, module by
//! module, before anything is compressed (a family measures it: [`crate::family::Family::analyse`];
//! BERT's word-embedding table can hold most parameters and cost almost no time).

use serde::{Deserialize, Serialize};

/// One module's row.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModuleRow {
    /// The module's path.
    pub module: String,
    /// Its parameters.
    pub params: usize,
    /// Its forward FLOPs an example.
    pub flops_per_example: u64,
    /// Measured share of the forward time at batch 1.
    pub time_share_b1: f64,
    /// Measured share of the forward time at batch 32.
    pub time_share_b32: f64,
}

/// The analysis of one model at one sequence length.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Analysis {
    /// Tokens an example.
    pub seq_len: usize,
    /// One row a module.
    pub rows: Vec<ModuleRow>,
    /// Summed module times of one forward pass (ms) at batch 1.
    pub forward_ms_b1: f64,
    /// The same at batch 32.
    pub forward_ms_b32: f64,
}
