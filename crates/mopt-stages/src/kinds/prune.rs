//! `kind = "prune"`: structured pruning of the input in rounds (the seeds' recipe: about 10% of
//! the prunable units a round, fine-tuning in between, up to a target). Each round scores every
//! unit of the target group kinds (heads, FFN neurons, hidden channels, layers; L1, L2,
//! first-order Taylor over training batches, or random),
//! removes the lowest physically (`mopt_prune`), fine-tunes with the KD loss against the baseline
//! teacher with `distill = true` (its logit cache reused across rounds; the unpruned input itself
//! when the stage starts from the baseline, as Minitron recovers), and is judged by the stage's
//! gate. `on-fail = "retry"` stops at the first failing round (the knee) and keeps the last
//! passing round's model. `baseline = true` also runs the schedule's hard-label twin (the same
//! rounds on hard labels alone) and reports it beside the chain.

use std::path::Path;

use burn::prelude::*;
use mopt_core::{Labeled, ModelConfig};
use mopt_data::epoch_order;
use mopt_distill::kd::KdTask;
use mopt_prune::{
    glob, origin_after, prune, select, units, Criterion, GroupKind, GroupScores, Keep, Limit,
    ParamTable, Progress, Prunable, Ranking, Reduce, UnitLimits, Units,
};
use mopt_recipe::{OnFail, RecipeError, StageEntry};
use mopt_train::trainer::{evaluate, fit, save_checkpoint_dir, Task};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::error::StageError;
use crate::family::FamilyEntry;
use crate::kinds::kd::kd_objective;
use crate::plan::train_settings;
use crate::record::max_abs_diff;
use crate::shape::Shape;
use crate::stage::{
    PlanContext, ReferenceModel, Stage, StageContext, StageKind, StageOutput, StagePlan,
};

/// The kind.
pub struct Prune;

/// A family's `prune` capability: its dependency-group kinds and the stage generic over its
/// model type ([`capability`]).
pub trait CanPrune: Send + Sync {
    /// The group kinds a stage can target, in the order pruning applies them (the first two
    /// are the default targets).
    fn targets(&self) -> Vec<&'static str>;
    /// The limits each group kind declares: its name and theirs ([`GroupKind::limits`]).
    fn limits(&self) -> Vec<(&'static str, &'static Limit)>;
    /// Plan a `prune` stage ([`PruneStage::plan`]).
    fn plan(
        &self,
        stage: &PruneStage,
        entry: &StageEntry,
        input: &Shape,
        cx: &PlanContext,
    ) -> Result<StagePlan, StageError>;
    /// Run a `prune` stage ([`PruneStage::run`]).
    fn run(
        &self,
        stage: &PruneStage,
        input: &Path,
        cx: &StageContext,
    ) -> Result<StageOutput, StageError>;
}

/// The `prune` capability of the model type `M`: its [`Prunable`] groups.
pub fn capability<M: Prunable<Batch: Labeled> + 'static>() -> Box<dyn CanPrune> {
    Box::new(Generic::<M>(std::marker::PhantomData))
}

struct Generic<M>(std::marker::PhantomData<fn() -> M>);

impl<M: Prunable<Batch: Labeled> + 'static> CanPrune for Generic<M> {
    fn targets(&self) -> Vec<&'static str> {
        M::group_kinds().iter().map(|k| k.name()).collect()
    }

    fn limits(&self) -> Vec<(&'static str, &'static Limit)> {
        let kinds = M::group_kinds();
        kinds
            .iter()
            .flat_map(|k| k.limits().iter().map(|l| (k.name(), *l)))
            .collect()
    }

    fn plan(
        &self,
        stage: &PruneStage,
        entry: &StageEntry,
        input: &Shape,
        cx: &PlanContext,
    ) -> Result<StagePlan, StageError> {
        stage.plan::<M>(entry, input, cx)
    }

    fn run(
        &self,
        stage: &PruneStage,
        input: &Path,
        cx: &StageContext,
    ) -> Result<StageOutput, StageError> {
        stage.run::<M>(input, cx)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawPrune {
    targets: Option<Vec<String>>,
    criterion: Option<String>,
    reduce: Option<String>,
    ranking: Option<String>,
    target: Option<f64>,
    step: Option<f64>,
    taylor_batches: Option<usize>,
    ignore_layers: Option<Vec<usize>>,
    distill: Option<bool>,
    alpha: Option<f64>,
    temperature: Option<f64>,
    teacher_top_k: Option<usize>,
    seed: Option<u64>,
    compare: Option<Vec<String>>,
    baseline: Option<bool>,
    ratios: Option<std::collections::BTreeMap<String, f64>>,
}

/// A prune stage, validated.
#[derive(Clone)]
pub struct PruneStage {
    /// The names of the group kinds pruned, in the order the model family applies them.
    pub targets: Vec<&'static str>,
    /// The importance criterion.
    pub criterion: Criterion,
    /// How a group's member scores combine.
    pub reduce: Reduce,
    /// Local (per scope) or global ranking.
    pub ranking: Ranking,
    /// Fraction of the input's prunable units removed by the last round.
    pub target: f64,
    /// Fraction of the input's units removed per round.
    pub step: f64,
    /// Training batches the Taylor gradients are accumulated over.
    pub taylor_batches: usize,
    /// What every round keeps (minimums, multiples, ignored layers, ratios).
    pub limits: UnitLimits,
    /// Fine-tune with the KD loss against the baseline, the unpruned input itself when the
    /// stage starts from the baseline (Minitron's recovery).
    pub distill: bool,
    /// KD weight of the hard labels in the fine-tuning.
    pub alpha: f64,
    /// KD temperature.
    pub temperature: f64,
    /// KD from each teacher row's `k` largest logits and the remaining mass (`None`: all).
    pub teacher_top_k: Option<usize>,
    /// Seed of the random criterion.
    pub seed: u64,
    /// The stage's gate retries (stops at the knee).
    pub retry: bool,
    /// Criteria run with the same schedule for comparison, reported beside the chain.
    pub compare: Vec<Criterion>,
    /// Also run the schedule's hard-label twin (`baseline = true`): the same rounds, criterion
    /// and budget, recovered on hard labels alone, reported beside the chain.
    pub twin: bool,
}

impl PruneStage {
    /// The number of rounds (up to the largest target, a scope's included).
    pub fn rounds(&self) -> usize {
        let top = self
            .limits
            .scopes
            .iter()
            .map(|(_, t)| *t)
            .fold(self.target, f64::max);
        ((top / self.step) - 1e-9).ceil().max(1.0) as usize
    }

    /// The target group kinds of an `M`.
    fn groups<M: Prunable>(&self) -> Vec<&'static dyn GroupKind<Config = M::Config>> {
        M::group_kinds()
            .into_iter()
            .filter(|k| self.targets.contains(&k.name()))
            .collect()
    }

    /// The layers of an `M` of `config`, checked against its layer-scoped target kinds (a
    /// model that declares such a kind counts its layers in `Prunable::layers`).
    fn layers<M: Prunable>(&self, config: &M::Config) -> Result<Vec<usize>, StageError> {
        let n = M::layers(config);
        for k in self.groups::<M>().into_iter().filter(|k| k.layer_scoped()) {
            if k.scopes(config) > n {
                return Err(StageError::Unsupported(format!(
                    "group kind `{}` is layer-scoped with {} scopes, but the model counts {n} layers: implement `Prunable::layers` for it",
                    k.name(),
                    k.scopes(config)
                )));
            }
        }
        Ok((0..n).collect())
    }

    /// The units round `r` keeps. `origin[l]`: the input layer that layer `l` is.
    fn keep<M: Prunable>(
        &self,
        scores: &GroupScores,
        config: &M::Config,
        orig: &Units,
        origin: &[usize],
        r: usize,
    ) -> Keep {
        let kinds: Vec<(&dyn GroupKind<Config = M::Config>, mopt_prune::Rule)> = self
            .groups::<M>()
            .into_iter()
            .map(|k| (k, k.rule(&self.limits)))
            .collect();
        let at = Progress {
            orig,
            origin,
            progress: r as f64 * self.step,
            target: self.target,
        };
        select(&kinds, scores, config, &at, &self.limits, self.ranking)
    }

    /// The target kinds' names, as a recipe lists them.
    fn target_names(&self) -> String {
        self.targets
            .iter()
            .map(|k| format!("\"{k}\""))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Cumulative fraction removed after round `r` (1-based).
    pub fn fraction(&self, r: usize) -> f64 {
        (r as f64 * self.step).min(self.target)
    }
}

fn one_of<T: Copy>(
    cx: &mopt_recipe::Scope,
    key: &str,
    v: Option<&str>,
    default: &str,
    options: &[(&str, T)],
) -> Result<T, RecipeError> {
    let v = v.unwrap_or(default);
    options
        .iter()
        .find(|(n, _)| *n == v)
        .map(|(_, t)| *t)
        .ok_or_else(|| {
            cx.err(
                key,
                format!("unknown {key} `{v}`"),
                format!(
                    "use one of: {}",
                    options
                        .iter()
                        .map(|(n, _)| format!("`{n}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        })
}

/// What a family without the capability lacks.
const NEEDS: (&str, &str) = ("a prunable model", "declares no dependency groups");

/// `targets`, validated against the family's group kinds, in the family's order.
fn parse_targets(
    cx: &mopt_recipe::Scope,
    targets: Option<Vec<String>>,
    family: &FamilyEntry,
) -> Result<Vec<&'static str>, RecipeError> {
    let Some(can) = family.capability::<dyn CanPrune>() else {
        return Err(cx.err(
            "kind",
            family.lacks("prune", NEEDS.0, NEEDS.1),
            "implement `mopt_core::prune::Prunable` for the model and register `kinds::prune::capability::<M>()` in the family's `capabilities`",
        ));
    };
    let known = can.targets();
    let listed = known
        .iter()
        .map(|k| format!("\"{k}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let default: Vec<String> = known.iter().take(2).map(|k| k.to_string()).collect();
    let mut wanted = Vec::new();
    for t in targets.unwrap_or(default) {
        match known.iter().find(|k| **k == t) {
            Some(k) => wanted.push(*k),
            None => {
                return Err(cx.err(
                    "targets",
                    format!("unknown pruning target `{t}`"),
                    format!("use any of {listed}"),
                ))
            }
        }
    }
    if wanted.is_empty() {
        return Err(cx.err(
            "targets",
            "nothing to prune",
            format!("list any of {listed}"),
        ));
    }
    let targets: Vec<&'static str> = known.into_iter().filter(|k| wanted.contains(k)).collect();
    Ok(targets)
}

/// The limits the family's group kinds declare, taken out of `settings`: each set one's group
/// kind, key and value (a positive integer).
fn take_limits(
    cx: &mopt_recipe::Scope,
    settings: &mut toml::Table,
    declared: &[(&'static str, &'static Limit)],
) -> Result<Vec<(&'static str, &'static str, usize)>, RecipeError> {
    let mut set = Vec::new();
    for (group, limit) in declared {
        let Some(v) = settings.get(limit.key) else {
            continue;
        };
        let n = v.as_integer().and_then(|n| usize::try_from(n).ok());
        let Some(n) = n.filter(|n| *n > 0) else {
            return Err(cx.err(
                limit.key,
                format!("`{v}` is not a positive integer"),
                format!("{} (default {})", limit.about, limit.default),
            ));
        };
        set.push((*group, limit.key, n));
    }
    // Removed after the loop: several kinds may read one limit (a ResNet's `channels` and
    // `residual` both read `hidden-multiple`), each with its entry.
    for (_, key, _) in &set {
        settings.remove(*key);
    }
    Ok(set)
}

/// A limit set in the stage must bound a group it targets. The values by key of every limit
/// the targeted kinds read, defaults included (so that a limit written out at its default
/// keys a reused stage as leaving it out does).
fn check_limit_targets(
    cx: &mopt_recipe::Scope,
    set: Vec<(&'static str, &'static str, usize)>,
    (declared, targets): (&[(&'static str, &'static Limit)], &[&'static str]),
) -> Result<std::collections::BTreeMap<&'static str, usize>, RecipeError> {
    let mut values = std::collections::BTreeMap::new();
    for (group, key, v) in &set {
        if targets.contains(group) {
            values.insert(*key, *v);
        }
    }
    if let Some((group, key, _)) = set.iter().find(|(_, k, _)| !values.contains_key(k)) {
        return Err(cx.err(
            key,
            format!("`{key}` limits the `{group}` groups, which this stage does not target"),
            format!("add \"{group}\" to targets, or remove the key"),
        ));
    }
    for (group, limit) in declared {
        if targets.contains(group) {
            values.entry(limit.key).or_insert(limit.default);
        }
    }
    Ok(values)
}

/// An unknown key's hint also names the limits the family's group kinds take.
fn limits_hint(e: RecipeError, declared: &[(&'static str, &'static Limit)]) -> RecipeError {
    match e {
        RecipeError::Invalid(mut i) if i.message.starts_with("unknown field") => {
            let mut keys: Vec<String> = Vec::new();
            for (_, l) in declared {
                let key = format!("`{}`", l.key);
                if !keys.contains(&key) {
                    keys.push(key);
                }
            }
            i.hint = match keys.is_empty() {
                true => format!("{}; this family's groups declare no limits", i.hint),
                false => format!(
                    "{}; this family's groups take the limits {}",
                    i.hint,
                    keys.join(", ")
                ),
            };
            RecipeError::Invalid(i)
        }
        other => other,
    }
}

/// `[stage.ratios]`: each pattern's final fraction, in [0, 1).
fn parse_ratios(
    cx: &mopt_recipe::Scope,
    ratios: std::collections::BTreeMap<String, f64>,
) -> Result<Vec<(String, f64)>, RecipeError> {
    let mut scopes = Vec::new();
    for (pattern, t) in ratios {
        if !(0.0..1.0).contains(&t) {
            return Err(cx.err(
                    "ratios",
                    format!("`{pattern}` = {t} is outside [0, 1)"),
                    "the fraction removed from the matching groups in the end, e.g. \"encoder.layer.0.*\" = 0.3",
                ));
        }
        // Which groups a pattern matches depends on the input's shape: checked by `plan`.
        scopes.push((pattern, t));
    }
    Ok(scopes)
}

impl StageKind for Prune {
    fn name(&self) -> &'static str {
        "prune"
    }

    fn about(&self) -> &'static str {
        "structured pruning (heads, FFN neurons, hidden channels, layers) in rounds with fine-tuning"
    }

    fn has_retry(&self) -> bool {
        true
    }

    fn parse(
        &self,
        entry: &StageEntry,
        family: &FamilyEntry,
    ) -> Result<Box<dyn Stage>, RecipeError> {
        let cx = &entry.scope;
        let mut settings = entry.settings.clone();
        let declared = family
            .capability::<dyn CanPrune>()
            .map(|c| c.limits())
            .unwrap_or_default();
        let set = take_limits(cx, &mut settings, &declared)?;
        let r: RawPrune = cx
            .deserialize(settings)
            .map_err(|e| limits_hint(e, &declared))?;
        let targets = parse_targets(cx, r.targets.clone(), family)?;
        let values = check_limit_targets(cx, set, (&declared, &targets))?;
        let criteria = [
            ("l1", Criterion::L1),
            ("l2", Criterion::L2),
            ("taylor", Criterion::Taylor),
            ("random", Criterion::Random),
            ("bn-scale", Criterion::BnScale),
            ("activation-mean", Criterion::ActivationMean),
            ("activation-l2", Criterion::ActivationL2),
            ("ablation", Criterion::Ablation),
        ];
        let scopes = parse_ratios(cx, r.ratios.clone().unwrap_or_default())?;
        let mut compare = Vec::new();
        for c in r.compare.clone().unwrap_or_default() {
            compare.push(one_of(cx, "compare", Some(&c), "", &criteria)?);
        }
        let criterion = one_of(cx, "criterion", r.criterion.as_deref(), "taylor", &criteria)?;
        use Criterion::{BnScale, Random, L1, L2};
        let reads_batches = |c: &Criterion| !matches!(c, L1 | L2 | Random | BnScale);
        if r.taylor_batches.is_some()
            && !reads_batches(&criterion)
            && !compare.iter().any(reads_batches)
        {
            return Err(cx.err(
                "taylor-batches",
                format!("criterion `{}` reads no batches", r.criterion.as_deref().unwrap_or("")),
                "remove it, or use a criterion measured on data (taylor, activation-mean, activation-l2, ablation)",
            ));
        }
        let reduce = one_of(
            cx,
            "reduce",
            r.reduce.as_deref(),
            "sum",
            &[
                ("sum", Reduce::Sum),
                ("mean", Reduce::Mean),
                ("max", Reduce::Max),
            ],
        )?;
        let ranking = one_of(
            cx,
            "ranking",
            r.ranking.as_deref(),
            "local",
            &[("local", Ranking::Local), ("global", Ranking::Global)],
        )?;
        if ranking == Ranking::Global && !scopes.is_empty() {
            return Err(cx.err(
                "ratios",
                "per-scope ratios need ranking = \"local\"",
                "drop [stage.ratios] or use local ranking",
            ));
        }
        let target = r.target.unwrap_or(0.5);
        if !(target > 0.0 && target < 1.0) {
            return Err(cx.err(
                "target",
                format!("{target} is outside (0, 1)"),
                "the fraction of the targeted units removed in the end, e.g. 0.5",
            ));
        }
        let step = r.step.unwrap_or(0.1);
        if !(step > 0.0 && step <= target) {
            return Err(cx.err(
                "step",
                format!("{step} must lie in (0, target = {target}]"),
                "about 0.1 (10% of the units per round)",
            ));
        }
        let (alpha, temperature) = crate::kinds::kd::kd_settings(cx, r.alpha, r.temperature)?;
        if r.baseline == Some(true) && r.distill == Some(false) {
            return Err(cx.err(
                "baseline",
                "a hard-label twin beside a schedule that is itself recovered on hard labels",
                "set distill = true (the twin is the same schedule without the teacher), or drop baseline",
            ));
        }
        if r.distill == Some(false) {
            crate::kinds::kd::refuse_without_kd(
                cx,
                [
                    ("alpha", r.alpha.is_some()),
                    ("temperature", r.temperature.is_some()),
                    ("teacher-top-k", r.teacher_top_k.is_some()),
                ],
                "distill = false",
            )?;
        }
        Ok(Box::new(PruneStage {
            targets,
            criterion,
            reduce,
            ranking,
            target,
            step,
            taylor_batches: cx.positive("taylor-batches", r.taylor_batches, 32)?,
            limits: UnitLimits {
                values,
                ignore_layers: r.ignore_layers.unwrap_or_default(),
                scopes,
            },
            distill: r.distill.unwrap_or(true),
            alpha,
            temperature,
            teacher_top_k: crate::kinds::kd::teacher_top_k(cx, r.teacher_top_k)?,
            seed: r.seed.unwrap_or(0),
            retry: entry
                .gate
                .as_ref()
                .is_some_and(|g| g.on_fail == OnFail::Retry),
            compare,
            twin: r.baseline.unwrap_or(false),
        }))
    }
}

/// The most units the `ablation` criterion evaluates one by one.
const MAX_ABLATION_UNITS: usize = 512;

/// A round's importance scores (per group kind and scope, one a unit of the round's input),
/// written beside its checkpoints for inspection.
fn write_scores(path: &Path, scores: &GroupScores) -> Result<(), StageError> {
    let text = serde_json::to_string(scores).expect("scores serialize");
    std::fs::write(path, text).map_err(|e| StageError::io(path, e))
}

/// What one schedule of rounds produced.
struct Pruned {
    checkpoint: std::path::PathBuf,
    rounds: Vec<RoundRecord>,
    notes: Vec<String>,
    steps: usize,
}

/// One round's record.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RoundRecord {
    /// The round (1-based).
    pub round: usize,
    /// Cumulative fraction of the input's units removed.
    pub removed: f64,
    /// The shape after the round ([`ModelConfig::facts`]; BERT: `heads`, `ffn`, `hidden`,
    /// `layers`).
    #[serde(flatten)]
    pub shape: serde_json::Map<String, serde_json::Value>,
    /// Parameters after the round.
    pub params: usize,
    /// Forward FLOPs an example.
    pub flops_per_example: u64,
    /// mopt CPU latency p50 at batch 32 (ms), when `[evaluation] latency-runs` > 0.
    #[serde(default)]
    pub latency_b32_ms: Option<f64>,
    /// Validation accuracy after fine-tuning.
    pub valid_accuracy: f64,
    /// The family's headline metric (`accuracy`, `perplexity`…).
    #[serde(default)]
    pub metric: String,
    /// Its validation value after fine-tuning.
    #[serde(default)]
    pub valid_value: f64,
    /// Largest logit change against the stage's input on the golden set.
    pub max_logit_error_vs_input: f64,
    /// Whether the gate passed.
    pub passed: bool,
    /// The gate's reason.
    pub reason: String,
    /// Fine-tuning steps.
    pub steps: usize,
    /// The stage input's layer each layer after the round is (`[0, 2, 3]`: layer 1 went);
    /// empty for models without layers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers_from: Vec<usize>,
}

fn shape_after<M: Prunable>(c: &M::Config, keep: &Keep) -> M::Config {
    let mut out = c.clone();
    for kind in M::group_kinds() {
        if let Some(k) = keep.get(kind.name()) {
            out = kind.resize(&out, k);
        }
    }
    out
}

impl PruneStage {
    fn units<M: Prunable>(&self, c: &M::Config) -> Units {
        units(&self.groups::<M>(), c)
    }

    /// Equal scores of the current shape (the plan's stand-in: local counts do not depend on
    /// them).
    fn flat_scores<M: Prunable>(&self, c: &M::Config) -> GroupScores {
        self.units::<M>(c)
            .into_iter()
            .map(|(k, n)| (k, n.into_iter().map(|n| vec![1.0; n]).collect()))
            .collect()
    }

    /// The objective of Taylor scoring and fine-tuning: KD against the baseline teacher's cached
    /// logits (also when the stage's input is the baseline: every pruned round learns from the
    /// unpruned model), or hard labels.
    fn task<M: Prunable<Batch: Labeled>>(
        &self,
        cx: &StageContext,
        ad: &Device,
    ) -> Result<KdTask<M>, StageError> {
        let kd = self.distill.then_some((self.alpha, self.temperature));
        kd_objective((kd, self.teacher_top_k), cx, ad)
    }

    /// The training examples of the `taylor_batches` calibration batches every data-driven
    /// criterion reads (Taylor, activations, ablation), in the stage's seeded order.
    fn calibration_chunks(&self, examples: usize, cx: &StageContext) -> Vec<Vec<usize>> {
        epoch_order(examples, self.seed ^ cx.seed, 0)
            .chunks(cx.entry.train.batch_size)
            .take(self.taylor_batches)
            .map(<[usize]>::to_vec)
            .collect()
    }

    /// First-order Taylor gradients of every parameter, summed over `taylor_batches` training
    /// batches ([`mopt_prune::measure::summed_gradients`] under the stage's objective).
    fn taylor_gradients<M: Prunable<Batch: Labeled>>(
        &self,
        dir: &Path,
        task: &mut KdTask<M>,
        cx: &StageContext,
        ad: &Device,
    ) -> Result<ParamTable, StageError> {
        let (model, _) = M::load(dir, ad)?;
        let train = cx.splits::<M::Batch>()?.train;
        // Dropout seeds from the stage's seeds alone, not from whatever ran before in this
        // process: a resumed stage scores its rounds as the uninterrupted one did.
        let stream = (self.seed ^ cx.seed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let chunks = self.calibration_chunks(train.len(), cx);
        let losses = chunks.iter().enumerate().map(|(i, chunk)| {
            let b = train.batch(chunk, ad);
            let (loss, _) = mopt_kernels::with_seed_stream(stream.wrapping_add(i as u64), || {
                task.loss(&model, &b, chunk, 0.0)
            });
            loss
        });
        Ok(mopt_prune::measure::summed_gradients(&model, losses))
    }
}

impl PruneStage {
    /// Activation-based scores of the targeted groups ([`mopt_prune::measure::activation_scores`])
    /// over the sequences of `taylor_batches` training batches (the order Taylor scoring reads),
    /// measured on the inference device without gradients.
    fn activation_scores<M: Prunable<Batch: Labeled>>(
        &self,
        model: &M,
        config: &M::Config,
        (criterion, stat): (Criterion, mopt_prune::ActivationStat),
        cx: &StageContext,
    ) -> Result<GroupScores, StageError> {
        let device = cx.device.device();
        let train = cx.splits::<M::Batch>()?.train;
        let chunks = self.calibration_chunks(train.len(), cx);
        let batches = chunks.iter().map(|c| (train.batch(c, &device), c.len()));
        mopt_prune::measure::activation_scores(model, config, batches, stat, &self.targets)
            .ok_or_else(|| {
                StageError::Unsupported(format!(
                    "stage `{}`: criterion `{}` needs activation statistics, and this family measures none; use `taylor` or `l1`",
                    cx.entry.name,
                    criterion.name()
                ))
            })
    }

    /// Ablation scores of the targeted groups ([`mopt_prune::measure::ablation_scores`]): the
    /// rise of the mean next-label cross-entropy over `taylor_batches` training batches (the
    /// order Taylor scoring reads) when a unit alone goes; `check_ablation` bounds their number.
    fn ablation_scores<M: Prunable<Batch: Labeled>>(
        &self,
        model: &M,
        config: &M::Config,
        cx: &StageContext,
    ) -> Result<GroupScores, StageError> {
        let device = cx.device.device();
        let train = cx.splits::<M::Batch>()?.train;
        let batches: Vec<M::Batch> = self
            .calibration_chunks(train.len(), cx)
            .iter()
            .map(|chunk| train.batch(chunk, &device))
            .collect();
        let ce = burn::nn::loss::CrossEntropyLossConfig::new().init(&device);
        let loss = |m: &M| -> f64 {
            let total: f64 = batches
                .iter()
                .map(|b| ce.forward(m.logits(b), b.labels()).into_scalar::<f32>() as f64)
                .sum();
            total / batches.len().max(1) as f64
        };
        let progress =
            |kind: &str, done: usize, total: usize| eprintln!("  ablation: {kind} {done}/{total}");
        let kinds = self.groups::<M>();
        Ok(mopt_prune::measure::ablation_scores(
            &model.valid(),
            config,
            &kinds,
            &device,
            loss,
            progress,
        ))
    }

    /// One schedule of up to `rounds` rounds with `criterion`, its rounds in `dir/round-N`. With
    /// `stop_at_knee` (the stage's `on-fail = "retry"`) it stops at the first round that fails
    /// the gate and hands on the last passing round's model; otherwise every round runs.
    fn schedule<M: Prunable<Batch: Labeled>>(
        &self,
        (criterion, stop_at_knee, max_rounds): (Criterion, bool, usize),
        task: &mut KdTask<M>,
        input: &Path,
        cx: &StageContext,
        dir: &Path,
    ) -> Result<Pruned, StageError> {
        let device = cx.device.device();
        let ad = cx.device.train_device(&cx.entry.train);
        let (mut model, mut config) = M::load(input, &device)?;
        let orig = self.units::<M>(&config);
        let mut origin = self.layers::<M>(&config)?;
        let golden_split = cx.golden::<M::Batch>()?;
        let golden = |m: &M, c: &M::Config| {
            let bs = cx.entry.train.eval_batch_size;
            evaluate(&m.valid(), &golden_split, bs, c.num_labels(), &device).logits
        };
        let mut current = input.to_path_buf();
        let mut last_pass = input.to_path_buf();
        let mut rounds: Vec<RoundRecord> = Vec::new();
        let mut notes = Vec::new();
        let mut steps = 0;
        for r in 1..=self.rounds().min(max_rounds) {
            let rdir = dir.join(format!("round-{r}"));
            std::fs::create_dir_all(&rdir).map_err(|e| StageError::io(&rdir, e))?;
            eprintln!(
                "prune round {r}/{}: scoring ({})",
                self.rounds(),
                criterion.name()
            );
            let grads = if criterion.needs_gradients() {
                Some(self.taylor_gradients(&current, task, cx, &ad)?)
            } else {
                None
            };
            let scores = match criterion.activation() {
                Some(stat) => self.activation_scores(&model, &config, (criterion, stat), cx)?,
                None if criterion == Criterion::Ablation => {
                    self.ablation_scores(&model, &config, cx)?
                }
                None => mopt_prune::scores(
                    &ParamTable::weights(&model.valid()),
                    &config,
                    &self.groups::<M>(),
                    criterion,
                    self.reduce,
                    grads.as_ref(),
                    self.seed.wrapping_add(r as u64),
                ),
            };
            write_scores(&rdir.join("scores.json"), &scores)?;
            let keep = self.keep::<M>(&scores, &config, &orig, &origin, r);
            let (pruned, pcfg) = prune(&model.valid(), &config, &keep, &device);
            let layers_before = origin.len();
            origin = origin_after(&origin, &keep);
            let pdir = rdir.join("pruned");
            save_checkpoint_dir(&pruned, &pcfg, cx.data, &pdir)?;
            eprintln!(
                "prune round {r}: {} ({:.2}M params); fine-tuning",
                pcfg.describe(),
                pcfg.num_params() as f64 / 1e6
            );
            let (student, _) = M::load(&pdir, &ad)?;
            let run = mopt_train::trainer::RunContext {
                run_dir: &rdir,
                ..cx.run_context::<M::Batch, _>(&pcfg)?
            };
            let report = fit(&run, &mut *task, student)?;
            steps += report.steps;
            let (m, c) = M::load(&report.checkpoint, &device)?;
            let err = max_abs_diff(&golden(&m, &c), cx.input_logits);
            let d = cx.judge(&report.best_valid, err);
            let (mut record, note) = self.record(r, (&m, &c), &report, err, &d, cx);
            record.layers_from = origin.clone();
            rounds.push(record);
            notes.push(if origin.len() < layers_before {
                format!("{note} Layers kept (of the stage's input): {origin:?}.")
            } else {
                note
            });
            model = m;
            config = c;
            current = report.checkpoint.clone();
            if d.passed {
                last_pass = current.clone();
            } else if stop_at_knee {
                notes.push(format!(
                    "Retry (on-fail = \"retry\"): round {r} failed the gate, so the stage stops at the knee and keeps {}.",
                    if r == 1 { "its input (no round passed)".to_string() } else { format!("round {}'s model", r - 1) }
                ));
                break;
            }
        }
        Ok(Pruned {
            checkpoint: if stop_at_knee { last_pass } else { current },
            rounds,
            notes,
            steps,
        })
    }
}

impl PruneStage {
    /// Round `r`'s record and report line: the fine-tuned model `(m, c)` (inference device),
    /// its training report, its golden logit error against the input and the gate's decision.
    fn record<M: Prunable<Batch: Labeled>>(
        &self,
        r: usize,
        (m, c): (&M, &M::Config),
        report: &mopt_train::trainer::TrainReport,
        err: f64,
        d: &crate::gate::Decision,
        cx: &StageContext,
    ) -> (RoundRecord, String) {
        let e = cx.evaluation;
        let latency = (e.latency_runs > 0)
            .then(|| {
                let shape = (32, e.seq_len(cx.size));
                let runs = (e.latency_warmup, e.latency_runs);
                mopt_distill::latency::measure(m, c, shape, runs, &cx.device.device())
                    .map(|l| l.p50_ms)
            })
            .flatten();
        let flops = c.flops(e.seq_len(cx.size)) as u64;
        let metric = cx.family.metric();
        let valid_value = report.best_valid.value(metric);
        let note = format!(
            "Round {r} ({:.0}% removed): {}, {:.2}M params, {:.3} GFLOPs/example{}; validation {} {:.4} after fine-tuning; {}.",
            self.fraction(r) * 100.0,
            c.describe(),
            c.num_params() as f64 / 1e6,
            flops as f64 / 1e9,
            latency.map_or(String::new(), |ms| format!(", mopt b32 latency p50 {ms:.1} ms")),
            metric.name(),
            valid_value,
            d.reason
        );
        let record = RoundRecord {
            round: r,
            removed: self.fraction(r),
            shape: c.facts(),
            latency_b32_ms: latency,
            params: c.num_params(),
            flops_per_example: flops,
            valid_accuracy: report.best_valid.accuracy,
            metric: metric.name().into(),
            valid_value,
            max_logit_error_vs_input: err,
            passed: d.passed,
            reason: d.reason.clone(),
            steps: report.steps,
            layers_from: Vec::new(),
        };
        (record, note)
    }

    /// The plan of a prune stage on an `M` (what a family's
    /// [`crate::family::Family::plan_prune`] calls).
    pub fn plan<M: Prunable>(
        &self,
        entry: &StageEntry,
        shape: &Shape,
        cx: &PlanContext,
    ) -> Result<StagePlan, StageError> {
        let input: &M::Config = shape.get()?;
        self.check_ratios::<M>(entry, input)?;
        self.check_criteria::<M>(entry, input)?;
        self.check_limits::<M>(entry, input)?;
        self.check_ignored_layers::<M>(entry, input)?;
        crate::kinds::kd::check_kd_augment(entry, self.distill, cx.data)?;
        if input.is_quantized() {
            return Err(entry
                .scope
                .err(
                    "kind",
                    "the input of this prune stage is quantized",
                    "prune before quantizing: put the `prune` stage before `ptq` / `qat`",
                )
                .into());
        }
        let orig = self.units::<M>(input);
        let mut settings = vec![format!(
            "targets = [{}], criterion = \"{}\", reduce = \"{}\", ranking = \"{}\", target = {}, step = {}, taylor-batches = {}, {}ignore-layers = {:?}, distill = {} (alpha = {}, temperature = {}{}), compare = {:?}, ratios = {:?}",
            self.target_names(),
            self.criterion.name(),
            self.reduce.name(),
            self.ranking.name(),
            self.target,
            self.step,
            self.taylor_batches,
            self.limit_settings::<M>(),
            self.limits.ignore_layers,
            self.distill,
            self.alpha,
            self.temperature,
            crate::kinds::kd::top_k_note(self.teacher_top_k),
            self.compare.iter().map(|c| c.name()).collect::<Vec<_>>(),
            self.limits.scopes
        )];
        let mut c = input.clone();
        let mut origin = self.layers::<M>(&c)?;
        let scored = if self.ranking == Ranking::Global {
            " (global: the split across layers follows the scores)"
        } else if self.targets.contains(&"layers") {
            " (which layers go follows the scores)"
        } else {
            ""
        };
        for r in 1..=self.rounds() {
            let keep = self.keep::<M>(&self.flat_scores::<M>(&c), &c, &orig, &origin, r);
            origin = origin_after(&origin, &keep);
            c = shape_after::<M>(&c, &keep);
            settings.push(format!(
                "round {r}: {:.0}% removed -> {}{scored}: {:.2}M params, {:.3} GFLOPs/example, then fine-tune",
                self.fraction(r) * 100.0,
                c.describe(),
                c.num_params() as f64 / 1e6,
                c.flops(cx.size()) / 1e9
            ));
        }
        if self.twin {
            settings.push(format!(
                "baseline = true: the same rounds recovered on hard labels alone (the hard-label twin), reported beside the chain; the better of the two on validation is handed on{}",
                if self.retry { "; as many rounds as the chain keeps" } else { "" }
            ));
        }
        settings.extend(train_settings(&entry.train, entry.train_overridden));
        Ok(StagePlan {
            memory: Some(input.training_memory(entry.train.batch_size, cx.size())),
            output: Shape::new(c),
            settings,
            extra_memory: self
                .distill
                .then(|| crate::kinds::kd::cache_memory(input, self.teacher_top_k, cx))
                .into_iter()
                .collect(),
        })
    }

    /// Run a prune stage on the `M` checkpoint at `input` (what a family's
    /// [`crate::family::Family::prune`] calls).
    pub fn run<M: Prunable<Batch: Labeled>>(
        &self,
        input: &Path,
        cx: &StageContext,
    ) -> Result<StageOutput, StageError> {
        // One objective for every round of every schedule: the teacher and its cached logits are
        // loaded once.
        let ad = cx.device.train_device(&cx.entry.train);
        let mut task = self.task::<M>(cx, &ad)?;
        let all = self.rounds();
        let main = self.schedule(
            (self.criterion, self.retry, all),
            &mut task,
            input,
            cx,
            cx.dir,
        )?;
        let mut references = Vec::new();
        let mut twin_note = None;
        if self.twin {
            let (twin, note) = self.twin::<M>(&main, input, cx, &ad)?;
            twin_note = Some(note);
            references.extend(twin);
        }
        let mut notes = main.notes;
        notes.extend(twin_note);
        let mut compared = Vec::new();
        for &c in &self.compare {
            eprintln!(
                "prune: the same schedule with {} importance, for comparison",
                c.name()
            );
            let dir = cx.dir.join(format!("compare-{}", c.name()));
            // Comparisons run every round (no stop at the knee): accuracy at equal sparsity.
            let other = self.schedule((c, false, all), &mut task, input, cx, &dir)?;
            notes.push(format!(
                "Comparison, the same schedule with {} importance: {}",
                c.name(),
                other
                    .rounds
                    .iter()
                    .map(|r| format!(
                        "round {} validation {} {:.4}",
                        r.round, r.metric, r.valid_value
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            references.push(ReferenceModel {
                name: format!("{} ({} importance)", cx.entry.name, c.name()),
                about: format!("the same pruning schedule scored by {}", c.name()),
                checkpoint: other.checkpoint,
                twin: false,
            });
            compared.push(json!({ "criterion": c.name(), "rounds": other.rounds }));
        }
        Ok(StageOutput {
            checkpoint: main.checkpoint,
            steps: main.steps,
            facts: json!({
                "criterion": self.criterion.name(),
                "reduce": self.reduce.name(),
                "ranking": self.ranking.name(),
                "rounds": main.rounds,
                "compare": compared,
            }),
            notes,
            references,
            logit_error_vs_input: None,
            artifacts: Vec::new(),
        })
    }

    /// The hard-label twin of the schedule `main` ran (in `<stage>/twin`): as many rounds as
    /// the chain's output went through, the same criterion, budget and seeds, recovered on hard
    /// labels alone (no teacher), so that the report sets the distilled model beside the one
    /// the same pruning gives without distillation.
    fn twin<M: Prunable<Batch: Labeled>>(
        &self,
        main: &Pruned,
        input: &Path,
        cx: &StageContext,
        ad: &Device,
    ) -> Result<(Option<ReferenceModel>, String), StageError> {
        let kept = match self.retry {
            true => main.rounds.iter().take_while(|r| r.passed).count(),
            false => main.rounds.len(),
        };
        if kept == 0 {
            let why = "No hard-label twin: no pruning round passed the gate, so the stage hands on its input unpruned.";
            return Ok((None, why.into()));
        }
        eprintln!("prune: the same {kept} round(s) on hard labels alone (the hard-label twin)");
        let mut hard = kd_objective::<M>((None, None), cx, ad)?;
        let dir = cx.dir.join("twin");
        let twin = self.schedule((self.criterion, false, kept), &mut hard, input, cx, &dir)?;
        let line = twin
            .rounds
            .iter()
            .zip(&main.rounds)
            .map(|(t, s)| {
                format!(
                    "round {} validation {} {:.4} (distilled {:.4})",
                    t.round, t.metric, t.valid_value, s.valid_value
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        Ok((
            Some(ReferenceModel {
                name: format!("{} (hard-label twin)", cx.entry.name),
                about: "the same pruning schedule, criterion and budget, recovered on hard labels only".into(),
                checkpoint: twin.checkpoint,
                twin: true,
            }),
            format!("Hard-label twin (the same {kept} round(s), criterion and budget, no teacher): {line}."),
        ))
    }

    /// The first of the stage's criteria (`criterion`, then `compare`) that `pick` accepts,
    /// with the recipe key naming it.
    fn naming(&self, pick: impl Fn(Criterion) -> bool) -> Option<(&'static str, Criterion)> {
        std::iter::once(("criterion", self.criterion))
            .chain(self.compare.iter().map(|k| ("compare", *k)))
            .find(|(_, k)| pick(*k))
    }

    /// `bn-scale` (as `criterion` or in `compare`) needs a normalisation scale in every targeted
    /// group: heads or FFN neurons have none.
    fn check_criteria<M: Prunable>(
        &self,
        entry: &StageEntry,
        c: &M::Config,
    ) -> Result<(), StageError> {
        if let Some((key, k)) = self.naming(|k| k.activation().is_some()) {
            if !M::scores_activations() {
                return Err(entry
                    .scope
                    .err(
                        key,
                        format!(
                            "`{}` measures activations, and this family's model does not report them",
                            k.name()
                        ),
                        "use `taylor`, `l1` or `l2` (activation-based importance is implemented for the llama family)",
                    )
                    .into());
            }
        }
        self.check_ablation::<M>(entry, c)?;
        let Some((key, _)) = self.naming(|k| k == Criterion::BnScale) else {
            return Ok(());
        };
        for kind in M::group_kinds() {
            if !self.targets.contains(&kind.name()) {
                continue;
            }
            let Some(s) = (0..kind.scopes(c)).find(|&s| kind.units(c, s) > 0) else {
                continue;
            };
            let members = kind.members(c, s, 0);
            if !members
                .iter()
                .any(|m| m.role == mopt_core::prune::Role::Scale)
            {
                return Err(entry
                    .scope
                    .err(
                        key,
                        format!(
                            "`bn-scale` scores BatchNorm scales, and the `{}` groups have none",
                            kind.name()
                        ),
                        "use `taylor` or `l1` for these targets (bn-scale suits convolution channels followed by BatchNorm)",
                    )
                    .into());
            }
        }
        Ok(())
    }

    /// `ablation` removes one unit at a time and evaluates the model each time: every
    /// targeted kind's units must be removable one by one (no runs of equal counts, no
    /// multiple: a Llama layer's query heads inside their KV groups, FFN widths in multiples of
    /// 8 are not), and together at most [`MAX_ABLATION_UNITS`].
    fn check_ablation<M: Prunable>(
        &self,
        entry: &StageEntry,
        c: &M::Config,
    ) -> Result<(), StageError> {
        let Some((key, _)) = self.naming(|k| k == Criterion::Ablation) else {
            return Ok(());
        };
        let mut total = 0;
        for kind in self.groups::<M>() {
            let scopes = 0..kind.scopes(c);
            let runs = scopes.clone().any(|s| kind.runs(c, s) > 1);
            if runs || kind.rule(&self.limits).multiple > 1 {
                return Err(entry
                    .scope
                    .err(
                        key,
                        format!(
                            "`ablation` removes one unit at a time, and `{}` units go {}",
                            kind.name(),
                            if runs { "in equal runs (a query head per KV group)".to_string() } else { format!("in multiples ({})", kind.rule(&self.limits).limit.unwrap_or("its rule")) }
                        ),
                        "use it on layers or KV groups (or set the multiple to 1); `activation-l2` or `taylor` for the others",
                    )
                    .into());
            }
            total += scopes.map(|s| kind.units(c, s)).sum::<usize>();
        }
        if total > MAX_ABLATION_UNITS {
            return Err(entry
                .scope
                .err(
                    key,
                    format!("`ablation` would evaluate the model once for each of {total} units (at most {MAX_ABLATION_UNITS})"),
                    "target fewer units (layers, KV groups), or use `activation-l2` or `taylor`",
                )
                .into());
        }
        Ok(())
    }

    /// The limits the targeted group kinds read, with their values (`min-heads = 1, `), in
    /// the family's order: a plan lists only the settings that apply.
    fn limit_settings<M: Prunable>(&self) -> String {
        let mut read: Vec<&Limit> = Vec::new();
        for l in self.groups::<M>().iter().flat_map(|k| k.limits()) {
            if !read.iter().any(|r| r.key == l.key) {
                read.push(l);
            }
        }
        read.iter()
            .map(|l| format!("{} = {}, ", l.key, self.limits.get(l)))
            .collect()
    }

    /// What every round must keep of a targeted group (`min-heads`, a width's multiple) must
    /// not exceed what the input has: the stage would otherwise run and prune nothing there.
    /// `ignore-layers` must be read by a targeted kind's rule (its frozen scopes or units) and
    /// name layers the model has: nothing ignores it in silence.
    fn check_ignored_layers<M: Prunable>(
        &self,
        entry: &StageEntry,
        c: &M::Config,
    ) -> Result<(), StageError> {
        let ignored = &self.limits.ignore_layers;
        if ignored.is_empty() {
            return Ok(());
        }
        let readers: Vec<&str> = M::group_kinds()
            .into_iter()
            .filter(|k| {
                let r = k.rule(&self.limits);
                !(r.frozen_scopes.is_empty() && r.frozen_units.is_empty())
            })
            .map(|k| k.name())
            .collect();
        if !self.targets.iter().any(|t| readers.contains(t)) {
            let fix = match readers.is_empty() {
                true => "remove the key: this family prunes nothing layer by layer".to_string(),
                false => format!("target {}, or remove the key", readers.join(" or ")),
            };
            let what = format!(
                "no targeted group kind ({}) is pruned layer by layer: nothing would read it",
                self.targets.join(", ")
            );
            return Err(entry.scope.err("ignore-layers", what, fix).into());
        }
        let n = M::layers(c);
        match ignored.iter().find(|&&l| l >= n) {
            Some(l) => Err(entry
                .scope
                .err(
                    "ignore-layers",
                    format!("layer {l} is past the model's {n} layers"),
                    format!("name layers 0 to {}", n.saturating_sub(1)),
                )
                .into()),
            None => Ok(()),
        }
    }

    fn check_limits<M: Prunable>(
        &self,
        entry: &StageEntry,
        c: &M::Config,
    ) -> Result<(), StageError> {
        let l = &self.limits;
        for kind in M::group_kinds() {
            if !self.targets.contains(&kind.name()) {
                continue;
            }
            let rule = kind.rule(l);
            for s in (0..kind.scopes(c)).filter(|s| !rule.frozen_scopes.contains(s)) {
                let units = kind.units(c, s);
                if units == 0 || rule.min_keep <= units {
                    continue;
                }
                let key = rule.limit.unwrap_or("targets");
                return Err(entry
                    .scope
                    .err(
                        key,
                        format!(
                            "every round keeps at least {} units of `{}`, which has {units}",
                            rule.min_keep,
                            kind.scope_path(s)
                        ),
                        format!(
                            "set {key} to at most {units}, or leave `{}` out of targets",
                            kind.name()
                        ),
                    )
                    .into());
            }
        }
        Ok(())
    }

    /// Every `[stage.ratios]` pattern must match a group of the input (any group kind, any
    /// scope): a typo would otherwise prune nothing it names.
    fn check_ratios<M: Prunable>(
        &self,
        entry: &StageEntry,
        c: &M::Config,
    ) -> Result<(), StageError> {
        let paths: Vec<String> = M::group_kinds()
            .iter()
            .flat_map(|k| {
                (0..k.scopes(c))
                    .map(|s| k.scope_path(s))
                    .collect::<Vec<_>>()
            })
            .collect();
        for (pattern, _) in &self.limits.scopes {
            if !paths.iter().any(|p| glob(pattern, p)) {
                return Err(entry
                    .scope
                    .err(
                        "ratios",
                        format!("`{pattern}` matches no group"),
                        format!(
                            "groups of this model: {}; `*` matches anything",
                            paths
                                .iter()
                                .map(|p| format!("`{p}`"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    )
                    .into());
            }
        }
        Ok(())
    }
}

impl Stage for PruneStage {
    fn kind(&self) -> &str {
        "prune"
    }

    fn plan(
        &self,
        entry: &StageEntry,
        shape: &Shape,
        cx: &PlanContext,
    ) -> Result<StagePlan, StageError> {
        cx.family
            .require::<dyn CanPrune>("prune", NEEDS.0, NEEDS.1)?
            .plan(self, entry, shape, cx)
    }

    fn run(&self, input: &Path, cx: &StageContext) -> Result<StageOutput, StageError> {
        cx.family
            .require::<dyn CanPrune>("prune", NEEDS.0, NEEDS.1)?
            .run(self, input, cx)
    }

    fn reuse_key(&self) -> Option<String> {
        // `compare` runs beside the chain and leaves the output alone.
        Some(format!(
            "targets [{}] {:?} {:?} {:?} target {:?} step {:?} taylor {} {:?} distill {} alpha {:?} T {:?} seed {} retry {}",
            self.target_names(),
            self.criterion,
            self.reduce,
            self.ranking,
            self.target,
            self.step,
            self.taylor_batches,
            self.limits,
            self.distill,
            self.alpha,
            self.temperature,
            self.seed,
            self.retry
        ) + &self.teacher_top_k.map_or(String::new(), |k| format!(" top-k {k}"))
            // The twin can be the output (the better on validation is handed on).
            + if self.twin { " twin" } else { "" })
    }
}
