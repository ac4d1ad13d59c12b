//! `[[stage]]` blocks: the parts every stage has (kind, name, training overrides, gate). The
//! kind-specific keys stay a table here; the stage kind that owns them validates them.

use crate::error::RecipeError;
use crate::raw::{RawGate, RawTrain};
use crate::scope::Scope;
use crate::train::{merge_tables, train_spec, TrainSpec};

/// Which validation metric a gate compares (any [`crate::Metric`], by its direction).
pub type GateMetric = crate::Metric;

/// What a gate compares against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateReference {
    /// The golden baseline (the teacher, or the recipe's model).
    Baseline,
    /// The model this stage started from (the last passing one).
    Previous,
}

impl GateReference {
    /// The reference's recipe name.
    pub fn name(self) -> &'static str {
        match self {
            GateReference::Baseline => "baseline",
            GateReference::Previous => "previous",
        }
    }
}

/// What happens when a stage fails its gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFail {
    /// Keep going; the next stage gets the last passing model.
    Rollback,
    /// Stop the run (exit 1) after writing the report.
    Abort,
    /// The kind's own gentler retry (pruning: fewer rounds; quantization: more float fallbacks).
    Retry,
}

impl OnFail {
    /// The action's recipe name.
    pub fn name(self) -> &'static str {
        match self {
            OnFail::Rollback => "rollback",
            OnFail::Abort => "abort",
            OnFail::Retry => "retry",
        }
    }
}

/// `[stage.gate]`: the tolerance a stage's output must meet on the validation split.
#[derive(Debug, Clone, PartialEq)]
pub struct GateSpec {
    /// The metric compared.
    pub metric: GateMetric,
    /// What it is compared against.
    pub against: GateReference,
    /// How much worse than the reference the metric may get, absolute: a drop of accuracy
    /// (`max-drop = 0.02`: 2 points) or a rise of perplexity (`max-rise = 2.0`).
    pub max_worse: Option<f64>,
    /// How much worse as a fraction of the reference's value (`max-relative-drop`,
    /// `max-relative-rise = 0.3`: at most 1.3x the reference's perplexity).
    pub max_relative_worse: Option<f64>,
    /// Largest allowed max |logit − input model's logit| on the golden set.
    pub max_logit_error: Option<f64>,
    /// What happens on failure.
    pub on_fail: OnFail,
}

impl GateSpec {
    /// Accuracy may drop at most `max_drop` (absolute: 0.02 = 2 points) against `against`; a
    /// failing stage is rolled back.
    pub fn max_drop(max_drop: f64, against: GateReference) -> Self {
        Self {
            metric: GateMetric::Accuracy,
            against,
            max_worse: Some(max_drop),
            max_relative_worse: None,
            max_logit_error: None,
            on_fail: OnFail::Rollback,
        }
    }

    /// The same gate with another action on failure.
    pub fn on_fail(mut self, on_fail: OnFail) -> Self {
        self.on_fail = on_fail;
        self
    }

    /// The gate as a recipe writes it: `{ max-drop = 0.03, against = "baseline", on-fail = "rollback" }`.
    pub fn to_toml(&self) -> String {
        let mut parts = vec![format!("metric = \"{}\"", self.metric.name())];
        let (abs, rel) = worse_keys(self.metric);
        if let Some(v) = self.max_worse {
            parts.push(format!("{abs} = {v}"));
        }
        if let Some(v) = self.max_relative_worse {
            parts.push(format!("{rel} = {v}"));
        }
        if let Some(v) = self.max_logit_error {
            parts.push(format!("max-logit-error = {v:?}"));
        }
        parts.push(format!("against = \"{}\"", self.against.name()));
        parts.push(format!("on-fail = \"{}\"", self.on_fail.name()));
        format!("{{ {} }}", parts.join(", "))
    }
}

/// One `[[stage]]`, validated in its common parts.
#[derive(Debug, Clone)]
pub struct StageEntry {
    /// 1-based position in the recipe.
    pub index: usize,
    /// The stage kind (`distill`, `prune`, …).
    pub kind: String,
    /// Unique within the recipe; the stage's folder is `NN-name`.
    pub name: String,
    /// `[train]` with this stage's `[stage.train]` overrides.
    pub train: TrainSpec,
    /// Whether `[stage.train]` changed anything.
    pub train_overridden: bool,
    /// The stage's gate, if any.
    pub gate: Option<GateSpec>,
    /// The kind's own keys, validated by the kind.
    pub settings: toml::Table,
    /// Where this block is, for the kind's errors.
    pub scope: Scope,
}

impl StageEntry {
    /// The stage's folder name inside the run folder.
    pub fn dir_name(&self) -> String {
        format!("{:02}-{}", self.index, self.name)
    }
}

fn take_table(
    cx: &Scope,
    t: &mut toml::Table,
    key: &str,
) -> Result<Option<toml::Table>, RecipeError> {
    match t.remove(key) {
        None => Ok(None),
        Some(toml::Value::Table(v)) => Ok(Some(v)),
        Some(_) => Err(cx.err(
            key,
            format!("`{key}` must be a table"),
            format!("write it as a `[stage.{key}]` section under the stage"),
        )),
    }
}

/// The keys of a gate's tolerances on `metric`: `max-drop` / `max-relative-drop` where higher is
/// better, `max-rise` / `max-relative-rise` where lower is.
pub fn worse_keys(metric: GateMetric) -> (&'static str, &'static str) {
    if metric.higher_is_better() {
        ("max-drop", "max-relative-drop")
    } else {
        ("max-rise", "max-relative-rise")
    }
}

/// The gate's tolerance of worsening on `metric` (absolute, relative), refusing the keys of
/// the other direction by name.
fn worse_tolerances(
    cx: &Scope,
    metric: GateMetric,
    g: &RawGate,
) -> Result<(Option<f64>, Option<f64>), RecipeError> {
    let (drop, rise) = (
        (g.max_drop, g.max_relative_drop),
        (g.max_rise, g.max_relative_rise),
    );
    let (mine, other) = if metric.higher_is_better() {
        (drop, rise)
    } else {
        (rise, drop)
    };
    let (abs, rel) = worse_keys(metric);
    let (other_abs, other_rel) = if metric.higher_is_better() {
        ("max-rise", "max-relative-rise")
    } else {
        ("max-drop", "max-relative-drop")
    };
    for (key, set, instead) in [(other_abs, other.0, abs), (other_rel, other.1, rel)] {
        if set.is_some() {
            return Err(cx.err(
                key,
                format!(
                    "{} is {} better: a gate on it limits its {}",
                    metric.name(),
                    if metric.higher_is_better() {
                        "higher"
                    } else {
                        "lower"
                    },
                    metric.worsening()
                ),
                format!("write `{instead}` instead"),
            ));
        }
    }
    Ok(mine)
}

fn gate_spec(cx: &Scope, g: RawGate) -> Result<GateSpec, RecipeError> {
    let name = g.metric.as_deref().unwrap_or("accuracy");
    let metric = GateMetric::from_name(name).ok_or_else(|| {
        cx.err(
            "metric",
            format!("unknown gate metric `{name}`"),
            format!(
                "use {} (measured on the validation split)",
                GateMetric::listed()
            ),
        )
    })?;
    let against = match g.against.as_deref().unwrap_or("baseline") {
        "baseline" => GateReference::Baseline,
        "previous" => GateReference::Previous,
        other => return Err(cx.err(
            "against",
            format!("unknown gate reference `{other}`"),
            "use `baseline` (the teacher or the recipe's model) or `previous` (this stage's input)",
        )),
    };
    let on_fail = match g.on_fail.as_deref().unwrap_or("rollback") {
        "rollback" => OnFail::Rollback,
        "abort" => OnFail::Abort,
        "retry" => OnFail::Retry,
        other => {
            return Err(cx.err(
                "on-fail",
                format!("unknown on-fail `{other}`"),
                "use `rollback` (the next stage gets the last passing model), `abort`, or `retry` where the kind has one",
            ))
        }
    };
    let (max_worse, max_relative_worse) = worse_tolerances(cx, metric, &g)?;
    let (abs, rel) = worse_keys(metric);
    for (k, v) in [
        (abs, max_worse),
        (rel, max_relative_worse),
        ("max-logit-error", g.max_logit_error),
    ] {
        if let Some(v) = v {
            if !(v >= 0.0 && v.is_finite()) {
                return Err(cx.err(
                    k,
                    format!("{v} must be a finite number >= 0"),
                    "e.g. max-drop = 0.02 (two points of accuracy), max-relative-rise = 0.3 (perplexity at most 1.3x the reference's)",
                ));
            }
        }
    }
    if max_worse.is_none() && max_relative_worse.is_none() && g.max_logit_error.is_none() {
        return Err(cx.err(
            abs,
            "a gate needs a tolerance",
            format!("set `{abs}` (absolute), `{rel}` (fraction of the reference) or `max-logit-error`, or remove [stage.gate]"),
        ));
    }
    Ok(GateSpec {
        metric,
        against,
        max_worse,
        max_relative_worse,
        max_logit_error: g.max_logit_error,
        on_fail,
    })
}

/// Validate the common parts of every `[[stage]]`; `shared_train` is the recipe's `[train]`.
pub fn stage_entries(
    root: &Scope,
    raw: Vec<toml::Table>,
    shared_train: &toml::Table,
) -> Result<Vec<StageEntry>, RecipeError> {
    let mut out: Vec<StageEntry> = Vec::new();
    for (i, mut t) in raw.into_iter().enumerate() {
        let index = i + 1;
        let cx = root.stage(index);
        let kind = stage_kind(&cx, &mut t)?;
        let name = stage_name(&cx, &mut t, &kind, index, &out)?;
        let overrides = take_table(&cx, &mut t, "train")?;
        let train = stage_train(root, &cx, overrides.as_ref(), shared_train)?;
        let gate = stage_gate(&cx, take_table(&cx, &mut t, "gate")?)?;
        out.push(StageEntry {
            index,
            kind,
            name,
            train,
            train_overridden: overrides.is_some_and(|o| !o.is_empty()),
            gate,
            settings: t,
            scope: cx,
        });
    }
    Ok(out)
}

/// Take the stage's `kind` out of its table `t`.
fn stage_kind(cx: &Scope, t: &mut toml::Table) -> Result<String, RecipeError> {
    match t.remove("kind") {
        Some(toml::Value::String(k)) => Ok(k),
        Some(_) => Err(cx.err("kind", "must be a string", "e.g. kind = \"distill\"")),
        None => Err(cx.err(
            "kind",
            "every [[stage]] needs a kind",
            "add e.g. kind = \"finetune\" (kinds: finetune, distill, export)",
        )),
    }
}

/// Take the stage's `name` (default: its `kind`) out of `t`; a default name that an `earlier`
/// stage already has gets the stage's `index` appended.
fn stage_name(
    cx: &Scope,
    t: &mut toml::Table,
    kind: &str,
    index: usize,
    earlier: &[StageEntry],
) -> Result<String, RecipeError> {
    let (name, explicit) = match t.remove("name") {
        Some(toml::Value::String(n)) => (n, true),
        Some(_) => return Err(cx.err("name", "must be a string", "e.g. name = \"distill-3l\"")),
        None => (kind.to_string(), false),
    };
    let name = if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(cx.err(
            "name",
            format!("`{name}` is not a usable stage name"),
            "use letters, digits, `-` and `_` (it names the stage's folder)",
        ));
    } else if let Some(first) = earlier.iter().find(|s| s.name == name) {
        if explicit {
            return Err(cx.err(
                "name",
                format!(
                    "`{name}` already names stage {} (a `reference` or a folder would be ambiguous)",
                    first.index
                ),
                "give each stage its own name",
            ));
        }
        format!("{name}-{index}")
    } else {
        name
    };
    Ok(name)
}

/// The stage's training settings: `shared_train` with its `[stage.train]` `overrides`, if any.
fn stage_train(
    root: &Scope,
    cx: &Scope,
    overrides: Option<&toml::Table>,
    shared_train: &toml::Table,
) -> Result<TrainSpec, RecipeError> {
    let train_cx = cx.nested("train");
    match overrides {
        Some(o) => {
            let raw: RawTrain = train_cx.deserialize(merge_tables(shared_train, o))?;
            train_spec(&train_cx, raw)
        }
        None => {
            let raw: RawTrain = train_cx.deserialize(shared_train.clone())?;
            train_spec(&root.nested("train"), raw)
        }
    }
}

/// Validate the stage's `[stage.gate]` table, if it has one.
fn stage_gate(cx: &Scope, gate: Option<toml::Table>) -> Result<Option<GateSpec>, RecipeError> {
    match gate {
        Some(g) => {
            let gcx = cx.nested("gate");
            Ok(Some(gate_spec(&gcx, gcx.deserialize(g)?)?))
        }
        None => Ok(None),
    }
}
