//! The distillation objective's settings (validated by the `distill` stage kind).

/// A value that may change linearly over training.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Schedule {
    /// The same value all along.
    Constant(f64),
    /// From `from` at the first step to `to` at the last.
    Linear {
        /// The value at the first step.
        from: f64,
        /// The value at the last step.
        to: f64,
    },
}

impl Schedule {
    /// The value at `progress` in [0, 1].
    pub fn at(&self, progress: f64) -> f64 {
        match *self {
            Schedule::Constant(v) => v,
            Schedule::Linear { from, to } => from + (to - from) * progress.clamp(0.0, 1.0),
        }
    }
}

/// The soft (teacher) term on logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SoftLoss {
    /// T²·KL(softmax(t/T) ‖ softmax(s/T)), batch mean.
    Kl,
    /// Mean squared error between logits.
    Mse,
}

/// What an intermediate match compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// Layer outputs (`0` is the embedding output).
    Hidden,
    /// Attention probabilities of a layer (1-based).
    AttentionProbs,
    /// Attention scores (before the mask and softmax) of a layer (1-based).
    AttentionScores,
    /// The embedding output.
    Embeddings,
    /// The word-embedding table itself, vocabulary-wide: a sample of rows each step, so words
    /// that never occur in the training data still learn from the teacher.
    WordEmbeddings,
}

/// Loss of an intermediate match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchLoss {
    /// Mean squared error.
    Mse,
    /// 1 − cosine similarity.
    Cosine,
    /// KL divergence (attention probabilities).
    Kl,
}

/// Student → teacher layer pairs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayerMap {
    /// Student layer `i` (1-based) ↔ teacher layer `i · L_t / L_s`.
    Uniform,
    /// Explicit `(student, teacher)` pairs.
    Pairs(Vec<(usize, usize)>),
}

/// How attention is compared when student and teacher head counts differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadPolicy {
    /// Different head counts are an error.
    Error,
    /// Average over heads on both sides.
    Mean,
}

/// Which token positions a hidden-state match compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Tokens {
    /// Every real (unpadded) token.
    #[default]
    All,
    /// Only the first position (a BERT's `[CLS]`, which its pooler and classifier read: BERT-PKD).
    First,
}

/// One `[[distill.match]]`.
#[derive(Debug, Clone)]
pub struct MatchSpec {
    /// What is compared.
    pub feature: Feature,
    /// How.
    pub loss: MatchLoss,
    /// Which student layers meet which teacher layers.
    pub layers: LayerMap,
    /// The term's weight in the objective.
    pub weight: f64,
    /// Learn a linear projection student width → teacher width (hidden features).
    pub projection: bool,
    /// How different head counts are compared (attention).
    pub heads: HeadPolicy,
    /// Token positions compared (hidden-state matches).
    pub tokens: Tokens,
    /// Last epoch (1-based) in which the match is on; `None` = every epoch. Matching first and
    /// logits alone afterwards is TinyBERT's two-stage schedule.
    pub until_epoch: Option<usize>,
    /// Vocabulary rows compared per step (word-embedding matches).
    pub rows: usize,
    /// Position in the recipe, for messages (`distill.match[1]`).
    pub index: usize,
}

/// `[distill]`.
#[derive(Debug, Clone)]
pub struct DistillSpec {
    /// `false` turns the recipe into its hard-label twin (no teacher terms).
    pub enabled: bool,
    /// Weight of the hard-label cross-entropy; the soft term gets `1 − α`.
    pub alpha: Schedule,
    /// Softmax temperature of the soft term.
    pub temperature: Schedule,
    /// The soft term's loss.
    pub soft_loss: SoftLoss,
    /// Cache the teacher's outputs on disk beside the data.
    pub teacher_cache: bool,
    /// Keep the teacher's `k` largest logits of each row and the remaining mass
    /// ([`crate::topk`]) instead of every logit: for vocabulary-wide rows.
    pub teacher_top_k: Option<usize>,
    /// Also train the hard-label twin for the same budget and report both.
    pub baseline: bool,
    /// Intermediate matches.
    pub matches: Vec<MatchSpec>,
}

impl MatchSpec {
    /// A match with a recipe's defaults: weight 1, no projection, head counts must agree, all
    /// tokens, every epoch (word-embedding matches compare 4096 vocabulary rows per step).
    ///
    /// ```
    /// use mopt_distill::spec::{Feature, LayerMap, MatchLoss, MatchSpec};
    /// let m = MatchSpec::new(Feature::Hidden, MatchLoss::Cosine, LayerMap::Pairs(vec![(1, 2), (2, 5)]))
    ///     .weight(0.5);
    /// assert_eq!((m.weight, m.projection), (0.5, false));
    /// ```
    pub fn new(feature: Feature, loss: MatchLoss, layers: LayerMap) -> Self {
        Self {
            feature,
            loss,
            layers,
            weight: 1.0,
            projection: false,
            heads: HeadPolicy::Error,
            tokens: Tokens::All,
            until_epoch: None,
            rows: if feature == Feature::WordEmbeddings {
                4096
            } else {
                0
            },
            index: 0,
        }
    }

    /// This match with weight `weight`.
    pub fn weight(mut self, weight: f64) -> Self {
        self.weight = weight;
        self
    }

    /// Learn a linear projection from the student's width to the teacher's.
    pub fn projection(mut self) -> Self {
        self.projection = true;
        self
    }

    /// This match comparing different head counts by `heads`.
    pub fn heads(mut self, heads: HeadPolicy) -> Self {
        self.heads = heads;
        self
    }

    /// This match on the token positions `tokens`.
    pub fn tokens(mut self, tokens: Tokens) -> Self {
        self.tokens = tokens;
        self
    }

    /// Match in epochs 1..=`epoch` only (TinyBERT's two-stage schedule).
    pub fn until_epoch(mut self, epoch: usize) -> Self {
        self.until_epoch = Some(epoch);
        self
    }

    /// Vocabulary rows compared per step (word-embedding matches).
    pub fn rows(mut self, rows: usize) -> Self {
        self.rows = rows;
        self
    }
}

impl Default for DistillSpec {
    /// A recipe's defaults: KD on, α = 0.5, T = 4, KL, teacher cache on, no twin, no matches.
    fn default() -> Self {
        Self {
            enabled: true,
            alpha: Schedule::Constant(0.5),
            temperature: Schedule::Constant(4.0),
            soft_loss: SoftLoss::Kl,
            teacher_cache: true,
            teacher_top_k: None,
            baseline: false,
            matches: Vec::new(),
        }
    }
}

impl DistillSpec {
    /// Its settings of the KD term on logits.
    pub fn kd(&self) -> crate::kd::KdSettings {
        crate::kd::KdSettings {
            alpha: self.alpha,
            temperature: self.temperature,
            soft_loss: self.soft_loss,
        }
    }

    /// The objective's keys as a recipe writes them: `enabled = …, alpha = …, temperature = …,
    /// soft-loss = "…"` (plans and reports add what their kind adds).
    pub fn objective_line(&self) -> String {
        format!(
            "enabled = {}, alpha = {}, temperature = {}, soft-loss = \"{}\"",
            self.enabled,
            self.alpha.to_toml(),
            self.temperature.to_toml(),
            self.soft_loss.name()
        )
    }

    /// Add an intermediate match (its position in the list names it in messages).
    pub fn with_match(mut self, mut m: MatchSpec) -> Self {
        m.index = self.matches.len();
        self.matches.push(m);
        self
    }
}

impl Schedule {
    /// The schedule as a recipe writes it: `0.5` or `{ from = 0.7, to = 0.3 }`.
    pub fn to_toml(&self) -> String {
        match *self {
            Schedule::Constant(v) => format!("{v:?}"),
            Schedule::Linear { from, to } => format!("{{ from = {from:?}, to = {to:?} }}"),
        }
    }
}

impl SoftLoss {
    /// The recipe's name of the soft loss.
    pub fn name(self) -> &'static str {
        match self {
            SoftLoss::Kl => "kl",
            SoftLoss::Mse => "mse",
        }
    }
}
