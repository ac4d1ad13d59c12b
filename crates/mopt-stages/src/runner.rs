//! Running a pipeline: the baseline and its golden reference, then each stage in order with its
//! gate, rollback or abort, and resume of finished stages (outputs checked by sha256).

use std::path::{Path, PathBuf};
use std::time::Instant;

use mopt_data::LabelMap;
use mopt_recipe::Recipe;
use mopt_train::backend::Token;
use mopt_train::memory::peak_rss_bytes;
use mopt_train::trainer::TrainOptions;
use mopt_train::{DeviceSpec, TrainError};
use serde::{Deserialize, Serialize};

use crate::clock::{self, Clock};
use crate::data::{RunData, Split};
use crate::error::StageError;
use crate::family::FamilyEntry;
use crate::gate::{decide, Action, Decision};
use crate::record::*;
use crate::report::{write_report, PipelineReport};
use crate::stage::{StageContext, StageOutput};
use crate::Pipeline;

/// How to run a pipeline (what does not belong in a recipe).
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The device to run on.
    pub device: DeviceSpec,
    /// Replace an existing run folder.
    pub force: bool,
    /// Continue an interrupted run: finished stages whose outputs verify are reused.
    pub resume: bool,
    /// Stop every training (stages, a teacher trained on the way) after N optimizer steps.
    pub max_steps: Option<usize>,
    /// The run folder (default `[run] output-dir / name`).
    pub run_dir: Option<PathBuf>,
    /// Reuse a stage another run of the same output folder finished with the same settings on
    /// the same input (see [`crate::donor`]).
    pub reuse: bool,
    /// Data-parallel replicas beside `device` (see [`DeviceSpec::data_parallel`]).
    pub replicas: Vec<DeviceSpec>,
}

impl RunOptions {
    /// Options with defaults on `device`.
    pub fn new(device: DeviceSpec) -> Self {
        Self {
            replicas: Vec::new(),
            device,
            force: false,
            resume: false,
            max_steps: None,
            run_dir: None,
            reuse: true,
        }
    }
}

/// The recipe's device (`[run] device`, or `flag` when given: a `--device` value), opened now so
/// that a missing GPU fails before a run folder exists.
pub fn recipe_device(recipe: &Recipe, flag: Option<&str>) -> Result<DeviceSpec, TrainError> {
    let spec = parse_device(recipe, flag)?;
    let token = recipe_token(recipe, None, spec.is_remote())?;
    let spec = spec.with_token(token.as_ref());
    spec.open()?;
    Ok(spec)
}

/// The device `flag` or `[run] device` names, not yet opened.
fn parse_device(recipe: &Recipe, flag: Option<&str>) -> Result<DeviceSpec, TrainError> {
    match flag {
        Some(name) => {
            DeviceSpec::parse(name).map_err(|e| TrainError::Input(format!("--device: {e}")))
        }
        None => DeviceSpec::parse(&recipe.run.device)
            .map_err(|e| TrainError::Input(format!("{}: run.device: {e}", recipe.path.display()))),
    }
}

/// The token remote servers check (`flag`, else `[run] token-file`), read only when a device
/// is `remote`.
fn recipe_token(
    recipe: &Recipe,
    flag: Option<&Path>,
    remote: bool,
) -> Result<Option<Token>, TrainError> {
    match flag.or(recipe.run.token_file.as_deref()) {
        Some(f) if remote => Token::read(f).map(Some),
        _ => Ok(None),
    }
}

/// What the command line says about devices, over the recipe's `[run]` settings.
#[derive(Debug, Clone, Copy, Default)]
pub struct DeviceFlags<'a> {
    /// `--device`, over `[run] device`.
    pub device: Option<&'a str>,
    /// `--token-file`, over `[run] token-file`: the credential remote servers check.
    pub token_file: Option<&'a Path>,
}

/// The main device and the data-parallel replicas (`[run] devices`), each opened once: a
/// remote server that cannot be reached, or refuses the token, fails here, before a run folder
/// exists.
pub fn recipe_devices(
    recipe: &Recipe,
    flags: DeviceFlags<'_>,
) -> Result<(DeviceSpec, Vec<DeviceSpec>), TrainError> {
    let device = parse_device(recipe, flags.device)?;
    if device.is_remote() && recipe.run.devices.iter().any(|d| !d.is_remote()) {
        return Err(TrainError::Input(format!(
            "{}: run.devices lists local device indices, and the device is the remote {}: an index means a device of [run] device's backend; make [run] device local (e.g. `cpu`) and list the servers in devices",
            recipe.path.display(),
            device.name()
        )));
    }
    let remote = device.is_remote() || recipe.run.devices.iter().any(|d| d.is_remote());
    let token = recipe_token(recipe, flags.token_file, remote)?;
    let (main, replicas) = device
        .with_token(token.as_ref())
        .data_parallel(&recipe.run.devices, token.as_ref());
    for d in std::iter::once(&main).chain(&replicas) {
        d.open()?;
    }
    Ok((main, replicas))
}

impl Pipeline {
    /// Run options as the binary builds them for this recipe: `[run] device` and `devices`
    /// (opened), reuse of other runs' stages on; no `--force`, `--resume` or `--max-steps`.
    pub fn options(&self) -> Result<RunOptions, StageError> {
        let (device, replicas) = recipe_devices(&self.recipe, DeviceFlags::default())?;
        Ok(RunOptions {
            replicas,
            ..RunOptions::new(device)
        })
    }
}

/// The golden reference: the baseline's logits on the first validation examples.
#[derive(Debug, Serialize, Deserialize)]
pub struct GoldenReference {
    /// The baseline checkpoint.
    pub baseline: String,
    /// Its sha256.
    pub baseline_sha256: String,
    /// Validation examples, in split order.
    pub examples: usize,
    /// Each example as its split records it (a text's token ids, an image's values).
    pub inputs: Vec<serde_json::Value>,
    /// The baseline's logits.
    pub logits: Vec<Vec<f32>>,
}

/// The model the next stage starts from.
struct Current {
    dir: PathBuf,
    facts: ModelFacts,
    logits: Vec<Vec<f32>>,
}

fn io(p: &Path) -> impl FnOnce(std::io::Error) -> StageError + '_ {
    move |e| StageError::io(p, e)
}

/// Copy a checkpoint folder to `to` atomically (`to.tmp`, then renamed).
fn copy_checkpoint(from: &Path, to: &Path) -> Result<(), StageError> {
    let tmp = to.with_extension("tmp");
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    for entry in std::fs::read_dir(from).map_err(io(from))? {
        let entry = entry.map_err(io(from))?;
        if entry.file_type().map_err(io(from))?.is_file() {
            std::fs::copy(entry.path(), tmp.join(entry.file_name())).map_err(io(&tmp))?;
        }
    }
    if to.exists() {
        std::fs::remove_dir_all(to).map_err(io(to))?;
    }
    std::fs::rename(&tmp, to).map_err(io(to))
}

/// `golden.json`: the baseline's logits on the first validation examples.
fn write_golden(
    run_dir: &Path,
    baseline: &StageRecord,
    data: &RunData,
    logits: &[Vec<f32>],
) -> Result<(), StageError> {
    let n = data.len(Split::Golden);
    write_json_atomic(
        &run_dir.join("golden.json"),
        &GoldenReference {
            baseline: baseline.model.checkpoint.clone(),
            baseline_sha256: baseline.model.sha256.clone(),
            examples: n,
            inputs: (0..n).map(|i| data.record(Split::Golden, i)).collect(),
            logits: logits.to_vec(),
        },
    )
}

/// Prepare the run folder: refuse, replace, or resume an existing one.
/// The run folder as this invocation opened it: on a failure of the input before any stage
/// ran ([`OpenedRunDir::rollback`]), a folder it created is removed and one `--force` set
/// aside is put back, so that a bad input leaves nothing behind and overwrites nothing.
struct OpenedRunDir {
    dir: PathBuf,
    created: bool,
    /// An earlier run `--force` replaces, kept aside until the new run has its baseline.
    displaced: Option<PathBuf>,
}

impl OpenedRunDir {
    /// Undo the opening (best effort: the error being reported matters more).
    fn rollback(&self) {
        if !self.created {
            return;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        if let Some(old) = &self.displaced {
            let _ = std::fs::rename(old, &self.dir);
        }
    }

    /// The new run stands: drop the run it replaces.
    fn commit(&self) -> Result<(), StageError> {
        match &self.displaced {
            Some(old) => std::fs::remove_dir_all(old).map_err(io(old)),
            None => Ok(()),
        }
    }
}

fn open_run_dir(
    recipe: &Recipe,
    dir: &Path,
    opts: &RunOptions,
) -> Result<OpenedRunDir, StageError> {
    let copy = dir.join("recipe.toml");
    let mut displaced = None;
    if dir.exists() {
        if opts.resume {
            let before = std::fs::read_to_string(&copy).unwrap_or_default();
            if before != recipe.source {
                return Err(TrainError::Input(format!(
                    "cannot resume {}: the recipe changed since the run started ({} differs from {}); pass --force to start over, or restore the recipe",
                    shown(dir),
                    shown(&recipe.path),
                    shown(&copy)
                ))
                .into());
            }
            eprintln!("resuming {}", shown(dir));
            return Ok(OpenedRunDir {
                dir: dir.to_path_buf(),
                created: false,
                displaced: None,
            });
        }
        if !opts.force {
            return Err(TrainError::Input(format!(
                "run folder {} already exists (from an earlier run of `{}`); pass --resume to continue it, --force to replace it, or change [run] name",
                shown(dir),
                recipe.run.name
            ))
            .into());
        }
        let mut aside = dir.as_os_str().to_owned();
        aside.push(".replaced");
        let aside = PathBuf::from(aside);
        if aside.exists() {
            std::fs::remove_dir_all(&aside).map_err(io(&aside))?;
        }
        std::fs::rename(dir, &aside).map_err(io(dir))?;
        displaced = Some(aside);
    }
    let opened = OpenedRunDir {
        dir: dir.to_path_buf(),
        created: true,
        displaced,
    };
    let made = std::fs::create_dir_all(dir)
        .map_err(io(dir))
        .and_then(|()| std::fs::write(&copy, &recipe.source).map_err(io(&copy)));
    if let Err(e) = made {
        opened.rollback();
        return Err(e);
    }
    Ok(opened)
}

impl Pipeline {
    /// Run the pipeline; writes the run folder, `report.md`, `report.json` and `chart.svg`.
    pub fn run(&self, opts: &RunOptions) -> Result<PipelineReport, StageError> {
        let wall = Instant::now();
        let recipe = &self.recipe;
        // Everything is validated before the run folder is touched.
        let chain = self.plan_chain()?;
        let run_dir = opts.run_dir.clone().unwrap_or_else(|| recipe.run.run_dir());
        let opened = open_run_dir(recipe, &run_dir, opts)?;
        // A bad input found while loading the data or the baseline leaves nothing behind.
        let undo = |e: StageError| {
            if e.is_input_error() {
                opened.rollback();
            }
            e
        };
        let train_opts = TrainOptions {
            max_steps: opts.max_steps,
            replicas: opts.replicas.clone(),
            resume: opts.resume,
        };
        let device = opts.device.device();

        // The baseline: the teacher (trained first when missing) or the recipe's [model].
        let base_dir = run_dir.join("00-baseline");
        let family = self
            .registry
            .recipe_family(recipe)
            .map_err(StageError::from)
            .map_err(undo)?;
        let (data, baseline_ckpt, baseline_note) = self
            .data_and_baseline(family, &base_dir, opts)
            .map_err(undo)?;
        let ev = Evaluator {
            family,
            registry: &self.registry,
            data: &data,
            settings: EvalSettings {
                eval_batch_size: recipe.train.eval_batch_size,
                evaluation: &recipe.evaluation,
                size: self
                    .registry
                    .example_size(recipe)
                    .map_err(StageError::from)
                    .map_err(undo)?,
                device: device.clone(),
            },
        };
        let (baseline, baseline_logits) = self
            .baseline_record(&base_dir, &baseline_ckpt, &baseline_note, &ev, opts)
            .map_err(undo)?;
        write_golden(&run_dir, &baseline, &data, &baseline_logits).map_err(undo)?;
        opened.commit()?;
        // The run's wall time, earlier invocations included (started once the folder is kept).
        let run_clock = run_dir.join("clocks").join("run.json");
        let before = if opts.resume {
            clock::counted(&run_clock)
        } else {
            0.0
        };
        let wall = Clock::start(
            run_clock,
            before + wall.elapsed().as_secs_f64(),
            clock::PERIOD,
        );

        let shared = RunShared {
            pipeline: self,
            opts,
            train_opts: &train_opts,
            run_dir: &run_dir,
            data: &data,
            ev: &ev,
            baseline_ckpt: &baseline_ckpt,
            baseline: &baseline,
            baseline_logits: &baseline_logits,
            chain: &chain,
        };
        let (records, current, aborted) = shared.run_chain()?;

        let final_dir = run_dir.join("best");
        copy_checkpoint(&current.dir, &final_dir)?;
        let report = write_report(
            self,
            &run_dir,
            &records,
            &current.facts,
            (data.len(Split::Golden), &device),
            wall.elapsed_s(),
            &baseline_ckpt,
        )?;
        if let Some((index, name, reason)) = aborted {
            return Err(StageError::Aborted {
                index,
                name,
                reason,
                report: shown(&run_dir.join("report.md")),
            });
        }
        Ok(report)
    }

    /// The data, loaded by the family with the baseline's label map when it has one, and the
    /// baseline checkpoint (a teacher, trained first when missing, or the recipe's `[model]`
    /// built and saved into `base_dir`) with a note for the report.
    fn data_and_baseline(
        &self,
        family: &FamilyEntry,
        base_dir: &Path,
        opts: &RunOptions,
    ) -> Result<(RunData, PathBuf, String), StageError> {
        let recipe = &self.recipe;
        std::fs::create_dir_all(base_dir).map_err(io(base_dir))?;
        let (baseline_ckpt, baseline_note) = self.baseline_checkpoint(base_dir, opts)?;
        let labels = match &baseline_ckpt {
            Some(c) => Some(LabelMap::load(&c.join("labels.json")).map_err(TrainError::from)?),
            None => None,
        };
        eprintln!("preparing data ({})", recipe.data.source_label());
        let golden = recipe.evaluation.golden_samples.unwrap_or(usize::MAX);
        let format = self.registry.data_format(recipe)?;
        let data = family.data().load(recipe, format, labels, golden)?;
        let sizes = [Split::Train, Split::Valid, Split::Test].map(|s| data.len(s));
        if sizes.contains(&0) {
            return Err(TrainError::Input(format!(
                "{}: a split is empty (train {}, valid {}, test {}); use more data or other [data] fractions",
                shown(&recipe.path),
                sizes[0],
                sizes[1],
                sizes[2]
            ))
            .into());
        }
        eprintln!("data: {}", data.describe());
        let baseline_ckpt = match baseline_ckpt {
            Some(c) => c,
            None => self.build_baseline(family, base_dir, &data, opts)?,
        };
        Ok((data, baseline_ckpt, baseline_note))
    }

    /// The teacher checkpoint, trained first when missing (`None`: the baseline is built from
    /// `[model]` once the data is loaded). Returns a note for the report.
    fn baseline_checkpoint(
        &self,
        base_dir: &Path,
        opts: &RunOptions,
    ) -> Result<(Option<PathBuf>, String), StageError> {
        let Some(t) = &self.recipe.teacher else {
            return Ok((None, "built from [model]".into()));
        };
        if t.checkpoint.join("model.bpk").is_file() {
            eprintln!("teacher: reusing {}", shown(&t.checkpoint));
        }
        let Some(path) = &t.recipe else {
            return Ok((
                Some(t.checkpoint.clone()),
                format!("teacher {}", shown(&t.checkpoint)),
            ));
        };
        let (ckpt, note) = obtain_checkpoint(
            &self.registry,
            &t.checkpoint,
            path,
            &base_dir.join("teacher-run"),
            opts,
        )?;
        if !ckpt.join("model.bpk").is_file() {
            return Err(TrainError::Recipe(self.recipe.invalid(
                "teacher.checkpoint",
                format!(
                    "the teacher recipe ran but wrote no checkpoint at {}",
                    shown(&ckpt)
                ),
                "point [teacher] checkpoint at `<teacher run folder>/best`",
            ))
            .into());
        }
        Ok((Some(ckpt), format!("teacher {note}")))
    }

    /// Build the recipe's `[model]` (its weights, a fresh head if allowed) and save it as the
    /// baseline checkpoint.
    fn build_baseline(
        &self,
        family: &FamilyEntry,
        base_dir: &Path,
        data: &RunData,
        opts: &RunOptions,
    ) -> Result<PathBuf, StageError> {
        let ckpt = base_dir.join("model");
        if opts.resume && ckpt.join("model.bpk").is_file() {
            return Ok(ckpt);
        }
        family.build(&self.recipe, data, &opts.device.device(), &ckpt)?;
        Ok(ckpt)
    }

    fn baseline_record(
        &self,
        base_dir: &Path,
        ckpt: &Path,
        note: &str,
        ev: &Evaluator,
        opts: &RunOptions,
    ) -> Result<(StageRecord, Vec<Vec<f32>>), StageError> {
        let path = base_dir.join("stage.json");
        let logits_path = base_dir.join("logits.json");
        if opts.resume {
            if let Some(r) = read_json::<StageRecord>(&path) {
                let logits = read_json::<Vec<Vec<f32>>>(&logits_path);
                if let Some(logits) =
                    logits.filter(|_| checkpoint_sha256(ckpt).is_ok_and(|h| h == r.model.sha256))
                {
                    eprintln!("baseline: measured earlier, checkpoint verified (sha256)");
                    return Ok((r, logits));
                }
                return Err(TrainError::Input(format!(
                    "cannot resume: the baseline {} changed since the run started; pass --force to start over",
                    shown(ckpt)
                ))
                .into());
            }
        }
        eprintln!(
            "baseline: measuring {} (validation, test, latency)",
            shown(ckpt)
        );
        let t0 = Instant::now();
        let (facts, logits) = ev.measure(ckpt)?;
        let r = StageRecord {
            index: 0,
            name: if self.recipe.teacher.is_some() {
                "teacher".into()
            } else {
                "baseline".into()
            },
            kind: "baseline".into(),
            settings: vec![note.to_string()],
            input: None,
            model: facts,
            decision: Decision {
                action: Action::Baseline,
                passed: true,
                reason: format!("golden baseline ({note})"),
            },
            delta_valid_vs_baseline: 0.0,
            delta_test_vs_baseline: 0.0,
            max_logit_error_vs_input: 0.0,
            max_logit_error_vs_baseline: 0.0,
            steps: 0,
            wall_time_s: t0.elapsed().as_secs_f64(),
            peak_rss_bytes: peak_rss_bytes(),
            max_steps: opts.max_steps,
            artifacts: Vec::new(),
            reuse_key: None,
            facts: serde_json::Value::Null,
            notes: Vec::new(),
            references: Vec::new(),
        };
        write_json_atomic(&logits_path, &logits)?;
        write_json_atomic(&path, &r)?;
        Ok((r, logits))
    }
}

/// What the runner measures every model with: the model's family (the run's, or the family
/// its checkpoint names: a cross-family student's) on the run's data.
struct Evaluator<'a> {
    family: &'a FamilyEntry,
    registry: &'a crate::Registry,
    data: &'a RunData,
    settings: EvalSettings<'a>,
}

impl Evaluator<'_> {
    /// The family of the checkpoint at `dir`: the one its `config.json` names, else the run's.
    fn family_of(&self, dir: &Path) -> &FamilyEntry {
        self.registry.source_family(dir).unwrap_or(self.family)
    }

    /// The checkpoint's facts and its logits on the golden set.
    fn measure(&self, dir: &Path) -> Result<(ModelFacts, Vec<Vec<f32>>), StageError> {
        self.family_of(dir).measure(dir, self.data, &self.settings)
    }
}

/// The stage that aborted a run: its index, name and the gate's reason.
type Aborted = (usize, String, String);

/// What every stage of a run shares.
struct RunShared<'a> {
    pipeline: &'a Pipeline,
    opts: &'a RunOptions,
    train_opts: &'a TrainOptions,
    run_dir: &'a Path,
    data: &'a RunData,
    ev: &'a Evaluator<'a>,
    baseline_ckpt: &'a Path,
    baseline: &'a StageRecord,
    baseline_logits: &'a [Vec<f32>],
    chain: &'a crate::plan::ChainPlan,
}

impl RunShared<'_> {
    /// Every stage in order, each on the last passing model: its records, the final current
    /// model, and the stage that aborted the run, if one did.
    fn run_chain(&self) -> Result<(Vec<StageRecord>, Current, Option<Aborted>), StageError> {
        let mut records = vec![self.baseline.clone()];
        let mut current = Current {
            dir: self.baseline_ckpt.to_path_buf(),
            facts: self.baseline.model.clone(),
            logits: self.baseline_logits.to_vec(),
        };
        let mut aborted: Option<(usize, String, String)> = None;
        let mut earlier: Vec<(String, PathBuf)> =
            vec![("baseline".into(), self.baseline_ckpt.to_path_buf())];
        for (entry, stage) in &self.pipeline.stages {
            let dir = self.run_dir.join(entry.dir_name());
            let reused = if self.opts.resume {
                reuse(&dir, &current)?
            } else {
                None
            };
            let (record, out_logits, out_dir) = match reused {
                Some(r) => r,
                None => self.run_stage(entry, stage.as_ref(), &current, &earlier)?,
            };
            earlier.push((entry.name.clone(), out_dir.clone()));
            match record.decision.action {
                Action::Kept | Action::Baseline => {
                    current = Current {
                        dir: out_dir,
                        facts: record.model.clone(),
                        logits: out_logits,
                    };
                }
                Action::RolledBack => {}
                Action::Aborted => {
                    aborted = Some((
                        entry.index,
                        entry.name.clone(),
                        record.decision.reason.clone(),
                    ));
                }
            }
            records.push(record);
            if aborted.is_some() {
                break;
            }
        }

        Ok((records, current, aborted))
    }

    /// Run `stage` on the current model (or take the output another run finished with the same
    /// reuse key), then measure and judge it; its folder is made afresh.
    fn run_stage(
        &self,
        entry: &mopt_recipe::StageEntry,
        stage: &dyn crate::Stage,
        current: &Current,
        earlier: &[(String, PathBuf)],
    ) -> Result<Finished, StageError> {
        let (recipe, opts) = (&self.pipeline.recipe, self.opts);
        let dir = self.run_dir.join(entry.dir_name());
        // Resuming, an interrupted stage keeps its folder: its training goes on from the last
        // saved state, and what it computes before training is computed again, the same.
        if dir.exists() && !opts.resume {
            std::fs::remove_dir_all(&dir).map_err(io(&dir))?;
        }
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        eprintln!("stage {} ({}): {}", entry.index, entry.kind, entry.name);
        // Its wall time, counting an interrupted earlier invocation's when resuming.
        let clock = Clock::resume_or_start(
            self.run_dir
                .join("clocks")
                .join(format!("{}.json", entry.dir_name())),
            opts.resume,
        );
        let cx = StageContext {
            entry,
            // The current model's family: after a cross-family distill stage, the student's.
            family: self.ev.family_of(&current.dir),
            registry: &self.pipeline.registry,
            device: &opts.device,
            data: self.data,
            data_spec: &recipe.data,
            size: self.pipeline.registry.example_size(recipe)?,
            evaluation: &recipe.evaluation,
            seed: recipe.run.seed,
            opts: self.train_opts,
            baseline: self.baseline_ckpt,
            baseline_valid: &self.baseline.model.valid,
            input_valid: &current.facts.valid,
            input_logits: &current.logits,
            earlier,
            dir: &dir,
        };
        let (reuse_key, donor) = self.donor(entry, stage, current);
        let out = match donor {
            Some(d) => d.into_output(),
            None => stage
                .run(&current.dir, &cx)
                .map_err(|e| e.in_stage(entry))?,
        };
        let settings = self.chain.stages[entry.index - 1].settings.clone();
        let prov = Provenance {
            clock: &clock,
            max_steps: opts.max_steps,
            reuse_key,
        };
        let r = finish_stage(
            entry,
            settings,
            current,
            self.baseline,
            self.baseline_logits,
            out,
            self.ev,
            &dir,
            prov,
        )?;
        clock.finish();
        let d = &r.0.decision;
        eprintln!(
            "stage {} ({}): {} — {}",
            entry.index,
            entry.name,
            d.action.label(),
            d.reason
        );
        Ok(r)
    }

    /// The stage's reuse key, and a finished stage of another run in the same output folder
    /// with that key, the same input and the same baseline (not with `--no-reuse` or in smoke
    /// runs).
    fn donor(
        &self,
        entry: &mopt_recipe::StageEntry,
        stage: &dyn crate::Stage,
        current: &Current,
    ) -> (Option<String>, Option<crate::donor::Donor>) {
        let recipe = &self.pipeline.recipe;
        let shared = crate::donor::Shared {
            data: &recipe.data,
            // Validated before the run began (the registry checks the data's sections).
            tokenizer: self
                .pipeline
                .registry
                .data_format(recipe)
                .ok()
                .and_then(|f| crate::data::tokenizer(f, recipe).ok().flatten()),
            seed: recipe.run.seed,
        };
        let key = crate::donor::reuse_key(stage.reuse_key(), entry, &shared);
        if !self.opts.reuse || self.opts.max_steps.is_some() {
            return (key, None);
        }
        let donor = key.as_deref().and_then(|key| {
            let w = crate::donor::Wanted {
                index: entry.index,
                kind: &entry.kind,
                key,
                input_sha256: &current.facts.sha256,
                baseline_sha256: &self.baseline.model.sha256,
            };
            crate::donor::find(self.run_dir.parent()?, self.run_dir, &w)
        });
        (key, donor)
    }
}

/// A stage's record, its output's golden logits and its output checkpoint.
type Finished = (StageRecord, Vec<Vec<f32>>, PathBuf);

/// The checkpoint `ckpt`, produced first by the recipe at `recipe` when it is missing (resuming
/// that recipe's run when it was interrupted). With `--max-steps` the recipe runs as a smoke run
/// into `smoke_dir` instead, so that a smoke model never becomes the shared checkpoint. Returns
/// the checkpoint to use and a note for the report.
/// The recipe's families and kinds are looked up in `registry`.
pub fn obtain_checkpoint(
    registry: &crate::Registry,
    ckpt: &Path,
    recipe: &Path,
    smoke_dir: &Path,
    opts: &RunOptions,
) -> Result<(PathBuf, String), StageError> {
    if ckpt.join("model.bpk").is_file() {
        return Ok((ckpt.to_path_buf(), format!("{} (reused)", shown(ckpt))));
    }
    let producer = Pipeline::load(recipe, registry)?;
    let mut popts = RunOptions {
        force: false,
        resume: true,
        run_dir: None,
        ..opts.clone()
    };
    if let Some(n) = opts.max_steps {
        eprintln!(
            "no checkpoint at {}; smoke run (--max-steps {n}) of {} into {}",
            shown(ckpt),
            shown(recipe),
            shown(smoke_dir)
        );
        popts.run_dir = Some(smoke_dir.to_path_buf());
        producer.run(&popts)?;
        return Ok((
            smoke_dir.join("best"),
            format!(
                "trained by {} with --max-steps {n} (smoke run, kept inside this run)",
                shown(recipe)
            ),
        ));
    }
    eprintln!(
        "no checkpoint at {}; running {} first",
        shown(ckpt),
        shown(recipe)
    );
    producer.run(&popts)?;
    Ok((
        ckpt.to_path_buf(),
        format!(
            "{} (fine-tuned in this run by {})",
            shown(ckpt),
            shown(recipe)
        ),
    ))
}

/// A finished stage's record, reused when its input is the current model and its outputs
/// verify; `None` means run it (again).
fn reuse(dir: &Path, current: &Current) -> Result<Option<Finished>, StageError> {
    let Some(r) = read_json::<StageRecord>(&dir.join("stage.json")) else {
        return Ok(None);
    };
    let Some(logits) = read_json::<Vec<Vec<f32>>>(&dir.join("logits.json")) else {
        return Ok(None);
    };
    let same_input = r
        .input
        .as_ref()
        .is_some_and(|i| i.sha256 == current.facts.sha256);
    let out_dir = PathBuf::from(&r.model.checkpoint);
    let out_ok = checkpoint_sha256(&out_dir).is_ok_and(|h| h == r.model.sha256);
    let artifacts_ok = r
        .artifacts
        .iter()
        .all(|a| sha256_file(Path::new(&a.path)).is_ok_and(|h| h == a.sha256));
    if same_input && out_ok && artifacts_ok {
        eprintln!(
            "stage {} ({}): finished earlier, outputs verified (sha256), reused",
            r.index, r.name
        );
        return Ok(Some((r, logits, out_dir)));
    }
    eprintln!(
        "stage {} ({}): its earlier outputs do not verify ({}); running it again",
        r.index,
        r.name,
        if !same_input {
            "another input"
        } else {
            "changed files"
        }
    );
    Ok(None)
}

/// The stage's clock, whether it was a smoke run, and its reuse key.
struct Provenance<'a> {
    clock: &'a Clock,
    max_steps: Option<usize>,
    reuse_key: Option<String>,
}

/// Hand on the stage's hard-label twin (`references[i]`), better on validation than the
/// stage's own model (`facts`): the stage is never worse than its twin there by construction.
/// The distilled model becomes a reference beside it, the report says which was kept and why,
/// and `facts.kept` records it (test is reported, never used to decide).
fn keep_twin(
    entry: &mopt_recipe::StageEntry,
    mut out: StageOutput,
    references: &mut Vec<ReferenceRecord>,
    i: usize,
    facts: ModelFacts,
    metric: mopt_recipe::Metric,
) -> (StageOutput, ModelFacts) {
    let twin = references[i].model.clone();
    let (t, s) = (twin.valid.value(metric), facts.valid.value(metric));
    let line = format!(
        "Kept the hard-label twin: validation {} {t:.4} against the distilled model's {s:.4}; the better of the two on validation is handed on (test is reported, never used to decide).",
        metric.name()
    );
    eprintln!("stage {}: {line}", entry.index);
    out.notes.push(line);
    set_kept(&mut out.facts, "hard-label twin");
    references.push(ReferenceRecord {
        name: format!("{} (distilled)", entry.name),
        about: "the stage's distilled model, handed over for its hard-label twin (better on validation)".into(),
        model: facts,
        twin: false,
    });
    out.checkpoint = out.references[i].checkpoint.clone();
    (out, twin)
}

/// `facts.kept`: which of the stage's model and its twin was handed on.
fn set_kept(facts: &mut serde_json::Value, kept: &str) {
    if facts.is_null() {
        *facts = serde_json::json!({});
    }
    if let serde_json::Value::Object(m) = facts {
        m.insert("kept".into(), kept.into());
    }
}

#[allow(clippy::too_many_arguments)]
fn finish_stage(
    entry: &mopt_recipe::StageEntry,
    settings: Vec<String>,
    current: &Current,
    baseline: &StageRecord,
    baseline_logits: &[Vec<f32>],
    out: StageOutput,
    ev: &Evaluator,
    dir: &Path,
    prov: Provenance<'_>,
) -> Result<Finished, StageError> {
    let (facts, logits) = if out.checkpoint == current.dir {
        (current.facts.clone(), current.logits.clone())
    } else {
        eprintln!("stage {}: measuring its output", entry.index);
        ev.measure(&out.checkpoint)?
    };
    let mut references = Vec::new();
    let mut twin = None;
    for r in &out.references {
        eprintln!("stage {}: measuring {}", entry.index, r.name);
        let (model, logits) = ev.measure(&r.checkpoint)?;
        if r.twin {
            twin = Some((references.len(), logits));
        }
        references.push(ReferenceRecord {
            name: r.name.clone(),
            about: r.about.clone(),
            model,
            twin: r.twin,
        });
    }
    let metric = ev.family.metric();
    let kept = twin.map(|(i, twin_logits)| {
        let (t, s) = (
            references[i].model.valid.value(metric),
            facts.valid.value(metric),
        );
        (metric.better(t, s), i, twin_logits)
    });
    let (out, facts, logits) = match kept {
        Some((true, i, twin_logits)) => {
            let (out, facts) = keep_twin(entry, out, &mut references, i, facts, metric);
            (out, facts, twin_logits)
        }
        Some((false, ..)) => {
            let mut out = out;
            set_kept(&mut out.facts, "distilled");
            (out, facts, logits)
        }
        None => (out, facts, logits),
    };
    let err_input = out
        .logit_error_vs_input
        .unwrap_or_else(|| max_abs_diff(&logits, &current.logits));
    let err_baseline =
        max_abs_diff(&logits, baseline_logits).max(if out.checkpoint == current.dir {
            err_input
        } else {
            0.0
        });
    let headline = crate::record::Headline(ev.family.metric());
    let decision = decide(
        entry.gate.as_ref(),
        &facts.valid,
        &baseline.model.valid,
        &current.facts.valid,
        err_input,
    );
    let artifacts = out
        .artifacts
        .iter()
        .map(|p| {
            Ok(FileHash {
                path: shown(p),
                sha256: sha256_file(p)?,
            })
        })
        .collect::<Result<Vec<_>, StageError>>()?;
    let record = StageRecord {
        index: entry.index,
        name: entry.name.clone(),
        kind: entry.kind.clone(),
        settings,
        input: Some(FileHash {
            path: shown(&current.dir),
            sha256: current.facts.sha256.clone(),
        }),
        delta_valid_vs_baseline: headline.of(&facts.valid) - headline.of(&baseline.model.valid),
        delta_test_vs_baseline: headline.of(&facts.test) - headline.of(&baseline.model.test),
        model: facts,
        decision,
        max_logit_error_vs_input: err_input,
        max_logit_error_vs_baseline: err_baseline,
        steps: out.steps,
        wall_time_s: prov.clock.elapsed_s(),
        peak_rss_bytes: peak_rss_bytes(),
        max_steps: prov.max_steps,
        artifacts,
        reuse_key: prov.reuse_key,
        facts: out.facts,
        notes: out.notes,
        references,
    };
    write_json_atomic(&dir.join("logits.json"), &logits)?;
    write_json_atomic(&dir.join("stage.json"), &record)?;
    Ok((record, logits, out.checkpoint))
}
