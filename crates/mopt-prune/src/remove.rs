//! Physical removal and scoring for any [`Prunable`] model.

use burn::prelude::*;
use mopt_core::prune::{GroupKind, GroupScores, Keep};
use mopt_core::{ParamTable, Prunable};

use crate::importance::{uniform, Criterion, Reduce};

/// Remove every unit not in `keep` (kinds absent from it stay whole), kind by kind in the
/// model's order: a new, smaller model built from the shrunken config on `device`, and that
/// config. Give it a model on an inference device.
///
/// # Panics
/// When the sliced table does not fit the shrunken config (a group definition that does not
/// describe the model).
pub fn prune<M: Prunable>(
    model: &M,
    config: &M::Config,
    keep: &Keep,
    device: &Device,
) -> (M, M::Config) {
    let mut table = ParamTable::weights(model);
    let mut cfg = config.clone();
    for kind in M::group_kinds() {
        if let Some(k) = keep.get(kind.name()) {
            kind.shrink(&cfg, &mut table, k);
            cfg = kind.resize(&cfg, k);
        }
    }
    let pruned = table
        .load_into(M::init(&cfg, device))
        .unwrap_or_else(|missing| panic!("pruned table does not fit its config: {missing:?}"));
    (pruned, cfg)
}

/// Every unit of every kind in `kinds` scored; `seed` drives the random criterion.
pub fn scores<C>(
    weights: &ParamTable,
    config: &C,
    kinds: &[&dyn GroupKind<Config = C>],
    criterion: Criterion,
    reduce: Reduce,
    grads: Option<&ParamTable>,
    seed: u64,
) -> GroupScores {
    let mut counter = 0u64;
    let mut random = || {
        counter += 1;
        uniform(seed, counter)
    };
    kinds
        .iter()
        .map(|k| {
            let s = crate::group::score(*k, config, weights, grads, criterion, reduce, &mut random);
            (k.name().to_string(), s)
        })
        .collect()
}
