//! `--check`: the stage plan (each stage's input and output shapes, parameters, settings as a
//! recipe writes them, its gate) and a memory estimate that counts the teacher and its cache.
//! A dry run: reads the recipe's inputs, writes nothing, ignores an existing run folder.

use std::fmt::Write;

use mopt_data::LabelMap;
use mopt_recipe::TrainSpec;
use mopt_train::memory::human_bytes;
use mopt_train::DeviceSpec;

use crate::error::StageError;
use crate::record::shown;
use crate::shape::Shape;
use crate::stage::{PlanContext, StagePlan};
use crate::Pipeline;

/// The `[train]` settings of a stage as a recipe writes them.
pub fn train_settings(t: &TrainSpec, overridden: bool) -> Vec<String> {
    vec![format!(
        "train{}: epochs = {}, batch-size = {}, grad-accum-steps = {}, lr = {:e}, weight-decay = {}, warmup-fraction = {}, final-lr-ratio = {}, grad-clip-norm = {}, best-metric = \"{}\"{}{}",
        if overridden { " ([stage.train] over [train])" } else { "" },
        t.epochs,
        t.batch_size,
        t.grad_accum_steps,
        t.lr,
        t.weight_decay,
        t.warmup_fraction,
        t.final_lr_ratio,
        t.grad_clip_norm.unwrap_or(0.0),
        t.best_metric.name(),
        if t.gradient_checkpointing { ", gradient-checkpointing = true" } else { "" },
        precision_note(t)
    )]
}

/// `, precision = ..` (with the loss-scale settings for fp16); empty for fp32.
fn precision_note(t: &TrainSpec) -> String {
    match (&t.precision, &t.loss_scale) {
        (mopt_recipe::Precision::Fp32, _) => String::new(),
        (p, None) => format!(", precision = \"{}\" (f32 master weights)", p.name()),
        (p, Some(s)) => format!(
            ", precision = \"{}\" (f32 master weights; dynamic loss scale from {} x{} every {} clean steps, x{} on overflow)",
            p.name(),
            s.init,
            s.growth_factor,
            s.growth_interval,
            s.backoff
        ),
    }
}

/// The resolved chain: the baseline's shape and each stage's plan.
pub struct ChainPlan {
    /// The baseline's shape.
    pub baseline: Shape,
    /// Where the baseline comes from.
    pub baseline_source: String,
    /// Each stage's plan.
    pub stages: Vec<StagePlan>,
    /// The plan's line on the model inputs (the tokenizer; the images' shape).
    pub inputs: String,
    /// Training examples.
    pub train_examples: usize,
    /// The size of one example estimates assume (a tokenizer's `max-len`; 0 for images).
    pub example_size: usize,
}

impl Pipeline {
    /// The baseline's shape: the teacher checkpoint's config, the config its recipe will train,
    /// or the recipe's `[model]`.
    fn baseline_config(
        &self,
        labels: &LabelMap,
        vocab: usize,
    ) -> Result<(Shape, String), StageError> {
        let r = &self.recipe;
        if let Some(t) = &r.teacher {
            let cfg = t.checkpoint.join("config.json");
            if cfg.is_file() {
                return Ok((
                    self.registry.recipe_family(r)?.read_shape(&t.checkpoint)?,
                    format!("teacher {} (exists)", shown(&t.checkpoint)),
                ));
            }
            let path = t.recipe.as_ref().expect("validated");
            let teacher = Pipeline::load(path, &self.registry)?;
            let chain = teacher.plan_chain()?;
            let out = chain
                .stages
                .last()
                .map_or(chain.baseline.clone(), |s| s.output.clone());
            return Ok((
                out,
                format!(
                    "teacher {} (missing: trained first by {})",
                    shown(&t.checkpoint),
                    shown(path)
                ),
            ));
        }
        let m = r.model.as_ref().expect("validated");
        let family = self.registry.recipe_family(r)?;
        let tokenizer = crate::data::tokenizer(self.registry.data_format(r)?, r)?;
        let c = family.model_shape(
            m,
            tokenizer.as_ref(),
            &r.scope.nested("model"),
            &labels.labels,
            vocab,
        )?;
        let init = family.weights_source(m);
        Ok((c, format!("[model] {} ({init})", shown(&m.config))))
    }

    /// Validate every stage against its input's shape, without running anything.
    pub fn plan_chain(&self) -> Result<ChainPlan, StageError> {
        let r = &self.recipe;
        let format = self.registry.data_format(r)?;
        let d = self.registry.recipe_family(r)?.data().plan(r, format)?;
        let tokenizer = crate::data::tokenizer(format, r)?;
        let (train_examples, mean_tokens, mean_tokens_sq) =
            (d.train_examples, d.mean_tokens, d.mean_tokens_sq);
        let (labels, vocab) = (&d.labels, d.vocab);
        let (baseline, baseline_source) = self.baseline_config(labels, vocab)?;
        let mut input = baseline.clone();
        let mut stages = Vec::new();
        let mut earlier = vec!["baseline".to_string()];
        let run_family = self.registry.recipe_family(r)?;
        for (entry, stage) in &self.stages {
            let cx = PlanContext {
                // The input's family: a cross-family distill stage hands on the student's.
                family: self.registry.shape_family(&input, run_family),
                registry: &self.registry,
                tokenizer: tokenizer.clone(),
                data: &r.data,
                vocab,
                train_examples,
                mean_tokens,
                mean_tokens_sq,
                earlier: earlier.clone(),
            };
            let p = stage.plan(entry, &input, &cx)?;
            earlier.push(entry.name.clone());
            input = p.output.clone();
            stages.push(p);
        }
        Ok(ChainPlan {
            baseline,
            baseline_source,
            stages,
            inputs: d.inputs,
            train_examples,
            example_size: crate::data::example_size(format, r)?,
        })
    }

    /// The plan as `--check` prints it.
    pub fn check(&self, device: &DeviceSpec) -> Result<String, StageError> {
        let r = &self.recipe;
        let chain = self.plan_chain()?;
        let mut s = String::new();
        let run_dir = r.run.run_dir();
        let _ = writeln!(s, "recipe     {}", shown(&r.path));
        let _ = writeln!(
            s,
            "run        {} -> {}{}",
            r.run.name,
            shown(&run_dir),
            if run_dir.exists() {
                " (exists: a run needs --resume or --force)"
            } else {
                ""
            }
        );
        let _ = writeln!(
            s,
            "device     {} (CPU GEMM path {}, bf16 products {}), seed {}",
            device.name(),
            mopt_kernels::gemm::path(),
            mopt_kernels::bf16::path(),
            r.run.seed
        );
        if !r.run.devices.is_empty() {
            let n = r.run.devices.len();
            let t = &r.train;
            let _ = writeln!(
                s,
                "           data-parallel on devices {}: batch-size {} per device, effective batch {} x {} x grad-accum {} = {} examples per optimizer step; the LR schedule counts those steps{}",
                mopt_recipe::device::list(&r.run.devices),
                t.batch_size,
                t.batch_size,
                n,
                t.grad_accum_steps,
                t.batch_size * n * t.grad_accum_steps,
                if device.feature().is_none() && !r.run.devices.iter().any(|d| d.is_remote()) {
                    " (on the CPU the replicas share the cores: the code path, not a speed-up)"
                } else {
                    ""
                }
            );
            let all_cuda =
                device.feature() == Some("cuda") && !r.run.devices.iter().any(|d| d.is_remote());
            let _ = writeln!(
                s,
                "           {}, one optimizer step on the main device ({})",
                mopt_train::parallel::strategy(all_cuda, n),
                r.run.devices[0],
            );
        }
        let _ = writeln!(s, "{}", chain.inputs);
        let _ = writeln!(
            s,
            "data       {} from {} ({} training examples)",
            r.data.format,
            shown(std::path::Path::new(&r.data.source_label())),
            chain.train_examples
        );
        let golden = r
            .evaluation
            .golden_samples
            .map_or("the whole validation split".to_string(), |n| {
                format!("the first {n} validation examples")
            });
        let _ = writeln!(
            s,
            "golden     baseline logits on {golden}; gates use validation only, test is reported"
        );
        let _ = writeln!(
            s,
            "baseline   {}: {}",
            chain.baseline_source,
            chain.baseline.describe()
        );
        let peak = self.write_stages(&mut s, &chain, &run_dir);
        let _ = writeln!(
            s,
            "memory     peak ~{} (the largest stage above)",
            human_bytes(peak)
        );
        Ok(s)
    }
    /// Each stage's lines of the plan (`stage`, `in`, `out`, `set`, `gate`, `memory`) into `s`;
    /// the peak memory over the stages.
    fn write_stages(&self, s: &mut String, chain: &ChainPlan, run_dir: &std::path::Path) -> u64 {
        let mut input = chain.baseline.clone();
        let mut peak = 4 * chain.baseline.num_params() as u64;
        for ((entry, _), p) in self.stages.iter().zip(&chain.stages) {
            let _ = writeln!(
                s,
                "stage {}    {} (kind {}) -> {}/",
                entry.index,
                entry.name,
                entry.kind,
                shown(&run_dir.join(entry.dir_name()))
            );
            let _ = writeln!(s, "  in       {}", input.describe());
            let _ = writeln!(s, "  out      {}", p.output.describe());
            for line in &p.settings {
                let _ = writeln!(s, "  set      {line}");
            }
            let _ = writeln!(
                s,
                "  gate     {}",
                entry
                    .gate
                    .as_ref()
                    .map_or("none (kept whatever it scores)".to_string(), |g| g
                        .to_toml())
            );
            if let Some(m) = &p.memory {
                let mut extras = p.extra_memory.clone();
                // Validation during training holds an eval batch's logits and what the loss,
                // the metrics and the kept golden rows make of them, and an inference copy of
                // the weights, beside the optimizer state: for a language model's vocabulary a
                // position, more than the training activations. 32 bytes a logit value:
                // measured, SmolLM2-135M at eval batch 16 x 128 tokens peaked at 6.5 GiB during
                // validation against ~4.2 GiB while it trained.
                let eval = entry.train.eval_batch_size;
                let size = chain.example_size;
                let logits = 32 * (eval * p.output.logit_values(size)) as u64 + m.weights;
                if logits > m.activations {
                    extras.push((
                        format!("validation logits at eval batch {eval} beyond the activations"),
                        logits - m.activations,
                    ));
                }
                let extra: u64 = extras.iter().map(|(_, b)| b).sum();
                let total = m.total() + extra;
                peak = peak.max(total);
                let _ = writeln!(
                    s,
                    "  memory   ~{} (student weights {}, grads {}, AdamW moments {}, activations {} at batch {}{}{})",
                    human_bytes(total),
                    human_bytes(m.weights),
                    human_bytes(m.grads),
                    human_bytes(m.adam_moments),
                    human_bytes(m.activations),
                    entry.train.batch_size,
                    match size { 0 => String::new(), n => format!(" x {n} tokens") },
                    extras.iter().map(|(what, b)| format!(", {what} {}", human_bytes(*b))).collect::<String>()
                );
                self.write_devices(s, m);
            }
            input = p.output.clone();
        }
        peak
    }

    /// What each data-parallel device holds: nothing is sharded (the optimizer state stays on
    /// the main device), every other device holds a step's fork of the weights, its shard's
    /// gradients and activations; a remote one receives the weights and sends the gradients
    /// back every step.
    fn write_devices(&self, s: &mut String, m: &mopt_core::MemoryEstimate) {
        let devices = &self.recipe.run.devices;
        if devices.len() < 2 {
            return;
        }
        let remote = devices.iter().filter(|d| d.is_remote()).count();
        let _ = writeln!(
            s,
            "  devices  main ({}): the memory above, optimizer state included (not sharded); each of the {} others ~{} (a fork of the weights, its shard's gradients and activations{}){}",
            devices[0],
            devices.len() - 1,
            human_bytes(m.weights + m.grads + m.activations),
            if self.stages.iter().any(|(e, _)| e.kind == "distill") { ", and a live teacher's fork" } else { "" },
            if remote > 0 {
                format!("; {} over the network a step for each remote device (weights out, gradients back)", human_bytes(m.weights + m.grads))
            } else {
                String::new()
            }
        );
    }
}
