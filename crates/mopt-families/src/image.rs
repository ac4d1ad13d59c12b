//! Image classifiers as families, once for every model type: image data, fine-tuning,
//! distillation (logits, or feature maps with the teacher live), channel pruning, export and
//! ONNX Runtime latency through the generic kinds; more (quantization) where the model type
//! adds it. A model type joins by implementing [`ImageModel`] (its arch name; its config a
//! [`ShapeFile`]) in one file and registering `ImageFamily::<M>::new()` ([`mopt_stages::Registry`]).

use std::marker::PhantomData;
use std::path::Path;

use burn::prelude::*;
use mopt_core::prune::Prunable;
use mopt_core::FeatureMaps;
use mopt_data::ImageBatch;
use mopt_data::TokenizerSpec;
use mopt_export::Exportable;
use mopt_models::shape_file::ShapeFile;
use mopt_models::ModelError;
use mopt_recipe::{ModelSpec, Recipe, Scope, StageEntry};
use mopt_train::trainer::save_checkpoint_dir;
use mopt_train::TrainError;

use mopt_stages::data::image::Images;
use mopt_stages::data::{DataSource, RunData};
use mopt_stages::family::{Capabilities, Family};
use mopt_stages::kinds::distill::{CanDistill, DistillStage};
use mopt_stages::kinds::{export, finetune, kd, kd_maps, kd_student, prune};
use mopt_stages::record::{measure_checkpoint, EvalSettings, ModelFacts};
use mopt_stages::shape::Shape;
use mopt_stages::stage::{PlanContext, StageContext, StageOutput, StagePlan};
use mopt_stages::StageError;

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

    /// Capabilities beyond those every image model has (`finetune`, `distill`, `prune`,
    /// `export`): a quantizable type adds `kinds::quantize::capability::<Self>()`.
    fn more_capabilities(capabilities: Capabilities) -> Capabilities {
        capabilities
    }
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
/// `config` file, random init. An image model table has no keys of its own: any other key is
/// refused, naming it.
fn model_config<M: ImageModel>(
    m: &ModelSpec,
    scope: &Scope,
    labels: &[String],
) -> Result<M::Config, StageError> {
    m.no_family_keys(M::ARCH, "remove it: image models start from random init (seeded by [run] seed); continue from a checkpoint with [teacher]")?;
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
    if let Some(arch) = stage.student.arch.as_deref().filter(|a| *a != M::ARCH) {
        return Err(TrainError::from(scope.err(
            "arch",
            format!("the student is a `{arch}`, the teacher {}", M::NAME),
            format!(
                "set [stage.student] arch = \"{}\" and a shape file of it as `config`",
                M::ARCH
            ),
        ))
        .into());
    }
    model_config::<M>(&stage.student, &scope, labels)
}

impl<M: ImageModel + 'static> Family for ImageFamily<M> {
    fn arch(&self) -> &'static str {
        M::ARCH
    }

    fn data(&self) -> &'static dyn DataSource {
        &Images
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

    fn read_shape(&self, dir: &Path) -> Result<Shape, StageError> {
        Ok(Shape::new(
            M::Shape::from_file(&dir.join("config.json")).map_err(fault)?,
        ))
    }

    fn measure(
        &self,
        ckpt: &Path,
        data: &RunData,
        ev: &EvalSettings,
    ) -> Result<(ModelFacts, Vec<Vec<f32>>), StageError> {
        measure_checkpoint::<M>(ckpt, data, ev, M::for_measurement)
    }

    fn capabilities(&self) -> Capabilities {
        M::more_capabilities(
            Capabilities::default()
                .with(finetune::capability::<M>())
                .with(kd::teach_capability::<M>())
                .with(prune::capability::<M>())
                .with::<dyn CanDistill>(Box::new(ImageDistill::<M>(PhantomData)))
                .with(export::capability::<M>(|_| {
                    "float32 images [batch, channels, side, side]; normalise grey values as the checkpoint's preprocess.json says: (pixel / pixel_max - mean) / std".into()
                })),
        )
    }
}

/// The `distill` capability of an image model type: logit KD from the cache, or feature maps
/// (and augmented batches) with the teacher live.
struct ImageDistill<M>(PhantomData<fn() -> M>);

impl<M: ImageModel + 'static> CanDistill for ImageDistill<M> {
    fn plan(
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
        let mut plan = kd_student::plan(stage, entry, (input, student), cx)?;
        if !matches.is_empty() {
            stage.refuse_cache_keys("feature-map matches run the teacher live")?;
            plan.settings.push(kd_maps::describe(&matches));
        } else if stage.spec.enabled && mopt_stages::data::image::augment(cx.data)?.is_on() {
            stage.refuse_cache_keys("on augmented batches the teacher runs live")?;
            plan.settings
                .push("the teacher runs live on the augmented batches (no logit cache)".into());
        }
        Ok(plan)
    }

    fn run(
        &self,
        stage: &DistillStage,
        input: &Path,
        cx: &StageContext,
    ) -> Result<StageOutput, StageError> {
        let student = student_config::<M>(stage, &cx.data.labels().labels)?;
        let teacher = M::Shape::from_file(&input.join("config.json")).map_err(fault)?;
        let matches = kd_maps::resolve::<M>(stage, &teacher, &student)?;
        // Cached logits are of the unaugmented images: augmented batches need the teacher live
        // (the hard-label twin, `enabled = false`, needs no teacher).
        let live = stage.spec.enabled && mopt_stages::data::image::augment(cx.data_spec)?.is_on();
        if matches.is_empty() && !live {
            kd_student::run::<M>(stage, input, cx, &student)
        } else {
            kd_student::run_maps::<M>(stage, input, cx, &student, matches)
        }
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
