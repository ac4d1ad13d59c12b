//! Quantizers on the Llama decoder's projections: the seven of every layer, each an
//! `Option<LinearQuant>` beside its `Linear` (`q_proj` → `q_proj_quant`), listed by module path
//! in forward order — `model.layers.{i}.self_attn.{q,k,v,o}_proj`, then
//! `model.layers.{i}.mlp.{gate,up,down}_proj` — the paths of the pruning groups' members
//! without their `.weight`. The `ptq` / `qat` stage kinds read that list; the quantization is
//! recorded in the config (`mopt_quant`), so a quantized checkpoint reloads quantized.
//!
//! What stays float: the RMSNorms, RoPE, the attention's scores and softmax, SiLU, the
//! embedding table, and the head. The head is no slot, tied or not: a tied head is the
//! embedding table (no `Linear` to quantize), and keeping an untied `lm_head` float too makes
//! tied and untied models quantize the same projections. It cannot be a slot kept float by
//! [`Quantizable::default_float_paths`] instead, because the stages check every `exclude`
//! pattern, the default ones included, against the model's slots, and a tied model has no
//! `lm_head`.

use mopt_core::quant::{QuantSlot as Slot, QuantSlotRef as SlotRef};
use mopt_core::smooth::{SmoothGroup, SmoothProducer};
use mopt_core::Quantizable;
use mopt_quant::node::QuantConfig;

use super::config::LlamaConfig;
use super::model::LlamaForCausalLM;

impl Quantizable for LlamaForCausalLM {
    fn quantization(c: &LlamaConfig) -> Option<&QuantConfig> {
        c.mopt_quant.as_ref()
    }

    fn with_quantization(c: &LlamaConfig, q: Option<QuantConfig>) -> LlamaConfig {
        LlamaConfig {
            mopt_quant: q,
            ..c.clone()
        }
    }

    /// Four groups a layer, `k = 4 · layer + g`: the input RMSNorm's gain into `q`, `k`,
    /// `v`; `v`'s output columns into `o` (query head `h`'s columns read value head
    /// `h / (heads / kv_heads)`); the post-attention RMSNorm's gain into `gate`, `up`; `up`'s
    /// output columns into `down` (SwiGLU's product is linear in `up`).
    fn smoothing_group(&mut self, k: usize) -> Option<SmoothGroup<'_>> {
        let i = k / 4;
        let layer = self.model.layers.get_mut(i)?;
        let (a, f) = (&mut layer.self_attn, &mut layer.mlp);
        let path = |name: &str| slot_path(i, name);
        Some(match k % 4 {
            0 => SmoothGroup {
                producer_path: path("input_layernorm"),
                producer: SmoothProducer::Gain(&mut layer.input_layernorm.weight),
                consumers: vec![
                    (path("self_attn.q_proj"), &mut a.q_proj.weight),
                    (path("self_attn.k_proj"), &mut a.k_proj.weight),
                    (path("self_attn.v_proj"), &mut a.v_proj.weight),
                ],
                channel_map: None,
            },
            1 => {
                let (h, kv, d) = (a.num_heads, a.num_kv_heads, a.head_dim);
                let group = (h / kv.max(1)).max(1);
                let map = (0..h * d).map(|c| (c / d / group) * d + c % d).collect();
                SmoothGroup {
                    producer_path: path("self_attn.v_proj"),
                    producer: SmoothProducer::Columns(&mut a.v_proj.weight),
                    consumers: vec![(path("self_attn.o_proj"), &mut a.o_proj.weight)],
                    channel_map: Some(map),
                }
            }
            2 => SmoothGroup {
                producer_path: path("post_attention_layernorm"),
                producer: SmoothProducer::Gain(&mut layer.post_attention_layernorm.weight),
                consumers: vec![
                    (path("mlp.gate_proj"), &mut f.gate_proj.weight),
                    (path("mlp.up_proj"), &mut f.up_proj.weight),
                ],
                channel_map: None,
            },
            _ => SmoothGroup {
                producer_path: path("mlp.up_proj"),
                producer: SmoothProducer::Columns(&mut f.up_proj.weight),
                consumers: vec![(path("mlp.down_proj"), &mut f.down_proj.weight)],
                channel_map: None,
            },
        })
    }

    fn quant_slots(&mut self) -> Vec<Slot<'_>> {
        let mut out = Vec::new();
        for (i, layer) in self.model.layers.iter_mut().enumerate() {
            let (a, f) = (&mut layer.self_attn, &mut layer.mlp);
            for (name, linear, quant) in [
                ("self_attn.q_proj", &mut a.q_proj, &mut a.q_proj_quant),
                ("self_attn.k_proj", &mut a.k_proj, &mut a.k_proj_quant),
                ("self_attn.v_proj", &mut a.v_proj, &mut a.v_proj_quant),
                ("self_attn.o_proj", &mut a.o_proj, &mut a.o_proj_quant),
                ("mlp.gate_proj", &mut f.gate_proj, &mut f.gate_proj_quant),
                ("mlp.up_proj", &mut f.up_proj, &mut f.up_proj_quant),
                ("mlp.down_proj", &mut f.down_proj, &mut f.down_proj_quant),
            ] {
                out.push(Slot::linear(slot_path(i, name), linear, quant));
            }
        }
        out
    }

    fn quant_slots_ref(&self) -> Vec<SlotRef<'_>> {
        let mut out = Vec::new();
        for (i, layer) in self.model.layers.iter().enumerate() {
            let (a, f) = (&layer.self_attn, &layer.mlp);
            for (name, linear, quant) in [
                ("self_attn.q_proj", &a.q_proj, &a.q_proj_quant),
                ("self_attn.k_proj", &a.k_proj, &a.k_proj_quant),
                ("self_attn.v_proj", &a.v_proj, &a.v_proj_quant),
                ("self_attn.o_proj", &a.o_proj, &a.o_proj_quant),
                ("mlp.gate_proj", &f.gate_proj, &f.gate_proj_quant),
                ("mlp.up_proj", &f.up_proj, &f.up_proj_quant),
                ("mlp.down_proj", &f.down_proj, &f.down_proj_quant),
            ] {
                out.push(SlotRef::linear(slot_path(i, name), linear, quant));
            }
        }
        out
    }
}

/// The module path of projection `name` (`self_attn.q_proj`) of layer `i`.
fn slot_path(i: usize, name: &str) -> String {
    format!("model.layers.{i}.{name}")
}

#[cfg(test)]
mod tests {
    use burn::prelude::*;

    use super::*;

    #[test]
    fn seven_slots_a_layer_named_by_module_path() {
        let c = LlamaConfig {
            tie_word_embeddings: false,
            ..LlamaConfig::tiny(50)
        };
        let paths = LlamaForCausalLM::linear_paths(&c);
        assert_eq!(paths.len(), 2 * 7);
        assert_eq!(paths[0], "model.layers.0.self_attn.q_proj");
        assert_eq!(paths[13], "model.layers.1.mlp.down_proj");
        // A float config builds no quantizers; one that records a quantization rebuilds them.
        let dev = Device::flex();
        assert!(!LlamaForCausalLM::new(&c, &dev).is_quantized());
        let q = QuantConfig::int8(8, paths[..3].to_vec());
        let m = LlamaForCausalLM::new(&LlamaForCausalLM::with_quantization(&c, Some(q)), &dev);
        let on: Vec<bool> = m
            .quant_slots_ref()
            .iter()
            .map(|s| s.quant.is_some())
            .collect();
        assert_eq!(on.iter().filter(|&&x| x).count(), 3);
        assert!(on[..3].iter().all(|&x| x));
    }
}
