//! Text generation with a [`LlamaForCausalLM`]: the prompt in one pass that fills the KV
//! cache, then one token a step, each step computing only the new position.
//!
//! Greedy decoding takes the most likely token (the first of equal ones, as `torch.argmax`
//! does): transformers' `generate(do_sample=False)` gives the same tokens. Sampling divides the
//! logits by a temperature, keeps the `top_k` most likely tokens and draws from their softmax
//! with a seeded generator (SplitMix64): the same seed gives the same text on every machine.

use burn::prelude::*;

use super::model::LlamaForCausalLM;

/// How the next token is chosen from the logits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sampling {
    /// The most likely token.
    Greedy,
    /// A draw from `softmax(logits / temperature)` over the `top_k` most likely tokens
    /// (`top_k = 0`: all of them). A temperature of 0 or less is greedy.
    TopK {
        /// Divides the logits (below 1 sharpens, above 1 flattens).
        temperature: f32,
        /// Tokens kept (0 keeps every token).
        top_k: usize,
    },
}

/// What [`generate`] does.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateConfig {
    /// At most this many new tokens.
    pub max_new_tokens: usize,
    /// How each token is chosen.
    pub sampling: Sampling,
    /// Seeds the sampler's generator (unused by greedy decoding).
    pub seed: u64,
    /// Generation ends after any of these (included in the output), e.g. the EOS id.
    pub stop_tokens: Vec<u32>,
}

impl GenerateConfig {
    /// Greedy decoding of up to `max_new_tokens`, no stop token.
    pub fn greedy(max_new_tokens: usize) -> Self {
        Self {
            max_new_tokens,
            sampling: Sampling::Greedy,
            seed: 0,
            stop_tokens: Vec::new(),
        }
    }

    /// Temperature / top-k sampling of up to `max_new_tokens`, seeded.
    pub fn sampled(max_new_tokens: usize, temperature: f32, top_k: usize, seed: u64) -> Self {
        Self {
            max_new_tokens,
            sampling: Sampling::TopK { temperature, top_k },
            seed,
            stop_tokens: Vec::new(),
        }
    }

    /// End generation after any of `tokens`.
    pub fn with_stop_tokens(mut self, tokens: impl IntoIterator<Item = u32>) -> Self {
        self.stop_tokens = tokens.into_iter().collect();
        self
    }
}

/// SplitMix64: a small, fast generator whose stream depends only on the seed.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Chooses tokens from logits by a [`Sampling`], with its own seeded generator.
#[derive(Debug, Clone)]
pub struct Sampler {
    sampling: Sampling,
    rng: SplitMix64,
}

/// The index of the largest value, the first of equal ones (NaN never wins).
fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] || logits[best].is_nan() {
            best = i;
        }
    }
    best as u32
}

impl Sampler {
    /// A sampler whose draws follow from `seed`.
    pub fn new(sampling: Sampling, seed: u64) -> Self {
        Self {
            sampling,
            rng: SplitMix64(seed),
        }
    }

    /// The next token given one position's logits over the vocabulary.
    ///
    /// # Panics
    /// On empty logits.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        assert!(!logits.is_empty(), "no logits to sample from");
        let (temperature, top_k) = match self.sampling {
            Sampling::TopK { temperature, top_k } if temperature > 0.0 => (temperature, top_k),
            _ => return argmax(logits),
        };
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        // Descending, ties by index; NaN last.
        let key = |i: &u32| {
            let x = logits[*i as usize];
            if x.is_nan() {
                f32::NEG_INFINITY
            } else {
                x
            }
        };
        order.sort_by(|a, b| key(b).total_cmp(&key(a)).then(a.cmp(b)));
        if top_k > 0 {
            order.truncate(top_k);
        }
        let max = f64::from(key(&order[0]));
        let weights: Vec<f64> = order
            .iter()
            .map(|i| ((f64::from(key(i)) - max) / f64::from(temperature)).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let mut u = self.rng.next_f64() * total;
        for (i, w) in order.iter().zip(&weights) {
            if u < *w {
                return *i;
            }
            u -= w;
        }
        order[0]
    }
}

/// Token ids as the `[1, n]` input of a forward pass.
pub fn token_ids(ids: &[u32], device: &Device) -> Tensor<2, Int> {
    let v: Vec<i64> = ids.iter().map(|&i| i64::from(i)).collect();
    Tensor::from_data(TensorData::new(v, [1, ids.len()]), device)
}

/// The new tokens `model` writes after `prompt`: up to `config.max_new_tokens`, ending early
/// after a stop token (which is returned). The prompt runs in one pass; each later step runs
/// one position on the KV cache.
///
/// # Panics
/// On an empty prompt.
pub fn generate(model: &LlamaForCausalLM, prompt: &[u32], config: &GenerateConfig) -> Vec<u32> {
    generate_timed(model, prompt, config).tokens
}

/// What [`generate_timed`] wrote, and how long each phase took.
#[derive(Debug, Clone, PartialEq)]
pub struct Generated {
    /// The new tokens.
    pub tokens: Vec<u32>,
    /// Seconds of the prompt's pass, its first new token included.
    pub prompt_secs: f64,
    /// Seconds of the one-position steps that wrote the other tokens.
    pub decode_secs: f64,
}

/// [`generate`], timing the prompt's pass and the decoding steps apart.
///
/// # Panics
/// On an empty prompt.
pub fn generate_timed(
    model: &LlamaForCausalLM,
    prompt: &[u32],
    config: &GenerateConfig,
) -> Generated {
    assert!(
        !prompt.is_empty(),
        "generation needs at least one prompt token"
    );
    let device = model.model.embed_tokens.weight.val().device();
    let mut sampler = Sampler::new(config.sampling, config.seed);
    let mut cache = model.new_cache();
    let mut out = Vec::with_capacity(config.max_new_tokens);
    let t0 = std::time::Instant::now();
    let mut prompt_secs = None;
    let mut hidden = model
        .model
        .forward(token_ids(prompt, &device), Some(&mut cache));
    while out.len() < config.max_new_tokens {
        let seq = hidden.dims()[1];
        let logits = model.head(hidden.narrow(1, seq - 1, 1));
        let logits: Vec<f32> = logits.into_data().try_to_vec().expect("logits are f32");
        let token = sampler.sample(&logits);
        out.push(token);
        prompt_secs.get_or_insert_with(|| t0.elapsed().as_secs_f64());
        if config.stop_tokens.contains(&token) || out.len() == config.max_new_tokens {
            break;
        }
        hidden = model
            .model
            .forward(token_ids(&[token], &device), Some(&mut cache));
    }
    let total = t0.elapsed().as_secs_f64();
    let prompt_secs = prompt_secs.unwrap_or(total);
    Generated {
        tokens: out,
        prompt_secs,
        decode_secs: total - prompt_secs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut s = Sampler::new(Sampling::Greedy, 0);
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 3.0]), 1);
        let mut cold = Sampler::new(
            Sampling::TopK {
                temperature: 0.0,
                top_k: 5,
            },
            9,
        );
        assert_eq!(cold.sample(&[0.1, 3.0, -1.0, 3.0]), 1);
        let mut k1 = Sampler::new(
            Sampling::TopK {
                temperature: 1.0,
                top_k: 1,
            },
            9,
        );
        assert!((0..20).all(|_| k1.sample(&[0.1, 3.0, -1.0, 3.0]) == 1));
    }

    /// Draws follow softmax(logits / T) over the top k, and repeat for a seed.
    #[test]
    fn sampling_follows_the_tempered_top_k_softmax_and_the_seed() {
        // p ∝ (1, 3) at T = 1 over the top 2 of 3; at T = 2, ∝ (1, √3).
        let logits = [0.0, 3f32.ln(), -50.0];
        let draw = |t: f32, seed: u64| {
            let mut s = Sampler::new(
                Sampling::TopK {
                    temperature: t,
                    top_k: 2,
                },
                seed,
            );
            (0..8000).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        let a = draw(1.0, 7);
        assert!(a.iter().all(|&t| t < 2), "outside the top 2");
        let share = a.iter().filter(|&&t| t == 1).count() as f64 / a.len() as f64;
        assert!((share - 0.75).abs() < 0.02, "share of token 1: {share}");
        let hot = draw(2.0, 7);
        let share = hot.iter().filter(|&&t| t == 1).count() as f64 / hot.len() as f64;
        let want = 3f64.sqrt() / (1.0 + 3f64.sqrt());
        assert!((share - want).abs() < 0.02, "T = 2: {share} vs {want}");
        assert_eq!(a, draw(1.0, 7));
        assert_ne!(a, draw(1.0, 8));
    }
}
