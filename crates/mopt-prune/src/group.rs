//! Scoring the units of a model's dependency groups ([`mopt_core::prune`]).

use mopt_core::prune::GroupKind;
use mopt_core::ParamTable;

use crate::importance::{Criterion, Reduce};

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
                        .filter(|m| criterion.scores(m.role))
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

#[cfg(test)]
mod tests {
    use super::*;
    use mopt_core::prune::{Member, Rule};
    use mopt_core::Array;

    /// Two channels of a conv-like weight `w` [2, 3] (axis 0), each with a BatchNorm running
    /// mean entry that has no gradient.
    struct Channels;

    impl GroupKind for Channels {
        type Config = ();
        fn name(&self) -> &'static str {
            "channels"
        }
        fn scopes(&self, _: &()) -> usize {
            1
        }
        fn layer_scoped(&self) -> bool {
            false
        }
        fn scope_path(&self, _: usize) -> String {
            "channels".into()
        }
        fn units(&self, _: &(), _: usize) -> usize {
            2
        }
        fn members(&self, _: &(), _: usize, u: usize) -> Vec<Member> {
            vec![
                Member::new("w", 0, vec![u]),
                Member::scale("gamma", 0, vec![u]),
                Member::carried("running_mean", 0, vec![u]),
            ]
        }
        fn resize(&self, _: &(), _: &[Vec<usize>]) {}
    }

    fn table(w: Vec<f32>, mean: Vec<f32>) -> ParamTable {
        let mut t = ParamTable::default();
        t.0.insert(
            "w".into(),
            Array {
                shape: vec![2, 3],
                data: w,
            },
        );
        t.0.insert(
            "running_mean".into(),
            Array {
                shape: vec![2],
                data: mean,
            },
        );
        t.0.insert(
            "gamma".into(),
            Array {
                shape: vec![2],
                data: vec![0.25, -4.0],
            },
        );
        t
    }

    #[test]
    fn carried_members_are_sliced_but_not_scored() {
        let w = table(vec![1., -2., 3., 0.5, 0.5, -0.5], vec![100., -7.]);
        let mut never = || unreachable!();
        let l1 = score(
            &Channels,
            &(),
            &w,
            None,
            Criterion::L1,
            Reduce::Sum,
            &mut never,
        );
        // The running means (100, -7) would dominate L1 if they were scored; γ is.
        assert_eq!(l1, vec![vec![6.25, 5.5]]);
        // bn-scale reads γ alone: the order flips.
        let bn = score(
            &Channels,
            &(),
            &w,
            None,
            Criterion::BnScale,
            Reduce::Sum,
            &mut never,
        );
        assert_eq!(bn, vec![vec![0.25, 4.0]]);
        // Taylor: the carried member needs no gradient.
        let mut g = ParamTable::default();
        g.0.insert("w".into(), w.get("w").clone());
        g.0.insert("gamma".into(), w.get("gamma").clone());
        let t = score(
            &Channels,
            &(),
            &w,
            Some(&g),
            Criterion::Taylor,
            Reduce::Sum,
            &mut never,
        );
        assert_eq!(t, vec![vec![14.0 + 0.0625, 0.75 + 16.0]]);
        // Removal slices both.
        let mut sliced = w.clone();
        Channels.shrink(&(), &mut sliced, &[vec![1]]);
        assert_eq!(sliced.get("w").data, vec![0.5, 0.5, -0.5]);
        assert_eq!(sliced.get("running_mean").data, vec![-7.0]);
        assert_eq!(sliced.get("gamma").data, vec![-4.0]);
        assert_eq!(
            Channels.rule(&limits()),
            Rule {
                min_keep: 1,
                multiple: 1,
                ..Rule::default()
            }
        );
    }

    fn limits() -> mopt_core::prune::UnitLimits {
        mopt_core::prune::UnitLimits {
            values: Default::default(),
            ignore_layers: vec![0],
            scopes: Vec::new(),
        }
    }
}
