//! Importance criteria: one number per dependency group, from its members' weights (and, for
//! Taylor, their accumulated gradients). Each member (a weight slice) is scored, then the
//! members' scores are reduced to the group's.

use serde::{Deserialize, Serialize};

/// How a weight slice is scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Criterion {
    /// Σ |w|.
    L1,
    /// √Σ w².
    L2,
    /// First-order Taylor: Σ |w · g|, g the gradient accumulated over training batches.
    Taylor,
    /// Uniform in [0, 1), seeded: the control.
    Random,
    /// Σ |γ| over the group's normalisation scales only (BatchNorm's γ, Network Slimming):
    /// for groups whose units each own a normalisation entry.
    BnScale,
    /// Minitron's activation-based importance: each unit's activations over calibration
    /// sequences, the mean of their magnitudes a sequence (then averaged over the sequences);
    /// whole layers by block influence, `1 − cos(input, output)`. Measured by the model
    /// ([`mopt_core::Prunable::activation_scores`]), not from weights.
    ActivationMean,
    /// As [`Criterion::ActivationMean`] with the root mean square over a sequence's tokens.
    ActivationL2,
    /// Ablation: a unit's score is the rise of the calibration loss when that unit alone is
    /// removed (Minitron's perplexity-based depth importance, for any group kind whose units
    /// can go one at a time). Measured by the stage, one evaluation a unit.
    Ablation,
}

impl Criterion {
    /// The criterion's recipe name (`taylor`, `bn-scale`, …).
    pub fn name(self) -> &'static str {
        match self {
            Criterion::L1 => "l1",
            Criterion::L2 => "l2",
            Criterion::Taylor => "taylor",
            Criterion::Random => "random",
            Criterion::BnScale => "bn-scale",
            Criterion::ActivationMean => "activation-mean",
            Criterion::ActivationL2 => "activation-l2",
            Criterion::Ablation => "ablation",
        }
    }

    /// The statistic of an activation-based criterion; `None` for those scored from weights.
    pub fn activation(self) -> Option<mopt_core::prune::ActivationStat> {
        use mopt_core::prune::ActivationStat;
        match self {
            Criterion::ActivationMean => Some(ActivationStat::Mean),
            Criterion::ActivationL2 => Some(ActivationStat::L2),
            _ => None,
        }
    }

    /// Whether a member of `role` is scored.
    pub fn scores(self, role: mopt_core::prune::Role) -> bool {
        use mopt_core::prune::Role;
        match self {
            Criterion::BnScale => role == Role::Scale,
            _ => role != Role::Carried,
        }
    }

    /// Whether scores need gradients.
    pub fn needs_gradients(self) -> bool {
        self == Criterion::Taylor
    }

    /// Score of one member: its weights `w` and, for Taylor, their gradients `g` (same length).
    pub fn member(self, w: &[f32], g: Option<&[f32]>) -> f64 {
        match self {
            Criterion::L1 | Criterion::BnScale => w.iter().map(|x| x.abs() as f64).sum(),
            Criterion::L2 => w.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt(),
            Criterion::Taylor => {
                let g = g.expect("Taylor importance needs gradients");
                w.iter()
                    .zip(g)
                    .map(|(x, d)| (*x as f64 * *d as f64).abs())
                    .sum()
            }
            Criterion::Random
            | Criterion::ActivationMean
            | Criterion::ActivationL2
            | Criterion::Ablation => 0.0,
        }
    }
}

/// How the members' scores become the group's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reduce {
    /// The sum of the members' scores.
    Sum,
    /// Their mean.
    Mean,
    /// Their maximum.
    Max,
}

impl Reduce {
    /// The reduction's recipe name.
    pub fn name(self) -> &'static str {
        match self {
            Reduce::Sum => "sum",
            Reduce::Mean => "mean",
            Reduce::Max => "max",
        }
    }

    /// The group's score from its members' `scores`.
    pub fn apply(self, scores: &[f64]) -> f64 {
        match self {
            Reduce::Sum => scores.iter().sum(),
            Reduce::Mean => scores.iter().sum::<f64>() / scores.len().max(1) as f64,
            Reduce::Max => scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
        }
    }
}

/// SplitMix64 in [0, 1), for the random criterion.
pub fn uniform(seed: u64, i: u64) -> f64 {
    let mut z = seed.wrapping_add(0x9E3779B97F4A7C15u64.wrapping_mul(i + 1));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
    ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn criteria_and_reductions_on_hand_values() {
        let w = [1.0f32, -2.0, 2.0];
        let g = [0.5f32, 0.25, -1.0];
        assert_eq!(Criterion::L1.member(&w, None), 5.0);
        assert_eq!(Criterion::L2.member(&w, None), 3.0);
        // |1·0.5| + |−2·0.25| + |2·−1| = 3
        assert_eq!(Criterion::Taylor.member(&w, Some(&g)), 3.0);
        assert_eq!(Reduce::Sum.apply(&[1.0, 2.0, 6.0]), 9.0);
        assert_eq!(Reduce::Mean.apply(&[1.0, 2.0, 6.0]), 3.0);
        assert_eq!(Reduce::Max.apply(&[1.0, 2.0, 6.0]), 6.0);
        let r: Vec<f64> = (0..1000).map(|i| uniform(7, i)).collect();
        assert!(r.iter().all(|x| (0.0..1.0).contains(x)));
        let mean = r.iter().sum::<f64>() / 1000.0;
        assert!((mean - 0.5).abs() < 0.05, "{mean}");
        assert_ne!(uniform(7, 1), uniform(8, 1));
    }
}
