//! # mopt-prune
//!
//! Structured pruning that really shrinks a model. A *dependency group* is the set of weight
//! slices that must go together for a unit to disappear ([`group`]): for BERT ([`bert`]), an
//! attention head, an FFN neuron, a hidden (residual-stream) channel and a whole layer. Units
//! are scored by an [`importance::Criterion`] (L1, L2, first-order Taylor, random) over their
//! members, ranked per scope or globally under a schedule ([`schedule`]), and removed
//! physically ([`bert::prune`]): the result is a smaller model built from a shrunken config
//! (per-layer heads and FFN widths, hidden size, layer count) that saves and reloads without
//! knowing its history. A new architecture or group is a [`group::GroupKind`] implementation
//! over a [`table::ParamTable`] of its parameters.

pub mod bert;
pub mod group;
pub mod importance;
pub mod schedule;
pub mod table;

pub use bert::{prune, BertGroup};
pub use group::{GroupKind, GroupScores, Keep, Member, Rule};
pub use importance::{Criterion, Reduce};
pub use schedule::{
    glob, keep_units, origin_after, select, units, Progress, Ranking, UnitLimits, Units,
};
pub use table::{Array, ParamTable};
