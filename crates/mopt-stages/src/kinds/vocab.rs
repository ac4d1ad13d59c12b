//! `kind = "vocab"`: vocabulary pruning (TextPruner's). The token-embedding table keeps the rows
//! of the tokens the *training* split uses at least `min-count` times, and of the special tokens;
//! the tokenizer is unchanged and every other id reads `[UNK]`'s row, so any text still
//! tokenizes and classifies. A 3-layer MiniLM student's 30522 × 384 word table is two thirds of
//! its parameters: the table shrinks to the corpus's vocabulary, the encoder is untouched.
//! Validation and test tokens the training split never used become `[UNK]`: the gate measures
//! what that costs.

use std::path::Path;

use mopt_data::vocab::{kept_ids, vocab_map};
use mopt_data::VocabPrunable;
use mopt_recipe::{RecipeError, StageEntry};
use mopt_train::trainer::save_checkpoint_dir;
use serde::Deserialize;
use serde_json::json;

use crate::error::StageError;
use crate::family::FamilyEntry;
use crate::shape::Shape;
use crate::stage::{PlanContext, Stage, StageContext, StageKind, StageOutput, StagePlan};

/// The kind.
pub struct Vocab;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawVocab {
    min_count: Option<usize>,
}

/// A vocabulary-pruning stage.
#[derive(Debug, Clone)]
pub struct VocabStage {
    /// A token keeps its row when the training split uses it at least this often.
    pub min_count: usize,
}

/// What a family hands [`VocabStage::run`]: the token ids it reads.
pub struct Corpus<'a> {
    /// The training split's token ids, one sequence an example.
    pub train: Vec<&'a [u32]>,
    /// The validation split's (for the share of its tokens that become `[UNK]`).
    pub valid: Vec<&'a [u32]>,
    /// Ids always kept (the special tokens).
    pub special: Vec<u32>,
    /// `[UNK]`'s id: where a dropped token goes.
    pub unk: u32,
}

/// What a family without the capability lacks.
const NEEDS: (&str, &str) = ("a token-embedding table", "declares none");

/// A family's `vocab` capability: the stage on its model type with the run's token ids
/// ([`VocabStage::plan`], [`VocabStage::run`] with a [`Corpus`]).
pub trait CanPruneVocab: Send + Sync {
    /// Plan a `vocab` stage.
    fn plan(
        &self,
        stage: &VocabStage,
        entry: &StageEntry,
        input: &Shape,
        cx: &PlanContext,
    ) -> Result<StagePlan, StageError>;
    /// Run a `vocab` stage.
    fn run(
        &self,
        stage: &VocabStage,
        input: &Path,
        cx: &StageContext,
    ) -> Result<StageOutput, StageError>;
}

impl StageKind for Vocab {
    fn name(&self) -> &'static str {
        "vocab"
    }

    fn about(&self) -> &'static str {
        "vocabulary pruning: keep the embedding rows of the tokens the training split uses; others read [UNK]"
    }

    fn parse(
        &self,
        entry: &StageEntry,
        family: &FamilyEntry,
    ) -> Result<Box<dyn Stage>, RecipeError> {
        family.check::<dyn CanPruneVocab>(
            entry,
            NEEDS,
            "implement `mopt_data::VocabPrunable` for the model and register a `CanPruneVocab` (its corpus of token ids) in the family's `capabilities`",
        )?;
        let cx = &entry.scope;
        let r: RawVocab = cx.deserialize(entry.settings.clone())?;
        if entry.train_overridden {
            return Err(cx.err(
                "train",
                "a vocab stage does not train",
                "remove [stage.train]; fine-tune in the next stage (a qat stage does)",
            ));
        }
        Ok(Box::new(VocabStage {
            min_count: cx.positive("min-count", r.min_count, 1)?,
        }))
    }
}

impl Stage for VocabStage {
    fn kind(&self) -> &str {
        "vocab"
    }

    fn plan(
        &self,
        entry: &StageEntry,
        input: &Shape,
        cx: &PlanContext,
    ) -> Result<StagePlan, StageError> {
        cx.family
            .require::<dyn CanPruneVocab>("vocab", NEEDS.0, NEEDS.1)?
            .plan(self, entry, input, cx)
    }

    fn run(&self, input: &Path, cx: &StageContext) -> Result<StageOutput, StageError> {
        cx.family
            .require::<dyn CanPruneVocab>("vocab", NEEDS.0, NEEDS.1)?
            .run(self, input, cx)
    }

    fn reuse_key(&self) -> Option<String> {
        Some(format!("{self:?}"))
    }
}

impl VocabStage {
    /// The plan on an `M`: the rows kept are counted when the stage runs, so the planned output
    /// keeps every row (an upper bound for the memory estimates after it).
    pub fn plan<M: VocabPrunable>(
        &self,
        entry: &StageEntry,
        shape: &Shape,
    ) -> Result<StagePlan, StageError> {
        let input: &M::Config = shape.get()?;
        if M::vocab_pruned(input) {
            return Err(entry
                .scope
                .err(
                    "kind",
                    "the input's vocabulary was pruned already",
                    "prune the vocabulary once per chain",
                )
                .into());
        }
        let n = M::input_vocab(input);
        Ok(StagePlan {
            output: Shape::new(M::with_vocab_map(input, (0..n as u32).collect())),
            settings: vec![format!(
                "min-count = {}: of the {n} token rows, keep those the training split uses that often and the special tokens (counted when the stage runs); any other id reads [UNK]'s row",
                self.min_count
            )],
            memory: None,
            extra_memory: Vec::new(),
        })
    }

    /// Prune the `M` at `input` to the tokens of `corpus`; the output is `model/`.
    pub fn run<M: VocabPrunable>(
        &self,
        input: &Path,
        corpus: &Corpus,
        cx: &StageContext,
    ) -> Result<StageOutput, StageError> {
        let device = cx.device.device();
        let (model, config) = M::load(input, &device)?;
        let n = M::input_vocab(&config);
        let mut always = corpus.special.clone();
        always.push(corpus.unk);
        let keep = kept_ids(corpus.train.iter().copied(), n, self.min_count, &always);
        let map = vocab_map(n, &keep, corpus.unk);
        let unk_row = map[corpus.unk as usize];
        let (valid_tokens, valid_unk) =
            corpus
                .valid
                .iter()
                .flat_map(|ids| ids.iter())
                .fold((0usize, 0usize), |(t, u), &id| {
                    let dropped = map.get(id as usize) == Some(&unk_row) && id != corpus.unk;
                    (t + 1, u + dropped as usize)
                });
        let before = M::table_rows(&config);
        let (model, config) = model.keep_vocab(&config, &keep, map);
        let out = cx.dir.join("model");
        save_checkpoint_dir(&model, &config, cx.data, &out)?;
        let unk_share = valid_unk as f64 / valid_tokens.max(1) as f64;
        eprintln!(
            "vocab: {} of {before} rows kept; {:.2}% of validation tokens now read [UNK]",
            keep.len(),
            100.0 * unk_share
        );
        Ok(StageOutput {
            checkpoint: out,
            steps: 0,
            facts: json!({
                "rows_before": before,
                "rows_kept": keep.len(),
                "min_count": self.min_count,
                "valid_tokens_to_unk": valid_unk,
                "valid_tokens": valid_tokens,
            }),
            notes: vec![format!(
                "Vocabulary: {} of {before} token rows kept (the training split's tokens used at least {} times, and the special tokens); {valid_unk} of {valid_tokens} validation tokens ({:.2}%) now read [UNK].",
                keep.len(),
                self.min_count,
                100.0 * unk_share
            )],
            references: Vec::new(),
            logit_error_vs_input: None,
            artifacts: Vec::new(),
        })
    }
}
