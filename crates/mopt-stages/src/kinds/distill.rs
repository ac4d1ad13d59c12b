//! `kind = "distill"`: distil the input model (the teacher) into the student declared in
//! `[stage.student]`, with KD on logits plus any `[[stage.match]]` intermediate matches; the
//! hard-label twin (same init, same budget, no teacher) is trained too when `baseline = true`.
//! This file owns the recipe keys; the family runs the stage (`CanDistill`; BERT's in
//! `mopt-families/src/bert/distill.rs`).

use std::path::Path;

use mopt_distill::spec::*;
use mopt_distill::text::augment::TextAugment;
use mopt_recipe::RawModel;
use mopt_recipe::{model_spec, ModelSpec, RecipeError, Scope, StageEntry, TrainSpec};
use serde::Deserialize;

use crate::error::StageError;
use crate::family::FamilyEntry;
use crate::shape::Shape;
use crate::stage::{PlanContext, Stage, StageContext, StageKind, StageOutput, StagePlan};

/// The kind.
pub struct Distill;

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum RawSchedule {
    Constant(f64),
    Linear { from: f64, to: f64 },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawDistillStage {
    student: Option<RawModel>,
    enabled: Option<bool>,
    alpha: Option<RawSchedule>,
    temperature: Option<RawSchedule>,
    soft_loss: Option<String>,
    teacher_cache: Option<bool>,
    teacher_top_k: Option<usize>,
    baseline: Option<bool>,
    augment_copies: Option<usize>,
    augment_replace: Option<f64>,
    augment_neighbours: Option<usize>,
    #[serde(default, rename = "match")]
    matches: Vec<RawMatch>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawLayers {
    Named(String),
    Pairs(Vec<[usize; 2]>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawMatch {
    feature: String,
    loss: Option<String>,
    layers: Option<RawLayers>,
    weight: Option<f64>,
    projection: Option<bool>,
    heads: Option<String>,
    tokens: Option<String>,
    until_epoch: Option<usize>,
    rows: Option<usize>,
}

/// A match's feature and loss (the loss defaulting by feature), checked against each other.
fn feature_and_loss(
    cx: &Scope,
    index: usize,
    m: &RawMatch,
) -> Result<(Feature, MatchLoss), RecipeError> {
    let key = |k: &str| format!("match.{k}");
    let feature =
        match m.feature.as_str() {
            "hidden" => Feature::Hidden,
            "attention" | "attention-probs" => Feature::AttentionProbs,
            "attention-scores" => Feature::AttentionScores,
            "embeddings" => Feature::Embeddings,
            "word-embeddings" => Feature::WordEmbeddings,
            other => return Err(cx.err(
                &key("feature"),
                format!("match {index}: unknown feature `{other}`"),
                "use `hidden`, `attention`, `attention-scores`, `embeddings` or `word-embeddings`",
            )),
        };
    let default_loss = match feature {
        Feature::AttentionProbs => "kl",
        _ => "mse",
    };
    let loss = match m.loss.as_deref().unwrap_or(default_loss) {
        "mse" => MatchLoss::Mse,
        "cosine" => MatchLoss::Cosine,
        "kl" => MatchLoss::Kl,
        other => {
            return Err(cx.err(
                &key("loss"),
                format!("match {index}: unknown loss `{other}`"),
                "use `mse`, `cosine` or `kl`",
            ))
        }
    };
    let ok = matches!(
        (feature, loss),
        (Feature::Hidden, MatchLoss::Mse | MatchLoss::Cosine)
            | (
                Feature::Embeddings | Feature::WordEmbeddings,
                MatchLoss::Mse | MatchLoss::Cosine
            )
            | (Feature::AttentionProbs, MatchLoss::Kl | MatchLoss::Mse)
            | (Feature::AttentionScores, MatchLoss::Mse)
    );
    if !ok {
        return Err(cx.err(
            &key("loss"),
            format!("match {index}: loss {loss:?} does not apply to {feature:?}"),
            "hidden/embeddings/word-embeddings: mse or cosine; attention: kl (text) or mse (attention transfer on images); attention-scores: mse",
        ));
    }
    Ok((feature, loss))
}

/// A match's layer map (tables take none).
fn layer_map(
    cx: &Scope,
    index: usize,
    feature: Feature,
    layers: Option<RawLayers>,
) -> Result<LayerMap, RecipeError> {
    let key = |k: &str| format!("match.{k}");
    let tables = matches!(feature, Feature::Embeddings | Feature::WordEmbeddings);
    let layers = match layers {
        None if tables => LayerMap::Pairs(vec![(0, 0)]),
        Some(_) if tables => {
            return Err(cx.err(
                &key("layers"),
                format!("match {index}: {feature:?} matches take no layer map"),
                "leave `layers` out: embeddings are compared at the input of the encoder",
            ))
        }
        None => {
            return Err(cx.err(
                &key("layers"),
                format!("match {index}: `layers` is missing"),
                "give `layers = \"uniform\"` or [student, teacher] pairs, e.g. [[2, 4], [3, 6]]",
            ))
        }
        Some(RawLayers::Named(n)) if n == "uniform" => LayerMap::Uniform,
        Some(RawLayers::Named(n)) => {
            return Err(cx.err(
                &key("layers"),
                format!("match {index}: unknown layer map `{n}`"),
                "use \"uniform\" or pairs [[student, teacher], ...]",
            ))
        }
        Some(RawLayers::Pairs(p)) if p.is_empty() => {
            return Err(cx.err(
                &key("layers"),
                format!("match {index}: empty layer map"),
                "list [student, teacher] pairs",
            ))
        }
        Some(RawLayers::Pairs(p)) => LayerMap::Pairs(p.into_iter().map(|[s, t]| (s, t)).collect()),
    };
    Ok(layers)
}

/// Validate one `[[stage.match]]` (`index`: its position, for messages).
fn match_spec(
    cx: &Scope,
    index: usize,
    m: RawMatch,
    train: &TrainSpec,
) -> Result<MatchSpec, RecipeError> {
    let key = |k: &str| format!("match.{k}");
    let (feature, loss) = feature_and_loss(cx, index, &m)?;
    let layers = layer_map(cx, index, feature, m.layers)?;
    let weight = m.weight.unwrap_or(1.0);
    if !(weight >= 0.0 && weight.is_finite()) {
        return Err(cx.err(
            &key("weight"),
            format!("match {index}: weight {weight} must be >= 0"),
            "use e.g. 1.0",
        ));
    }
    let attention = matches!(feature, Feature::AttentionProbs | Feature::AttentionScores);
    if m.heads.is_some() && !attention {
        return Err(cx.err(
            &key("heads"),
            format!(
                "match {index}: `heads` applies to attention matches, and this one compares `{}`",
                m.feature
            ),
            "remove `heads`",
        ));
    }
    if m.projection.is_some() && attention {
        return Err(cx.err(
            &key("projection"),
            format!(
                "match {index}: attention maps are compared head to head, with no width to project"
            ),
            "remove `projection`",
        ));
    }
    let heads = match m.heads.as_deref().unwrap_or("error") {
        "error" => HeadPolicy::Error,
        "mean" => HeadPolicy::Mean,
        other => {
            return Err(cx.err(
                &key("heads"),
                format!("match {index}: unknown head policy `{other}`"),
                "use `mean` (average heads on both sides) or leave it out",
            ))
        }
    };
    let tokens = match m.tokens.as_deref().unwrap_or("all") {
        "all" => Tokens::All,
        "cls" => Tokens::First,
        other => {
            return Err(cx.err(
                &key("tokens"),
                format!("match {index}: unknown token selection `{other}`"),
                "use `all` (every real token) or `cls` (the [CLS] token only)",
            ))
        }
    };
    if tokens == Tokens::First && feature != Feature::Hidden {
        return Err(cx.err(
            &key("tokens"),
            format!("match {index}: `tokens = \"cls\"` applies to hidden-state matches only"),
            "use it with `feature = \"hidden\"`, or leave `tokens` out",
        ));
    }
    if let Some(u) = m.until_epoch {
        if u == 0 || u >= train.epochs {
            return Err(cx.err(
                &key("until-epoch"),
                format!(
                    "match {index}: until-epoch = {u} must lie in 1..{e} ([train] epochs = {e})",
                    e = train.epochs
                ),
                "the match is on in epochs 1..=until-epoch; leave it out to match in every epoch",
            ));
        }
    }
    let rows = match (feature, m.rows) {
        (Feature::WordEmbeddings, None) => 4096,
        (Feature::WordEmbeddings, Some(r)) if r > 0 => r,
        (Feature::WordEmbeddings, Some(_)) => {
            return Err(cx.err(
                &key("rows"),
                format!("match {index}: rows must be > 0"),
                "use e.g. 4096 (vocabulary rows compared per step)",
            ))
        }
        (_, Some(_)) => {
            return Err(cx.err(
                &key("rows"),
                format!("match {index}: `rows` applies to word-embedding matches only"),
                "leave `rows` out, or use it with `feature = \"word-embeddings\"`",
            ))
        }
        (_, None) => 0,
    };
    Ok(MatchSpec {
        feature,
        loss,
        layers,
        weight,
        projection: m.projection.unwrap_or(false),
        heads,
        tokens,
        until_epoch: m.until_epoch,
        rows,
        index,
    })
}

/// Validate a distill stage's own keys.
fn distill_spec(
    cx: &Scope,
    d: RawDistillStage,
    train: &TrainSpec,
) -> Result<(ModelSpec, DistillSpec, Option<TextAugment>), RecipeError> {
    let Some(raw_student) = d.student else {
        return Err(cx.err(
            "student",
            "a distill stage needs its student",
            "add [stage.student] with `config` (and the keys of the student's family: for BERT `init-from-teacher-layers`, `weights` or neither for random init, and optional [stage.student.overrides])",
        ));
    };
    let scx = cx.nested("student");
    // The student's family validates its own keys when it plans the stage.
    let student = model_spec(&scx, raw_student)?;
    if d.enabled == Some(false) {
        crate::kinds::kd::refuse_without_kd(
            cx,
            [
                ("alpha", d.alpha.is_some()),
                ("temperature", d.temperature.is_some()),
                ("soft-loss", d.soft_loss.is_some()),
                ("teacher-cache", d.teacher_cache.is_some()),
                ("teacher-top-k", d.teacher_top_k.is_some()),
                ("baseline", d.baseline.is_some()),
                ("match", !d.matches.is_empty()),
            ],
            "enabled = false",
        )?;
    }
    let sched = |raw: Option<RawSchedule>, default: f64| match raw {
        None => Schedule::Constant(default),
        Some(RawSchedule::Constant(v)) => Schedule::Constant(v),
        Some(RawSchedule::Linear { from, to }) => Schedule::Linear { from, to },
    };
    let alpha = sched(d.alpha, 0.5);
    let (a0, a1) = (alpha.at(0.0), alpha.at(1.0));
    if !(0.0..=1.0).contains(&a0) || !(0.0..=1.0).contains(&a1) {
        return Err(cx.err(
            "alpha",
            format!("alpha must lie in [0, 1] (got {a0} → {a1})"),
            "alpha weighs the hard-label loss; 0.3 to 0.7 is typical",
        ));
    }
    let temperature = sched(d.temperature, 4.0);
    let (t0, t1) = (temperature.at(0.0), temperature.at(1.0));
    if !(t0 > 0.0 && t1 > 0.0) {
        return Err(cx.err(
            "temperature",
            format!("temperature must be > 0 (got {t0} → {t1})"),
            "use 1 to 8; 4 is a good start for classification",
        ));
    }
    let soft_loss = match d.soft_loss.as_deref().unwrap_or("kl") {
        "kl" => SoftLoss::Kl,
        "mse" => SoftLoss::Mse,
        other => {
            return Err(cx.err(
                "soft-loss",
                format!("unknown soft loss `{other}`"),
                "use `kl` or `mse`",
            ))
        }
    };
    if d.teacher_top_k == Some(0) {
        return Err(cx.err(
            "teacher-top-k",
            "0 keeps no logit",
            "keep the k largest logits of each row, e.g. 64, or leave the key out (every logit)",
        ));
    }
    let augment = augment_spec(
        cx,
        (d.augment_copies, d.augment_replace, d.augment_neighbours),
        (d.enabled, d.teacher_cache),
    )?;
    let matches = d
        .matches
        .into_iter()
        .enumerate()
        .map(|(index, m)| match_spec(cx, index, m, train))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((
        student,
        DistillSpec {
            enabled: d.enabled.unwrap_or(true),
            alpha,
            temperature,
            soft_loss,
            teacher_cache: d.teacher_cache.unwrap_or(true),
            teacher_top_k: d.teacher_top_k,
            baseline: d.baseline.unwrap_or(false),
            matches,
        },
        augment,
    ))
}

/// `augment-copies` and its companions: TinyBERT's augmentation, labelled by the cached teacher.
fn augment_spec(
    cx: &Scope,
    (copies, replace, neighbours): (Option<usize>, Option<f64>, Option<usize>),
    (enabled, teacher_cache): (Option<bool>, Option<bool>),
) -> Result<Option<TextAugment>, RecipeError> {
    let Some(copies) = copies else {
        for (key, set) in [
            ("augment-replace", replace.is_some()),
            ("augment-neighbours", neighbours.is_some()),
        ] {
            if set {
                return Err(cx.err(
                    key,
                    "is set without `augment-copies`",
                    "add `augment-copies = 4` (copies of every training sentence), or remove the key",
                ));
            }
        }
        return Ok(None);
    };
    let defaults = TextAugment::default();
    let spec = TextAugment {
        copies,
        replace: replace.unwrap_or(defaults.replace),
        neighbours: neighbours.unwrap_or(defaults.neighbours),
    };
    if !(1..=100).contains(&copies) {
        return Err(cx.err(
            "augment-copies",
            format!("{copies} copies of every sentence"),
            "use 1 to 100 (TinyBERT used 20; each copy adds a training set to every epoch)",
        ));
    }
    if !(spec.replace > 0.0 && spec.replace <= 1.0) {
        return Err(cx.err(
            "augment-replace",
            format!("{} is not a probability in (0, 1]", spec.replace),
            "the chance that a word is replaced; TinyBERT used 0.4",
        ));
    }
    if spec.neighbours == 0 {
        return Err(cx.err(
            "augment-neighbours",
            "0 neighbours leaves nothing to replace a word with",
            "draw from the 15 nearest words (TinyBERT's choice), or any number above 0",
        ));
    }
    if enabled == Some(false) || teacher_cache == Some(false) {
        let key = if enabled == Some(false) {
            "enabled"
        } else {
            "teacher-cache"
        };
        return Err(cx.err(
            key,
            "`augment-copies` needs the teacher and its cache: the copies are labelled by the cached teacher",
            "remove `augment-copies`, or set this key to true",
        ));
    }
    Ok(Some(spec))
}

pub use mopt_distill::text::task::ExtraTerm;

/// A distill stage, validated.
#[derive(Clone)]
pub struct DistillStage {
    /// The student's model table.
    pub student: ModelSpec,
    /// The objective's settings.
    pub spec: DistillSpec,
    /// TinyBERT's data augmentation (`augment-copies`): copies of the training sentences that
    /// the teacher labels ([`mopt_distill::text::augment`]); the twin trains on the originals
    /// for as many steps. Text families only.
    pub augment: Option<TextAugment>,
    /// An extra loss term (Rust API only).
    pub extra: Option<ExtraTerm>,
    /// The scope of the stage's block, for shape errors found against the teacher.
    pub scope: Scope,
    /// The keys its recipe block writes (none for a stage declared in Rust): a family refuses
    /// one it would not read, rather than ignore it.
    pub written: Vec<String>,
}

impl DistillStage {
    /// A distill stage declared in Rust (errors name `scope`'s keys).
    pub fn new(student: ModelSpec, spec: DistillSpec, scope: Scope) -> Self {
        Self {
            student,
            spec,
            augment: None,
            extra: None,
            scope,
            written: Vec::new(),
        }
    }

    /// Validate a `[[stage]]` block of kind `distill`.
    pub fn from_entry(entry: &StageEntry) -> Result<Self, RecipeError> {
        let raw: RawDistillStage = entry.scope.deserialize(entry.settings.clone())?;
        let (student, spec, augment) = distill_spec(&entry.scope, raw, &entry.train)?;
        Ok(DistillStage {
            augment,
            written: entry.settings.keys().cloned().collect(),
            ..DistillStage::new(student, spec, entry.scope.clone())
        })
    }

    /// Add `term` to the objective.
    pub fn with_term(mut self, term: ExtraTerm) -> Self {
        self.extra = Some(term);
        self
    }

    /// Whether `[stage.student] arch` names another family than the teacher's `family`.
    pub fn of_another_family(&self, family: &FamilyEntry) -> bool {
        self.student
            .arch
            .as_deref()
            .is_some_and(|a| a != family.arch() && !family.aliases().contains(&a))
    }

    /// The family that builds and trains the student: the teacher's (`teacher`), or the
    /// registered family `[stage.student] arch` names, which must read the same data and
    /// distil (its `CanDistill` then distils from a teacher of another family: logit KD
    /// through the teacher family's `CanTeach`).
    pub fn student_family<'a>(
        &self,
        teacher: &'a FamilyEntry,
        registry: &'a crate::Registry,
    ) -> Result<&'a FamilyEntry, StageError> {
        if !self.of_another_family(teacher) {
            return Ok(teacher);
        }
        let scope = self.scope.nested("student");
        let arch = self.student.arch.as_deref().unwrap_or_default();
        let f = registry.output_family(teacher, arch, &scope, "arch")?;
        if f.capability::<dyn CanDistill>().is_none() {
            return Err(scope
                .err("arch", f.lacks("distill", NEEDS.0, NEEDS.1), FIX)
                .into());
        }
        if teacher
            .capability::<dyn crate::kinds::kd::CanTeach>()
            .is_none()
        {
            let what = teacher.lacks(
                "distill",
                "a teacher of another family's student",
                "lists no teach capability",
            );
            let fix = "register `mopt_stages::kinds::kd::teach_capability::<M>()` in the teacher family's `capabilities`";
            return Err(scope.err("arch", what, fix).into());
        }
        Ok(f)
    }

    /// Refuse `augment-copies` for a stage whose family cannot augment its inputs (`why`).
    pub fn refuse_augment(&self, why: &str) -> Result<(), StageError> {
        match self.augment {
            Some(_) => Err(self
                .scope
                .err(
                    "augment-copies",
                    format!("{why}: there are no sentences to copy"),
                    "remove the augment-* keys (TinyBERT's augmentation is for text classifiers)",
                )
                .into()),
            None => Ok(()),
        }
    }

    /// Refuse a written `teacher-cache` and `teacher-top-k` for a stage whose teacher runs
    /// live (`why`: how), rather than ignore them.
    pub fn refuse_cache_keys(&self, why: &str) -> Result<(), StageError> {
        if self.written.iter().any(|k| k == "teacher-cache") {
            return Err(self
                .scope
                .err(
                    "teacher-cache",
                    format!("{why}: there is no teacher cache to keep or leave out"),
                    "remove the key",
                )
                .into());
        }
        self.refuse_top_k(why)
    }

    /// Refuse `teacher-top-k` for a stage whose teacher is not read from a logit cache
    /// (`why`: how it runs instead), rather than ignore it.
    pub fn refuse_top_k(&self, why: &str) -> Result<(), StageError> {
        match self.spec.teacher_top_k {
            Some(_) => Err(self
                .scope
                .err(
                    "teacher-top-k",
                    format!("{why}: there is no logit cache to keep the top-k of"),
                    "remove the key (the top-k cache is for the logits-only distillation of vocabulary-wide rows)",
                )
                .into()),
            None => Ok(()),
        }
    }
}

/// What a family without the capability lacks.
const NEEDS: (&str, &str) = ("distillation support", "declares none");

/// How a family gains it.
const FIX: &str = "register a `CanDistill` in the family's `capabilities` (for logit KD its `plan` and `run` call `mopt_stages::kinds::kd_student::plan` and `mopt_stages::kinds::kd_student::run::<M>`, as the Llama family does)";

/// A family's `distill` capability: build the `[stage.student]` of its models and train it
/// against the input (the teacher).
pub trait CanDistill: Send + Sync {
    /// Plan a `distill` stage: the student's shape and memory.
    fn plan(
        &self,
        stage: &DistillStage,
        entry: &StageEntry,
        input: &Shape,
        cx: &PlanContext,
    ) -> Result<StagePlan, StageError>;
    /// Run a `distill` stage on the teacher at `input`.
    fn run(
        &self,
        stage: &DistillStage,
        input: &Path,
        cx: &StageContext,
    ) -> Result<StageOutput, StageError>;
}

impl StageKind for Distill {
    fn name(&self) -> &'static str {
        "distill"
    }

    fn about(&self) -> &'static str {
        "distil the input model into a smaller student"
    }

    fn parse(
        &self,
        entry: &StageEntry,
        family: &FamilyEntry,
    ) -> Result<Box<dyn Stage>, RecipeError> {
        // A student of another family is checked against that family when the stage is
        // planned (the registry is at hand there); a student of the teacher's, here.
        let arch = entry
            .settings
            .get("student")
            .and_then(|s| s.get("arch"))
            .and_then(|a| a.as_str());
        if !arch.is_some_and(|a| a != family.arch() && !family.aliases().contains(&a)) {
            family.check::<dyn CanDistill>(entry, NEEDS, FIX)?;
        }
        Ok(Box::new(DistillStage::from_entry(entry)?))
    }
}

/// A feature match as its `[[stage.match]]` line reads (the `--check` plan prints it).
pub fn match_line(m: &MatchSpec) -> String {
    let feature = match m.feature {
        Feature::Hidden => "hidden",
        Feature::AttentionProbs => "attention",
        Feature::AttentionScores => "attention-scores",
        Feature::Embeddings => "embeddings",
        Feature::WordEmbeddings => "word-embeddings",
    };
    let loss = match m.loss {
        MatchLoss::Mse => "mse",
        MatchLoss::Cosine => "cosine",
        MatchLoss::Kl => "kl",
    };
    let mut s = format!("[[stage.match]] feature = \"{feature}\", loss = \"{loss}\"");
    match &m.layers {
        LayerMap::Uniform => s += ", layers = \"uniform\"",
        LayerMap::Pairs(p)
            if m.feature != Feature::Embeddings && m.feature != Feature::WordEmbeddings =>
        {
            let pairs: Vec<String> = p.iter().map(|(a, b)| format!("[{a}, {b}]")).collect();
            s += &format!(", layers = [{}]", pairs.join(", "));
        }
        LayerMap::Pairs(_) => {}
    }
    s += &format!(", weight = {:?}", m.weight);
    if m.projection {
        s += ", projection = true";
    }
    if m.heads == HeadPolicy::Mean {
        s += ", heads = \"mean\"";
    }
    if m.tokens == Tokens::First {
        s += ", tokens = \"cls\"";
    }
    if let Some(u) = m.until_epoch {
        s += &format!(", until-epoch = {u}");
    }
    if m.feature == Feature::WordEmbeddings {
        s += &format!(", rows = {}", m.rows);
    }
    s
}

impl Stage for DistillStage {
    fn kind(&self) -> &str {
        "distill"
    }

    fn plan(
        &self,
        entry: &StageEntry,
        shape: &Shape,
        cx: &PlanContext,
    ) -> Result<StagePlan, StageError> {
        self.student_family(cx.family, cx.registry)?
            .require::<dyn CanDistill>("distill", NEEDS.0, NEEDS.1)?
            .plan(self, entry, shape, cx)
    }

    fn run(&self, input: &Path, cx: &StageContext) -> Result<StageOutput, StageError> {
        self.student_family(cx.family, cx.registry)?
            .require::<dyn CanDistill>("distill", NEEDS.0, NEEDS.1)?
            .run(self, input, cx)
    }

    fn output_arch(&self) -> Option<(&'static str, &str)> {
        self.student.arch.as_deref().map(|a| ("student.arch", a))
    }

    fn reuse_key(&self) -> Option<String> {
        // A loss term written in Rust cannot be compared: such a stage always runs. The
        // hard-label twin is part of the key: the better on validation is the output.
        if self.extra.is_some() {
            return None;
        }
        let spec = &self.spec;
        Some(format!(
            "student {}\n{spec:?}\naugment {:?}",
            self.student.identity(),
            self.augment
        ))
    }
}
