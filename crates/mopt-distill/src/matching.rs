//! Intermediate matches: resolving `[[stage.match]]` against the two model shapes, and their losses.

use std::collections::{BTreeMap, BTreeSet};

use burn::nn::Linear;
use burn::prelude::*;
use mopt_core::{TapLayout, Taps};
use mopt_recipe::{RecipeError, Scope};

use crate::spec::{Feature, HeadPolicy, LayerMap, MatchLoss, MatchSpec, Tokens};

/// One student ↔ teacher pair of a match. Hidden indices count the embedding output as 0;
/// attention indices are 1-based layers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pair {
    /// The student's index.
    pub student: usize,
    /// The teacher's index.
    pub teacher: usize,
    /// Index into the trainable projections (hidden features only).
    pub projection: Option<usize>,
    /// Average attention over heads (different head counts with `heads = "mean"`).
    pub mean_heads: bool,
}

/// A match with its pairs resolved.
#[derive(Debug, Clone)]
pub struct ResolvedMatch {
    /// What is compared.
    pub feature: Feature,
    /// How.
    pub loss: MatchLoss,
    /// The term's weight in the objective.
    pub weight: f64,
    /// Token positions compared (hidden features).
    pub tokens: Tokens,
    /// Last epoch (1-based) the match is on; `None` = always.
    pub until_epoch: Option<usize>,
    /// Vocabulary rows compared per step (word-embedding matches).
    pub rows: usize,
    /// The compared pairs.
    pub pairs: Vec<Pair>,
    /// Name in logs, e.g. `hidden_mse_0` (`hidden_cls_mse_3` for `[CLS]`-only matches).
    pub name: &'static str,
}

/// Teacher features the matches read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TeacherNeeds {
    /// Hidden-state indices (0: the embedding output).
    pub hidden: BTreeSet<usize>,
    /// Layers (1-based) whose attention probabilities are compared.
    pub attentions: BTreeSet<usize>,
    /// Layers (1-based) whose attention scores are compared.
    pub scores: BTreeSet<usize>,
}

impl TeacherNeeds {
    /// The teacher forward pass that computes these features.
    pub fn request(&self) -> mopt_core::TapRequest {
        mopt_core::TapRequest {
            hidden_states: !self.hidden.is_empty(),
            attentions: !self.attentions.is_empty(),
            attention_scores: !self.scores.is_empty(),
        }
    }

    /// Whether no teacher feature is needed (logits only).
    pub fn is_empty(&self) -> bool {
        self.hidden.is_empty() && self.attentions.is_empty() && self.scores.is_empty()
    }
}

/// Resolved matches, the projections they need (`(d_in, d_out)` each) and the teacher features.
#[derive(Debug, Clone)]
pub struct MatchPlan {
    /// The matches, resolved.
    pub matches: Vec<ResolvedMatch>,
    /// `(d_in, d_out)` of each learned projection.
    pub projections: Vec<(usize, usize)>,
    /// The teacher features the matches read.
    pub needs: TeacherNeeds,
}

fn leak(s: String) -> &'static str {
    // A handful of names per run, kept for the process lifetime by the loggers anyway.
    Box::leak(s.into_boxed_str())
}

/// Resolve the matches for these shapes. Errors are recipe errors that name the key in `cx`
/// (the distill stage's block).
pub fn resolve(
    cx: &Scope,
    specs: &[MatchSpec],
    student: &TapLayout,
    teacher: &TapLayout,
) -> Result<MatchPlan, RecipeError> {
    let mut plan = MatchPlan {
        matches: Vec::new(),
        projections: Vec::new(),
        needs: TeacherNeeds::default(),
    };
    for m in specs {
        if m.feature == Feature::AttentionProbs && m.loss != MatchLoss::Kl {
            return Err(cx.err(
                "match.loss",
                format!(
                    "match {}: attention probabilities of a Transformer compare with `kl`",
                    m.index
                ),
                "use loss = \"kl\" (`mse` on attention is attention transfer, for feature maps of images)",
            ));
        }
        let pairs = layer_pairs(cx, m, student.layers, teacher.layers)?;
        let mut resolved = Vec::new();
        for (s, t) in pairs {
            resolved.push(plan.pair(cx, m, (s, t), student, teacher)?);
        }
        plan.matches.push(ResolvedMatch {
            feature: m.feature,
            loss: m.loss,
            weight: m.weight,
            tokens: m.tokens,
            until_epoch: m.until_epoch,
            rows: m.rows,
            pairs: resolved,
            name: match_name(m),
        });
    }
    Ok(plan)
}

fn is_attention(m: &MatchSpec) -> bool {
    matches!(
        m.feature,
        Feature::AttentionProbs | Feature::AttentionScores
    )
}

/// The (student, teacher) indices of match `m` for `ls` student and `lt` teacher layers,
/// checked against them.
pub fn layer_pairs(
    cx: &Scope,
    m: &MatchSpec,
    ls: usize,
    lt: usize,
) -> Result<Vec<(usize, usize)>, RecipeError> {
    let (i, attention) = (m.index, is_attention(m));
    let pairs: Vec<(usize, usize)> = match (&m.feature, &m.layers) {
        (Feature::Embeddings | Feature::WordEmbeddings, _) => vec![(0, 0)],
        (_, LayerMap::Uniform) => (1..=ls)
            .map(|s| (s, ((s * lt) as f64 / ls as f64).round() as usize))
            .collect(),
        (_, LayerMap::Pairs(p)) => p.clone(),
    };
    let lo = usize::from(attention);
    for &(s, t) in &pairs {
        if s < lo || s > ls || t < lo || t > lt {
            return Err(cx.err(
                "match.layers",
                format!(
                    "match {i}: pair [{s}, {t}] is out of range: the student has {} {}, the teacher {}",
                    ls,
                    if attention { "layers (1-based)" } else { "hidden states (0 = embeddings … layers)" },
                    lt
                ),
                if attention {
                    "attention pairs are 1-based layers: [student, teacher] with 1 ≤ student ≤ student layers"
                } else {
                    "hidden pairs index hidden states: 0 is the embedding output, i is layer i's output"
                },
            ));
        }
    }
    Ok(pairs)
}

/// The log name of a match, e.g. `hidden_mse_0` (`hidden_cls_mse_3` for `[CLS]`-only matches).
fn match_name(m: &MatchSpec) -> &'static str {
    let feature = match m.feature {
        Feature::Hidden => "hidden",
        Feature::Embeddings => "embeddings",
        Feature::WordEmbeddings => "word_embeddings",
        Feature::AttentionProbs => "attention",
        Feature::AttentionScores => "attention_scores",
    };
    let feature = match m.tokens {
        Tokens::First => "hidden_cls",
        Tokens::All => feature,
    };
    let loss = match m.loss {
        MatchLoss::Mse => "mse",
        MatchLoss::Cosine => "cosine",
        MatchLoss::Kl => "kl",
    };
    leak(format!("{feature}_{loss}_{}", m.index))
}

impl MatchPlan {
    /// One (student `s`, teacher `t`) pair of match `m`: head counts (attention) or widths
    /// (hidden, with a new projection when asked) checked, the teacher feature noted.
    fn pair(
        &mut self,
        cx: &Scope,
        m: &MatchSpec,
        (s, t): (usize, usize),
        student: &TapLayout,
        teacher: &TapLayout,
    ) -> Result<Pair, RecipeError> {
        let i = m.index;
        let mut pair = Pair {
            student: s,
            teacher: t,
            projection: None,
            mean_heads: false,
        };
        if is_attention(m) {
            let (hs, ht) = (student.heads[s - 1], teacher.heads[t - 1]);
            if hs != ht && m.heads == HeadPolicy::Error {
                return Err(cx.err(
                    "match.heads",
                    format!("match {i}: student layer {s} has {hs} heads, teacher layer {t} has {ht}"),
                    "set `heads = \"mean\"` to compare head-averaged attention, or match layers with equal head counts",
                ));
            }
            pair.mean_heads = m.heads == HeadPolicy::Mean;
            self.needs_insert(m.feature, t);
        } else {
            let (ws, wt) = (student.width, teacher.width);
            if m.projection {
                pair.projection = Some(self.projections.len());
                self.projections.push((ws, wt));
            } else if ws != wt {
                return Err(cx.err(
                    "match.projection",
                    format!("match {i}: student width {ws} differs from teacher width {wt}"),
                    "set `projection = true` to learn a linear map from the student's width to the teacher's",
                ));
            }
            if m.feature != Feature::WordEmbeddings {
                self.needs.hidden.insert(t);
            }
        }
        Ok(pair)
    }

    fn needs_insert(&mut self, feature: Feature, t: usize) {
        match feature {
            Feature::AttentionProbs => self.needs.attentions.insert(t),
            Feature::AttentionScores => self.needs.scores.insert(t),
            _ => self.needs.hidden.insert(t),
        };
    }
}

impl ResolvedMatch {
    /// Whether the match is on in `epoch` (1-based).
    pub fn active(&self, epoch: usize) -> bool {
        self.until_epoch.is_none_or(|u| epoch <= u)
    }
}

/// Teacher features of one batch, keyed like [`TeacherNeeds`].
#[derive(Debug, Clone)]
pub struct TeacherBatch {
    /// `[batch, classes]`
    pub logits: Tensor<2>,
    /// `[batch, seq, hidden_t]` by hidden index.
    pub hidden: BTreeMap<usize, Tensor<3>>,
    /// `[batch, heads, seq, seq]` by 1-based layer.
    pub attentions: BTreeMap<usize, Tensor<4>>,
    /// `[batch, heads, seq, seq]` attention scores by 1-based layer.
    pub scores: BTreeMap<usize, Tensor<4>>,
    /// Word-embedding rows sampled for this step (word-embedding matches only).
    pub word_rows: Option<WordRows>,
}

/// Vocabulary rows sampled for one step of a word-embedding match, with the teacher's rows.
#[derive(Debug, Clone)]
pub struct WordRows {
    /// `[rows]` token ids.
    pub ids: Tensor<1, Int>,
    /// `[rows, hidden_t]`
    pub teacher: Tensor<2>,
}

impl WordRows {
    /// `rows` token ids drawn uniformly (with replacement) from `0..vocab` by `seed`, and the
    /// teacher's embedding rows for them. The same seed gives the same rows.
    pub fn sample(teacher_table: &Tensor<2>, rows: usize, seed: u64) -> Self {
        let [table_rows, _] = teacher_table.dims();
        let mut rng = mopt_data::SplitMix64::new(seed);
        let ids: Vec<i64> = (0..rows).map(|_| rng.below(table_rows) as i64).collect();
        let ids =
            Tensor::<1, Int>::from_data(TensorData::new(ids, [rows]), &teacher_table.device());
        Self {
            teacher: teacher_table.clone().select(0, ids.clone()),
            ids,
        }
    }
}

/// Relative squared error `Σ(s−t)² / Σt²` (0 = exact, 1 = as far off as predicting zeros), so
/// the weight of a table match does not depend on the teacher's embedding scale.
///
/// # Shapes
/// - s, t: `[rows, width]` → `[1]`
pub fn relative_mse(s: Tensor<2>, t: Tensor<2>) -> Tensor<1> {
    (s - t.clone())
        .square()
        .sum()
        .div(t.square().sum().add_scalar(EPS))
}

/// Mean of `1 − cos(s, t)` over rows.
pub fn rows_cosine(s: Tensor<2>, t: Tensor<2>) -> Tensor<1> {
    let [r, w] = s.dims();
    let mask = Tensor::ones([1, r], &t.device());
    hidden_cosine(s.reshape([1, r, w]), t.reshape([1, r, w]), mask)
}

const EPS: f32 = 1e-12;

/// Masked mean squared error over tokens: `Σ mask·(s−t)² / (Σ mask · width)`.
///
/// # Shapes
/// - s, t: `[batch, seq, width]`; mask: `[batch, seq]` → `[1]`
pub fn hidden_mse(s: Tensor<3>, t: Tensor<3>, mask: Tensor<2>) -> Tensor<1> {
    let [b, q, w] = s.dims();
    let m = mask.reshape([b, q, 1]);
    let tokens = m.clone().sum();
    ((s - t).square() * m)
        .sum()
        .div(tokens.mul_scalar(w as f32))
}

/// Masked mean of `1 − cos(s, t)` over tokens.
pub fn hidden_cosine(s: Tensor<3>, t: Tensor<3>, mask: Tensor<2>) -> Tensor<1> {
    let dot = (s.clone() * t.clone()).sum_dim(2);
    let ns = s.square().sum_dim(2).sqrt();
    let nt = t.square().sum_dim(2).sqrt();
    let cos = dot.div(ns * nt + 1e-8);
    let [b, q, _] = cos.dims();
    let m = mask.reshape([b, q, 1]);
    let tokens = m.clone().sum();
    (cos.neg().add_scalar(1.0) * m).sum().div(tokens)
}

/// KL(teacher row ‖ student row) of attention distributions, mean over real query rows and heads.
///
/// # Shapes
/// - s, t: `[batch, heads, seq, seq]`; mask: `[batch, seq]` → `[1]`
pub fn attention_kl(s: Tensor<4>, t: Tensor<4>, mask: Tensor<2>) -> Tensor<1> {
    let [b, h, q, _] = s.dims();
    let kl = (t.clone() * (t.add_scalar(EPS).log() - s.add_scalar(EPS).log())).sum_dim(3);
    let m = mask.reshape([b, 1, q, 1]);
    let rows = m.clone().sum().mul_scalar(h as f32);
    (kl * m).sum().div(rows)
}

/// MSE of attention scores over real (query, key) pairs.
pub fn scores_mse(s: Tensor<4>, t: Tensor<4>, mask: Tensor<2>) -> Tensor<1> {
    let [b, h, q, _] = s.dims();
    let mq = mask.clone().reshape([b, 1, q, 1]);
    let mk = mask.reshape([b, 1, 1, q]);
    let m = mq * mk;
    let n = m.clone().sum().mul_scalar(h as f32);
    ((s - t).square() * m).sum().div(n)
}

fn heads_mean(x: Tensor<4>) -> Tensor<4> {
    x.mean_dim(1)
}

/// Loss of one resolved match (mean over its pairs, times its weight).
pub fn match_loss(
    m: &ResolvedMatch,
    student: &Taps,
    teacher: &TeacherBatch,
    projections: &[Linear],
    mask: &Tensor<2>,
    student_words: Option<&Tensor<2>>,
) -> Tensor<1> {
    let mut total: Option<Tensor<1>> = None;
    for p in &m.pairs {
        let l = match m.feature {
            Feature::WordEmbeddings => {
                let rows = teacher
                    .word_rows
                    .as_ref()
                    .expect("the task samples word rows for word-embedding matches");
                let table = student_words.expect("the student's word-embedding table");
                let n = m.rows.min(rows.ids.dims()[0]);
                let mut s = table.clone().select(0, rows.ids.clone().narrow(0, 0, n));
                let t = rows.teacher.clone().narrow(0, 0, n);
                if let Some(j) = p.projection {
                    s = projections[j].forward(s);
                }
                match m.loss {
                    MatchLoss::Cosine => rows_cosine(s, t),
                    _ => relative_mse(s, t),
                }
            }
            Feature::Hidden | Feature::Embeddings => {
                let mut s = student.hidden_states[p.student].clone();
                if let Some(j) = p.projection {
                    s = projections[j].forward(s);
                }
                let mut t = teacher.hidden[&p.teacher].clone();
                let mut mask = mask.clone();
                if m.tokens == Tokens::First {
                    s = s.narrow(1, 0, 1);
                    t = t.narrow(1, 0, 1);
                    mask = mask.narrow(1, 0, 1);
                }
                match m.loss {
                    MatchLoss::Cosine => hidden_cosine(s, t, mask),
                    _ => hidden_mse(s, t, mask),
                }
            }
            Feature::AttentionProbs | Feature::AttentionScores => {
                let probs = matches!(m.feature, Feature::AttentionProbs);
                let (mut s, mut t) = if probs {
                    (
                        student.attentions[p.student - 1].clone(),
                        teacher.attentions[&p.teacher].clone(),
                    )
                } else {
                    (
                        student.attention_scores[p.student - 1].clone(),
                        teacher.scores[&p.teacher].clone(),
                    )
                };
                if p.mean_heads {
                    s = heads_mean(s);
                    t = heads_mean(t);
                }
                if probs {
                    attention_kl(s, t, mask.clone())
                } else {
                    scores_mse(s, t, mask.clone())
                }
            }
        };
        total = Some(match total {
            Some(acc) => acc + l,
            None => l,
        });
    }
    total
        .expect("a match has at least one pair")
        .div_scalar(m.pairs.len() as f32)
        .mul_scalar(m.weight as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_losses_ignore_padding() {
        let d = Device::flex();
        let s = Tensor::<3>::from_floats([[[1.0, 2.0], [5.0, 5.0]]], &d);
        let t = Tensor::<3>::from_floats([[[1.0, 0.0], [-9.0, 9.0]]], &d);
        let mask = Tensor::<2>::from_floats([[1.0, 0.0]], &d);
        let mse: f32 = hidden_mse(s.clone(), t.clone(), mask.clone()).into_scalar();
        assert!((mse - 2.0).abs() < 1e-6, "(0² + 2²)/2 = 2, got {mse}");
        let cos: f32 = hidden_cosine(s, t, mask).into_scalar();
        let want = 1.0 - 1.0 / 5f32.sqrt();
        assert!((cos - want).abs() < 1e-6, "{cos} vs {want}");
    }

    #[test]
    fn cls_matches_read_only_the_first_token() {
        let d = Device::flex();
        // Token 0 differs by (1, 2); token 1 differs wildly and must not count.
        let s = Tensor::<3>::from_floats([[[1.0, 2.0], [50.0, -50.0]]], &d);
        let t = Tensor::<3>::from_floats([[[0.0, 0.0], [0.0, 0.0]]], &d);
        let outputs = Taps {
            logits: Tensor::zeros([1, 2], &d),
            hidden_states: vec![s.clone(), s],
            attentions: vec![],
            attention_scores: vec![],
        };
        let teacher = TeacherBatch {
            logits: Tensor::zeros([1, 2], &d),
            hidden: BTreeMap::from([(3, t)]),
            attentions: BTreeMap::new(),
            scores: BTreeMap::new(),
            word_rows: None,
        };
        let mask = Tensor::<2>::from_floats([[1.0, 1.0]], &d);
        let mut m = ResolvedMatch {
            feature: Feature::Hidden,
            loss: MatchLoss::Mse,
            weight: 2.0,
            tokens: Tokens::First,
            until_epoch: Some(1),
            rows: 0,
            pairs: vec![Pair {
                student: 1,
                teacher: 3,
                projection: None,
                mean_heads: false,
            }],
            name: "hidden_cls_mse_0",
        };
        let cls: f32 = match_loss(&m, &outputs, &teacher, &[], &mask, None).into_scalar();
        // weight · (1² + 2²) / 2
        assert!((cls - 5.0).abs() < 1e-5, "{cls}");
        m.tokens = Tokens::All;
        let all: f32 = match_loss(&m, &outputs, &teacher, &[], &mask, None).into_scalar();
        assert!((all - 2.0 * (5.0 + 5000.0) / 4.0).abs() < 1e-2, "{all}");
        assert!(m.active(1) && !m.active(2));
    }

    #[test]
    fn attention_kl_is_zero_for_equal_rows_and_positive_otherwise() {
        let d = Device::flex();
        let p = Tensor::<4>::from_floats([[[[0.7, 0.3], [0.5, 0.5]]]], &d);
        let q = Tensor::<4>::from_floats([[[[0.5, 0.5], [0.1, 0.9]]]], &d);
        let mask = Tensor::<2>::from_floats([[1.0, 0.0]], &d);
        let zero: f32 = attention_kl(p.clone(), p.clone(), mask.clone()).into_scalar();
        assert!(zero.abs() < 1e-6);
        let kl: f32 = attention_kl(q, p, mask).into_scalar();
        // Only row 0 counts: 0.7 ln(0.7/0.5) + 0.3 ln(0.3/0.5)
        let want = 0.7f32 * (0.7f32 / 0.5).ln() + 0.3 * (0.3f32 / 0.5).ln();
        assert!((kl - want).abs() < 1e-5, "{kl} vs {want}");
    }

    #[test]
    fn word_table_match_is_relative_and_trains_only_the_sampled_rows() {
        let d = Device::flex();
        let ad = d.clone().autodiff();
        // Teacher table: 6 words x 2 dims; the student's is 3 dims wide with a projection 3 -> 2.
        let teacher = Tensor::<2>::from_floats(
            [
                [1.0, 0.0],
                [0.0, 2.0],
                [3.0, 1.0],
                [1.0, 1.0],
                [0.5, -1.0],
                [2.0, 2.0],
            ],
            &ad,
        );
        let a = WordRows::sample(&teacher, 50, 7);
        let b = WordRows::sample(&teacher, 50, 7);
        let ints = |t: Tensor<1, Int>| -> Vec<i64> {
            t.into_data().convert::<i64>().try_to_vec().unwrap()
        };
        let ids = ints(a.ids.clone());
        assert_eq!(ids, ints(b.ids), "same seed, same rows");
        assert!(ids.iter().all(|&i| (0..6).contains(&i)));
        assert!(ids.iter().collect::<BTreeSet<_>>().len() > 1, "{ids:?}");
        assert_ne!(
            ids,
            ints(WordRows::sample(&teacher, 50, 8).ids),
            "another seed, other rows"
        );
        // Relative squared error: 0 when exact, 1 when predicting zeros.
        let exact: f32 = relative_mse(a.teacher.clone(), a.teacher.clone()).into_scalar();
        let zeros: f32 = relative_mse(a.teacher.zeros_like(), a.teacher.clone()).into_scalar();
        assert!(
            exact.abs() < 1e-7 && (zeros - 1.0).abs() < 1e-6,
            "{exact} {zeros}"
        );

        // Only rows 0 and 2 sampled: the loss reads and trains those rows alone.
        let rows = WordRows {
            ids: Tensor::<1, Int>::from_data(TensorData::new(vec![0i64, 2, 2], [3]), &ad),
            teacher: teacher.clone().select(
                0,
                Tensor::<1, Int>::from_data(TensorData::new(vec![0i64, 2, 2], [3]), &ad),
            ),
        };
        let student = Tensor::<2>::from_floats(
            [
                [1.0, 0.0, 0.0],
                [9.0, 9.0, 9.0],
                [0.0, 1.0, 0.0],
                [9.0, 9.0, 9.0],
                [0.0; 3],
                [0.0; 3],
            ],
            &ad,
        )
        .require_grad();
        // Projection picking dims 0 and 1: row 0 -> (1, 0) exact, row 2 -> (0, 1) vs (3, 1).
        let mut proj = burn::nn::LinearConfig::new(3, 2).with_bias(false).init(&ad);
        proj.weight = burn::module::Param::from_tensor(Tensor::<2>::from_floats(
            [[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]],
            &ad,
        ));
        let outputs = Taps {
            logits: Tensor::zeros([1, 2], &ad),
            hidden_states: vec![],
            attentions: vec![],
            attention_scores: vec![],
        };
        let batch = TeacherBatch {
            logits: Tensor::zeros([1, 2], &ad),
            hidden: BTreeMap::new(),
            attentions: BTreeMap::new(),
            scores: BTreeMap::new(),
            word_rows: Some(rows),
        };
        let m = ResolvedMatch {
            feature: Feature::WordEmbeddings,
            loss: MatchLoss::Mse,
            weight: 0.5,
            tokens: Tokens::All,
            until_epoch: None,
            rows: 3,
            pairs: vec![Pair {
                student: 0,
                teacher: 0,
                projection: Some(0),
                mean_heads: false,
            }],
            name: "word_embeddings_mse_0",
        };
        let mask = Tensor::<2>::ones([1, 1], &ad);
        let loss = match_loss(&m, &outputs, &batch, &[proj], &mask, Some(&student));
        // weight · Σ(s−t)² / Σt² = 0.5 · (0 + 2·3²) / (1 + 2·10)
        let v: f32 = loss.clone().into_scalar();
        assert!((v - 0.5 * 18.0 / 21.0).abs() < 1e-6, "{v}");
        let grads = loss.backward();
        let g: Vec<f32> = student
            .grad(&grads)
            .unwrap()
            .into_data()
            .try_to_vec()
            .unwrap();
        let row_norm = |r: usize| g[r * 3..r * 3 + 3].iter().map(|x| x.abs()).sum::<f32>();
        assert!(row_norm(2) > 0.0, "sampled row 2 learns: {g:?}");
        for r in [1, 3, 4, 5] {
            assert_eq!(row_norm(r), 0.0, "row {r} was not sampled: {g:?}");
        }
    }
}
