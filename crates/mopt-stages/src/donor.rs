//! Reusing a stage another run already finished: the same kind with the same settings (its own
//! keys, its merged `[train]`, the data and tokenizer sections, the seed, and the gate where
//! the gate shapes the output: `on-fail = "retry"`), on the same input model and against the
//! same baseline, both by sha256, whose outputs still verify. Such a stage is not run again:
//! its output is measured and judged by this run's gate like any other. This is how a
//! `compress` recipe picks up the teacher, the distilled student and the pruned model that
//! `distill_bert.toml` and `prune_bert.toml` produced, and recomputes them when anything they
//! depend on differs.
//!
//! Donors are the other run folders of the same `output-dir`; smoke runs (`--max-steps`)
//! never donate.

use std::path::{Path, PathBuf};

use mopt_recipe::merge_tables;

use crate::record::{checkpoint_sha256, sha256_file, short_sha, shown, StageRecord};

/// What must be equal for a stage of a recipe to be reused: stage `index` (1-based) of the
/// recipe text `source`, without its name and the keys in `ignore`.
pub fn fingerprint(source: &str, index: usize, ignore: &[&str]) -> Option<toml::Table> {
    let top: toml::Table = toml::from_str(source).ok()?;
    let mut stage = top
        .get("stage")?
        .as_array()?
        .get(index.checked_sub(1)?)?
        .as_table()?
        .clone();
    stage.remove("name");
    for k in ignore {
        stage.remove(*k);
    }
    let empty = toml::Table::new();
    let own_train = stage
        .remove("train")
        .and_then(|t| t.as_table().cloned())
        .unwrap_or_default();
    let base_train = top
        .get("train")
        .and_then(|t| t.as_table())
        .unwrap_or(&empty);
    let gate = stage.remove("gate");
    let retry = gate
        .as_ref()
        .and_then(|g| g.get("on-fail"))
        .and_then(|v| v.as_str())
        == Some("retry");
    let mut fp = toml::Table::new();
    fp.insert("stage".into(), stage.into());
    fp.insert("train".into(), merge_tables(base_train, &own_train).into());
    if retry {
        fp.insert("gate".into(), gate.unwrap_or(toml::Value::Boolean(true)));
    }
    for k in ["data", "tokenizer"] {
        if let Some(v) = top.get(k) {
            fp.insert(k.into(), v.clone());
        }
    }
    if let Some(seed) = top.get("run").and_then(|r| r.get("seed")) {
        fp.insert("seed".into(), seed.clone());
    }
    Some(fp)
}

fn read_record(p: &Path) -> Option<StageRecord> {
    serde_json::from_slice(&std::fs::read(p).ok()?).ok()
}

/// A finished stage of another run that this one can reuse.
pub struct Donor {
    /// Its stage folder.
    pub dir: PathBuf,
    pub record: StageRecord,
}

impl Donor {
    /// The donor's output as this run's stage output (measured and judged again by the
    /// runner).
    pub fn into_output(self) -> crate::stage::StageOutput {
        let r = self.record;
        let mut notes = vec![format!(
            "Reused from `{}`: the same stage (kind, settings, training, data, seed) already ran there on the same input (sha256 {}…) against the same baseline, and its outputs verify; it was not run again (its {} steps and {:.0} s are not counted here).",
            shown(&self.dir),
            short_sha(r.input.as_ref().map_or("", |i| i.sha256.as_str())),
            r.steps,
            r.wall_time_s
        )];
        notes.extend(r.notes);
        crate::stage::StageOutput {
            checkpoint: PathBuf::from(&r.model.checkpoint),
            steps: 0,
            facts: serde_json::json!({ "reused_from": shown(&self.dir), "donor": r.facts }),
            notes,
            references: Vec::new(),
            logit_error_vs_input: None,
            artifacts: r.artifacts.iter().map(|a| PathBuf::from(&a.path)).collect(),
        }
    }
}

/// What a stage about to run is: its recipe text and index, the keys its kind ignores, its
/// input's and the baseline's sha256.
pub struct Wanted<'a> {
    pub source: &'a str,
    pub index: usize,
    pub kind: &'a str,
    pub ignore: &'a [&'a str],
    pub input_sha256: &'a str,
    pub baseline_sha256: &'a str,
}

/// The first run folder in `output_dir` (other than `own`) with a finished stage matching `w`.
pub fn find(output_dir: &Path, own: &Path, w: &Wanted) -> Option<Donor> {
    let want = fingerprint(w.source, w.index, w.ignore)?;
    let mut runs: Vec<PathBuf> = std::fs::read_dir(output_dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("recipe.toml").is_file() && p.as_path() != own)
        .collect();
    runs.sort();
    for run in runs {
        let Some(base) = read_record(&run.join("00-baseline/stage.json")) else {
            continue;
        };
        if base.model.sha256 != w.baseline_sha256 || base.max_steps.is_some() {
            continue;
        }
        let Ok(source) = std::fs::read_to_string(run.join("recipe.toml")) else {
            continue;
        };
        let mut stages: Vec<PathBuf> = std::fs::read_dir(&run)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.join("stage.json").is_file())
            .collect();
        stages.sort();
        for dir in stages {
            let Some(r) = read_record(&dir.join("stage.json")) else {
                continue;
            };
            if r.index == 0
                || r.kind != w.kind
                || r.max_steps.is_some()
                || r.input.as_ref().map(|i| i.sha256.as_str()) != Some(w.input_sha256)
                || fingerprint(&source, r.index, w.ignore).as_ref() != Some(&want)
            {
                continue;
            }
            let out_ok = checkpoint_sha256(Path::new(&r.model.checkpoint))
                .is_ok_and(|h| h == r.model.sha256);
            let artifacts_ok = r
                .artifacts
                .iter()
                .all(|a| sha256_file(Path::new(&a.path)).is_ok_and(|h| h == a.sha256));
            if out_ok && artifacts_ok {
                eprintln!(
                    "stage {} ({}): the same stage finished in {} on the same input; reused",
                    w.index,
                    w.kind,
                    shown(&dir)
                );
                return Some(Donor { dir, record: r });
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_ignore_names_and_merge_training() {
        let a = "[run]\nseed = 1\n[train]\nlr = 1e-4\nepochs = 2\n[data]\npath = \"x\"\n[[stage]]\nkind = \"prune\"\nname = \"a\"\ncompare = [\"l1\"]\n[stage.train]\nlr = 8e-6\n[stage.gate]\nmax-drop = 0.01\non-fail = \"rollback\"\n";
        // The same merged training written the other way round, another name, no compare,
        // another non-retry gate: the same stage.
        let b = "[run]\nseed = 1\n[train]\nlr = 8e-6\nepochs = 2\n[data]\npath = \"x\"\n[[stage]]\nkind = \"prune\"\nname = \"b\"\n[stage.gate]\nmax-drop = 0.5\n";
        assert_eq!(
            fingerprint(a, 1, &["compare"]),
            fingerprint(b, 1, &["compare"])
        );
        assert_ne!(fingerprint(a, 1, &[]), fingerprint(b, 1, &[]));
        // Another seed, another epoch count, or a retry gate (it shapes the output) differ.
        for c in [
            b.replace("seed = 1", "seed = 2"),
            b.replace("epochs = 2", "epochs = 3"),
            b.replace("max-drop = 0.5", "max-drop = 0.5\non-fail = \"retry\""),
        ] {
            assert_ne!(
                fingerprint(a, 1, &["compare"]),
                fingerprint(&c, 1, &["compare"])
            );
        }
        assert!(fingerprint(a, 2, &[]).is_none());
    }
}
