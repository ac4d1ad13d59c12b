//! Where in a recipe a key lives, for errors that name the file, the key, its line and the fix.
//!
//! A [`Scope`] is the recipe file (the shared sections) or one `[[stage]]` block of it (keys show
//! as `stage[2].alpha`, looked up inside that block), optionally nested under a sub-table
//! (`stage[2].student.`). Stage kinds validate their own settings through the scope they are given.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::de::DeserializeOwned;

use crate::error::{locate, Invalid, RecipeError};

/// A region of a recipe file that keys are validated in.
#[derive(Debug, Clone)]
pub struct Scope {
    path: PathBuf,
    source: Arc<str>,
    dir: PathBuf,
    /// Shown before every key in messages: `""` or `"stage[2]."`.
    prefix: String,
    /// Prepended to keys when locating them in the block: `""` or `"stage."`.
    section: String,
    /// The block's lines, 0-based, end exclusive.
    block: (usize, usize),
}

impl Scope {
    /// The whole recipe file.
    pub fn root(path: &Path, source: &str) -> Self {
        let dir = path
            .parent()
            .map(Path::to_path_buf)
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or_else(|| PathBuf::from("."));
        Self {
            path: path.to_path_buf(),
            source: Arc::from(source),
            dir,
            prefix: String::new(),
            section: String::new(),
            block: (0, source.lines().count()),
        }
    }

    /// The `n`-th `[[stage]]` block (1-based), from its header to the next `[[stage]]` header.
    pub fn stage(&self, n: usize) -> Self {
        let headers: Vec<usize> = self
            .source
            .lines()
            .enumerate()
            .filter(|(_, l)| {
                let t = l.trim();
                t.starts_with("[[")
                    && t.trim_start_matches('[').split(']').next().map(str::trim) == Some("stage")
            })
            .map(|(i, _)| i)
            .collect();
        let total = self.source.lines().count();
        let block = match headers.get(n.wrapping_sub(1)) {
            Some(&start) => (start, headers.get(n).copied().unwrap_or(total)),
            None => (0, total),
        };
        Self {
            prefix: format!("stage[{n}]."),
            section: "stage.".into(),
            block,
            ..self.clone()
        }
    }

    /// Keys under the sub-table `key` of this scope (`student` → `stage[2].student.config`).
    pub fn nested(&self, key: &str) -> Self {
        Self {
            prefix: format!("{}{key}.", self.prefix),
            section: format!("{}{key}.", self.section),
            ..self.clone()
        }
    }

    /// The whole recipe file this scope is part of (its shared sections' keys).
    pub fn file(&self) -> Self {
        Self::root(&self.path, &self.source)
    }

    /// The folder relative paths resolve against (the recipe's).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The recipe file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The recipe's text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// How `key` is shown in messages (`stage[2].alpha`).
    pub fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// The 1-based line where `key` is set (or its section's header), if found.
    pub fn line(&self, key: &str) -> Option<usize> {
        let (start, end) = self.block;
        let text: Vec<&str> = self.source.lines().skip(start).take(end - start).collect();
        locate(&text.join("\n"), &format!("{}{key}", self.section)).map(|l| l + start)
    }

    /// An error about `key`: file, line, key, what is wrong and the fix.
    pub fn err(
        &self,
        key: &str,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) -> RecipeError {
        RecipeError::Invalid(Box::new(Invalid {
            path: self.path.clone(),
            key: self.key(key),
            line: self.line(key),
            message: message.into(),
            hint: hint.into(),
        }))
    }

    /// Resolve a path against the recipe's folder.
    pub fn resolve(&self, p: &str) -> PathBuf {
        let p = Path::new(p);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            normalize(&self.dir.join(p))
        }
    }

    /// Resolve a path that must exist as a file.
    pub fn input_file(&self, key: &str, p: &str) -> Result<PathBuf, RecipeError> {
        let full = self.resolve(p);
        if !full.is_file() {
            return Err(self.err(
                key,
                format!("file `{}` does not exist (resolved against the recipe's folder)", full.display()),
                "run `datasets/fetch.sh` to fetch the data and models, or correct the path (relative paths start at the recipe's folder)",
            ));
        }
        Ok(full)
    }

    /// [`Scope::input_file`], or a folder.
    pub fn input_path(&self, key: &str, p: &str) -> Result<PathBuf, RecipeError> {
        let full = self.resolve(p);
        if !full.exists() {
            return Err(self.err(
                key,
                format!("`{}` does not exist (resolved against the recipe's folder)", full.display()),
                "run `datasets/fetch.sh --small` to fetch the text, or correct the path (relative paths start at the recipe's folder)",
            ));
        }
        Ok(full)
    }

    /// `v` or `default`; `Some(0)` is an error.
    pub fn positive(
        &self,
        key: &str,
        v: Option<usize>,
        default: usize,
    ) -> Result<usize, RecipeError> {
        match v {
            Some(0) => Err(self.err(key, "must be at least 1", "set a positive integer")),
            Some(v) => Ok(v),
            None => Ok(default),
        }
    }

    /// `v` or `default`, which must lie in [0, 1).
    pub fn fraction(
        &self,
        key: &str,
        v: Option<f64>,
        default: f64,
        hint: &str,
    ) -> Result<f64, RecipeError> {
        let v = v.unwrap_or(default);
        if !(0.0..1.0).contains(&v) || !v.is_finite() {
            return Err(self.err(key, format!("{v} is outside [0, 1)"), hint.to_string()));
        }
        Ok(v)
    }

    /// Deserialize the settings `table` of this scope into `T` (`deny_unknown_fields` structs),
    /// naming the offending key and its line on failure.
    pub fn deserialize<T: DeserializeOwned>(&self, table: toml::Table) -> Result<T, RecipeError> {
        toml::Value::Table(table.clone()).try_into::<T>().map_err(|e| {
            let message = e.message().trim().to_string();
            // `unknown field `x``, `missing field `x``: the key is in the message; a wrong type
            // or value (`invalid type: floating point `16.5``) names none.
            let named = message.contains(" field `");
            let field = named
                .then(|| message.split('`').nth(1).map(str::to_string))
                .flatten()
                .or_else(|| culprit::<T>(&table, &message))
                .unwrap_or_default();
            let hint = if message.contains("unknown field") {
                "remove or rename the key; each stage kind's chapter (docs/src/stages/) lists its keys"
            } else if message.contains("missing field") {
                "add the key; the recipe reference (docs/src/recipe-reference.md) gives its meaning and an example"
            } else {
                "correct the value's type (see docs/src/recipe-reference.md)"
            };
            self.err(&field, message, hint)
        })
    }

    /// [`Scope::deserialize`] for a table whose keys an owner declares (`what`: `a \`llama\`
    /// model table`): a key `T` does not declare is refused naming the keys the table takes,
    /// the `shared` ones (read elsewhere: a model table's `arch` and `config`) first.
    pub fn deserialize_keys<T: DeserializeOwned>(
        &self,
        table: toml::Table,
        what: &str,
        shared: &[&str],
    ) -> Result<T, RecipeError> {
        self.deserialize_owned(
            table,
            (what, shared),
            "remove the key (each family's keys: docs/src/recipe-reference.md, \"[model]\")",
        )
    }

    /// [`Scope::deserialize_keys`] with `hint` as the fix of an unknown key (`owner`: what the
    /// section is, and the keys it takes besides `T`'s).
    pub fn deserialize_owned<T: DeserializeOwned>(
        &self,
        table: toml::Table,
        (what, shared): (&str, &[&str]),
        hint: &str,
    ) -> Result<T, RecipeError> {
        self.deserialize(table).map_err(|e| match e {
            RecipeError::Invalid(mut i) if i.message.starts_with("unknown field") => {
                let key = i.message.split('`').nth(1).unwrap_or_default().to_string();
                let declared: Vec<&str> = match i.message.split_once(", expected ") {
                    Some((_, list)) => list.split('`').skip(1).step_by(2).collect(),
                    None => Vec::new(),
                };
                let takes: Vec<String> = shared
                    .iter()
                    .chain(declared.iter())
                    .map(|k| format!("`{k}`"))
                    .collect();
                i.message = match takes.is_empty() {
                    true => format!("{what} has no key `{key}`; it takes none"),
                    false => format!("{what} has no key `{key}`; it takes {}", takes.join(", ")),
                };
                i.hint = hint.into();
                RecipeError::Invalid(i)
            }
            other => other,
        })
    }
}

/// The key of `table` behind a deserialization error that names none (a wrong type: `invalid
/// type: string "two", expected usize`): the one whose removal changes the error.
fn culprit<T: DeserializeOwned>(table: &toml::Table, message: &str) -> Option<String> {
    table.keys().find_map(|k| {
        let mut t = table.clone();
        t.remove(k);
        let changed = match toml::Value::Table(t).try_into::<T>() {
            Ok(_) => true,
            Err(e) => e.message().trim() != message,
        };
        changed.then(|| k.clone())
    })
}

/// `p` as an absolute path, normalized (`..` and `.` folded lexically): the same file named from
/// another working directory or recipe folder reads the same. Keys that must not depend on where
/// a run was started from (stage reuse across runs) name files this way.
pub fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).map_or_else(|_| normalize(p), |a| normalize(&a))
}

/// `a/b/../c` → `a/c`, `./x` → `x`, without touching the file system (paths in messages and
/// reports read as the user would write them).
pub fn normalize(p: &Path) -> PathBuf {
    use std::path::Component;
    let mut out: Vec<Component> = Vec::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => match out.last() {
                Some(Component::Normal(_)) => {
                    out.pop();
                }
                Some(Component::RootDir) => {}
                _ => out.push(c),
            },
            other => out.push(other),
        }
    }
    if out.is_empty() {
        return PathBuf::from(".");
    }
    out.iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: &str = "[run]\nname = \"x\"\n\n[[stage]]\nkind = \"finetune\"\n[stage.train]\nlr = 1\n\n[[stage]]\nkind = \"distill\"\nalpha = 2\n[stage.train]\nlr = 3\n[stage.student.overrides]\nnum-hidden-layers = 0\n";

    #[test]
    fn stage_scopes_locate_keys_in_their_own_block() {
        let root = Scope::root(Path::new("r/x.toml"), SRC);
        assert_eq!(root.line("run.name"), Some(2));
        let s1 = root.stage(1);
        let s2 = root.stage(2);
        assert_eq!(s1.line("train.lr"), Some(7));
        assert_eq!(s2.line("train.lr"), Some(13));
        assert_eq!(s2.line("alpha"), Some(11));
        assert_eq!(s2.key("alpha"), "stage[2].alpha");
        let st = s2.nested("student");
        assert_eq!(
            st.key("overrides.num-hidden-layers"),
            "stage[2].student.overrides.num-hidden-layers"
        );
        assert_eq!(st.line("overrides.num-hidden-layers"), Some(15));
    }

    #[test]
    fn paths_are_normalised() {
        assert_eq!(
            normalize(Path::new("recipes/../checkpoints/a/./best")),
            PathBuf::from("checkpoints/a/best")
        );
        assert_eq!(normalize(Path::new("/a/b/../../c")), PathBuf::from("/c"));
        assert_eq!(normalize(Path::new("../x")), PathBuf::from("../x"));
    }
}
