//! `[data]`: where the examples come from and how they are split, the part every data format
//! shares. The format (`format = "…"`) is a name the stage runner resolves against its
//! registered data formats (`mopt_stages::data::DataFormat`); each format declares and validates
//! its own keys of the table ([`DataSpec::format_keys`]) and the sections it reads
//! ([`crate::Recipe::sections`]). A key no one declares is an error naming the section, the key
//! and the keys the section takes.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde::de::DeserializeOwned;

use crate::error::RecipeError;
use crate::raw::RawData;
use crate::scope::Scope;

/// The keys of `[data]` every format shares (read here, not by the format).
pub const SHARED_DATA_KEYS: &[&str] = &[
    "format",
    "path",
    "train",
    "valid",
    "test",
    "valid-fraction",
    "test-fraction",
    "split-seed",
    "max-train",
    "max-eval",
    "cache-dir",
];

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
    /// `format` as the recipe writes it: the registered data format that reads the files.
    pub format: String,
    /// Where the splits come from.
    pub source: DataSource,
    /// `split-seed` as written: the seed of the split's shuffle ([`DataSpec::split_seed`]).
    pub split_seed_written: Option<u64>,
    /// Keep at most this many training examples (smoke runs), taken after the split.
    pub max_train: Option<usize>,
    /// Keep at most this many validation and test examples each.
    pub max_eval: Option<usize>,
    /// The folder caches derived from the data go to (encoded examples, teacher outputs):
    /// `cache-dir`, resolved against the recipe's folder; `None`: `.mopt-cache/` beside the
    /// data (for a read-only or shared data folder, point it elsewhere).
    pub cache_dir: Option<PathBuf>,
    /// The table's other keys as written: the format's ([`DataSpec::format_keys`]).
    pub keys: toml::Table,
    /// The shared keys the recipe wrote (a format refuses those it does not read).
    pub written: BTreeSet<String>,
    /// Where the table is (`data.`): errors about its keys name it.
    pub scope: Scope,
}

impl DataSpec {
    /// The seed of the split's shuffle: `split-seed`, 42 when not written.
    pub fn split_seed(&self) -> u64 {
        self.split_seed_written.unwrap_or(42)
    }

    /// Whether the recipe wrote the shared key `key` (`valid-fraction`).
    pub fn wrote(&self, key: &str) -> bool {
        self.written.contains(key)
    }

    /// Those of the format's keys named in `names`, as `T` (a `#[serde(deny_unknown_fields,
    /// rename_all = "kebab-case")]` struct), and the keys left for [`DataSpec::format_keys`]:
    /// how a format's modality reads the keys every format of it shares (labelled data's
    /// `labels`).
    pub fn take_keys<T: DeserializeOwned>(
        &self,
        names: &[&str],
    ) -> Result<(T, toml::Table), RecipeError> {
        let (mine, rest): (toml::Table, toml::Table) = self
            .keys
            .clone()
            .into_iter()
            .partition(|(k, _)| names.contains(&k.as_str()));
        Ok((self.scope.deserialize(mine)?, rest))
    }

    /// The keys `rest` (what [`DataSpec::take_keys`] left) as `T`, the format's own: a key `T`
    /// does not declare is refused naming the keys `[data]` takes for this format (the shared
    /// ones, `also` and `T`'s), with `fix` as the hint.
    pub fn format_keys<T: DeserializeOwned>(
        &self,
        rest: toml::Table,
        also: &[&str],
        fix: &str,
    ) -> Result<T, RecipeError> {
        let takes: Vec<&str> = SHARED_DATA_KEYS.iter().chain(also).copied().collect();
        self.scope
            .deserialize_owned(rest, (&format!("`{}` data", self.format), &takes), fix)
    }

    /// What the table says, for keys that decide whether a finished stage can be reused: every
    /// value (paths absolute), not where in which recipe file it was written.
    pub fn identity(&self) -> String {
        let d = self.absolute();
        format!(
            "format {:?}, source {:?}, split-seed {}, max-train {:?}, max-eval {:?}, cache-dir {:?}, keys {:?}",
            d.format,
            d.source,
            d.split_seed(),
            d.max_train,
            d.max_eval,
            d.cache_dir.as_deref().map(crate::absolute),
            d.keys,
        )
    }

    /// An error about `key` of `[data]`.
    pub fn err(
        &self,
        key: &str,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) -> RecipeError {
        self.scope.err(key, message, hint)
    }

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

/// Validate `[data]`'s shared keys (`cx` is the root scope); its format validates the rest.
pub fn data_spec(cx: &Scope, d: RawData) -> Result<DataSpec, RecipeError> {
    let written = [
        ("path", d.path.is_some()),
        ("train", d.train.is_some()),
        ("valid", d.valid.is_some()),
        ("test", d.test.is_some()),
        ("valid-fraction", d.valid_fraction.is_some()),
        ("test-fraction", d.test_fraction.is_some()),
        ("split-seed", d.split_seed.is_some()),
    ]
    .into_iter()
    .filter(|(_, set)| *set)
    .map(|(k, _)| k.to_string())
    .collect();
    Ok(DataSpec {
        format: d.format.clone(),
        source: data_source(cx, &d)?,
        split_seed_written: d.split_seed,
        max_train: d.max_train,
        max_eval: d.max_eval,
        cache_dir: cache_folder(cx, d.cache_dir.as_deref())?,
        keys: d.keys.clone(),
        written,
        scope: cx.nested("data"),
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
            // A file or a folder (of works, say): the format reads it or says it cannot.
            let input = |key: &str, p: &str| cx.input_path(key, p);
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
