//! `mopt-train lr-find RECIPE`: the LR range test ([`mopt_train::lr_find`]) on the recipe's
//! `[model]`, over its training split.

use std::path::Path;

use mopt_data::TextExamples;
use mopt_models::bert::setup::{build_model, model_config};
use mopt_recipe::Recipe;
use mopt_train::lr_find::{LrFindResult, LrFindRun};
use mopt_train::setup::prepare_data;
use mopt_train::{DeviceSpec, TrainError};

use crate::error::StageError;

/// Sweep the learning rate on a fresh copy of `recipe`'s `[model]`; results in `run_dir`.
pub fn lr_find(
    recipe: &Recipe,
    device_spec: &DeviceSpec,
    run_dir: &Path,
) -> Result<LrFindResult, StageError> {
    let ad = device_spec.train_device(&recipe.train);
    let Some(m) = &recipe.model else {
        return Err(TrainError::Recipe(recipe.invalid(
            "model",
            "lr-find sweeps the recipe's [model]; this recipe starts from a [teacher]",
            "run lr-find on the teacher's recipe, or give the recipe a [model]",
        ))
        .into());
    };
    let tokenizer = recipe.text_tokenizer()?;
    let prepared = prepare_data(tokenizer, &recipe.data, None)?;
    let data = &prepared.data;
    let config = model_config(
        m,
        tokenizer,
        &recipe.scope.nested("model"),
        &data.labels.labels,
        prepared.tokenizer.vocab_size(),
    )?;
    let (model, _) = build_model(m, recipe.run.seed, &config, &ad)?;
    let run = LrFindRun {
        spec: &recipe.lr_find,
        train: &recipe.train,
        seed: recipe.run.seed,
        device: &ad,
        run_dir,
    };
    let train = TextExamples::new(&data.train, prepared.tokenizer.pad_id);
    Ok(mopt_train::lr_find::lr_find(&run, model, &train)?)
}
