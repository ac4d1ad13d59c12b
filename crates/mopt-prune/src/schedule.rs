//! Which units a round keeps: the cumulative fraction of the *original* units to remove after
//! this round, per layer (local ranking) or over the whole model (global), with a minimum kept
//! per layer and FFN widths rounded to a multiple.

use crate::bert::Keep;
use crate::importance::GroupScores;

/// Which group kinds are pruned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Targets {
    pub heads: bool,
    pub ffn: bool,
}

/// Ranking scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ranking {
    /// Each layer loses the same fraction of its own units.
    Local,
    /// Units compete across layers; the fraction holds for the model as a whole.
    Global,
}

impl Ranking {
    pub fn name(self) -> &'static str {
        match self {
            Ranking::Local => "local",
            Ranking::Global => "global",
        }
    }
}

/// Constraints every round keeps.
#[derive(Debug, Clone, PartialEq)]
pub struct UnitLimits {
    /// Heads kept per layer at least.
    pub min_heads: usize,
    /// FFN widths kept are a multiple of this (and at least this).
    pub ffn_multiple: usize,
    /// Layers (0-based) left whole.
    pub ignore_layers: Vec<usize>,
    /// Per-scope targets: a glob over group paths (`encoder.layer.0.attention`,
    /// `encoder.layer.2.ffn`; `*` matches anything) and the fraction removed there in the end.
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
    /// The final fraction removed from the group at `path`.
    pub fn target_of(&self, path: &str, default: f64) -> f64 {
        self.scopes
            .iter()
            .filter(|(p, _)| glob(p, path))
            .max_by_key(|(p, _)| p.chars().filter(|c| *c != '*').count())
            .map_or(default, |(_, t)| *t)
    }
}

/// The path of a layer's head group (`kind = "attention"`) or FFN group (`"ffn"`).
pub fn group_path(layer: usize, kind: &str) -> String {
    format!("encoder.layer.{layer}.{kind}")
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

/// The units a round keeps. `orig_heads` / `orig_ffn` are the unpruned model's per-layer counts;
/// after this round a group has lost `min(progress, its target)` of them, its target being its
/// scope's (see [`UnitLimits::scopes`]) or `target`.
#[allow(clippy::too_many_arguments)]
pub fn select(
    scores: &GroupScores,
    orig_heads: &[usize],
    orig_ffn: &[usize],
    progress: f64,
    target: f64,
    targets: Targets,
    limits: &UnitLimits,
    ranking: Ranking,
) -> Keep {
    let fracs = |kind: &str| -> Vec<f64> {
        (0..scores.heads.len())
            .map(|l| progress.min(limits.target_of(&group_path(l, kind), target)))
            .collect()
    };
    let heads = if targets.heads {
        let n = counts(
            &scores.heads,
            orig_heads,
            &fracs("attention"),
            ranking,
            limits.min_heads.max(1),
            &limits.ignore_layers,
        );
        scores.heads.iter().zip(n).map(|(s, n)| top(s, n)).collect()
    } else {
        scores
            .heads
            .iter()
            .map(|s| (0..s.len()).collect())
            .collect()
    };
    let ffn = if targets.ffn {
        let m = limits.ffn_multiple.max(1);
        let n = counts(
            &scores.ffn,
            orig_ffn,
            &fracs("ffn"),
            ranking,
            m,
            &limits.ignore_layers,
        );
        scores
            .ffn
            .iter()
            .enumerate()
            .zip(n)
            .map(|((l, s), n)| {
                let n = if limits.ignore_layers.contains(&l) {
                    s.len()
                } else {
                    round_to(n, m, s.len())
                };
                top(s, n)
            })
            .collect()
    } else {
        scores.ffn.iter().map(|s| (0..s.len()).collect()).collect()
    };
    Keep { heads, ffn }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> UnitLimits {
        UnitLimits {
            min_heads: 1,
            ffn_multiple: 4,
            ignore_layers: Vec::new(),
            scopes: Vec::new(),
        }
    }

    #[test]
    fn local_keeps_the_best_units_of_each_layer() {
        let s = GroupScores {
            heads: vec![vec![0.1, 0.9, 0.5, 0.3], vec![4.0, 3.0, 2.0, 1.0]],
            ffn: vec![
                (0..16).map(|i| i as f64).collect(),
                (0..16).map(|i| -(i as f64)).collect(),
            ],
        };
        let t = Targets {
            heads: true,
            ffn: true,
        };
        let k = select(
            &s,
            &[4, 4],
            &[16, 16],
            0.5,
            0.5,
            t,
            &limits(),
            Ranking::Local,
        );
        assert_eq!(k.heads, vec![vec![1, 2], vec![0, 1]]);
        assert_eq!(k.ffn[0], (8..16).collect::<Vec<_>>());
        assert_eq!(k.ffn[1], (0..8).collect::<Vec<_>>());
        // 90% leaves the minimum: one head, one FFN multiple.
        let k = select(
            &s,
            &[4, 4],
            &[16, 16],
            0.9,
            0.9,
            t,
            &limits(),
            Ranking::Local,
        );
        assert_eq!(k.heads, vec![vec![1], vec![0]]);
        assert_eq!(k.ffn[0], vec![12, 13, 14, 15]);
        // Ignored layers stay whole; FFN widths round to the multiple (16·0.7 = 11.2 → 12 kept).
        let l = UnitLimits {
            ignore_layers: vec![1],
            ..limits()
        };
        let k = select(&s, &[4, 4], &[16, 16], 0.3, 0.3, t, &l, Ranking::Local);
        assert_eq!(k.heads[1].len(), 4);
        assert_eq!(k.ffn[0].len(), 12);
    }

    #[test]
    fn scopes_set_their_own_targets_by_path_pattern() {
        assert!(glob("encoder.layer.*.ffn", "encoder.layer.12.ffn"));
        assert!(glob("encoder.layer.0.*", "encoder.layer.0.attention"));
        assert!(!glob("encoder.layer.0.*", "encoder.layer.10.attention"));
        assert!(glob("*", "anything"));
        let s = GroupScores {
            heads: vec![vec![1.0, 2.0, 3.0, 4.0]; 2],
            ffn: vec![(0..16).map(|i| i as f64).collect(); 2],
        };
        let l = UnitLimits {
            scopes: vec![
                ("encoder.layer.*.ffn".into(), 0.75),
                ("encoder.layer.1.ffn".into(), 0.25),
            ],
            ..limits()
        };
        let t = Targets {
            heads: true,
            ffn: true,
        };
        // Progress 0.5 of a 0.5 default: heads lose half; layer 0's FFN (scope 0.75) half so far,
        // layer 1's FFN (the more specific pattern, 0.25) stops at a quarter.
        let k = select(&s, &[4, 4], &[16, 16], 0.5, 0.5, t, &l, Ranking::Local);
        assert_eq!(
            (k.heads[0].len(), k.ffn[0].len(), k.ffn[1].len()),
            (2, 8, 12)
        );
        // Later rounds go on where the scope's target is higher.
        let k = select(&s, &[4, 4], &[16, 16], 0.8, 0.5, t, &l, Ranking::Local);
        assert_eq!(
            (k.heads[0].len(), k.ffn[0].len(), k.ffn[1].len()),
            (2, 4, 12)
        );
    }

    #[test]
    fn global_ranking_lets_layers_lose_different_amounts() {
        let s = GroupScores {
            heads: vec![vec![0.1, 0.2, 0.3, 0.4], vec![5.0, 6.0, 7.0, 8.0]],
            ffn: vec![vec![1.0; 4], vec![1.0; 4]],
        };
        let t = Targets {
            heads: true,
            ffn: false,
        };
        let k = select(
            &s,
            &[4, 4],
            &[4, 4],
            0.5,
            0.5,
            t,
            &limits(),
            Ranking::Global,
        );
        // Four heads go, all from layer 0, but it keeps its minimum of one.
        assert_eq!(k.heads, vec![vec![3], vec![1, 2, 3]]);
        assert_eq!(k.ffn, vec![vec![0, 1, 2, 3], vec![0, 1, 2, 3]]);
    }
}
