//! # mopt-prune
//!
//! Structured pruning that really shrinks a model, for any [`Prunable`] model family. A
//! *dependency group* is the set of weight slices that must go together for a unit to
//! disappear ([`mopt_core::prune`]; BERT's are attention heads, FFN neurons, hidden channels and
//! whole layers). Units are scored by an [`importance::Criterion`] (L1, L2, first-order Taylor,
//! random; or activation-based, measured by the model) over their scored members ([`group::score`])
//! or measured on calibration batches ([`measure`]: Taylor gradients, activation statistics,
//! ablation), ranked per scope or globally under a
//! schedule ([`schedule`]), and removed physically ([`remove::prune`]): the result is a smaller
//! model built from a shrunken config that saves and reloads without knowing its history.

#![deny(missing_docs)]
pub mod group;
pub mod importance;
pub mod measure;
pub mod remove;
pub mod schedule;

pub use importance::{Criterion, Reduce};
pub use mopt_core::prune::{
    glob, ActivationStat, GroupKind, GroupScores, Keep, Limit, Member, Prunable, Role, Rule,
    UnitLimits,
};
pub use mopt_core::{Array, ParamTable};
pub use remove::{prune, scores};
pub use schedule::{
    keep_units, keep_units_in_runs, origin_after, select, units, Progress, Ranking, Units,
};
