//! `pixels-csv`: CSV of pixels, one image a row, no header: `side × side` grey values, then the
//! label (MNIST-5k, scikit-learn's 8×8 digits; gzip or plain).

use std::path::Path;

use mopt_data::{DataError, RawImages};
use mopt_recipe::{DataSpec, RecipeError};

use super::NoKeys;
use crate::data::{DataFormat, Modality};

/// Rows of grey values and a label.
pub struct PixelsCsv;

impl DataFormat for PixelsCsv {
    fn name(&self) -> &'static str {
        "pixels-csv"
    }

    fn modality(&self) -> Modality {
        Modality::Images
    }

    fn check(&self, data: &DataSpec, rest: toml::Table) -> Result<(), RecipeError> {
        data.format_keys::<NoKeys>(
            rest,
            Modality::Images.keys(),
            "remove it (images have no columns to name: the label is the last value of a row)",
        )
        .map(|_| ())
    }

    fn read_images(
        &self,
        _: &DataSpec,
        path: &Path,
        pixel_max: f64,
    ) -> Result<RawImages, DataError> {
        mopt_data::read_pixels_csv(path, pixel_max)
    }
}
