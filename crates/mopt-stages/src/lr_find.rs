//! `mopt-train lr-find RECIPE`: the LR range test ([`mopt_train::lr_find`]) on the recipe's
//! `[model]`, over its training split, for any family with the `finetune` capability.

use std::path::Path;

use mopt_recipe::Recipe;
use mopt_train::lr_find::{LrFindResult, LrFindRun};
use mopt_train::{DeviceSpec, TrainError};

use crate::error::StageError;
use crate::kinds::finetune::CanFinetune;
use crate::Registry;

/// Sweep the learning rate on a fresh copy of `recipe`'s `[model]` (its family looked up in
/// `registry`, built into `run_dir/model` as a run's baseline is); results in `run_dir`.
pub fn lr_find(
    registry: &Registry,
    recipe: &Recipe,
    device_spec: &DeviceSpec,
    run_dir: &Path,
) -> Result<LrFindResult, StageError> {
    if recipe.model.is_none() {
        return Err(TrainError::Recipe(recipe.invalid(
            "model",
            "lr-find sweeps the recipe's [model]; this recipe starts from a [teacher]",
            "run lr-find on the teacher's recipe, or give the recipe a [model]",
        ))
        .into());
    }
    let family = registry.recipe_family(recipe)?;
    let can = family.require::<dyn CanFinetune>(
        "lr-find",
        "a trainable model",
        "lists no finetune capability",
    )?;
    let ad = device_spec.train_device(&recipe.train);
    let data = family
        .data()
        .load(recipe, registry.data_format(recipe)?, None, 0)?;
    let ckpt = run_dir.join("model");
    family.build(recipe, &data, &ad, &ckpt)?;
    let run = LrFindRun {
        spec: &recipe.lr_find,
        train: &recipe.train,
        seed: recipe.run.seed,
        device: &ad,
        run_dir,
    };
    can.lr_find(&ckpt, &data, &run)
}
