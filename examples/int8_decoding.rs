//! A quantized Llama (a `ptq` or `qat` stage's checkpoint folder) run two ways on windows of a
//! text: its fake-quantized forward pass (float products of quantize → dequantize values, how
//! it trains and is evaluated) and its integer form (int8 weights packed once, exact `u8 · s8`
//! sums: how `mopt-train generate` serves it). Prints each one's perplexity, how often they
//! pick the same next token, their largest logit difference, and their speed at batch 1.
//!
//! ```sh
//! cargo run --example int8_decoding -- CHECKPOINT_DIR TOKENIZER.gguf TEXT.txt [WINDOWS]
//! ```

use std::path::PathBuf;
use std::time::Instant;

use burn::prelude::*;
use mopt_core::Quantizable;
use mopt_export::contract::argmax;
use mopt_gguf::{Gguf, GgufTokenizer};
use mopt_models::llama::{load_checkpoint, LlamaForCausalLM};

const LEN: usize = 128;

/// Mean next-token loss over the windows, top-1 choices, every logit, and the seconds of the
/// forward passes alone (one untimed pass first).
fn run(m: &LlamaForCausalLM, windows: &[Vec<i64>]) -> (f64, Vec<usize>, Vec<f32>, f64) {
    let forward = |w: &[i64]| -> Vec<f32> {
        let ids = TensorData::new(w[..LEN].to_vec(), [1, LEN]);
        let ids = Tensor::<2, Int>::from_data(ids, &Device::flex());
        m.forward(ids).into_data().try_to_vec().expect("f32")
    };
    let _ = forward(&windows[0]);
    let (mut loss, mut picks, mut all, mut secs) = (0f64, Vec::new(), Vec::new(), 0f64);
    for w in windows {
        let t0 = Instant::now();
        let logits = forward(w);
        secs += t0.elapsed().as_secs_f64();
        let vocab = logits.len() / LEN;
        for (p, row) in logits.chunks(vocab).enumerate() {
            let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let lse = max as f64
                + row
                    .iter()
                    .map(|&x| ((x - max) as f64).exp())
                    .sum::<f64>()
                    .ln();
            loss += lse - row[w[p + 1] as usize] as f64;
            picks.push(argmax(row.iter().map(|&x| x as f64)));
        }
        all.extend(logits);
    }
    (loss / (windows.len() * LEN) as f64, picks, all, secs)
}

fn main() -> anyhow::Result<()> {
    mopt_kernels::tune_allocator();
    mopt_kernels::init_pool(None)?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, tok, text] =
        [0, 1, 2].map(|i| PathBuf::from(args.get(i).cloned().unwrap_or_default()));
    let n: usize = args.get(3).map(|s| s.parse()).transpose()?.unwrap_or(8);
    let (model, _) = load_checkpoint(&dir, &Device::flex())?;
    anyhow::ensure!(
        model.is_quantized(),
        "{}: not a quantized checkpoint",
        dir.display()
    );
    let tokenizer = GgufTokenizer::from_gguf(&Gguf::open(&tok)?)?;
    let ids: Vec<i64> = tokenizer
        .encode(&std::fs::read_to_string(&text)?)?
        .into_iter()
        .map(i64::from)
        .collect();
    // Windows of LEN ids and the next id each predicts last (the next window's first).
    let windows: Vec<Vec<i64>> = (0..)
        .map(|k| k * LEN)
        .take_while(|s| s + LEN < ids.len())
        .take(n)
        .map(|s| ids[s..=s + LEN].to_vec())
        .collect();
    anyhow::ensure!(
        !windows.is_empty(),
        "{}: fewer than {} tokens",
        text.display(),
        LEN + 1
    );
    let (fake_loss, fake_picks, fake_logits, fake_secs) = run(&model, &windows);
    let (int_model, packed) = model.with_integer_kernels();
    let (int_loss, int_picks, int_logits, int_secs) = run(&int_model, &windows);
    let same = fake_picks
        .iter()
        .zip(&int_picks)
        .filter(|(a, b)| a == b)
        .count();
    let max_diff = fake_logits
        .iter()
        .zip(&int_logits)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    // Mean KL(fake-quantized || integer) over the positions, in nats.
    let vocab = fake_logits.len() / fake_picks.len();
    let kl: f64 = fake_logits
        .chunks(vocab)
        .zip(int_logits.chunks(vocab))
        .map(|(a, b)| mopt_export::kl_of_logits(a, b))
        .sum::<f64>()
        / fake_picks.len() as f64;
    println!("mean KL(fake-quantized || integer) {kl:.3e} nats a token");
    let tokens = (windows.len() * LEN) as f64;
    println!(
        "{} windows of {LEN} tokens; {packed} layers packed as int8",
        windows.len()
    );
    println!(
        "fake-quantized: perplexity {:.3}, {:.1} tokens/s (forward, batch 1)",
        fake_loss.exp(),
        tokens / fake_secs
    );
    println!(
        "integer:        perplexity {:.3}, {:.1} tokens/s (forward, batch 1)",
        int_loss.exp(),
        tokens / int_secs
    );
    println!(
        "same next token at {same} of {} positions ({:.2}%); max |logit difference| {max_diff:.3e}",
        fake_picks.len(),
        100.0 * same as f64 / fake_picks.len() as f64
    );
    Ok(())
}
