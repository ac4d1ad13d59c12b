//! Image classifiers as families, once for every model type: image data, fine-tuning,
//! distillation (logits, or feature maps with the teacher live), channel pruning, export and
//! ONNX Runtime latency through the generic kinds; quantization where the model type says it
//! quantizes. A model type joins by implementing [`ImageModel`] (its arch name; its config a
//! [`ShapeFile`]) in one file and registering `ImageFamily::<M>::new()` ([`crate::Registry`]).

use std::marker::PhantomData;
use std::path::Path;

use burn::prelude::*;
use mopt_core::prune::Prunable;
use mopt_core::FeatureMaps;
use mopt_data::{ImageBatch, LabelMap};
use mopt_export::{ExportOptions, Exportable, ModelCard};
use mopt_models::shape_file::ShapeFile;
use mopt_models::ModelError;
use mopt_recipe::{ModelSpec, Recipe, RecipeError, Scope, StageEntry, TokenizerSpec};
use mopt_train::trainer::save_checkpoint_dir;
use mopt_train::TrainError;

use super::{checkpoint_accuracy, export_split, Family};
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

/// An image classifier type that runs as a family: the contracts it implements (its config a
/// [`ShapeFile`]) and its arch name; quantization is optional.
pub trait ImageModel:
    FeatureMaps<Batch = ImageBatch, Config = Self::Shape> + Prunable + Exportable
{
    /// The model's config, read from shape files.
    type Shape: ShapeFile + mopt_core::ModelConfig;
    /// `[model] arch`.
    const ARCH: &'static str;
    /// The arch in messages (`a ResNet`).
    const NAME: &'static str;

    /// The loaded model as measured (quantized weights baked once); unchanged by default.
    fn for_measurement(self) -> Self {
        self
    }

    /// How the type quantizes (`ptq` / `qat` stages); `None` (the default): it does not.
    fn quant_hooks() -> Option<QuantHooks> {
        None
    }
}

/// A quantizable image model's part in `ptq` / `qat` stages: the generic stage code
/// instantiated for it, and the layers it keeps float by default.
pub struct QuantHooks {
    /// The layers kept float unless a recipe says otherwise.
    pub default_float: Vec<String>,
    /// [`QuantStage::plan`] for the model type.
    pub plan: fn(&QuantStage, &StageEntry, &Shape, &PlanContext) -> Result<StagePlan, StageError>,
    /// [`QuantStage::run`] for the model type.
    pub run: fn(&QuantStage, &Path, &StageContext) -> Result<StageOutput, StageError>,
}

/// The family of the image model type `M`.
pub struct ImageFamily<M>(PhantomData<fn() -> M>);

impl<M> ImageFamily<M> {
    /// The family (a `const`, for the registry).
    pub const fn new() -> Self {
        Self(PhantomData)
    }
}

impl<M> Default for ImageFamily<M> {
    fn default() -> Self {
        Self::new()
    }
}

fn fault(e: ModelError) -> StageError {
    TrainError::from(mopt_core::ModelFault::from(e)).into()
}

/// The recipe's `[model]` (or a student's table) as an `M` shape for classes `labels`: its
/// `config` file, random init (keys that only BERT reads are refused, naming the key).
fn model_config<M: ImageModel>(
    m: &ModelSpec,
    scope: &Scope,
    labels: &[String],
) -> Result<M::Config, StageError> {
    let refuse = |key: &str, set: bool| -> Result<(), RecipeError> {
        if set {
            return Err(scope.err(
                key,
                format!("{} `[model]` has no such setting", M::NAME),
                "remove it: image models start from random init (seeded by [run] seed); continue from a checkpoint with [teacher]",
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
    M::Shape::for_labels(&m.config, labels).map_err(|e| {
        scope
            .err(
                "config",
                e.to_string(),
                "see recipes/models/ for shape files",
            )
            .into()
    })
}

/// The student of a distill stage: `[stage.student]`, of the teacher's arch.
fn student_config<M: ImageModel>(
    stage: &DistillStage,
    labels: &[String],
) -> Result<M::Config, StageError> {
    let scope = stage.scope.nested("student");
    if stage.student.arch != M::ARCH {
        return Err(TrainError::from(scope.err(
            "arch",
            format!(
                "the student is a `{}`, the teacher {}",
                stage.student.arch,
                M::NAME
            ),
            format!(
                "set [stage.student] arch = \"{}\" and a shape file of it as `config`",
                M::ARCH
            ),
        ))
        .into());
    }
    model_config::<M>(&stage.student, &scope, labels)
}

impl<M: ImageModel> Family for ImageFamily<M> {
    fn arch(&self) -> &'static str {
        M::ARCH
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
        let scope = recipe.scope.nested("model");
        let config = model_config::<M>(m, &scope, &data.labels().labels)?;
        device.seed(recipe.run.seed);
        let model = M::init(&config, device);
        save_checkpoint_dir(&model, &config, data, ckpt)?;
        Ok(())
    }

    fn measure(
        &self,
        ckpt: &Path,
        data: &RunData,
        ev: &EvalSettings,
    ) -> Result<(ModelFacts, Vec<Vec<f32>>), StageError> {
        measure_checkpoint::<M>(ckpt, data, ev, M::for_measurement)
    }

    fn read_shape(&self, dir: &Path) -> Result<Shape, StageError> {
        Ok(Shape::new(
            M::Shape::from_file(&dir.join("config.json")).map_err(fault)?,
        ))
    }

    fn model_shape(
        &self,
        model: &ModelSpec,
        _tokenizer: Option<&TokenizerSpec>,
        scope: &Scope,
        labels: &[String],
        _vocab: usize,
    ) -> Result<Shape, StageError> {
        Ok(Shape::new(model_config::<M>(model, scope, labels)?))
    }

    fn finetune(&self, input: &Path, cx: &StageContext) -> Result<StageOutput, StageError> {
        crate::kinds::finetune::run::<M>(input, cx)
    }

    fn prune_targets(&self) -> Vec<&'static str> {
        M::group_kinds().iter().map(|k| k.name()).collect()
    }

    fn plan_prune(
        &self,
        stage: &PruneStage,
        entry: &StageEntry,
        input: &Shape,
        cx: &PlanContext,
    ) -> Result<StagePlan, StageError> {
        stage.plan::<M>(entry, input, cx)
    }

    fn prune(
        &self,
        stage: &PruneStage,
        input: &Path,
        cx: &StageContext,
    ) -> Result<StageOutput, StageError> {
        stage.run::<M>(input, cx)
    }

    fn quantizable(&self) -> bool {
        M::quant_hooks().is_some()
    }

    fn quant_default_exclude(&self) -> Vec<String> {
        M::quant_hooks().map_or_else(Vec::new, |q| q.default_float)
    }

    fn plan_quantize(
        &self,
        stage: &QuantStage,
        entry: &StageEntry,
        input: &Shape,
        cx: &PlanContext,
    ) -> Result<StagePlan, StageError> {
        match M::quant_hooks() {
            Some(q) => (q.plan)(stage, entry, input, cx),
            None => Err(self.lacks(
                "ptq/qat",
                "a quantizable model",
                "declares no quantizable layers",
            )),
        }
    }

    fn quantize(
        &self,
        stage: &QuantStage,
        input: &Path,
        cx: &StageContext,
    ) -> Result<StageOutput, StageError> {
        match M::quant_hooks() {
            Some(q) => (q.run)(stage, input, cx),
            None => Err(self.lacks(
                "ptq/qat",
                "a quantizable model",
                "declares no quantizable layers",
            )),
        }
    }

    fn plan_distill(
        &self,
        stage: &DistillStage,
        entry: &StageEntry,
        input: &Shape,
        cx: &PlanContext,
    ) -> Result<StagePlan, StageError> {
        let teacher: &M::Config = input.get()?;
        let labels = teacher_labels::<M>(teacher);
        let student = student_config::<M>(stage, &labels)?;
        let matches = kd_maps::resolve::<M>(stage, teacher, &student)?;
        let mut plan = kd_student::plan(stage, entry, (input, student), cx.size())?;
        if !matches.is_empty() {
            plan.settings.push(kd_maps::describe(&matches));
        } else if cx.data.augment.is_on() {
            plan.settings
                .push("the teacher runs live on the augmented batches (no logit cache)".into());
        }
        Ok(plan)
    }

    fn distill(
        &self,
        stage: &DistillStage,
        input: &Path,
        cx: &StageContext,
    ) -> Result<StageOutput, StageError> {
        let student = student_config::<M>(stage, &cx.data.labels().labels)?;
        let teacher = M::Shape::from_file(&input.join("config.json")).map_err(fault)?;
        let matches = kd_maps::resolve::<M>(stage, &teacher, &student)?;
        // Cached logits are of the unaugmented images: augmented batches need the teacher live.
        if matches.is_empty() && !cx.data_spec.augment.is_on() {
            kd_student::run::<M>(stage, input, cx, &student)
        } else {
            kd_student::run_maps::<M>(stage, input, cx, &student, matches)
        }
    }

    fn accuracy(&self, ckpt: &Path, data: &RunData, which: Split) -> Result<f64, StageError> {
        checkpoint_accuracy::<M>(ckpt, data, which)
    }

    fn export(
        &self,
        ckpt: &Path,
        out: &Path,
        data: &RunData,
        samples: (Split, usize),
        opts: &ExportOptions,
    ) -> Result<ModelCard, StageError> {
        export_split::<M>(ckpt, out, data, samples, opts)
    }

    fn bench_feeds(
        &self,
        ckpt: &Path,
        size: usize,
    ) -> Result<Option<serde_json::Value>, StageError> {
        let config = M::Shape::from_file(&ckpt.join("config.json")).map_err(fault)?;
        Ok(mopt_export::bench_feeds::<M>(&config, size))
    }
}

/// The classes a teacher of `config` was trained on (its saved names, or their indices).
fn teacher_labels<M: ImageModel>(config: &M::Config) -> Vec<String> {
    let n = mopt_core::ModelConfig::num_labels(config);
    config.class_names().map_or_else(
        || (0..n).map(|i| i.to_string()).collect(),
        <[String]>::to_vec,
    )
}
