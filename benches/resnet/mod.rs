//! The ResNet rows of the speed harness: the Fashion-MNIST teacher's shape (32/64/128 channels,
//! two BasicBlocks a stage, 1×28×28 images), a training step at batch 64 (forward, cross-entropy,
//! backward, clipping, AdamW) and inference at batch 64 and 1. The PyTorch side
//! (`torch_resnet.py`) loads the same weights from `resnet.json` and checks its logits first.

use std::path::Path;

use burn::prelude::*;
use mopt_core::{ModelConfig, ParamTable};
use mopt_data::ImageBatch;
use mopt_models::resnet::{ResNet, ResNetConfig};
use mopt_recipe::{Precision, TrainSpec};
use mopt_train::trainer::FinetuneTask;
use serde_json::json;

use super::{time_ms, time_training, Bench};

const BATCH: usize = 64;

/// Batch `i`: a deterministic pattern of values in [-1, 1) (the same formula in Python), labels
/// `(i·BATCH + r) mod 10`.
fn batch(i: usize, n: usize, device: &Device) -> ImageBatch {
    let k = 28 * 28;
    let values: Vec<f32> = (0..n * k)
        .map(|j| (((i * n * k + j) * 7919) % 2003) as f32 / 1001.5 - 1.0)
        .collect();
    let labels: Vec<i64> = (0..n).map(|r| ((i * n + r) % 10) as i64).collect();
    ImageBatch {
        images: Tensor::from_data(TensorData::new(values, [n, 1, 28, 28]), device),
        labels: Tensor::from_data(TensorData::new(labels, [n]), device),
    }
}

pub fn run(bench: &mut Bench, work: &Path) {
    let (warmup, steps) = (bench.args.warmup, bench.args.steps);
    let (device, ad) = bench.devices();
    let config = ResNetConfig::new(&[32, 64, 128], 2, 1, 28);
    let model = ResNet::new(&config, &ad);
    // The weights and the eval logits of batch 0 for the PyTorch side.
    let table = ParamTable::weights(&model.valid());
    let weights: serde_json::Map<String, serde_json::Value> = table
        .0
        .iter()
        .map(|(k, a)| (k.clone(), json!({ "shape": a.shape, "data": a.data })))
        .collect();
    let logits = model.valid().forward(batch(0, BATCH, &device).images);
    let logits: Vec<f32> = logits.into_data().convert::<f32>().try_to_vec().unwrap();
    let t = TrainSpec::default();
    let clip = 1.0;
    let lr = 1e-3;
    std::fs::write(
        work.join("resnet.json"),
        json!({
            "widths": [32, 64, 128], "blocks": 2, "batch": BATCH,
            "warmup": warmup, "steps": steps, "lr": lr, "weight_decay": t.weight_decay, "clip": clip,
            "weights": weights, "reference_logits": logits,
            "forward_flops": config.flops(0),
        })
        .to_string(),
    )
    .expect("resnet.json");
    eprintln!(
        "ResNet {} ({} params), batch {BATCH}",
        config.describe(),
        config.num_params()
    );
    let batches: Vec<ImageBatch> = (0..warmup + steps).map(|i| batch(i, BATCH, &ad)).collect();
    let indices: Vec<Vec<usize>> = (0..warmup + steps)
        .map(|i| (i * BATCH..(i + 1) * BATCH).collect())
        .collect();
    let fwd = config.flops(0) * BATCH as f64;
    let ms = time_training(
        (warmup, steps),
        Precision::Fp32,
        &mut FinetuneTask::new(&ad),
        model,
        mopt_train::trainer::adamw(&t),
        &batches,
        &indices,
        clip,
        lr,
    );
    bench.record("resnet_step_b64", &ms, BATCH, Some(3.0 * fwd));
    let eval = ResNet::new(&config, &device);
    for (name, n, runs) in [("resnet_infer_b64", BATCH, 10), ("resnet_infer_b1", 1, 50)] {
        let images = batch(1, n, &device).images;
        let ms = time_ms(3, runs, |_| {
            let _ = eval.forward(images.clone()).into_data();
        });
        bench.record(name, &ms, n, Some(config.flops(0) * n as f64));
    }
}
