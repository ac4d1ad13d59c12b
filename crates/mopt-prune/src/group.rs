//! Dependency groups: the weight slices that must go together for one unit (a head, a neuron, a
//! channel, a layer) to disappear. An architecture describes each kind of group once, as a
//! [`GroupKind`]: where its units are ([`Member`]s: a parameter, an axis, indices) and what the
//! config looks like after removal. Scoring ([`score`]) and slicing ([`GroupKind::shrink`]) are
//! generic over those members, so a new layer type or group (the CNN path's conv channels tied
//! through shortcuts and BatchNorm) is one small implementation.

use std::collections::BTreeMap;

use crate::importance::{Criterion, Reduce};
use crate::table::ParamTable;

/// One slice of a group: the entries at `index` along `axis` of parameter `param`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub param: String,
    pub axis: usize,
    pub index: Vec<usize>,
}

impl Member {
    pub fn new(param: impl Into<String>, axis: usize, index: Vec<usize>) -> Self {
        Self {
            param: param.into(),
            axis,
            index,
        }
    }
}

/// Constraints of one group kind in a schedule.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rule {
    /// Units kept per scope, at least.
    pub min_keep: usize,
    /// Kept counts are a multiple of this (1: any count).
    pub multiple: usize,
    /// Scopes left whole.
    pub frozen_scopes: Vec<usize>,
    /// Units never removed (in every scope).
    pub frozen_units: Vec<usize>,
}

/// Units kept, per group kind (its [`GroupKind::name`]) and scope: indices into the current
/// model's units, ascending.
pub type Keep = BTreeMap<String, Vec<Vec<usize>>>;

/// Scores per group kind and scope, one per unit.
pub type GroupScores = BTreeMap<String, Vec<Vec<f64>>>;

/// One kind of dependency group of an architecture with config type `C`.
pub trait GroupKind {
    type Config;

    /// Its name in recipes (`targets = ["heads"]`).
    fn name(&self) -> &'static str;

    /// Ranking scopes (a layer each, or one for the whole model).
    fn scopes(&self, config: &Self::Config) -> usize;

    /// Whether scope `s` is layer `s` (its path, ratios and ignored layers follow the layer).
    fn layer_scoped(&self) -> bool;

    /// The path ratios match against; `s` is the scope, or for layer-scoped kinds the layer.
    fn scope_path(&self, s: usize) -> String;

    /// Units in scope `s`.
    fn units(&self, config: &Self::Config, s: usize) -> usize;

    /// Unit `u` of scope `s`.
    fn members(&self, config: &Self::Config, s: usize, u: usize) -> Vec<Member>;

    /// The config after keeping `keep[s]` units of every scope.
    fn resize(&self, config: &Self::Config, keep: &[Vec<usize>]) -> Self::Config;

    /// Slice `table` to keep `keep[s]` units of every scope: by default every removed unit's
    /// members go (along their axes); kinds whose removal is not slicing (whole layers) override.
    fn shrink(&self, config: &Self::Config, table: &mut ParamTable, keep: &[Vec<usize>]) {
        let mut gone: BTreeMap<(String, usize), Vec<usize>> = BTreeMap::new();
        for (s, kept) in keep.iter().enumerate() {
            for u in (0..self.units(config, s)).filter(|u| !kept.contains(u)) {
                for m in self.members(config, s, u) {
                    gone.entry((m.param, m.axis)).or_default().extend(m.index);
                }
            }
        }
        for ((param, axis), removed) in gone {
            let a = table
                .0
                .get_mut(&param)
                .unwrap_or_else(|| panic!("no parameter `{param}`"));
            let kept: Vec<usize> = (0..a.shape[axis])
                .filter(|i| !removed.contains(i))
                .collect();
            a.keep(axis, &kept);
        }
    }
}

/// Every unit's score: each member scored by `criterion` (with its gradient slice for Taylor),
/// the members reduced. `random` draws the random criterion's scores.
pub fn score<G: GroupKind + ?Sized>(
    kind: &G,
    config: &G::Config,
    weights: &ParamTable,
    grads: Option<&ParamTable>,
    criterion: Criterion,
    reduce: Reduce,
    random: &mut dyn FnMut() -> f64,
) -> Vec<Vec<f64>> {
    (0..kind.scopes(config))
        .map(|s| {
            (0..kind.units(config, s))
                .map(|u| {
                    if criterion == Criterion::Random {
                        return random();
                    }
                    let parts: Vec<f64> = kind
                        .members(config, s, u)
                        .iter()
                        .map(|m| {
                            let w = weights.get(&m.param);
                            let ws = w.slice(m.axis, &m.index);
                            let gs = grads
                                .and_then(|g| g.0.get(&m.param))
                                .filter(|g| g.shape == w.shape)
                                .map(|g| g.slice(m.axis, &m.index));
                            criterion.member(&ws, gs.as_deref())
                        })
                        .collect();
                    reduce.apply(&parts)
                })
                .collect()
        })
        .collect()
}
