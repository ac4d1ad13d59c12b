//! The language-model rows of the speed harness: SmolLM2-135M-Instruct (a 30-layer Llama
//! decoder, hidden 576, 9 heads over 3 KV heads, FFN 1536, vocabulary 49152, head tied to the
//! embeddings) loaded from its Q4_1 GGUF (every weight dequantized to f32), on windows of 256
//! token ids: a training step at batch 8 (forward, next-token cross-entropy at every position,
//! backward, global-norm clipping at 1.0, AdamW at lr 1e-5 without weight decay) and inference
//! at batch 1 and 8. The ids are `(i·7919 + 13) mod vocab` over the flattened batch
//! (`Checkpoint::bench_batch`), each target the next id of the same formula.
//!
//! A step takes seconds (tens of them on two cores), so these rows run at most one warm-up and
//! 3 timed steps, 3 forwards at batch 8 and 5 at batch 1, whatever `--steps` asks above that.
//! The PyTorch side (`torch_lm.py`) loads the same file with transformers, checks its logits
//! against the sample of mopt's in `lm.json`, then times the rows named there.

use std::path::Path;

use burn::prelude::*;
use mopt_core::{Checkpoint, ModelConfig};
use mopt_data::TokenWindows;
use mopt_models::llama::{load_gguf, LlamaConfig, LlamaForCausalLM};
use mopt_recipe::{Precision, TrainSpec};
use mopt_train::trainer::FinetuneTask;
use serde_json::{json, Value};

use super::{time_ms, time_training, Bench};

/// The model, relative to the repository root (`datasets/fetch.sh --small` fetches it).
const GGUF: &str = "datasets/data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
const SEQ: usize = 256;
const STEP_BATCH: usize = 8;
/// The rows of window 0's logits (batch 1) that `lm.json` keeps for PyTorch's check, and the
/// stride of the vocabulary columns kept in each (507 of 49152).
const CHECK_ROWS: [usize; 9] = [0, 1, 2, 3, 4, 5, 6, 7, SEQ - 1];
const CHECK_STRIDE: usize = 97;

/// The rows this module records (`--only` picks among them).
pub const ROWS: [&str; 3] = ["lm_step_b8x256", "lm_forward_b1x256", "lm_forward_b8x256"];

/// `batch` windows of `SEQ` ids and their next-token targets (`bench_batch`'s formula).
fn windows(config: &LlamaConfig, batch: usize, device: &Device) -> TokenWindows {
    LlamaForCausalLM::bench_batch(config, batch, SEQ, device).expect("Llama has bench batches")
}

/// Warm-up and timed runs of a row: `--warmup` and `--steps`, capped at 1 and `max`.
fn runs(bench: &Bench, max: usize) -> (usize, usize) {
    (bench.args.warmup.min(1), bench.args.steps.clamp(1, max))
}

pub fn run(bench: &mut Bench, work: &Path) {
    let path = bench.root.join(GGUF);
    if !path.exists() {
        eprintln!(
            "lm rows skipped: {} not found (datasets/fetch.sh --small fetches it)",
            path.display()
        );
        return;
    }
    let (device, ad) = bench.devices();
    let (config, model) = match load_gguf(&path, &ad) {
        Ok(loaded) => loaded,
        Err(e) => {
            eprintln!("lm rows skipped: {e}");
            return;
        }
    };
    let c = &config;
    eprintln!(
        "LM: {} layers x {}, {} heads over {} KV heads, FFN {}, vocabulary {} ({} params), \
         windows of {SEQ} tokens",
        c.num_hidden_layers,
        c.hidden_size,
        c.heads(0),
        c.kv_heads(0),
        c.ffn(0),
        c.vocab_size,
        c.num_params()
    );
    let mut rows = serde_json::Map::new();
    // Inference on the weights as loaded, before the step changes them.
    let eval = model.valid();
    let reference = reference_logits(&eval, &config, &device);
    for (name, batch, max) in [("lm_forward_b1x256", 1, 5), ("lm_forward_b8x256", 8, 3)] {
        if bench.wants(name) {
            let (warmup, timed) = runs(bench, max);
            rows.insert(name.into(), row_spec(batch, warmup, timed));
            forward_row(bench, name, &eval, &config, batch, (warmup, timed), &device);
        }
    }
    drop(eval);
    let name = "lm_step_b8x256";
    if bench.wants(name) {
        let (warmup, timed) = runs(bench, 3);
        rows.insert(name.into(), row_spec(STEP_BATCH, warmup, timed));
        step_row(bench, name, model, &config, (warmup, timed), &ad);
    }
    write_spec(bench, work, &path, &config, reference, rows);
}

fn row_spec(batch: usize, warmup: usize, runs: usize) -> Value {
    json!({ "batch": batch, "warmup": warmup, "runs": runs })
}

/// The sample of window 0's logits at batch 1 that PyTorch must reproduce: rows
/// [`CHECK_ROWS`], every [`CHECK_STRIDE`]-th column.
fn reference_logits(model: &LlamaForCausalLM, config: &LlamaConfig, device: &Device) -> Value {
    let logits = model.forward(windows(config, 1, device).inputs);
    let all: Vec<f32> = logits
        .into_data()
        .convert::<f32>()
        .try_to_vec()
        .expect("f32");
    let v = config.vocab_size;
    let rows: Vec<Vec<f32>> = CHECK_ROWS
        .iter()
        .map(|&r| {
            all[r * v..(r + 1) * v]
                .iter()
                .step_by(CHECK_STRIDE)
                .copied()
                .collect()
        })
        .collect();
    json!({ "rows": CHECK_ROWS, "col_stride": CHECK_STRIDE, "logits": rows })
}

/// Inference at `batch` windows: `forward` and the logits read back (which waits for them).
fn forward_row(
    bench: &mut Bench,
    name: &str,
    model: &LlamaForCausalLM,
    config: &LlamaConfig,
    batch: usize,
    (warmup, runs): (usize, usize),
    device: &Device,
) {
    let ids = windows(config, batch, device).inputs;
    let ms = time_ms(warmup, runs, |_| {
        let _ = model.forward(ids.clone()).into_data();
    });
    bench.record(name, &ms, batch, Some(config.flops(SEQ) * batch as f64));
}

/// The fine-tuning step at [`STEP_BATCH`] windows, on the same batch at every step, with the
/// trainer's components (cross-entropy over every position, clipping, mopt's fused AdamW).
fn step_row(
    bench: &mut Bench,
    name: &str,
    model: LlamaForCausalLM,
    config: &LlamaConfig,
    (warmup, steps): (usize, usize),
    ad: &Device,
) {
    let t = lm_train();
    let batch = windows(config, STEP_BATCH, ad);
    let batches = vec![batch; warmup + steps];
    let indices: Vec<Vec<usize>> = (0..warmup + steps)
        .map(|i| (i * STEP_BATCH..(i + 1) * STEP_BATCH).collect())
        .collect();
    let ms = time_training(
        (warmup, steps),
        Precision::Fp32,
        &mut FinetuneTask::new(ad),
        model,
        mopt_train::trainer::adamw(&t),
        &batches,
        &indices,
        t.grad_clip_norm.expect("clipping"),
        t.lr,
    );
    let fwd = config.flops(SEQ) * STEP_BATCH as f64;
    bench.record(name, &ms, STEP_BATCH, Some(3.0 * fwd));
}

/// The step's optimiser: AdamW at 1e-5 without weight decay, clipping at 1.0.
fn lm_train() -> TrainSpec {
    TrainSpec {
        lr: 1e-5,
        weight_decay: 0.0,
        grad_clip_norm: Some(1.0),
        ..TrainSpec::default()
    }
}

/// `lm.json`: the model file, the rows mopt timed (batch, warm-up, runs), the optimiser, the
/// ids' formula and the reference logits.
fn write_spec(
    bench: &Bench,
    work: &Path,
    gguf: &Path,
    config: &LlamaConfig,
    reference: Value,
    rows: serde_json::Map<String, Value>,
) {
    let t = lm_train();
    // f32 settings as written (0.9, not 0.8999999761581421).
    let short = |x: f32| x.to_string().parse::<f64>().unwrap_or(x as f64);
    let spec = json!({
        "gguf": gguf,
        "device": bench.torch_device(),
        "seq": SEQ,
        "vocab": config.vocab_size,
        "ids": "(i * 7919 + 13) % vocab over the flattened batch; target i: id i + 1",
        "rows": rows,
        "lr": t.lr,
        "weight_decay": t.weight_decay,
        "betas": [short(t.adam_beta1), short(t.adam_beta2)],
        "eps": short(t.adam_epsilon),
        "clip": t.grad_clip_norm,
        "forward_flops": config.flops(SEQ),
        "reference": reference,
    });
    std::fs::write(work.join("lm.json"), spec.to_string()).expect("lm.json");
}
