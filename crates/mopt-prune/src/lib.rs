//! # mopt-prune
//!
//! Structured pruning that really shrinks a model. A *dependency group* is the set of weight
//! slices that must go together for a unit to disappear: for BERT, an attention head (its Q, K, V
//! output columns and biases and the matching input rows of the attention output projection) and
//! an FFN neuron (its up-projection column and bias and its down-projection row). Groups are
//! scored by an [`importance::Criterion`] (L1, L2, first-order Taylor, random), ranked per layer
//! or globally under a schedule ([`schedule`]), and removed physically ([`bert::prune`]): the
//! result is a smaller model built from a shrunken config (per-layer heads and FFN widths) that
//! saves and reloads without knowing its history.

pub mod bert;
pub mod importance;
pub mod schedule;

pub use bert::{prune, Keep, LayerTensors};
pub use importance::{Criterion, GroupScores, Reduce};
pub use schedule::{glob, group_path, select, Ranking, Targets, UnitLimits};
