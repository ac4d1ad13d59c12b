//! The prunable contract: dependency groups. A group is the set of weight slices that must go
//! together for one unit (a head, a neuron, a channel, a layer) to disappear. A model family
//! describes each kind of group once, as a [`GroupKind`]: where its units are ([`Member`]s: a
//! parameter, an axis, indices, a role) and what the config looks like after removal. The
//! algorithms (`mopt-prune`: importance, schedules, removal) are generic over those members.

use std::collections::BTreeMap;

use crate::model::Checkpoint;
use crate::table::ParamTable;

/// What a member is to importance scoring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Role {
    /// A trained weight: scored by the criterion and sliced.
    #[default]
    Scored,
    /// Sliced with the unit but never scored (a BatchNorm's running statistics, which have no
    /// gradient, or a tensor whose magnitude says nothing about the unit).
    Carried,
    /// A normalisation's per-unit scale (BatchNorm's γ): scored like a weight, and the only
    /// member the `bn-scale` criterion reads (Network Slimming, Liu et al., 2017).
    Scale,
}

/// One slice of a group: the entries at `index` along `axis` of parameter `param`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The parameter's path in the model (`stages.0.1.conv1.conv.weight`).
    pub param: String,
    /// The axis the unit's entries lie along.
    pub axis: usize,
    /// The unit's entries along `axis`.
    pub index: Vec<usize>,
    /// What the member is to importance scoring.
    pub role: Role,
}

impl Member {
    /// A scored member.
    pub fn new(param: impl Into<String>, axis: usize, index: Vec<usize>) -> Self {
        Self {
            param: param.into(),
            axis,
            index,
            role: Role::Scored,
        }
    }

    /// A normalisation scale: scored, and what the `bn-scale` criterion reads.
    pub fn scale(param: impl Into<String>, axis: usize, index: Vec<usize>) -> Self {
        Self {
            role: Role::Scale,
            ..Self::new(param, axis, index)
        }
    }

    /// A member sliced with its unit but not scored.
    pub fn carried(param: impl Into<String>, axis: usize, index: Vec<usize>) -> Self {
        Self {
            role: Role::Carried,
            ..Self::new(param, axis, index)
        }
    }
}

/// Constraints of one group kind in a schedule.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rule {
    /// Units kept per scope, at least (0: a scope may lose every unit, as a stage its
    /// removable blocks).
    pub min_keep: usize,
    /// Kept counts are a multiple of this (1: any count).
    pub multiple: usize,
    /// Scopes left whole.
    pub frozen_scopes: Vec<usize>,
    /// Units never removed (in every scope).
    pub frozen_units: Vec<usize>,
    /// The key of the [`Limit`] that set `min_keep` and `multiple`, if one did (errors name it).
    pub limit: Option<&'static str>,
}

impl Rule {
    /// Kept counts a positive multiple of `m` (at least `m`; 0 counts as 1), nothing frozen.
    pub fn multiple_of(m: usize) -> Self {
        let m = m.max(1);
        Self {
            min_keep: m,
            multiple: m,
            ..Self::default()
        }
    }

    /// Kept counts a positive multiple of `limit`'s value under `limits`, nothing frozen.
    pub fn multiple_of_limit(limit: &Limit, limits: &UnitLimits) -> Self {
        Self {
            limit: Some(limit.key),
            ..Self::multiple_of(limits.get(limit))
        }
    }
}

/// Units kept, per group kind (its [`GroupKind::name`]) and scope: indices into the current
/// model's units, ascending.
pub type Keep = BTreeMap<String, Vec<Vec<usize>>>;

/// Scores per group kind and scope, one per unit.
pub type GroupScores = BTreeMap<String, Vec<Vec<f64>>>;

/// One kind of dependency group of an architecture with config type `Config`.
pub trait GroupKind: Sync {
    /// The config of the models this kind describes.
    type Config;

    /// Its name in recipes (`targets = ["heads"]`).
    fn name(&self) -> &'static str;

    /// Ranking scopes (a layer each, or one for the whole model).
    fn scopes(&self, config: &Self::Config) -> usize;

    /// Whether scope `s` is layer `s` (its path, ratios and ignored layers follow the layer).
    /// True by default.
    fn layer_scoped(&self) -> bool {
        true
    }

    /// The path ratios match against; `s` is the scope, or for layer-scoped kinds the layer.
    /// `layers.{s}` by default.
    fn scope_path(&self, s: usize) -> String {
        format!("layers.{s}")
    }

    /// Units in scope `s`.
    fn units(&self, config: &Self::Config, s: usize) -> usize;

    /// Unit `u` of scope `s`.
    fn members(&self, config: &Self::Config, s: usize, u: usize) -> Vec<Member>;

    /// The runs scope `s`'s units fall in: `r` > 1 splits them into `r` equal runs of
    /// consecutive units that must keep equal counts, each run keeping its own best-scored
    /// units (a Llama layer's query heads, a run per key/value group, so that every group keeps
    /// as many queries). 1 (the default): the scope's best units, wherever they lie.
    fn runs(&self, _config: &Self::Config, _s: usize) -> usize {
        1
    }

    /// The config after keeping `keep[s]` units of every scope.
    fn resize(&self, config: &Self::Config, keep: &[Vec<usize>]) -> Self::Config;

    /// The limits its [`GroupKind::rule`] reads (none by default): the keys a `prune` stage
    /// targeting this kind takes.
    fn limits(&self) -> &'static [&'static Limit] {
        &[]
    }

    /// The constraints this kind follows under a schedule's `limits`. By default at least one
    /// unit per scope, any count, and the ignored layers left whole (layer-scoped kinds).
    fn rule(&self, limits: &UnitLimits) -> Rule {
        Rule {
            min_keep: 1,
            multiple: 1,
            frozen_scopes: if self.layer_scoped() {
                limits.ignore_layers.clone()
            } else {
                Vec::new()
            },
            frozen_units: Vec::new(),
            limit: None,
        }
    }

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

/// A setting a group kind's [`GroupKind::rule`] reads (a least count of heads, a multiple of
/// widths), declared by the kind that has it: its key in a `prune` stage, its default and what
/// it means. A stage takes exactly the limits its family's group kinds declare.
#[derive(Debug, PartialEq, Eq)]
pub struct Limit {
    /// Its key in a `prune` stage (`min-heads`).
    pub key: &'static str,
    /// The value when the stage does not set it.
    pub default: usize,
    /// What it bounds, for plans and errors (`attention heads kept per layer, at least`).
    pub about: &'static str,
}

/// Constraints every round keeps.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UnitLimits {
    /// The [`Limit`]s a stage set, by key (the others take their defaults).
    pub values: BTreeMap<&'static str, usize>,
    /// Layers (0-based, of the stage's input) left whole: their layer-scoped groups are not
    /// pruned and they are not removed. Groups running through every layer ignore this.
    pub ignore_layers: Vec<usize>,
    /// Per-scope targets: a glob over group paths (`encoder.layer.0.attention`,
    /// `encoder.layer.2.ffn`, `hidden`, `encoder.layers`; `*` matches anything) and the fraction removed there in the end.
    /// The most specific matching pattern (most literal characters) wins; unmatched groups use
    /// the stage's target.
    pub scopes: Vec<(String, f64)>,
}

/// `*`-glob match of `text` against `pattern`.
pub fn glob(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((head, rest)) => {
            let Some(tail) = text.strip_prefix(head) else {
                return false;
            };
            (0..=tail.len()).any(|i| tail.is_char_boundary(i) && glob(rest, &tail[i..]))
        }
    }
}

impl UnitLimits {
    /// The value of `limit`: the stage's, or its default.
    pub fn get(&self, limit: &Limit) -> usize {
        self.values.get(limit.key).copied().unwrap_or(limit.default)
    }

    /// The final fraction removed from the group at `path`.
    pub fn target_of(&self, path: &str, default: f64) -> f64 {
        self.scopes
            .iter()
            .filter(|(p, _)| glob(p, path))
            .max_by_key(|(p, _)| p.chars().filter(|c| *c != '*').count())
            .map_or(default, |(_, t)| *t)
    }
}

/// How a unit's activations over one sequence become its score (Minitron's activation-based
/// importance, Muralidharan et al., 2024): the mean of their magnitudes over the tokens, or
/// their root mean square. Scores are then averaged over the calibration sequences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActivationStat {
    /// `mean_t |a_t|`.
    Mean,
    /// `√(mean_t a_t²)`.
    L2,
}

/// A model whose units can be removed physically: its dependency group kinds, and a fresh model
/// of a (shrunken) config to load the sliced parameters into ([`Checkpoint::init`]). The
/// pruned model is a plain model of the smaller config: it saves and reloads with no history.
pub trait Prunable: Checkpoint {
    /// Every group kind, in the order removal applies them (unit indices refer to the model
    /// before any of them).
    fn group_kinds() -> Vec<&'static dyn GroupKind<Config = Self::Config>>;

    /// The group kind named `name` (`heads`, `channels`, …).
    fn group_kind(name: &str) -> Option<&'static dyn GroupKind<Config = Self::Config>> {
        Self::group_kinds().into_iter().find(|k| k.name() == name)
    }

    /// The number of layers that layer-scoped group kinds count (their scopes, `ignore-layers`,
    /// the input layer each pruned layer came from). 0 (the default): no layer-scoped kinds.
    fn layers(_config: &Self::Config) -> usize {
        0
    }

    /// Whether [`Prunable::activation_scores`] measures this family's groups (the
    /// `activation-*` criteria refuse the others). False by default.
    fn scores_activations() -> bool {
        false
    }

    /// Activation-based importance over one calibration batch: for every group kind (by name)
    /// and scope, one score a unit, **summed over the batch's sequences** (the caller divides
    /// by the number of sequences). What a unit's activation is belongs to the family (an
    /// attention head's output, an FFN neuron's gated value, a hidden channel's normalised
    /// values, a layer's block influence `1 − cos(input, output)`); `stat` reduces it over a
    /// sequence's tokens. `None` (the default): no activation statistics.
    fn activation_scores(
        &self,
        _config: &Self::Config,
        _batch: &Self::Batch,
        _stat: ActivationStat,
    ) -> Option<GroupScores> {
        None
    }
}
