//! `idx`: IDX image files (MNIST, Fashion-MNIST; gzip or plain): `train` and `test` name the
//! image files, whose labels lie beside them (`…-images-idx3-ubyte` → `…-labels-idx1-ubyte`).

use std::path::Path;

use mopt_data::{DataError, RawImages};
use mopt_recipe::{DataSpec, RecipeError};

use super::NoKeys;
use crate::data::{DataFormat, Modality};

/// IDX images with their labels file.
pub struct Idx;

impl DataFormat for Idx {
    fn name(&self) -> &'static str {
        "idx"
    }

    fn modality(&self) -> Modality {
        Modality::Images
    }

    fn check(&self, data: &DataSpec, rest: toml::Table) -> Result<(), RecipeError> {
        super::refuse(
            data,
            "path",
            "IDX data comes as separate training and test files",
            "write `train = \"…/train-images-idx3-ubyte.gz\"` and `test = \"…/t10k-images-idx3-ubyte.gz\"`",
        )?;
        data.format_keys::<NoKeys>(
            rest,
            Modality::Images.keys(),
            "remove it (images have no columns to name: the labels are the IDX labels file)",
        )
        .map(|_| ())
    }

    fn read_images(&self, _: &DataSpec, path: &Path, _: f64) -> Result<RawImages, DataError> {
        mopt_data::read_idx(path)
    }
}
