//! BERT sequence classifiers (`mopt_models::bert`) as a family.

use std::path::Path;

use mopt_models::bert::{onnx, BertConfig, BertForSequenceClassification as Model, BertModel};

use mopt_core::Quantizable;
use mopt_data::TokenizerSpec;
use mopt_models::bert::setup::{build_model, model_config};
use mopt_recipe::{ModelSpec, Recipe, Scope, StageEntry};
use mopt_train::trainer::save_checkpoint_dir;

pub mod analysis;
pub mod augment;
pub mod distill;

use burn::prelude::Device;
use mopt_stages::convert::{unknown_format, CanConvert};
use mopt_stages::data::text::{Text, TextData};
use mopt_stages::data::{DataSource, RunData};
use mopt_stages::family::{Capabilities, Family};
use mopt_stages::kinds::distill::{CanDistill, DistillStage};
use mopt_stages::kinds::vocab::{CanPruneVocab, Corpus, VocabStage};
use mopt_stages::kinds::{export, finetune, kd, prune, quantize};
use mopt_stages::record::{measure_checkpoint, EvalSettings, ModelFacts};
use mopt_stages::shape::Shape;
use mopt_stages::stage::{PlanContext, StageContext, StageOutput, StagePlan};
use mopt_stages::StageError;

/// The BERT family.
pub struct Bert;

impl Family for Bert {
    fn arch(&self) -> &'static str {
        "bert"
    }

    fn aliases(&self) -> &'static [&'static str] {
        &["bert-classifier"]
    }

    /// Its `weights` file, or random init (a table whose keys are wrong fails in `model_shape`).
    fn weights_source(&self, model: &ModelSpec) -> String {
        match BertModel::from_spec(model).ok().and_then(|k| k.weights) {
            Some(w) => mopt_stages::record::shown(&w),
            None => "random init".into(),
        }
    }

    fn build(
        &self,
        recipe: &Recipe,
        data: &RunData,
        device: &burn::prelude::Device,
        ckpt: &Path,
    ) -> Result<(), StageError> {
        let m = recipe
            .model
            .as_ref()
            .expect("validated: [model] or [teacher]");
        let text = data.get::<TextData>()?;
        let config = model_config(
            m,
            &text.spec,
            &recipe.scope.nested("model"),
            &text.labels.labels,
            text.vocab(),
        )?;
        let (model, load) = build_model(m, recipe.run.seed, &config, device)?;
        if let Some(l) = &load {
            eprintln!(
                "weights: {} tensors loaded, {} fresh ({}), {} skipped",
                l.applied,
                l.fresh.len(),
                l.fresh.join(", "),
                l.skipped.len()
            );
        }
        save_checkpoint_dir(&model, &config, data, ckpt)?;
        Ok(())
    }

    /// Quantized checkpoints are measured with their weights fake-quantized once.
    fn measure(
        &self,
        ckpt: &Path,
        data: &RunData,
        ev: &EvalSettings,
    ) -> Result<(ModelFacts, Vec<Vec<f32>>), StageError> {
        measure_checkpoint::<Model>(ckpt, data, ev, |m| m.with_baked_weights())
    }

    fn analyse(
        &self,
        ckpt: &Path,
        size: usize,
        runs: usize,
        device: &burn::prelude::Device,
    ) -> Result<Option<mopt_stages::analysis::Analysis>, StageError> {
        Ok(Some(analysis::analyse(ckpt, size, runs, device)?))
    }

    fn read_shape(&self, dir: &Path) -> Result<Shape, StageError> {
        Ok(Shape::new(BertConfig::from_file(&dir.join("config.json"))?))
    }

    fn model_shape(
        &self,
        model: &ModelSpec,
        tokenizer: Option<&TokenizerSpec>,
        scope: &Scope,
        labels: &[String],
        vocab: usize,
    ) -> Result<Shape, StageError> {
        let tokenizer = tokenizer.ok_or_else(|| {
            StageError::Unsupported(
                "the recipe's [model] needs text data and a [tokenizer]: `bert` reads text".into(),
            )
        })?;
        if BertModel::from_spec(model)?
            .init_from_teacher_layers
            .is_some()
        {
            return Err(model
                .err(
                    "init-from-teacher-layers",
                    "the baseline [model] has no teacher to copy layers from",
                    "use it in a distill stage's [stage.student]; a baseline starts from `weights` (with `weights-layers` to pick layers of a deeper file)",
                )
                .into());
        }
        Ok(Shape::new(model_config(
            model, tokenizer, scope, labels, vocab,
        )?))
    }

    fn data(&self) -> &'static dyn DataSource {
        &Text
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .with(finetune::capability::<Model>())
            .with(kd::teach_capability::<Model>())
            .with(prune::capability::<Model>())
            .with(quantize::capability::<Model>())
            .with::<dyn CanPruneVocab>(Box::new(BertVocab))
            .with::<dyn CanDistill>(Box::new(BertDistill))
            .with(export::capability::<Model>(onnx::input_notes))
            .with(mopt_stages::predict::capability::<Model>())
            .with::<dyn CanConvert>(Box::new(BertHf))
    }
}

/// BERT checkpoints as transformers reads them: `model.safetensors` (BertForSequenceClassification
/// keys) and `config.json`; per-layer shapes, a pruned vocabulary and quantization are refused.
struct BertHf;

impl CanConvert for BertHf {
    fn formats(&self) -> Vec<(&'static str, &'static str)> {
        vec![(
            "hf",
            "a transformers folder: model.safetensors and config.json",
        )]
    }

    fn convert(&self, checkpoint: &Path, format: &str, out: &Path) -> Result<String, StageError> {
        if format != "hf" {
            return Err(unknown_format(format, "bert", self));
        }
        let device = Device::flex();
        let (model, config) = mopt_models::bert::weights::load_checkpoint(checkpoint, &device)?;
        mopt_models::bert::weights::save_hf(&model, &config, out)?;
        Ok(format!(
            "{}/model.safetensors and config.json",
            out.display()
        ))
    }
}

/// BERT's `vocab` capability: the run's token ids, `[UNK]` for dropped tokens.
struct BertVocab;

impl CanPruneVocab for BertVocab {
    fn plan(
        &self,
        stage: &VocabStage,
        entry: &StageEntry,
        input: &Shape,
        _cx: &PlanContext,
    ) -> Result<StagePlan, StageError> {
        stage.plan::<Model>(entry, input)
    }

    fn run(
        &self,
        stage: &VocabStage,
        input: &Path,
        cx: &StageContext,
    ) -> Result<StageOutput, StageError> {
        let text: &TextData = cx.data.get()?;
        fn ids(s: &mopt_data::TextSplit) -> Vec<&[u32]> {
            s.examples.iter().map(|e| e.ids.as_slice()).collect()
        }
        let unk = text.tokenizer.token_id("[UNK]").ok_or_else(|| {
            StageError::Unsupported(format!(
                "kind `vocab`: the tokenizer {} has no [UNK] token for dropped tokens to read",
                text.tokenizer.path.display()
            ))
        })?;
        let corpus = Corpus {
            train: ids(&text.train),
            valid: ids(&text.valid),
            special: text.tokenizer.special_ids(),
            unk,
        };
        stage.run::<Model>(input, &corpus, cx)
    }
}

/// BERT's `distill` capability: matches of hidden states, attention and embeddings, student
/// initialisation from teacher layers ([`distill`]).
struct BertDistill;

impl CanDistill for BertDistill {
    fn plan(
        &self,
        stage: &DistillStage,
        entry: &StageEntry,
        input: &Shape,
        cx: &PlanContext,
    ) -> Result<StagePlan, StageError> {
        distill::plan(stage, entry, input, cx)
    }

    fn run(
        &self,
        stage: &DistillStage,
        input: &Path,
        cx: &StageContext,
    ) -> Result<StageOutput, StageError> {
        distill::run(stage, input, cx)
    }
}
