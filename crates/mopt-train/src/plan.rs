//! `--check`: the resolved plan of a recipe, without training.

use std::fmt::Write;

use mopt_data::LabelMap;
use mopt_data::TextTokenizer;
use mopt_models::bert::BertConfig;
use mopt_recipe::Recipe;

use crate::backend::DeviceSpec;
use crate::error::TrainError;
use crate::memory::{human_bytes, MemoryEstimate};
use crate::setup::model_config;

/// Validate everything a run needs (recipe, device, tokenizer, model config) and describe it.
/// Writes nothing; reads no data set beyond the tokenizer and configs.
pub fn check_plan(recipe: &Recipe, device: &DeviceSpec, force: bool) -> Result<String, TrainError> {
    let tok = TextTokenizer::from_file(
        &recipe.tokenizer.path,
        recipe.tokenizer.max_len,
        recipe.tokenizer.lowercase,
    )?;
    let labels = recipe
        .data
        .labels
        .clone()
        .map(LabelMap::new)
        .unwrap_or_else(|| LabelMap::new(vec!["<class 0>".into(), "<class 1>".into()]));
    let config: BertConfig = model_config(recipe, &labels, tok.vocab_size())?;
    let run_dir = recipe.run.run_dir();
    if run_dir.exists() && !force {
        return Err(TrainError::Input(format!(
            "run folder {} already exists; pass --force to replace it, or change [run] name",
            run_dir.display()
        )));
    }
    let t = &recipe.train;
    let mem = MemoryEstimate::for_bert(&config, t.batch_size, recipe.tokenizer.max_len);
    let mut s = String::new();
    let _ = writeln!(s, "recipe     {}", recipe.path.display());
    let _ = writeln!(s, "run        {} -> {}", recipe.run.name, run_dir.display());
    let _ = writeln!(s, "device     {}", device.name());
    let _ = writeln!(s, "seed       {}", recipe.run.seed);
    let _ = writeln!(
        s,
        "model      BERT classifier: {} layers, hidden {}, heads {:?}, FFN {:?}, vocab {}",
        config.num_hidden_layers,
        config.hidden_size,
        (0..config.num_hidden_layers)
            .map(|i| config.heads(i))
            .collect::<Vec<_>>(),
        (0..config.num_hidden_layers)
            .map(|i| config.ffn(i))
            .collect::<Vec<_>>(),
        config.vocab_size
    );
    let _ = writeln!(
        s,
        "params     {} ({:.1}M)",
        config.num_params(),
        config.num_params() as f64 / 1e6
    );
    let init = match (
        &recipe.model.weights,
        &recipe.model.init_from_teacher_layers,
    ) {
        (Some(w), _) => w.display().to_string(),
        (None, Some(layers)) => {
            format!("teacher layers {layers:?} (embeddings, pooler, head copied)")
        }
        (None, None) => "random init".to_string(),
    };
    let _ = writeln!(s, "weights    {init}");
    if let Some(t) = &recipe.teacher {
        let state = if t.checkpoint.join("model.bpk").is_file() {
            "exists".to_string()
        } else {
            format!(
                "missing; will be trained by {}",
                t.recipe
                    .as_ref()
                    .map_or("?".into(), |r| r.display().to_string())
            )
        };
        let _ = writeln!(s, "teacher    {} ({state})", t.checkpoint.display());
    }
    if let Some(d) = &recipe.distill {
        let _ = writeln!(
            s,
            "distill    {}: alpha {:?}, T {:?}, soft {:?}, {} matches, teacher cache {}, baseline {}",
            if d.enabled { "on" } else { "off (hard labels only)" },
            d.alpha,
            d.temperature,
            d.soft_loss,
            d.matches.len(),
            d.teacher_cache,
            d.baseline
        );
    }
    let _ = writeln!(
        s,
        "tokenizer  {} (vocab {}, max-len {})",
        recipe.tokenizer.path.display(),
        tok.vocab_size(),
        tok.max_len
    );
    let _ = writeln!(
        s,
        "data       {:?} from {}",
        recipe.data.format,
        recipe.data.source_label()
    );
    let _ = writeln!(
        s,
        "train      {} epochs, batch {} x accum {}, AdamW lr {:e} wd {}, warmup {:.0}%, cosine to {:.0}%, clip {}",
        t.epochs,
        t.batch_size,
        t.grad_accum_steps,
        t.lr,
        t.weight_decay,
        t.warmup_fraction * 100.0,
        t.final_lr_ratio * 100.0,
        t.grad_clip_norm.map_or("off".into(), |n| format!("global norm {n}"))
    );
    let _ = writeln!(s, "best by    validation {}", t.best_metric.name());
    if t.gradient_checkpointing {
        let _ = writeln!(
            s,
            "grad ckpt  on: Burn's balanced checkpointing recomputes memory-bound activations in the backward pass (the activation estimate below is the upper bound without it)"
        );
    }
    let _ = writeln!(
        s,
        "memory     ~{} (weights {}, grads {}, AdamW moments {}, activations {} at batch {} x {} tokens)",
        human_bytes(mem.total()),
        human_bytes(mem.weights),
        human_bytes(mem.grads),
        human_bytes(mem.adam_moments),
        human_bytes(mem.activations),
        t.batch_size,
        recipe.tokenizer.max_len
    );
    Ok(s)
}
