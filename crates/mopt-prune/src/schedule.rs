//! Which units a round keeps: the cumulative fraction of the *original* units to remove after
//! this round, per layer (local ranking) or over the whole model (global), with a minimum kept
//! per scope and kept counts rounded to a multiple, for every group kind pruned.

use std::collections::BTreeMap;

use mopt_core::prune::{GroupKind, GroupScores, Keep, Rule, UnitLimits};

/// Ranking scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ranking {
    /// Each layer loses the same fraction of its own units.
    Local,
    /// Units compete across layers; the fraction holds for the model as a whole.
    Global,
}

impl Ranking {
    /// The ranking's recipe name.
    pub fn name(self) -> &'static str {
        match self {
            Ranking::Local => "local",
            Ranking::Global => "global",
        }
    }
}

/// Indices of the `n` best-scored units, ascending.
fn top(scores: &[f64], n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    let mut keep: Vec<usize> = order.into_iter().take(n.min(scores.len())).collect();
    keep.sort_unstable();
    keep
}

fn round_to(n: usize, m: usize, max: usize) -> usize {
    let m = m.max(1);
    (((n + m / 2) / m) * m).max(m).min(max)
}

/// Per-layer counts to keep after removing `frac[l]` of `orig` units (local), or the best units
/// model-wide (global, one fraction). `scores[l]` are the current units of layer `l`.
fn counts(
    scores: &[Vec<f64>],
    orig: &[usize],
    frac: &[f64],
    ranking: Ranking,
    min_keep: usize,
    ignore: &[usize],
) -> Vec<usize> {
    let layers = scores.len();
    match ranking {
        Ranking::Local => (0..layers)
            .map(|l| {
                if ignore.contains(&l) {
                    return scores[l].len();
                }
                let want = orig[l] - (orig[l] as f64 * frac[l]).floor() as usize;
                want.max(min_keep).min(scores[l].len())
            })
            .collect(),
        Ranking::Global => {
            let total: usize = (0..layers)
                .filter(|l| !ignore.contains(l))
                .map(|l| orig[l])
                .sum();
            let mut to_remove = (total as f64 * frac[0]).floor() as usize;
            let already: usize = (0..layers)
                .filter(|l| !ignore.contains(l))
                .map(|l| orig[l] - scores[l].len())
                .sum();
            to_remove = to_remove.saturating_sub(already);
            let mut kept: Vec<usize> = scores.iter().map(|s| s.len()).collect();
            let mut all: Vec<(f64, usize)> = (0..layers)
                .filter(|l| !ignore.contains(l))
                .flat_map(|l| scores[l].iter().map(move |&s| (s, l)))
                .collect();
            all.sort_by(|a, b| a.0.total_cmp(&b.0));
            for (_, l) in all {
                if to_remove == 0 {
                    break;
                }
                if kept[l] > min_keep {
                    kept[l] -= 1;
                    to_remove -= 1;
                }
            }
            kept
        }
    }
}

/// The kept units of one group kind: `scores[s]` are scope `s`'s current units, `orig[s]` its
/// count in the stage's input, `frac[s]` the fraction of those removed after this round.
pub fn keep_units(
    scores: &[Vec<f64>],
    orig: &[usize],
    frac: &[f64],
    ranking: Ranking,
    rule: &Rule,
) -> Vec<Vec<usize>> {
    keep_units_in_runs(scores, orig, frac, ranking, rule, &[])
}

/// [`keep_units`] where scope `s`'s units form `runs[s]` equal runs of consecutive units
/// ([`GroupKind::runs`]; absent or 1: one run): the scope's count is rounded to a multiple of
/// its runs (to the nearest, never below `min_keep` nor one unit a run) and each run keeps its
/// own best units.
pub fn keep_units_in_runs(
    scores: &[Vec<f64>],
    orig: &[usize],
    frac: &[f64],
    ranking: Ranking,
    rule: &Rule,
    runs: &[usize],
) -> Vec<Vec<usize>> {
    let m = rule.multiple.max(1);
    let guarded: Vec<Vec<f64>> = scores
        .iter()
        .map(|s| {
            s.iter()
                .enumerate()
                .map(|(u, &x)| {
                    if rule.frozen_units.contains(&u) {
                        f64::INFINITY
                    } else {
                        x
                    }
                })
                .collect()
        })
        .collect();
    let n = counts(
        &guarded,
        orig,
        frac,
        ranking,
        rule.min_keep,
        &rule.frozen_scopes,
    );
    guarded
        .iter()
        .enumerate()
        .zip(n)
        .map(|((s, sc), n)| {
            if rule.frozen_scopes.contains(&s) {
                return top(sc, n);
            }
            let n = if m == 1 { n } else { round_to(n, m, sc.len()) };
            match runs.get(s).copied().unwrap_or(1) {
                r if r > 1 && sc.len().is_multiple_of(r) => top_in_runs(sc, n, r, rule.min_keep),
                _ => top(sc, n),
            }
        })
        .collect()
}

/// About `n` units of `scores` kept as `r` equal runs of consecutive units, each keeping its own
/// best: `n / r` a run, rounded to the nearest, at least one and at least `min_keep / r`
/// (rounded up), at most the run.
fn top_in_runs(scores: &[f64], n: usize, r: usize, min_keep: usize) -> Vec<usize> {
    let g = scores.len() / r;
    let each = ((n + r / 2) / r).max(min_keep.div_ceil(r)).clamp(1, g);
    (0..r)
        .flat_map(|k| {
            top(&scores[k * g..(k + 1) * g], each)
                .into_iter()
                .map(move |u| k * g + u)
        })
        .collect()
}

/// Unit counts per group kind and scope of the stage's input (`heads` → per layer, ...).
pub type Units = BTreeMap<String, Vec<usize>>;

/// The current shape's unit counts for `kinds`.
pub fn units<K: GroupKind + ?Sized>(kinds: &[&K], config: &K::Config) -> Units {
    kinds
        .iter()
        .map(|k| {
            let n = (0..k.scopes(config)).map(|s| k.units(config, s)).collect();
            (k.name().to_string(), n)
        })
        .collect()
}

/// Where a round is: the input's unit counts, which input layer each current layer is (layers
/// may have been removed), how far the schedule has come and its default target.
pub struct Progress<'a> {
    /// Unit counts of the stage's input, per kind and scope.
    pub orig: &'a Units,
    /// The input layer each current layer came from.
    pub origin: &'a [usize],
    /// Fraction of the input's units removed after this round.
    pub progress: f64,
    /// The stage's final fraction (scopes without a ratio of their own).
    pub target: f64,
}

/// The units a round keeps, per kind in `kinds` (each with its rule under `limits`): after it
/// a scope has lost `min(progress, its target)` of its input units, its target being its
/// path's ratio (see [`UnitLimits::scopes`]) or the default. Layer-scoped kinds read paths,
/// input counts and ignored layers by input layer.
pub fn select<K: GroupKind + ?Sized>(
    kinds: &[(&K, Rule)],
    scores: &GroupScores,
    config: &K::Config,
    at: &Progress,
    limits: &UnitLimits,
    ranking: Ranking,
) -> Keep {
    kinds
        .iter()
        .map(|(k, rule)| {
            let name = k.name();
            let n = k.scopes(config);
            let origin = |s: usize| if k.layer_scoped() { at.origin[s] } else { s };
            let orig: Vec<usize> = (0..n).map(|s| at.orig[name][origin(s)]).collect();
            let frac: Vec<f64> = (0..n)
                .map(|s| {
                    at.progress
                        .min(limits.target_of(&k.scope_path(origin(s)), at.target))
                })
                .collect();
            // Ignored layers are input layers: map them to where they are now.
            let now = |v: &[usize]| -> Vec<usize> {
                (0..at.origin.len())
                    .filter(|&l| v.contains(&at.origin[l]))
                    .collect()
            };
            let rule = Rule {
                frozen_scopes: if k.layer_scoped() {
                    now(&rule.frozen_scopes)
                } else {
                    rule.frozen_scopes.clone()
                },
                frozen_units: if k.layer_scoped() {
                    rule.frozen_units.clone()
                } else {
                    now(&rule.frozen_units)
                },
                ..rule.clone()
            };
            let runs: Vec<usize> = (0..n).map(|s| k.runs(config, s)).collect();
            let kept = keep_units_in_runs(&scores[name], &orig, &frac, ranking, &rule, &runs);
            (name.to_string(), kept)
        })
        .collect()
}

/// Which input layer each layer is after `keep` (its `layers` entry, when layers are pruned).
pub fn origin_after(origin: &[usize], keep: &Keep) -> Vec<usize> {
    match keep.get("layers") {
        Some(k) => k[0].iter().map(|&l| origin[l]).collect(),
        None => origin.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mopt_core::prune::glob;

    fn rule(min_keep: usize, multiple: usize) -> Rule {
        Rule {
            min_keep,
            multiple,
            ..Rule::default()
        }
    }

    #[test]
    fn local_keeps_the_best_units_of_each_scope() {
        let heads = vec![vec![0.1, 0.9, 0.5, 0.3], vec![4.0, 3.0, 2.0, 1.0]];
        let ffn: Vec<Vec<f64>> = vec![
            (0..16).map(|i| i as f64).collect(),
            (0..16).map(|i| -(i as f64)).collect(),
        ];
        let k = keep_units(&heads, &[4, 4], &[0.5, 0.5], Ranking::Local, &rule(1, 1));
        assert_eq!(k, vec![vec![1, 2], vec![0, 1]]);
        let k = keep_units(&ffn, &[16, 16], &[0.5, 0.5], Ranking::Local, &rule(4, 4));
        assert_eq!(k[0], (8..16).collect::<Vec<_>>());
        assert_eq!(k[1], (0..8).collect::<Vec<_>>());
        // 90% leaves the minimum: one head, one FFN multiple.
        let k = keep_units(&heads, &[4, 4], &[0.9, 0.9], Ranking::Local, &rule(1, 1));
        assert_eq!(k, vec![vec![1], vec![0]]);
        let k = keep_units(&ffn, &[16, 16], &[0.9, 0.9], Ranking::Local, &rule(4, 4));
        assert_eq!(k[0], vec![12, 13, 14, 15]);
        // Frozen scopes stay whole; widths round to the multiple (16·0.7 = 11.2 → 12 kept).
        let frozen = Rule {
            frozen_scopes: vec![1],
            ..rule(4, 4)
        };
        let k = keep_units(&ffn, &[16, 16], &[0.3, 0.3], Ranking::Local, &frozen);
        assert_eq!((k[0].len(), k[1].len()), (12, 16));
        // Frozen units survive even with the lowest score.
        let k = keep_units(
            &[vec![0.0, 5.0, 6.0]],
            &[3],
            &[0.6],
            Ranking::Local,
            &Rule {
                frozen_units: vec![0],
                ..rule(1, 1)
            },
        );
        assert_eq!(k, vec![vec![0, 2]]);
    }

    #[test]
    fn runs_keep_equal_counts_of_their_own_best_units() {
        // Two runs of three (a layer's query heads in two KV groups): the layer's best four
        // would be 0, 1, 2 and 5, three from the first run; each run keeps its best two.
        let s = vec![vec![0.9, 0.8, 0.7, 0.1, 0.2, 0.6]];
        let k = keep_units_in_runs(&s, &[6], &[0.34], Ranking::Local, &rule(1, 1), &[2]);
        assert_eq!(k, vec![vec![0, 1, 4, 5]]);
        assert_eq!(
            keep_units(&s, &[6], &[0.34], Ranking::Local, &rule(1, 1)),
            vec![vec![0, 1, 2, 5]]
        );
        // A count that is not a multiple rounds to the nearest (6 of 6 kept at 10%; 1 -> one a
        // run at 100%), and never below min_keep (3 -> two a run).
        let k = keep_units_in_runs(&s, &[6], &[0.1], Ranking::Local, &rule(1, 1), &[2]);
        assert_eq!(k, vec![vec![0, 1, 2, 3, 4, 5]]);
        let k = keep_units_in_runs(&s, &[6], &[1.0], Ranking::Local, &rule(1, 1), &[2]);
        assert_eq!(k, vec![vec![0, 5]]);
        let k = keep_units_in_runs(&s, &[6], &[1.0], Ranking::Local, &rule(3, 1), &[2]);
        assert_eq!(k, vec![vec![0, 1, 4, 5]]);
        // Global ranking: counts cross layers, each layer's then splits evenly over its runs.
        let s = vec![vec![0.1, 0.2, 0.3, 0.4], vec![5.0, 6.0, 7.0, 8.0]];
        let k = keep_units_in_runs(
            &s,
            &[4, 4],
            &[0.5, 0.5],
            Ranking::Global,
            &rule(1, 1),
            &[2, 2],
        );
        assert_eq!(k, vec![vec![1, 3], vec![0, 1, 2, 3]]);
    }

    #[test]
    fn rounds_never_over_prune_and_count_from_the_input() {
        // Round 2 of 10% steps on 10 input units of which 9 remain: 8 kept, not 9·0.8.
        let s = vec![(0..9).map(|i| i as f64).collect::<Vec<_>>()];
        let k = keep_units(&s, &[10], &[0.2], Ranking::Local, &rule(1, 1));
        assert_eq!(k, vec![(1..9).collect::<Vec<_>>()]);
        // A fraction that would remove everything keeps the minimum.
        let k = keep_units(&s, &[10], &[1.0], Ranking::Local, &rule(2, 1));
        assert_eq!(k, vec![vec![7, 8]]);
    }

    #[test]
    fn scopes_set_their_own_targets_by_path_pattern() {
        assert!(glob("encoder.layer.*.ffn", "encoder.layer.12.ffn"));
        assert!(glob("encoder.layer.0.*", "encoder.layer.0.attention"));
        assert!(!glob("encoder.layer.0.*", "encoder.layer.10.attention"));
        assert!(glob("*", "anything"));
        let l = UnitLimits {
            values: Default::default(),
            ignore_layers: Vec::new(),
            scopes: vec![
                ("encoder.layer.*.ffn".into(), 0.75),
                ("encoder.layer.1.ffn".into(), 0.25),
            ],
        };
        assert_eq!(l.target_of("encoder.layer.0.ffn", 0.5), 0.75);
        assert_eq!(l.target_of("encoder.layer.1.ffn", 0.5), 0.25);
        assert_eq!(l.target_of("encoder.layer.1.attention", 0.5), 0.5);
    }

    #[test]
    fn global_ranking_lets_scopes_lose_different_amounts() {
        let s = vec![vec![0.1, 0.2, 0.3, 0.4], vec![5.0, 6.0, 7.0, 8.0]];
        let k = keep_units(&s, &[4, 4], &[0.5, 0.5], Ranking::Global, &rule(1, 1));
        // Four heads go, all from layer 0, but it keeps its minimum of one.
        assert_eq!(k, vec![vec![3], vec![1, 2, 3]]);
    }
}
