//! The Llama decoder's dependency groups (Minitron-style width and depth pruning).
//!
//! Burn's `Linear.weight` is `[d_in, d_out]`; the projections have no biases. With `d` the head
//! width and `g = heads / kv_heads` the query heads a key/value head serves (query head `j`
//! reads key/value head `j / g`, so a KV group's queries are consecutive), the five kinds, each
//! a [`GroupKind`], applied in this order by `mopt_prune::prune`:
//! - [`Heads`] (`heads`): one query head, columns `j·d..(j+1)·d` of `q_proj` and the same rows
//!   of `o_proj`. Scope: its layer; **units: the layer's query heads, `heads(l)`**, in
//!   `kv_heads(l)` runs of `g` (one a KV group, [`GroupKind::runs`]): the schedule keeps the same
//!   number in every group, each group its own best-scored heads, so `heads % kv_heads == 0`
//!   holds after every round. A count that is not a multiple of `kv_heads(l)` rounds to the
//!   nearest one (at least one query a group); `min-heads` counts the layer's query heads.
//! - [`KvGroups`] (`kv-groups`): a key/value head with its `g` query heads: columns
//!   `k·d..(k+1)·d` of `k_proj` and `v_proj`, columns `k·g·d..(k+1)·g·d` of `q_proj` and those
//!   rows of `o_proj`. Scope: its layer; units: `kv_heads(l)`. The group size stays `g`.
//! - [`Ffn`] (`ffn`): a SwiGLU channel, column `j` of `gate_proj` and `up_proj` and row `j` of
//!   `down_proj`. Scope: its layer; units: `ffn(l)`.
//! - [`Hidden`] (`hidden`): a residual-stream channel, everywhere it is read or written: column
//!   `i` of the embedding table (and so of the tied head), entry `i` of every RMSNorm weight
//!   (both of every layer and the final one), row `i` of every `q/k/v/gate/up_proj`, column `i`
//!   of every `o_proj` and `down_proj`, and row `i` of `lm_head` when the head is not tied. One
//!   scope; units: `hidden_size`. `head_dim` stays. RMSNorm divides by the root mean square of
//!   the kept channels, so removal is exact slicing, not the same function as zeroing them.
//! - [`Layers`] (`layers`): a whole decoder layer (every tensor under `model.layers.N.`); later
//!   layers are renumbered. One scope; units: `num_hidden_layers`.
//!
//! Unit indices of every kind refer to the input model: heads are removed first (each KV group
//! keeping as many), so that a KV group's queries are still consecutive when `kv-groups` slices
//! them with the shrunken group size.

use mopt_core::prune::{
    ActivationStat, GroupKind, GroupScores, Limit, Member, Prunable, Rule, UnitLimits,
};
use mopt_core::ParamTable;
use mopt_data::TokenWindows;

use super::{LlamaConfig, LlamaForCausalLM};
use crate::limits::{FFN_MULTIPLE, HIDDEN_MULTIPLE, MIN_HEADS};

fn layer(l: usize) -> String {
    format!("model.layers.{l}")
}

fn attn(l: usize, x: &str) -> String {
    format!("model.layers.{l}.self_attn.{x}_proj.weight")
}

fn mlp(l: usize, x: &str) -> String {
    format!("model.layers.{l}.mlp.{x}_proj.weight")
}

fn span(start: usize, len: usize) -> Vec<usize> {
    (start..start + len).collect()
}

/// Query heads inside their KV group.
pub struct Heads;
/// Key/value heads with their query heads.
pub struct KvGroups;
/// SwiGLU channels.
pub struct Ffn;
/// Residual-stream (hidden) channels.
pub struct Hidden;
/// Whole decoder layers.
pub struct Layers;

impl Prunable for LlamaForCausalLM {
    fn group_kinds() -> Vec<&'static dyn GroupKind<Config = LlamaConfig>> {
        vec![&Heads, &KvGroups, &Ffn, &Hidden, &Layers]
    }

    fn layers(c: &LlamaConfig) -> usize {
        c.num_hidden_layers
    }

    fn scores_activations() -> bool {
        true
    }

    /// Minitron's activation statistics (`super::activations`).
    fn activation_scores(
        &self,
        config: &LlamaConfig,
        batch: &TokenWindows,
        stat: ActivationStat,
    ) -> Option<GroupScores> {
        Some(LlamaForCausalLM::activation_scores(
            self,
            config,
            batch.inputs.clone(),
            stat,
        ))
    }
}

/// `c` with its per-layer widths written out, `head_dim` explicit (so that no later change of
/// `hidden_size` or the head counts moves it).
fn explicit(c: &LlamaConfig) -> LlamaConfig {
    LlamaConfig {
        head_dim: Some(c.head_dim()),
        mopt_layer_heads: Some(c.layer_heads()),
        mopt_layer_kv_heads: Some(c.layer_kv_heads()),
        mopt_layer_intermediate_sizes: Some(c.layer_ffn()),
        ..c.clone()
    }
}

/// The rule of the kinds scoped by layer: `min_keep` units, ignored layers left whole.
fn in_layers(min_keep: usize, limits: &UnitLimits) -> Rule {
    Rule {
        min_keep,
        multiple: 1,
        frozen_scopes: limits.ignore_layers.clone(),
        frozen_units: Vec::new(),
        limit: None,
    }
}

impl GroupKind for Heads {
    type Config = LlamaConfig;
    fn name(&self) -> &'static str {
        "heads"
    }
    fn scopes(&self, c: &LlamaConfig) -> usize {
        c.num_hidden_layers
    }
    fn scope_path(&self, l: usize) -> String {
        format!("{}.attention", layer(l))
    }
    fn units(&self, c: &LlamaConfig, l: usize) -> usize {
        c.heads(l)
    }
    /// One run a KV group.
    fn runs(&self, c: &LlamaConfig, l: usize) -> usize {
        c.kv_heads(l)
    }
    fn members(&self, c: &LlamaConfig, l: usize, j: usize) -> Vec<Member> {
        let d = c.head_dim();
        vec![
            Member::new(attn(l, "q"), 1, span(j * d, d)),
            Member::new(attn(l, "o"), 0, span(j * d, d)),
        ]
    }
    /// # Panics
    /// When a layer keeps unequal numbers of query heads in its KV groups (a `Keep` that did
    /// not come from the schedule, which keeps them equal).
    fn resize(&self, c: &LlamaConfig, keep: &[Vec<usize>]) -> LlamaConfig {
        for (l, kept) in keep.iter().enumerate() {
            let g = c.heads(l) / c.kv_heads(l);
            let per: Vec<usize> = (0..c.kv_heads(l))
                .map(|k| kept.iter().filter(|&&j| j / g == k).count())
                .collect();
            assert!(
                per.iter().all(|&n| n == per[0] && n > 0),
                "layer {l}: query heads kept per KV group {per:?} must be equal and at least one"
            );
        }
        LlamaConfig {
            mopt_layer_heads: Some(keep.iter().map(Vec::len).collect()),
            ..explicit(c)
        }
    }
    fn limits(&self) -> &'static [&'static Limit] {
        &[&MIN_HEADS]
    }
    fn rule(&self, l: &UnitLimits) -> Rule {
        Rule {
            limit: Some(MIN_HEADS.key),
            ..in_layers(l.get(&MIN_HEADS).max(1), l)
        }
    }
}

impl GroupKind for KvGroups {
    type Config = LlamaConfig;
    fn name(&self) -> &'static str {
        "kv-groups"
    }
    fn scopes(&self, c: &LlamaConfig) -> usize {
        c.num_hidden_layers
    }
    fn scope_path(&self, l: usize) -> String {
        format!("{}.kv-groups", layer(l))
    }
    fn units(&self, c: &LlamaConfig, l: usize) -> usize {
        c.kv_heads(l)
    }
    fn members(&self, c: &LlamaConfig, l: usize, k: usize) -> Vec<Member> {
        let d = c.head_dim();
        let g = c.heads(l) / c.kv_heads(l);
        vec![
            Member::new(attn(l, "k"), 1, span(k * d, d)),
            Member::new(attn(l, "v"), 1, span(k * d, d)),
            Member::new(attn(l, "q"), 1, span(k * g * d, g * d)),
            Member::new(attn(l, "o"), 0, span(k * g * d, g * d)),
        ]
    }
    fn resize(&self, c: &LlamaConfig, keep: &[Vec<usize>]) -> LlamaConfig {
        let heads = keep
            .iter()
            .enumerate()
            .map(|(l, kept)| kept.len() * (c.heads(l) / c.kv_heads(l)))
            .collect();
        LlamaConfig {
            mopt_layer_heads: Some(heads),
            mopt_layer_kv_heads: Some(keep.iter().map(Vec::len).collect()),
            ..explicit(c)
        }
    }
    fn rule(&self, l: &UnitLimits) -> Rule {
        in_layers(1, l)
    }
}

impl GroupKind for Ffn {
    type Config = LlamaConfig;
    fn name(&self) -> &'static str {
        "ffn"
    }
    fn scopes(&self, c: &LlamaConfig) -> usize {
        c.num_hidden_layers
    }
    fn scope_path(&self, l: usize) -> String {
        format!("{}.ffn", layer(l))
    }
    fn units(&self, c: &LlamaConfig, l: usize) -> usize {
        c.ffn(l)
    }
    fn members(&self, _: &LlamaConfig, l: usize, j: usize) -> Vec<Member> {
        vec![
            Member::new(mlp(l, "gate"), 1, vec![j]),
            Member::new(mlp(l, "up"), 1, vec![j]),
            Member::new(mlp(l, "down"), 0, vec![j]),
        ]
    }
    fn resize(&self, c: &LlamaConfig, keep: &[Vec<usize>]) -> LlamaConfig {
        LlamaConfig {
            mopt_layer_intermediate_sizes: Some(keep.iter().map(Vec::len).collect()),
            ..explicit(c)
        }
    }
    fn limits(&self) -> &'static [&'static Limit] {
        &[&FFN_MULTIPLE]
    }
    fn rule(&self, l: &UnitLimits) -> Rule {
        Rule {
            frozen_scopes: l.ignore_layers.clone(),
            ..Rule::multiple_of_limit(&FFN_MULTIPLE, l)
        }
    }
}

impl GroupKind for Hidden {
    type Config = LlamaConfig;
    fn name(&self) -> &'static str {
        "hidden"
    }
    fn scopes(&self, _: &LlamaConfig) -> usize {
        1
    }
    fn layer_scoped(&self) -> bool {
        false
    }
    fn scope_path(&self, _: usize) -> String {
        "hidden".into()
    }
    fn units(&self, c: &LlamaConfig, _: usize) -> usize {
        c.hidden_size
    }
    fn members(&self, c: &LlamaConfig, _: usize, i: usize) -> Vec<Member> {
        let mut m = vec![Member::new("model.embed_tokens.weight", 1, vec![i])];
        for l in 0..c.num_hidden_layers {
            let p = layer(l);
            m.push(Member::new(
                format!("{p}.input_layernorm.weight"),
                0,
                vec![i],
            ));
            for x in ["q", "k", "v"] {
                m.push(Member::new(attn(l, x), 0, vec![i]));
            }
            m.push(Member::new(attn(l, "o"), 1, vec![i]));
            m.push(Member::new(
                format!("{p}.post_attention_layernorm.weight"),
                0,
                vec![i],
            ));
            for x in ["gate", "up"] {
                m.push(Member::new(mlp(l, x), 0, vec![i]));
            }
            m.push(Member::new(mlp(l, "down"), 1, vec![i]));
        }
        m.push(Member::new("model.norm.weight", 0, vec![i]));
        if !c.tie_word_embeddings {
            m.push(Member::new("lm_head.weight", 0, vec![i]));
        }
        m
    }
    fn resize(&self, c: &LlamaConfig, keep: &[Vec<usize>]) -> LlamaConfig {
        LlamaConfig {
            hidden_size: keep[0].len(),
            ..explicit(c)
        }
    }
    fn limits(&self) -> &'static [&'static Limit] {
        &[&HIDDEN_MULTIPLE]
    }
    fn rule(&self, l: &UnitLimits) -> Rule {
        Rule::multiple_of_limit(&HIDDEN_MULTIPLE, l)
    }
}

/// The tensors of layer `l` and their first-axis lengths.
fn layer_tensors(c: &LlamaConfig, l: usize) -> Vec<(String, usize)> {
    let (h, q, f) = (c.hidden_size, c.heads(l) * c.head_dim(), c.ffn(l));
    let p = layer(l);
    vec![
        (attn(l, "q"), h),
        (attn(l, "k"), h),
        (attn(l, "v"), h),
        (attn(l, "o"), q),
        (mlp(l, "gate"), h),
        (mlp(l, "up"), h),
        (mlp(l, "down"), f),
        (format!("{p}.input_layernorm.weight"), h),
        (format!("{p}.post_attention_layernorm.weight"), h),
    ]
}

impl GroupKind for Layers {
    type Config = LlamaConfig;
    fn name(&self) -> &'static str {
        "layers"
    }
    fn scopes(&self, _: &LlamaConfig) -> usize {
        1
    }
    fn layer_scoped(&self) -> bool {
        false
    }
    fn scope_path(&self, _: usize) -> String {
        "model.layers".into()
    }
    fn units(&self, c: &LlamaConfig, _: usize) -> usize {
        c.num_hidden_layers
    }
    fn members(&self, c: &LlamaConfig, _: usize, l: usize) -> Vec<Member> {
        layer_tensors(c, l)
            .into_iter()
            .map(|(name, n)| Member::new(name, 0, span(0, n)))
            .collect()
    }
    fn resize(&self, c: &LlamaConfig, keep: &[Vec<usize>]) -> LlamaConfig {
        let kept = &keep[0];
        let pick = |v: Vec<usize>| Some(kept.iter().map(|&l| v[l]).collect());
        LlamaConfig {
            num_hidden_layers: kept.len(),
            head_dim: Some(c.head_dim()),
            mopt_layer_heads: pick(c.layer_heads()),
            mopt_layer_kv_heads: pick(c.layer_kv_heads()),
            mopt_layer_intermediate_sizes: pick(c.layer_ffn()),
            ..c.clone()
        }
    }
    /// Removed layers' tensors go; kept layer `keep[0][k]` becomes layer `k`.
    fn shrink(&self, c: &LlamaConfig, table: &mut ParamTable, keep: &[Vec<usize>]) {
        let mut moved = Vec::new();
        for l in 0..c.num_hidden_layers {
            let prefix = format!("{}.", layer(l));
            let names: Vec<String> = table
                .0
                .keys()
                .filter(|k| k.starts_with(&prefix))
                .cloned()
                .collect();
            let new = keep[0].iter().position(|&k| k == l);
            for name in names {
                let a = table.0.remove(&name).expect("listed");
                if let Some(k) = new {
                    moved.push((format!("{}.{}", layer(k), &name[prefix.len()..]), a));
                }
            }
        }
        table.0.extend(moved);
    }
    fn rule(&self, l: &UnitLimits) -> Rule {
        Rule {
            min_keep: 1,
            multiple: 1,
            frozen_scopes: Vec::new(),
            frozen_units: l.ignore_layers.clone(),
            limit: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_name_the_model_parameters_with_their_lengths() {
        for tied in [true, false] {
            let c = LlamaConfig {
                tie_word_embeddings: tied,
                ..LlamaConfig::tiny(50)
            };
            let m = LlamaForCausalLM::new(&c, &burn::prelude::Device::flex());
            let t = ParamTable::weights(&m);
            let mut seen = std::collections::BTreeSet::new();
            for kind in LlamaForCausalLM::group_kinds() {
                for s in 0..kind.scopes(&c) {
                    for u in 0..kind.units(&c, s) {
                        for mb in kind.members(&c, s, u) {
                            let a = t.get(&mb.param);
                            let len = a.shape[mb.axis];
                            assert!(mb.index.iter().all(|&i| i < len), "{mb:?} of {len}");
                            seen.insert(mb.param);
                        }
                    }
                }
            }
            // Every parameter belongs to some group (the hidden channels reach all of them).
            let all: std::collections::BTreeSet<String> = t.0.keys().cloned().collect();
            assert_eq!(seen, all);
            assert_eq!(all.contains("lm_head.weight"), !tied);
        }
    }

    #[test]
    fn a_layer_keeps_its_kv_groups_query_heads_together() {
        let c = LlamaConfig::tiny(50); // 4 query heads of 8 over 2 KV heads: g = 2
        let m = KvGroups.members(&c, 1, 1);
        assert_eq!(m[0].param, "model.layers.1.self_attn.k_proj.weight");
        assert_eq!((m[0].axis, m[0].index.clone()), (1, span(8, 8)));
        assert_eq!((m[2].axis, m[2].index.clone()), (1, span(16, 16)));
        assert_eq!((m[3].axis, m[3].index.clone()), (0, span(16, 16)));
        assert_eq!(Heads.runs(&c, 0), 2);
        let r = KvGroups.resize(&c, &[vec![0, 1], vec![1]]);
        assert_eq!(
            (r.layer_heads(), r.layer_kv_heads()),
            (vec![4, 2], vec![2, 1])
        );
        assert!(r.check().is_ok());
    }

    #[test]
    #[should_panic(expected = "query heads kept per KV group [2, 0]")]
    fn unequal_groups_are_refused() {
        let c = LlamaConfig::tiny(50);
        Heads.resize(&c, &[vec![0, 1], vec![0, 2]]);
    }
}
