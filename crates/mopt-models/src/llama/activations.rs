//! Minitron's activation-based importance for the Llama decoder (Muralidharan et al., 2024,
//! "Compact Language Models via Pruning and Knowledge Distillation"): one forward pass over a
//! calibration batch, every dependency group's units scored by what they emit.
//!
//! | group | a unit's activation at a token |
//! |---|---|
//! | `heads` | the L2 norm of the query head's context (its slice of `o_proj`'s input) |
//! | `kv-groups` | the sum of its query heads' scores |
//! | `ffn` | the neuron's value `silu(gate·x) · (up·x)` (`down_proj`'s input) |
//! | `hidden` | the channel's value after every RMSNorm (both of every layer, and the final one), the norms' scores summed |
//! | `layers` | block influence, `1 − cos(x_in, x_out)` of the layer's input and output |
//!
//! [`ActivationStat`] reduces a unit's activations over one sequence's tokens (the mean of
//! their magnitudes, or their root mean square; block influence is always the mean); the
//! sequences' scores are summed, and the caller divides by their number.

use burn::prelude::*;
use mopt_core::prune::{ActivationStat, GroupScores};

use super::config::LlamaConfig;
use super::model::{causal_bias, LlamaForCausalLM};

/// `[batch, seq, units]` → `[units]`: each sequence's tokens reduced by `stat`, summed over
/// the sequences. `x` holds magnitudes or signed values (both statistics use `|x|`).
fn reduce(x: Tensor<3>, stat: ActivationStat) -> Vec<f64> {
    let [b, _, u] = x.dims();
    let per_seq = match stat {
        ActivationStat::Mean => x.abs().mean_dim(1),
        ActivationStat::L2 => x.powi_scalar(2).mean_dim(1).sqrt(),
    };
    let summed: Tensor<1> = per_seq.reshape([b, u]).sum_dim(0).reshape([u]);
    to_f64(summed)
}

fn to_f64(t: Tensor<1>) -> Vec<f64> {
    t.into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .expect("f32 data")
        .into_iter()
        .map(f64::from)
        .collect()
}

/// `[batch, seq, hidden]` twice → per sequence, the mean over tokens of `1 − cos(a_t, b_t)`,
/// summed over the sequences.
fn block_influence(a: Tensor<3>, b: Tensor<3>) -> f64 {
    let dot = (a.clone() * b.clone()).sum_dim(2);
    let na = a.powi_scalar(2).sum_dim(2).sqrt();
    let nb = b.powi_scalar(2).sum_dim(2).sqrt();
    let cos = dot / (na * nb).clamp_min(1e-12);
    let bi = cos.neg().add_scalar(1.0).mean_dim(1).sum();
    to_f64(bi.reshape([1]))[0]
}

/// Adds `x` into `acc` element by element.
fn add(acc: &mut [f64], x: &[f64]) {
    acc.iter_mut().zip(x).for_each(|(a, b)| *a += b);
}

impl LlamaForCausalLM {
    /// Activation-based scores of every group kind over `input_ids`, summed over its
    /// sequences (see the module's table). Float arithmetic; no gradients are kept.
    ///
    /// # Shapes
    /// - input_ids: `[batch, seq]`
    pub fn activation_scores(
        &self,
        config: &LlamaConfig,
        input_ids: Tensor<2, Int>,
        stat: ActivationStat,
    ) -> GroupScores {
        let [_, seq] = input_ids.dims();
        let device = input_ids.device();
        let (cos, sin) = self.model.rope.tables(0, seq, &device);
        let bias = causal_bias(seq, seq, &device);
        let layers = self.model.layers.len();
        let mut hidden = vec![0.0; config.hidden_size];
        let (mut heads, mut groups, mut ffn, mut influence) = (
            Vec::with_capacity(layers),
            Vec::with_capacity(layers),
            Vec::with_capacity(layers),
            Vec::with_capacity(layers),
        );
        let mut x = self.model.embed_tokens.forward(input_ids);
        for layer in &self.model.layers {
            let attn = &layer.self_attn;
            let normed = layer.input_layernorm.forward(x.clone());
            add(&mut hidden, &reduce(normed.clone(), stat));
            let ctx = attn.context(normed, (&cos, &sin), bias.clone(), None);
            let [b, s, _] = ctx.dims();
            let (h, d) = (attn.num_heads, attn.head_dim);
            let norms = ctx
                .clone()
                .reshape([b, s, h, d])
                .powi_scalar(2)
                .sum_dim(3)
                .sqrt()
                .reshape([b, s, h]);
            let head = reduce(norms, stat);
            let g = h / attn.num_kv_heads;
            groups.push(head.chunks(g).map(|c| c.iter().sum()).collect());
            heads.push(head);
            let mid = x.clone() + attn.project(ctx);
            let normed = layer.post_attention_layernorm.forward(mid.clone());
            add(&mut hidden, &reduce(normed.clone(), stat));
            let gated = layer.mlp.gated(normed);
            ffn.push(reduce(gated.clone(), stat));
            let out = mid + layer.mlp.down(gated);
            influence.push(block_influence(x, out.clone()));
            x = out;
        }
        add(&mut hidden, &reduce(self.model.norm.forward(x), stat));
        GroupScores::from([
            ("heads".to_string(), heads),
            ("kv-groups".to_string(), groups),
            ("ffn".to_string(), ffn),
            ("hidden".to_string(), vec![hidden]),
            ("layers".to_string(), vec![influence]),
        ])
    }
}
