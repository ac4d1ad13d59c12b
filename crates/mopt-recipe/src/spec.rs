//! The validated, typed recipe: shared sections once, then the ordered stages.

use std::path::{Path, PathBuf};

use crate::data::{data_spec, DataSpec};
use crate::device::DeviceRef;
use crate::error::RecipeError;
use crate::model::{model_spec, ModelSpec};
use crate::raw::*;
use crate::scope::Scope;
use crate::section::{sections, Section};
use crate::stage::{stage_entries, StageEntry};
use crate::train::{train_spec, LrFindSpec, TrainSpec};

/// A validated recipe. Stage kinds validate their own keys (`mopt_stages`); everything else is
/// typed here.
#[derive(Debug, Clone)]
pub struct Recipe {
    /// The recipe file.
    pub path: PathBuf,
    /// Its text, copied into each run folder.
    pub source: String,
    /// `[run]`.
    pub run: RunSpec,
    /// `[model]`: the baseline when there is no `[teacher]`.
    pub model: Option<ModelSpec>,
    /// `[data]`.
    pub data: DataSpec,
    /// `[train]`: the defaults every stage starts from.
    pub train: TrainSpec,
    /// `[lr-find]`.
    pub lr_find: LrFindSpec,
    /// `[teacher]`: the baseline checkpoint (and the recipe that trains it when missing).
    pub teacher: Option<TeacherSpec>,
    /// `[evaluation]`.
    pub evaluation: EvaluationSpec,
    /// The ordered stages; a recipe without `[[stage]]` has one `finetune` stage.
    pub stages: Vec<StageEntry>,
    /// The sections outside the recipe's grammar, by name: its data format's (`[tokenizer]`
    /// for text), which the format validates; the stage runner refuses one no owner reads.
    pub sections: std::collections::BTreeMap<String, Section>,
    /// The whole file, for errors found after validation.
    pub scope: Scope,
}

/// `[teacher]`: the fine-tuned model the stages start from and are gated against.
#[derive(Debug, Clone)]
pub struct TeacherSpec {
    /// A mopt checkpoint folder (`config.json` + `model.bpk`).
    pub checkpoint: PathBuf,
    /// Recipe that produces the checkpoint when it does not exist yet.
    pub recipe: Option<PathBuf>,
}

/// `[evaluation]`: the golden reference, the latency benchmark and the baseline analysis.
#[derive(Debug, Clone)]
pub struct EvaluationSpec {
    /// Validation examples in the golden reference; `None` = the whole validation split.
    pub golden_samples: Option<usize>,
    /// Untimed runs before the latency benchmark.
    pub latency_warmup: usize,
    /// Timed runs at batch 32 (4x at batch 1); 0 skips the latency benchmark.
    pub latency_runs: usize,
    /// The size of an example in the latency benchmark as written (`latency-seq-len`, tokens
    /// for text); `None`: the data's example size (a tokenizer's `max-len`).
    pub latency_seq_len: Option<usize>,
    /// Per-module parameters, FLOPs and forward-time shares of the baseline.
    pub analysis: bool,
}

/// `[run]`: naming, output and reproducibility.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// The run folder's name.
    pub name: String,
    /// Parent of the run folder; the run writes to `output_dir/name`.
    pub output_dir: PathBuf,
    /// Seed of init, dropout and data order.
    pub seed: u64,
    /// `[run] seeds`: run the recipe once per seed and summarize (as `--seeds`); empty: once.
    pub seeds: Vec<u64>,
    /// Device name (`cpu`); the CLI's `--device` overrides it.
    pub device: String,
    /// Data-parallel devices (`[run] devices`): indices of `device`'s backend and remote
    /// servers' addresses; the first is the main device (the optimizer's). Empty: one device.
    /// `batch-size` is per device: a step sees `batch-size × devices × grad-accum-steps` examples.
    pub devices: Vec<DeviceRef>,
    /// `[run] token-file`: the credential remote servers check (`mopt-train serve --token-file`),
    /// read when the devices open; the CLI's `--token-file` overrides it.
    pub token_file: Option<PathBuf>,
}

impl RunSpec {
    /// The run folder: `output_dir/name`.
    pub fn run_dir(&self) -> PathBuf {
        self.output_dir.join(&self.name)
    }
}

fn run_spec(cx: &Scope, r: RawRun) -> Result<RunSpec, RecipeError> {
    let name = r.name.trim().to_string();
    if name.is_empty() || name.contains(['/', '\\']) || name == "." || name == ".." {
        return Err(cx.err(
            "run.name",
            format!("`{}` is not a usable run-folder name", r.name),
            "use a plain name such as `finetune-teacher` (no slashes)",
        ));
    }
    Ok(RunSpec {
        name,
        output_dir: cx.resolve(r.output_dir.as_deref().unwrap_or("checkpoints")),
        seed: r.seed.unwrap_or(42),
        seeds: seeds(cx, r.seeds)?,
        device: r.device.unwrap_or_else(|| "cpu".into()),
        devices: devices(cx, r.devices)?,
        token_file: r.token_file.map(|f| cx.resolve(&f)),
    })
}

/// The first value of `v` that appeared earlier in it.
pub(crate) fn first_repeat<T: Ord>(v: &[T]) -> Option<&T> {
    let mut seen = std::collections::BTreeSet::new();
    v.iter().find(|x| !seen.insert(*x))
}

fn seeds(cx: &Scope, s: Option<Vec<u64>>) -> Result<Vec<u64>, RecipeError> {
    let s = s.unwrap_or_default();
    if let Some(dup) = first_repeat(&s) {
        return Err(cx.err(
            "run.seeds",
            format!("seed {dup} is listed twice"),
            "list each seed once, e.g. seeds = [42, 1, 2]",
        ));
    }
    if s.len() == 1 {
        return Err(cx.err(
            "run.seeds",
            "one seed is an anecdote: `seeds` runs the recipe once per seed and summarizes",
            "list two seeds or more, or use `seed` for one run",
        ));
    }
    Ok(s)
}

fn devices(cx: &Scope, d: Option<Vec<RawDevice>>) -> Result<Vec<DeviceRef>, RecipeError> {
    d.unwrap_or_default()
        .into_iter()
        .map(|raw| match raw {
            RawDevice::Index(i) => Ok(DeviceRef::Local(i)),
            RawDevice::Address(a) => DeviceRef::parse(&a),
        })
        .collect::<Result<Vec<_>, _>>()
        .and_then(crate::device::checked)
        .map_err(|e| cx.err("run.devices", e.to_string(), e.fix()))
}

fn teacher_spec(cx: &Scope, t: RawTeacher) -> Result<TeacherSpec, RecipeError> {
    let recipe = match &t.recipe {
        Some(r) => Some(cx.input_file("teacher.recipe", r)?),
        None => None,
    };
    let checkpoint = cx.resolve(&t.checkpoint);
    if recipe.is_none() && !checkpoint.join("model.bpk").is_file() {
        return Err(cx.err(
            "teacher.checkpoint",
            format!("no mopt checkpoint at `{}` (needs model.bpk and config.json)", checkpoint.display()),
            "train the teacher first, or add `recipe = \"finetune_teacher.toml\"` so mopt trains it when missing",
        ));
    }
    Ok(TeacherSpec { checkpoint, recipe })
}

fn evaluation_spec(cx: &Scope, e: RawEvaluation) -> Result<EvaluationSpec, RecipeError> {
    Ok(EvaluationSpec {
        golden_samples: match e.golden_samples {
            Some(n) => Some(cx.positive("evaluation.golden-samples", Some(n), n)?),
            None => None,
        },
        latency_warmup: e.latency_warmup.unwrap_or(10),
        latency_runs: e.latency_runs.unwrap_or(30),
        latency_seq_len: match e.latency_seq_len {
            Some(n) => Some(cx.positive("evaluation.latency-seq-len", Some(n), n)?),
            None => None,
        },
        analysis: e.analysis.unwrap_or(true),
    })
}

impl EvaluationSpec {
    /// The size of an example in the latency benchmark: `latency-seq-len`, else `example_size`
    /// (the data's: a tokenizer's `max-len`, 0 for fixed-shape inputs, whose size is ignored).
    pub fn seq_len(&self, example_size: usize) -> usize {
        match example_size {
            0 => 0,
            n => self.latency_seq_len.unwrap_or(n),
        }
    }
}

fn lr_find_spec(cx: &Scope, lf: RawLrFind) -> Result<LrFindSpec, RecipeError> {
    let spec = LrFindSpec {
        start_lr: lf.start_lr.unwrap_or(1e-7),
        end_lr: lf.end_lr.unwrap_or(1e-2),
        steps: cx.positive("lr-find.steps", lf.steps, 200)?,
    };
    if !(spec.start_lr > 0.0 && spec.start_lr < spec.end_lr && spec.end_lr <= 1.0) {
        return Err(cx.err(
            "lr-find.start-lr",
            "need 0 < start-lr < end-lr <= 1",
            "e.g. start-lr = 1e-7, end-lr = 1e-2",
        ));
    }
    Ok(spec)
}

pub(crate) fn validate(path: &Path, source: &str, raw: RawRecipe) -> Result<Recipe, RecipeError> {
    let cx = Scope::root(path, source);
    refuse_old_sections(&cx, raw.distill.as_ref(), raw.report.as_ref())?;
    let run = run_spec(&cx, raw.run)?;
    let model = match raw.model {
        Some(m) => Some(model_spec(&cx.nested("model"), m)?),
        None => None,
    };
    let data = data_spec(&cx, raw.data)?;
    let train_cx = cx.nested("train");
    let train = train_spec(&train_cx, train_cx.deserialize(raw.train.clone())?)?;
    let lr_find = lr_find_spec(&cx, raw.lr_find)?;
    let teacher = match raw.teacher {
        Some(t) => Some(teacher_spec(&cx, t)?),
        None => None,
    };
    check_baseline(&cx, model.as_ref(), teacher.as_ref())?;
    let evaluation = evaluation_spec(&cx, raw.evaluation)?;
    let stages = stage_entries(&cx, stages_or_finetune(raw.stage), &raw.train)?;
    Ok(Recipe {
        path: path.to_path_buf(),
        source: source.to_string(),
        run,
        model,
        data,
        train,
        lr_find,
        teacher,
        evaluation,
        stages,
        sections: sections(&cx, raw.sections)?,
        scope: cx,
    })
}

/// Refuse the pre-stages sections `[distill]` and `[report]`, with how to migrate them.
fn refuse_old_sections(
    cx: &Scope,
    distill: Option<&toml::Value>,
    report: Option<&toml::Value>,
) -> Result<(), RecipeError> {
    if distill.is_some() {
        return Err(cx.err(
            "distill",
            "`[distill]` is now a stage",
            "write `[[stage]]` with `kind = \"distill\"` and move the [distill] keys under it (`[[distill.match]]` becomes `[[stage.match]]`, the student's [model] becomes `[stage.student]`); the shipped recipes in recipes/ show the form",
        ));
    }
    if report.is_some() {
        return Err(cx.err(
            "report",
            "`[report]` is now `[evaluation]`",
            "rename the section to [evaluation] (same keys)",
        ));
    }
    Ok(())
}

/// Refuse a recipe whose baseline is neither or both of `[model]` and `[teacher]`.
fn check_baseline(
    cx: &Scope,
    model: Option<&ModelSpec>,
    teacher: Option<&TeacherSpec>,
) -> Result<(), RecipeError> {
    match (model, teacher) {
        (None, None) => Err(cx.err(
            "model",
            "a recipe needs a baseline: [model] (what the first stage starts from) or [teacher]",
            "add [model] config = \"…/config.json\" (and weights), or [teacher] checkpoint = \"…/best\"",
        )),
        (Some(_), Some(_)) => Err(cx.err(
            "model",
            "[model] and [teacher] both name the baseline",
            "keep [teacher] and move the student's [model] keys into the distill stage's [stage.student]",
        )),
        _ => Ok(()),
    }
}

/// The recipe's `[[stage]]` blocks, or one `finetune` stage when it has none.
fn stages_or_finetune(stages: Vec<toml::Table>) -> Vec<toml::Table> {
    if stages.is_empty() {
        let mut t = toml::Table::new();
        t.insert("kind".into(), toml::Value::String("finetune".into()));
        vec![t]
    } else {
        stages
    }
}

impl Recipe {
    /// This recipe run with `seed` instead of `[run] seed` (the CLI's `--seed`): the run folder
    /// becomes `<name>-seed<seed>`, so that several seeds of one recipe sit side by side, and
    /// the copy of the recipe in the run folder records the override (a `--resume` needs the
    /// same `--seed`). The data split keeps `[data] split-seed`.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.run.seed = seed;
        self.run.name = format!("{}-seed{seed}", self.run.name);
        self.source
            .push_str(&format!("\n# run with `mopt-train --seed {seed}`\n"));
        self
    }

    /// The recipe with `[run] devices` replaced by `devices` (the command line's `--devices`,
    /// checked as the recipe's list is). The copy of the recipe in the run folder records a
    /// change of the device count (which changes the steps), not of the devices: a `--resume`
    /// may name a replacement server, not another count.
    pub fn with_devices(mut self, devices: &[String]) -> Result<Self, RecipeError> {
        let list = devices
            .iter()
            .map(|d| DeviceRef::parse_entry(d))
            .collect::<Result<Vec<_>, _>>()
            .and_then(crate::device::checked)
            .map_err(|e| {
                RecipeError::Invalid(Box::new(crate::Invalid {
                    path: self.path.clone(),
                    key: "--devices".into(),
                    line: None,
                    message: e.to_string(),
                    hint: e.fix().into(),
                }))
            })?;
        let count = |d: &[DeviceRef]| d.len().max(1);
        if count(&list) != count(&self.run.devices) {
            self.source.push_str(&format!(
                "\n# run with `mopt-train --devices` on {} device(s)\n",
                count(&list)
            ));
        }
        self.run.devices = list;
        Ok(self)
    }

    /// The section `name` outside the recipe's grammar (`tokenizer`), as written.
    pub fn section(&self, name: &str) -> Option<&Section> {
        self.sections.get(name)
    }

    /// An error about `key` of this recipe's shared sections, found after validation (e.g.
    /// against a model's shape): it names the file, the key and its line, like every recipe error.
    pub fn invalid(
        &self,
        key: &str,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) -> RecipeError {
        self.scope.err(key, message, hint)
    }
}
