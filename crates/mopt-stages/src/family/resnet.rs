//! ResNets on grey images (`mopt_models::resnet`) as a family: image data, fine-tuning,
//! distillation, channel pruning, quantization (BatchNorm folded first), export and latency
//! through the generic kinds.

use std::path::Path;

use burn::prelude::*;
use mopt_core::prune::Prunable;
use mopt_core::Quantizable;
use mopt_data::LabelMap;
use mopt_export::{ExportOptions, ModelCard};
use mopt_models::resnet::{ResNet as Model, ResNetConfig};
use mopt_recipe::{ModelSpec, Recipe, RecipeError, Scope, TokenizerSpec};
use mopt_train::trainer::save_checkpoint_dir;
use mopt_train::TrainError;

use super::{checkpoint_accuracy, export_split, ort_latency_of, Family};
use crate::data::image::ImageData;
use crate::data::{RunData, Split};
use crate::error::StageError;
use crate::kinds::distill::DistillStage;
use crate::kinds::prune::PruneStage;
use crate::kinds::quantize::QuantStage;
use crate::kinds::{kd_maps, kd_student};
use crate::record::{measure_checkpoint, EvalSettings, ModelFacts};
use crate::shape::Shape;
use crate::stage::{PlanContext, StageContext, StageOutput, StagePlan};

/// The ResNet family.
pub struct ResNet;

/// The student of a distill stage: `[stage.student] config` for classes `labels`, random
/// init.
fn student_config(stage: &DistillStage, labels: &[String]) -> Result<ResNetConfig, StageError> {
    let scope = stage.scope.nested("student");
    if stage.student.arch != "resnet" {
        return Err(TrainError::from(scope.err(
            "arch",
            format!(
                "the student is a `{}`, the teacher a ResNet",
                stage.student.arch
            ),
            "set [stage.student] arch = \"resnet\" and a ResNet shape file as `config`",
        ))
        .into());
    }
    model_config(&stage.student, &scope, labels)
}

/// The recipe's `[model]` as a ResNet shape for classes `labels`: its `config` file, random
/// init (keys that only BERT reads are refused, naming the key).
fn model_config(
    m: &ModelSpec,
    scope: &Scope,
    labels: &[String],
) -> Result<ResNetConfig, StageError> {
    let refuse = |key: &str, set: bool| -> Result<(), RecipeError> {
        if set {
            return Err(scope.err(
                key,
                "a ResNet `[model]` has no such setting",
                "remove it: a ResNet starts from random init (seeded by [run] seed); continue from a checkpoint with [teacher]",
            ));
        }
        Ok(())
    };
    refuse("weights", m.weights.is_some())?;
    refuse("dropout", m.dropout.is_some())?;
    refuse(
        "init-from-teacher-layers",
        m.init_from_teacher_layers.is_some(),
    )?;
    ResNetConfig::for_labels(&m.config, labels).map_err(|e| {
        scope
            .err(
                "config",
                e.to_string(),
                "see recipes/resnet_digits.json for the keys",
            )
            .into()
    })
}

impl Family for ResNet {
    fn arch(&self) -> &'static str {
        "resnet"
    }

    fn modality(&self) -> &'static str {
        "images"
    }

    fn input_notes(&self, _size: usize) -> String {
        "float32 images [batch, channels, side, side]; normalise grey values as the checkpoint's preprocess.json says: (pixel / pixel_max - mean) / std".into()
    }

    fn load_data(
        &self,
        recipe: &Recipe,
        labels: Option<LabelMap>,
        golden: usize,
    ) -> Result<RunData, StageError> {
        Ok(RunData::new(ImageData::load(recipe, labels, golden)?))
    }

    fn build(
        &self,
        recipe: &Recipe,
        data: &RunData,
        device: &Device,
        ckpt: &Path,
    ) -> Result<(), StageError> {
        let m = recipe
            .model
            .as_ref()
            .expect("validated: [model] or [teacher]");
        let config = model_config(m, &recipe.scope.nested("model"), &data.labels().labels)?;
        device.seed(recipe.run.seed);
        let model = Model::new(&config, device);
        save_checkpoint_dir(&model, &config, data, ckpt)?;
        Ok(())
    }

    fn measure(
        &self,
        ckpt: &Path,
        data: &RunData,
        ev: &EvalSettings,
    ) -> Result<(ModelFacts, Vec<Vec<f32>>), StageError> {
        measure_checkpoint::<Model>(ckpt, data, ev, |m| m.with_baked_weights())
    }

    fn read_shape(&self, dir: &Path) -> Result<Shape, StageError> {
        let config = ResNetConfig::from_file(&dir.join("config.json"))
            .map_err(|e| TrainError::from(mopt_core::ModelFault::from(e)))?;
        Ok(Shape::new(config))
    }

    fn model_shape(
        &self,
        model: &ModelSpec,
        _tokenizer: Option<&TokenizerSpec>,
        scope: &Scope,
        labels: &[String],
        _vocab: usize,
    ) -> Result<Shape, StageError> {
        Ok(Shape::new(model_config(model, scope, labels)?))
    }

    fn finetune(&self, input: &Path, cx: &StageContext) -> Result<StageOutput, StageError> {
        crate::kinds::finetune::run::<Model>(input, cx)
    }

    fn prune_targets(&self) -> Vec<&'static str> {
        <Model as Prunable>::group_kinds()
            .iter()
            .map(|k| k.name())
            .collect()
    }

    fn plan_prune(
        &self,
        stage: &PruneStage,
        entry: &mopt_recipe::StageEntry,
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

    fn plan_quantize(
        &self,
        stage: &QuantStage,
        entry: &mopt_recipe::StageEntry,
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

    fn plan_distill(
        &self,
        stage: &DistillStage,
        entry: &mopt_recipe::StageEntry,
        input: &Shape,
        cx: &PlanContext,
    ) -> Result<StagePlan, StageError> {
        let teacher: &ResNetConfig = input.get()?;
        let labels: Vec<String> = match &teacher.labels {
            Some(l) => l.clone(),
            None => (0..teacher.num_labels).map(|i| i.to_string()).collect(),
        };
        let student = student_config(stage, &labels)?;
        let matches = kd_maps::resolve::<Model>(stage, teacher, &student)?;
        let mut plan = kd_student::plan(stage, entry, (input, student), cx.size())?;
        if !matches.is_empty() {
            plan.settings.push(kd_maps::describe(&matches));
        }
        Ok(plan)
    }

    fn distill(
        &self,
        stage: &DistillStage,
        input: &Path,
        cx: &StageContext,
    ) -> Result<StageOutput, StageError> {
        let student = student_config(stage, &cx.data.labels().labels)?;
        let teacher = ResNetConfig::from_file(&input.join("config.json"))
            .map_err(|e| TrainError::from(mopt_core::ModelFault::from(e)))?;
        let matches = kd_maps::resolve::<Model>(stage, &teacher, &student)?;
        if matches.is_empty() {
            kd_student::run::<Model>(stage, input, cx, &student)
        } else {
            kd_student::run_maps::<Model>(stage, input, cx, &student, matches)
        }
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

    fn ort_latency(
        &self,
        ckpt: &Path,
        onnx: &Path,
        size: usize,
        warmup_runs: (usize, usize),
    ) -> Result<Option<serde_json::Value>, StageError> {
        let config = ResNetConfig::from_file(&ckpt.join("config.json"))
            .map_err(|e| TrainError::from(mopt_core::ModelFault::from(e)))?;
        ort_latency_of::<Model>(onnx, &config, size, warmup_runs)
    }
}
