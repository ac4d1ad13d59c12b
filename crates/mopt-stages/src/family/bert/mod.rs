//! BERT sequence classifiers (`mopt_models::bert`) as a family.

use std::path::Path;

use mopt_data::LabelMap;
use mopt_export::{ExportOptions, ModelCard};
use mopt_models::bert::{onnx, BertConfig, BertForSequenceClassification as Model};

use mopt_core::prune::Prunable;
use mopt_core::Quantizable;
use mopt_models::bert::setup::{build_model, model_config};
use mopt_recipe::{ModelSpec, Recipe, Scope, StageEntry, TokenizerSpec};
use mopt_train::trainer::save_checkpoint_dir;

pub mod analysis;
pub mod distill;

use super::{checkpoint_accuracy, export_split, Family};
use crate::data::text::TextData;
use crate::data::{RunData, Split};
use crate::error::StageError;
use crate::kinds::distill::DistillStage;
use crate::kinds::prune::PruneStage;
use crate::kinds::quantize::QuantStage;
use crate::kinds::vocab::{Corpus, VocabStage};
use crate::predict::TextClassifier;
use crate::record::{measure_checkpoint, EvalSettings, ModelFacts};
use crate::shape::Shape;
use crate::stage::{PlanContext, StageContext, StageOutput, StagePlan};

/// The BERT family.
pub struct Bert;

impl Family for Bert {
    fn arch(&self) -> &'static str {
        "bert"
    }

    fn modality(&self) -> &'static str {
        "text"
    }

    fn aliases(&self) -> &'static [&'static str] {
        &["bert-classifier"]
    }

    fn input_notes(&self, max_len: usize) -> String {
        onnx::input_notes(max_len)
    }

    fn load_data(
        &self,
        recipe: &Recipe,
        labels: Option<LabelMap>,
        golden: usize,
    ) -> Result<RunData, StageError> {
        Ok(RunData::new(TextData::load(recipe, labels, golden)?))
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
    ) -> Result<Option<crate::analysis::Analysis>, StageError> {
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
            self.lacks(
                "the recipe's [model]",
                "text data and a [tokenizer]",
                "reads text",
            )
        })?;
        Ok(Shape::new(model_config(
            model, tokenizer, scope, labels, vocab,
        )?))
    }

    fn finetune(&self, input: &Path, cx: &StageContext) -> Result<StageOutput, StageError> {
        crate::kinds::finetune::run::<Model>(input, cx)
    }

    fn prune_targets(&self) -> Vec<&'static str> {
        Model::group_kinds().iter().map(|k| k.name()).collect()
    }

    fn plan_prune(
        &self,
        stage: &PruneStage,
        entry: &StageEntry,
        input: &Shape,
        cx: &PlanContext,
    ) -> Result<StagePlan, StageError> {
        stage.plan::<Model>(entry, input, cx)
    }

    fn prune(
        &self,
        stage: &PruneStage,
        input: &Path,
        cx: &StageContext,
    ) -> Result<StageOutput, StageError> {
        stage.run::<Model>(input, cx)
    }

    fn quantizable(&self) -> bool {
        true
    }

    fn quant_default_exclude(&self) -> Vec<String> {
        Model::default_float_paths()
    }

    fn plan_vocab(
        &self,
        stage: &VocabStage,
        entry: &StageEntry,
        input: &Shape,
        _cx: &PlanContext,
    ) -> Result<StagePlan, StageError> {
        stage.plan::<Model>(entry, input)
    }

    fn prune_vocab(
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

    fn plan_quantize(
        &self,
        stage: &QuantStage,
        entry: &StageEntry,
        input: &Shape,
        cx: &PlanContext,
    ) -> Result<StagePlan, StageError> {
        stage.plan::<Model>(entry, input, cx)
    }

    fn quantize(
        &self,
        stage: &QuantStage,
        input: &Path,
        cx: &StageContext,
    ) -> Result<StageOutput, StageError> {
        stage.run::<Model>(input, cx)
    }

    fn classifier(
        &self,
        ckpt: &Path,
        device: &burn::prelude::Device,
    ) -> Result<Box<dyn TextClassifier>, StageError> {
        let (model, _) = <Model as mopt_core::Checkpoint>::load(ckpt, device)?;
        Ok(Box::new(burn::module::Module::valid(&model)))
    }

    fn plan_distill(
        &self,
        stage: &DistillStage,
        entry: &StageEntry,
        input: &Shape,
        cx: &PlanContext,
    ) -> Result<StagePlan, StageError> {
        distill::plan(stage, entry, input, cx)
    }

    fn distill(
        &self,
        stage: &DistillStage,
        input: &Path,
        cx: &StageContext,
    ) -> Result<StageOutput, StageError> {
        distill::run(stage, input, cx)
    }

    fn accuracy(&self, ckpt: &Path, data: &RunData, which: Split) -> Result<f64, StageError> {
        checkpoint_accuracy::<Model>(ckpt, data, which)
    }

    fn export(
        &self,
        ckpt: &Path,
        out: &Path,
        data: &RunData,
        samples: (Split, usize),
        opts: &ExportOptions,
    ) -> Result<ModelCard, StageError> {
        export_split::<Model>(ckpt, out, data, samples, opts)
    }

    fn bench_feeds(
        &self,
        ckpt: &Path,
        size: usize,
    ) -> Result<Option<serde_json::Value>, StageError> {
        let config = BertConfig::from_file(&ckpt.join("config.json"))?;
        Ok(mopt_export::bench_feeds::<Model>(&config, size))
    }
}
