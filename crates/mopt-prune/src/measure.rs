//! Data-driven importance, measured on calibration batches the caller picks: first-order
//! Taylor gradients under the caller's objective, the model's activation statistics (Minitron),
//! and ablation (each unit alone removed). The weight-based criteria score the parameters alone
//! ([`crate::scores`]); these read data, so the stage kind decides which batches and which loss.

use burn::prelude::*;
use mopt_core::prune::{ActivationStat, GroupKind, GroupScores, Keep};
use mopt_core::{ParamTable, Prunable};

use crate::remove::prune;

/// The gradients of every parameter of `model`, summed over `losses` (each computed from
/// `model` on one calibration batch, on an autodiff device): what [`crate::Criterion::Taylor`]
/// multiplies the weights by.
pub fn summed_gradients<M: Module>(
    model: &M,
    losses: impl IntoIterator<Item = Tensor<1>>,
) -> ParamTable {
    let mut acc = ParamTable::default();
    for loss in losses {
        let grads = loss.backward();
        acc.add(&ParamTable::gradients(model, &grads));
    }
    acc
}

/// The model's activation statistics of the kinds named in `targets`
/// ([`Prunable::activation_scores`]), averaged over the sequences of `batches` (each with its
/// number of sequences). `None` when the model measures none.
pub fn activation_scores<M: Prunable>(
    model: &M,
    config: &M::Config,
    batches: impl IntoIterator<Item = (M::Batch, usize)>,
    stat: ActivationStat,
    targets: &[&str],
) -> Option<GroupScores> {
    let mut acc = GroupScores::new();
    let mut sequences = 0usize;
    for (b, n) in batches {
        for (kind, scopes) in model.activation_scores(config, &b, stat)? {
            let a = acc
                .entry(kind)
                .or_insert_with(|| scopes.iter().map(|u| vec![0.0; u.len()]).collect());
            for (x, y) in a.iter_mut().flatten().zip(scopes.iter().flatten()) {
                *x += y;
            }
        }
        sequences += n;
    }
    let n = sequences.max(1) as f64;
    acc.retain(|kind, _| targets.contains(&kind.as_str()));
    acc.values_mut()
        .flat_map(|s| s.iter_mut().flatten())
        .for_each(|x| *x /= n);
    Some(acc)
}

/// Ablation scores of `kinds`: every unit alone removed from `model` (on `device`, an
/// inference device), the rise of `loss` over the unpruned model's. One evaluation a unit;
/// `progress(kind, done, total)` is told before each.
pub fn ablation_scores<M: Prunable>(
    model: &M,
    config: &M::Config,
    kinds: &[&dyn GroupKind<Config = M::Config>],
    device: &Device,
    loss: impl Fn(&M) -> f64,
    mut progress: impl FnMut(&str, usize, usize),
) -> GroupScores {
    let base = loss(model);
    let mut out = GroupScores::new();
    for kind in kinds {
        let counts: Vec<usize> = (0..kind.scopes(config))
            .map(|s| kind.units(config, s))
            .collect();
        let total: usize = counts.iter().sum();
        let mut scores: Vec<Vec<f64>> = Vec::with_capacity(counts.len());
        for (s, &n) in counts.iter().enumerate() {
            let mut row = Vec::with_capacity(n);
            for u in 0..n {
                progress(
                    kind.name(),
                    scores.iter().map(Vec::len).sum::<usize>() + u + 1,
                    total,
                );
                let keep: Vec<Vec<usize>> = counts
                    .iter()
                    .enumerate()
                    .map(|(t, &m)| (0..m).filter(|&v| t != s || v != u).collect())
                    .collect();
                let one = Keep::from([(kind.name().to_string(), keep)]);
                let (pruned, _) = prune(model, config, &one, device);
                row.push(loss(&pruned) - base);
            }
            scores.push(row);
        }
        out.insert(kind.name().to_string(), scores);
    }
    out
}
