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

use mopt_data::TokenizerSpec;
use mopt_recipe::{DataSpec, OnFail, StageEntry};
use sha2::{Digest, Sha256};

use crate::record::{checkpoint_sha256, read_json, sha256_file, short_sha, shown, StageRecord};

/// What a run shares with every stage and what shapes a stage's output besides its own settings.
pub struct Shared<'a> {
    /// `[data]`.
    pub data: &'a DataSpec,
    /// `[tokenizer]`, if the data is text.
    pub tokenizer: Option<TokenizerSpec>,
    /// The run's seed.
    pub seed: u64,
}

/// The reuse key of a stage about to run: sha256 over its kind, its validated settings as it
/// will use them ([`crate::Stage::reuse_key`]), its merged training settings, the data and
/// tokenizer sections (files by absolute path: a run started from another folder keys the same
/// files the same), the seed, and the gate where the gate shapes the output (`on-fail =
/// "retry"`). Taken from the typed, validated structs, never from the recipe text: a stage
/// pushed or edited in Rust gets the key of what it really runs. `None`: never reused.
pub fn reuse_key(stage_key: Option<String>, entry: &StageEntry, shared: &Shared) -> Option<String> {
    let stage_key = stage_key?;
    let gate = entry
        .gate
        .as_ref()
        .filter(|g| g.on_fail == OnFail::Retry)
        .map_or(String::new(), |g| format!("{g:?}"));
    let text = format!(
        "kind {}\nstage {stage_key}\ntrain {:?}\ndata {}\ntokenizer {}\nseed {}\ngate {gate}",
        entry.kind,
        entry.train,
        shared.data.identity(),
        shared
            .tokenizer
            .as_ref()
            .map_or("none".into(), |t| format!("{:?}", t.absolute())),
        shared.seed
    );
    Some(format!("{:x}", Sha256::digest(text.as_bytes())))
}

/// A finished stage of another run that this one can reuse.
pub struct Donor {
    /// Its stage folder.
    pub dir: PathBuf,
    /// Its record.
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
            // Its references (a distillation's twin) come along, measured again like the output:
            // a seeds summary pairs every seed's student with its twin.
            references: r
                .references
                .iter()
                .map(|x| crate::stage::ReferenceModel {
                    name: x.name.clone(),
                    about: x.about.clone(),
                    checkpoint: PathBuf::from(&x.model.checkpoint),
                    twin: x.twin,
                })
                .collect(),
            logit_error_vs_input: None,
            artifacts: r.artifacts.iter().map(|a| PathBuf::from(&a.path)).collect(),
        }
    }
}

/// What a stage about to run is: its index and kind, its [`reuse_key`], its input's and the
/// baseline's sha256.
pub struct Wanted<'a> {
    /// Its 1-based position.
    pub index: usize,
    /// Its kind.
    pub kind: &'a str,
    /// Its reuse key.
    pub key: &'a str,
    /// sha256 of its input checkpoint.
    pub input_sha256: &'a str,
    /// sha256 of the run's baseline.
    pub baseline_sha256: &'a str,
}

/// The first run folder in `output_dir` (other than `own`) with a finished stage matching `w`.
pub fn find(output_dir: &Path, own: &Path, w: &Wanted) -> Option<Donor> {
    let mut runs: Vec<PathBuf> = std::fs::read_dir(output_dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("recipe.toml").is_file() && p.as_path() != own)
        .collect();
    runs.sort();
    for run in runs {
        let Some(base) = read_json::<StageRecord>(&run.join("00-baseline/stage.json")) else {
            continue;
        };
        if base.model.sha256 != w.baseline_sha256 || base.max_steps.is_some() {
            continue;
        }
        let mut stages: Vec<PathBuf> = std::fs::read_dir(&run)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.join("stage.json").is_file())
            .collect();
        stages.sort();
        for dir in stages {
            let Some(r) = read_json::<StageRecord>(&dir.join("stage.json")) else {
                continue;
            };
            if r.index == 0
                || r.kind != w.kind
                || r.max_steps.is_some()
                || r.input.as_ref().map(|i| i.sha256.as_str()) != Some(w.input_sha256)
                || r.reuse_key.as_deref() != Some(w.key)
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

    /// The recipe `source` written into `dir` (data and model files beside it), its first stage.
    fn entry(dir: &Path, source: &str) -> (mopt_recipe::Recipe, StageEntry) {
        let p = dir.join("r.toml");
        std::fs::write(&p, source).unwrap();
        for f in ["c.json", "t.json", "d"] {
            std::fs::write(dir.join(f), "{}").unwrap();
        }
        let r = mopt_recipe::load(&p).unwrap();
        let e = r.stages[0].clone();
        (r, e)
    }

    fn key(dir: &Path, source: &str, stage_key: &str) -> Option<String> {
        let (r, e) = entry(dir, source);
        let shared = Shared {
            data: &r.data,
            tokenizer: crate::data::text::tokenizer(&r).ok(),
            seed: r.run.seed,
        };
        reuse_key(Some(stage_key.into()), &e, &shared)
    }

    const BASE: &str = "[run]\nname = \"x\"\nseed = 1\n[model]\narch = \"bert\"\nconfig = \"c.json\"\n[data]\nformat = \"rotten-tomatoes\"\npath = \"d\"\n[tokenizer]\npath = \"t.json\"\n[train]\nlr = 1e-4\nepochs = 2\n[[stage]]\nkind = \"finetune\"\nname = \"a\"\n[stage.train]\nlr = 8e-6\n[stage.gate]\nmax-drop = 0.01\non-fail = \"rollback\"\n";

    #[test]
    fn keys_follow_the_settings_used_not_the_text() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let a = key(dir, BASE, "s").expect("a key");
        // The same merged training written the other way round, another name, another
        // non-retry gate: the same stage.
        let b = BASE
            .replace("lr = 1e-4", "lr = 8e-6")
            .replace("[stage.train]\nlr = 8e-6\n", "")
            .replace("name = \"a\"", "name = \"b\"")
            .replace("max-drop = 0.01", "max-drop = 0.5");
        assert_eq!(key(dir, &b, "s").as_ref(), Some(&a));
        // Other stage settings, seed, epochs, or a retry gate (it shapes the output) differ.
        assert_ne!(key(dir, BASE, "t").as_ref(), Some(&a));
        for c in [
            BASE.replace("seed = 1", "seed = 2"),
            BASE.replace("epochs = 2", "epochs = 3"),
            BASE.replace("on-fail = \"rollback\"", "on-fail = \"retry\""),
        ] {
            assert_ne!(key(dir, &c, "s").as_ref(), Some(&a), "{c}");
        }
        // The same text in another folder reads other data: another key.
        let other = tempfile::tempdir().unwrap();
        assert_ne!(key(other.path(), BASE, "s").as_ref(), Some(&a));
        // The same files named from the working directory (relative) or absolutely: the same
        // key, so a recipe run from another folder finds its donors.
        let cwd = std::env::current_dir().unwrap();
        let up = "../".repeat(cwd.components().count() - 1);
        let relative = std::path::PathBuf::from(up).join(dir.strip_prefix("/").unwrap());
        assert!(relative.is_relative() && relative.join("c.json").is_file());
        assert_eq!(key(&relative, BASE, "s").as_ref(), Some(&a));
        // A stage without a key is never reused.
        let (r, e) = entry(dir, BASE);
        let shared = Shared {
            data: &r.data,
            tokenizer: crate::data::text::tokenizer(&r).ok(),
            seed: 1,
        };
        assert!(reuse_key(None, &e, &shared).is_none());
    }
}
