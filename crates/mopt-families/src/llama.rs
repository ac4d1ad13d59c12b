//! Llama decoder language models (`mopt_models::llama`) as a family: running text in windows
//! ([`LmText`]), perplexity as the headline metric, and the generic `finetune` (next-token
//! cross-entropy), `prune` (Minitron's groups: query heads inside their KV group, KV groups,
//! FFN channels, hidden channels, layers), logits-only `distill` (KD per token over the
//! vocabulary, from the teacher's cached top-k logits with `teacher-top-k`) and `ptq` / `qat`
//! (int8 fake-quant on the seven projections of every layer, `model.layers.<i>.self_attn.q_proj`
//! … `.mlp.down_proj`; the embedding table and the head stay float) capabilities.
//! Written against the framework alone: no line of the runner or of a stage kind names it.
//!
//! `[model] config` is a GGUF file (its config and dequantized weights: the teacher) or a JSON
//! config (random init, seeded by `[run] seed`: tiny models for tests and smoke runs).

use std::path::Path;

use burn::prelude::*;
use mopt_core::{Checkpoint, Quantizable};
use mopt_data::TokenizerSpec;
use mopt_models::llama::{load_gguf, LlamaConfig, LlamaForCausalLM as Model};
use mopt_recipe::{Metric, ModelSpec, Recipe, Scope};
use mopt_train::trainer::save_checkpoint_dir;

use mopt_gguf::{Gguf, GgufTokenizer};
use mopt_models::llama::{generate_timed, load_checkpoint, GenerateConfig};
use mopt_recipe::StageEntry;
use mopt_stages::convert::CanConvert;
use mopt_stages::data::lm::LmText;
use mopt_stages::data::lm::TOKENIZER_FILE;
use mopt_stages::data::{DataSource, RunData};
use mopt_stages::family::{Capabilities, Family};
use mopt_stages::generate::{CanGenerate, GenerateSettings, Generation};
use mopt_stages::kinds::distill::{CanDistill, DistillStage};
use mopt_stages::kinds::{export, finetune, kd, kd_student, prune, quantize};
use mopt_stages::record::{measure_checkpoint, EvalSettings, ModelFacts};
use mopt_stages::shape::Shape;
use mopt_stages::stage::{PlanContext, StageContext, StageOutput, StagePlan};
use mopt_stages::StageError;

/// The Llama family.
pub struct Llama;

fn is_gguf(path: &Path) -> bool {
    path.extension().is_some_and(|x| x == "gguf")
}

/// The `[model]` table's config: from the GGUF's metadata or the JSON file. A Llama model
/// table has no keys of its own: any other key is refused, naming it.
fn config(m: &ModelSpec) -> Result<LlamaConfig, StageError> {
    m.no_family_keys(
        "llama",
        "remove it: `config` names a GGUF file (weights included) or a JSON config (random init)",
    )?;
    if is_gguf(&m.config) {
        let gguf = mopt_gguf::Gguf::open(&m.config).map_err(gguf_error)?;
        return Ok(mopt_models::llama::config_from_gguf(&gguf)?);
    }
    Ok(LlamaConfig::from_file(&m.config)?)
}

/// The shape of `config`, whose context must hold the `[tokenizer]`'s windows (`max-len`).
fn check_context(
    config: &LlamaConfig,
    m: &ModelSpec,
    tokenizer: Option<&TokenizerSpec>,
) -> Result<Shape, StageError> {
    if let Some(t) = tokenizer.filter(|t| t.max_len > config.max_position_embeddings) {
        return Err(m
            .scope
            .file()
            .err(
                "tokenizer.max-len",
                format!(
                    "{} exceeds the model's context of {} positions ({})",
                    t.max_len,
                    config.max_position_embeddings,
                    m.config.display()
                ),
                "lower [tokenizer] max-len to the model's context or less",
            )
            .into());
    }
    Ok(Shape::new(config.clone()))
}

impl Family for Llama {
    fn arch(&self) -> &'static str {
        "llama"
    }

    fn data(&self) -> &'static dyn DataSource {
        &LmText
    }

    fn metric(&self) -> Metric {
        Metric::Perplexity
    }

    fn model_shape(
        &self,
        model: &ModelSpec,
        tokenizer: Option<&TokenizerSpec>,
        _scope: &Scope,
        _labels: &[String],
        _vocab: usize,
    ) -> Result<Shape, StageError> {
        check_context(&config(model)?, model, tokenizer)
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
        let config = config(m)?;
        let model = if is_gguf(&m.config) {
            load_gguf(&m.config, device)?.1
        } else {
            device.seed(recipe.run.seed);
            Model::init(&config, device)
        };
        if config.vocab_size != data.labels().len() {
            return Err(StageError::Unsupported(format!(
                "{}: the model's vocabulary is {} tokens and the [tokenizer]'s {}: pair the model with its own tokenizer",
                m.config.display(),
                config.vocab_size,
                data.labels().len()
            )));
        }
        save_checkpoint_dir(&model, &config, data, ckpt)?;
        Ok(())
    }

    fn read_shape(&self, dir: &Path) -> Result<Shape, StageError> {
        Ok(Shape::new(LlamaConfig::from_file(
            &dir.join("config.json"),
        )?))
    }

    fn measure(
        &self,
        ckpt: &Path,
        data: &RunData,
        ev: &EvalSettings,
    ) -> Result<(ModelFacts, Vec<Vec<f32>>), StageError> {
        // A quantized model's weights fake-quantized once, not at every forward pass.
        measure_checkpoint::<Model>(ckpt, data, ev, |m| m.with_baked_weights())
    }

    /// A GGUF `config` carries the weights; a JSON one starts from random init.
    fn weights_source(&self, model: &ModelSpec) -> String {
        match is_gguf(&model.config) {
            true => "its weights, dequantized".into(),
            false => "random init".into(),
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .with(finetune::capability::<Model>())
            .with(kd::teach_capability::<Model>())
            .with(prune::capability::<Model>())
            .with(quantize::capability::<Model>())
            .with(export::capability::<Model>(|len| {
                format!(
                    "token ids of the folder's tokenizer (tokenizer.gguf), no padding (every sequence of a batch whole); the prompt (up to {len} tokens in the recipe's windows) through model.onnx, then one token at a time through decoder_with_past.onnx with the present.* outputs fed back as past_key_values.*"
                )
            }))
            .with::<dyn CanDistill>(Box::new(LlamaDistill))
            .with::<dyn CanGenerate>(Box::new(LlamaGenerate))
            .with::<dyn mopt_stages::zero_shot::CanScore>(Box::new(crate::llama_score::LlamaScore))
            .with::<dyn CanConvert>(Box::new(LlamaGguf))
    }
}

/// Llama checkpoints out to llama.cpp: a GGUF file ([`mopt_models::llama::write_gguf`]) with
/// the folder's tokenizer; per-layer widths of a pruned model kept.
struct LlamaGguf;

impl CanConvert for LlamaGguf {
    fn formats(&self) -> Vec<(&'static str, &'static str)> {
        vec![
            ("gguf", "a GGUF file, weights in F32"),
            ("gguf-f16", "a GGUF file, weights in F16"),
            (
                "gguf-q8_0",
                "a GGUF file, weights in Q8_0 (rows of a multiple of 32)",
            ),
        ]
    }

    /// `model.gguf`, `model-f16.gguf`, `model-q8_0.gguf`.
    fn file_name(&self, format: &str) -> String {
        match format.strip_prefix("gguf-") {
            Some(t) => format!("model-{t}.gguf"),
            None => format!("model.{format}"),
        }
    }

    fn convert(&self, checkpoint: &Path, format: &str, out: &Path) -> Result<String, StageError> {
        use mopt_gguf::GgmlType;
        let dtype = match format {
            "gguf" => GgmlType::F32,
            "gguf-f16" => GgmlType::F16,
            "gguf-q8_0" => GgmlType::Q8_0,
            _ => return Err(mopt_stages::convert::unknown_format(format, "llama", self)),
        };
        let (model, config) = load_checkpoint(checkpoint, &Device::flex())?;
        let tokenizer = checkpoint.join(TOKENIZER_FILE);
        let gguf = Gguf::open(&tokenizer).map_err(gguf_error)?;
        mopt_models::llama::write_gguf(&model, &config, gguf.metadata(), out, dtype)?;
        Ok(format!("{} ({format})", out.display()))
    }
}

/// Generation from a checkpoint folder (its `tokenizer.gguf`) or a GGUF file, on the CPU, the
/// tokenizer's end-of-text token ending it early.
struct LlamaGenerate;

/// A GGUF file's error (its message names the file and the field).
pub(crate) fn gguf_error(e: mopt_gguf::GgufError) -> StageError {
    StageError::Unsupported(e.to_string())
}

/// The model at `source` (a checkpoint folder, with its `tokenizer.gguf`, or a GGUF file), its
/// config and its tokenizer, on `device`.
pub(crate) fn load_source(
    source: &Path,
    device: &Device,
) -> Result<(Model, LlamaConfig, GgufTokenizer), StageError> {
    let (model, config, tokenizer) = if source.is_dir() {
        let (m, c) = load_checkpoint(source, device)?;
        (m, c, source.join(TOKENIZER_FILE))
    } else {
        let (c, m) = load_gguf(source, device)?;
        (m, c, source.to_path_buf())
    };
    let gguf = Gguf::open(&tokenizer).map_err(gguf_error)?;
    let tok = GgufTokenizer::from_gguf(&gguf).map_err(gguf_error)?;
    Ok((model, config, tok))
}

impl CanGenerate for LlamaGenerate {
    fn generate(
        &self,
        source: &Path,
        prompt: &str,
        s: &GenerateSettings,
    ) -> Result<Generation, StageError> {
        let (model, _, tok) = load_source(source, &Device::flex())?;
        let prompt_tokens = tok.encode(prompt).map_err(gguf_error)?;
        if prompt_tokens.is_empty() {
            return Err(StageError::Unsupported(
                "the prompt is empty: give --prompt some text".into(),
            ));
        }
        let config = match s.temperature > 0.0 {
            true => GenerateConfig::sampled(s.max_new_tokens, s.temperature, s.top_k, s.seed),
            false => GenerateConfig::greedy(s.max_new_tokens),
        };
        let config = config.with_stop_tokens(tok.eos_id());
        // A quantized model decodes in integers (int8 weights, a byte a weight read).
        let (model, integer_layers) = model.with_integer_kernels();
        let g = generate_timed(&model, &prompt_tokens, &config);
        let text = tok.decode(&g.tokens).map_err(gguf_error)?;
        Ok(Generation {
            prompt_tokens,
            tokens: g.tokens,
            text,
            prompt_secs: g.prompt_secs,
            decode_secs: g.decode_secs,
            integer_layers,
        })
    }
}

/// Logit distillation into a fresh `[stage.student]` Llama (a JSON config, random init) on the
/// teacher's next-token distributions, every token of every window a row, beside its
/// hard-token twin with `baseline = true`. A student that starts from the teacher's weights
/// is a pruned teacher: `kind = "prune"` with `distill = true`.
struct LlamaDistill;

impl LlamaDistill {
    fn student(stage: &DistillStage, teacher: &LlamaConfig) -> Result<LlamaConfig, StageError> {
        if !stage.spec.matches.is_empty() {
            let fix = "remove the [[stage.match]] tables (a Llama distils on logits only); to start from the teacher's weights, prune it (kind = \"prune\", distill = true)";
            let what = "a Llama exposes no taps to match";
            return Err(stage.scope.err("match", what, fix).into());
        }
        let scope = stage.scope.nested("student");
        let why = match &stage.student.arch {
            Some(a) if a != "llama" => Some(("arch", format!("the student is a `{a}`, the teacher a Llama"))),
            _ if is_gguf(&stage.student.config) => Some(("config", "a student starts from random init: its config is a JSON Llama config, not a GGUF file".into())),
            _ => None,
        };
        if let Some((key, what)) = why {
            let fix = "a JSON Llama config of the student's shape as `config`; to start from the teacher's weights, prune it (kind = \"prune\", distill = true)";
            return Err(scope.err(key, what, fix).into());
        }
        let student = config(&stage.student)?;
        if student.vocab_size != teacher.vocab_size {
            let what = format!(
                "the student's vocabulary is {} tokens, the teacher's {}",
                student.vocab_size, teacher.vocab_size
            );
            return Err(scope
                .err("config", what, "give the student the teacher's vocab_size")
                .into());
        }
        Ok(student)
    }
}

impl CanDistill for LlamaDistill {
    fn plan(
        &self,
        stage: &DistillStage,
        entry: &StageEntry,
        input: &Shape,
        cx: &PlanContext,
    ) -> Result<StagePlan, StageError> {
        let student = Self::student(stage, input.get()?)?;
        kd_student::plan(stage, entry, (input, student), cx)
    }

    fn run(
        &self,
        stage: &DistillStage,
        input: &Path,
        cx: &StageContext,
    ) -> Result<StageOutput, StageError> {
        let teacher = LlamaConfig::from_file(&input.join("config.json"))?;
        let student = Self::student(stage, &teacher)?;
        kd_student::run::<Model>(stage, input, cx, &student)
    }
}
