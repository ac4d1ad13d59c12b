//! BERT's baseline analysis: where its parameters, FLOPs and forward time go, module by module
//! (the word-embedding table can hold most parameters and cost almost no time; attention's
//! share grows with the sequence length).

use std::time::Instant;

use burn::prelude::*;
use mopt_models::bert::{weights, BertConfig, BertForSequenceClassification};

use mopt_stages::analysis::{Analysis, ModuleRow};
use mopt_stages::StageError;

/// Seconds spent in each module over `runs` forward passes at `[batch, seq]`.
fn module_times(
    m: &BertForSequenceClassification,
    c: &BertConfig,
    batch: usize,
    seq: usize,
    runs: usize,
    device: &Device,
) -> Vec<f64> {
    let ids: Vec<i64> = (0..batch * seq)
        .map(|i| 1000 + ((i * 7919) % 20000) as i64)
        .collect();
    let input = Tensor::<2, Int>::from_data(TensorData::new(ids, [batch, seq]), device);
    let types = Tensor::<2, Int>::zeros([batch, seq], device);
    let mask_bias = Tensor::<4>::zeros([batch, 1, 1, seq], device);
    let mut t = vec![0.0; 2 + 2 * c.num_hidden_layers];
    for run in 0..runs + 1 {
        let mut clock = Instant::now();
        let mut lap = |slot: usize, t: &mut Vec<f64>| {
            if run > 0 {
                t[slot] += clock.elapsed().as_secs_f64();
            }
            clock = Instant::now();
        };
        let mut x = m.bert.embeddings.forward(input.clone(), types.clone());
        let _ = x.clone().slice([0..1, 0..1, 0..1]).into_data();
        lap(0, &mut t);
        for (i, layer) in m.bert.encoder.layer.iter().enumerate() {
            let a = layer.attention_block(x, mask_bias.clone());
            let _ = a.clone().slice([0..1, 0..1, 0..1]).into_data();
            lap(1 + 2 * i, &mut t);
            x = layer.ffn(a);
            let _ = x.clone().slice([0..1, 0..1, 0..1]).into_data();
            lap(2 + 2 * i, &mut t);
        }
        let (_, logits) = m.head(x);
        let _ = logits.into_data();
        let last = t.len() - 1;
        lap(last, &mut t);
    }
    t
}

/// Analyse the checkpoint at `dir` at `seq` tokens; `runs` timed passes at batch 32 (4x at 1).
pub fn analyse(
    dir: &std::path::Path,
    seq: usize,
    runs: usize,
    device: &Device,
) -> Result<Analysis, StageError> {
    let (model, c) = weights::load_checkpoint(dir, device)?;
    let model = model.valid();
    let runs = runs.max(3);
    let b1 = module_times(&model, &c, 1, seq, runs * 4, device);
    let b32 = module_times(&model, &c, 32, seq, runs, device);
    let (s1, s32): (f64, f64) = (b1.iter().sum(), b32.iter().sum());
    let h = c.hidden_size;
    let mut rows = vec![ModuleRow {
        module: format!(
            "embeddings (word table {} x {h}: {} params)",
            c.vocab_size,
            c.vocab_size * h
        ),
        params: c.embedding_params(),
        flops_per_example: 0,
        time_share_b1: b1[0] / s1,
        time_share_b32: b32[0] / s32,
    }];
    for i in 0..c.num_hidden_layers {
        let (pa, pf) = c.layer_params(i);
        let (fa, ff) = c.layer_flops(i, seq);
        rows.push(ModuleRow {
            module: format!("layer {} attention ({} heads)", i + 1, c.heads(i)),
            params: pa,
            flops_per_example: fa,
            time_share_b1: b1[1 + 2 * i] / s1,
            time_share_b32: b32[1 + 2 * i] / s32,
        });
        rows.push(ModuleRow {
            module: format!("layer {} FFN ({})", i + 1, c.ffn(i)),
            params: pf,
            flops_per_example: ff,
            time_share_b1: b1[2 + 2 * i] / s1,
            time_share_b32: b32[2 + 2 * i] / s32,
        });
    }
    let last = b1.len() - 1;
    rows.push(ModuleRow {
        module: "pooler + classifier".into(),
        params: c.head_params(),
        flops_per_example: c.head_flops(),
        time_share_b1: b1[last] / s1,
        time_share_b32: b32[last] / s32,
    });
    Ok(Analysis {
        seq_len: seq,
        rows,
        forward_ms_b1: s1 * 1e3 / (runs * 4) as f64,
        forward_ms_b32: s32 * 1e3 / runs as f64,
    })
}
