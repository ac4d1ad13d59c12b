//! The ResNet's dependency groups (Torch-Pruning's, for BasicBlocks). Burn's `Conv2d.weight` is
//! `[out, in, k, k]`, `Linear.weight` `[in, out]`; BatchNorm's `gamma`/`beta` are scored with
//! their channel (`gamma` as the scale the `bn-scale` criterion reads) and its running
//! statistics carried.
//!
//! Channel widths stay multiples of `hidden-multiple` in every scope (SIMD-friendly).
//!
//! - [`Channels`]: a block's inner channel: output `u` of its first convolution, its
//!   BatchNorm entry, input `u` of its second convolution. Scope: the block (`block.N`, counted
//!   over all stages).
//! - [`Residual`]: a stage's residual channel, tied across everything that writes or reads the
//!   stream: the stem (stage 0), every block's second convolution and BatchNorm, the projection
//!   shortcut and its BatchNorm, the first convolution (and projection) of every block that
//!   reads the stream, and the classifier's input row after the last stage. Identity shortcuts
//!   add the stream to itself, so they need no slicing. Scope: the stage (`stage.S`).
//!
//! - [`Blocks`]: a stage's blocks after its first (the first carries the stride and the
//!   projection), whole: both convolutions and BatchNorms go and the identity shortcut carries
//!   the stream past. Scope: the stage (`stage.S.blocks`); unit `u` is block `u + 1`.
//!
//! Removal slices exactly: a removed inner channel no longer reaches the second convolution, a
//! removed residual channel no longer reaches any reader, so the pruned network equals the
//! network with those reading weights zeroed (eval mode).

use mopt_core::prune::{GroupKind, Limit, Member, Prunable, Rule, UnitLimits};

use crate::limits::HIDDEN_MULTIPLE;
use mopt_core::ParamTable;

use crate::norm::conv_bn_members;

use super::{ResNet, ResNetConfig};

/// A block's inner channels.
pub struct Channels;
/// A stage's residual channels.
pub struct Residual;
/// A stage's removable blocks (all but its first).
pub struct Blocks;

impl Prunable for ResNet {
    /// Blocks last: their removal renumbers the blocks the other kinds slice.
    fn group_kinds() -> Vec<&'static dyn GroupKind<Config = ResNetConfig>> {
        vec![&Channels, &Residual, &Blocks]
    }
}

/// `(stage, block)` of block `n` counted over all stages.
fn locate(c: &ResNetConfig, mut n: usize) -> (usize, usize) {
    for (s, st) in c.stages.iter().enumerate() {
        if n < st.blocks.len() {
            return (s, n);
        }
        n -= st.blocks.len();
    }
    panic!("block {n} past the last stage")
}

/// A convolution-with-BatchNorm's output channel `u`.
fn conv_bn_out(path: &str, u: usize) -> Vec<Member> {
    conv_bn_members(path, vec![u])
}

fn block(s: usize, b: usize) -> String {
    format!("stages.{s}.{b}")
}

impl GroupKind for Channels {
    type Config = ResNetConfig;
    fn name(&self) -> &'static str {
        "channels"
    }
    fn scopes(&self, c: &ResNetConfig) -> usize {
        c.stages.iter().map(|s| s.blocks.len()).sum()
    }
    fn layer_scoped(&self) -> bool {
        false
    }
    fn scope_path(&self, s: usize) -> String {
        format!("block.{s}")
    }
    fn units(&self, c: &ResNetConfig, n: usize) -> usize {
        let (s, b) = locate(c, n);
        c.stages[s].blocks[b]
    }
    fn members(&self, c: &ResNetConfig, n: usize, u: usize) -> Vec<Member> {
        let (s, b) = locate(c, n);
        let p = block(s, b);
        let mut m = conv_bn_out(&format!("{p}.conv1"), u);
        m.push(Member::new(format!("{p}.conv2.conv.weight"), 1, vec![u]));
        m
    }
    fn resize(&self, c: &ResNetConfig, keep: &[Vec<usize>]) -> ResNetConfig {
        let mut out = c.clone();
        for (n, kept) in keep.iter().enumerate() {
            let (s, b) = locate(c, n);
            out.stages[s].blocks[b] = kept.len();
        }
        out
    }
    fn limits(&self) -> &'static [&'static Limit] {
        &[&HIDDEN_MULTIPLE]
    }
    fn rule(&self, l: &UnitLimits) -> Rule {
        Rule::multiple_of_limit(&HIDDEN_MULTIPLE, l)
    }
}

impl GroupKind for Residual {
    type Config = ResNetConfig;
    fn name(&self) -> &'static str {
        "residual"
    }
    fn scopes(&self, c: &ResNetConfig) -> usize {
        c.stages.len()
    }
    fn layer_scoped(&self) -> bool {
        false
    }
    fn scope_path(&self, s: usize) -> String {
        format!("stage.{s}")
    }
    fn units(&self, c: &ResNetConfig, s: usize) -> usize {
        c.stages[s].width
    }
    fn members(&self, c: &ResNetConfig, s: usize, u: usize) -> Vec<Member> {
        let mut m = Vec::new();
        // Writers of the stream.
        if s == 0 {
            m.extend(conv_bn_out("stem", u));
        }
        for b in 0..c.stages[s].blocks.len() {
            m.extend(conv_bn_out(&format!("{}.conv2", block(s, b)), u));
            if c.has_projection(s, b) {
                m.extend(conv_bn_out(&format!("{}.shortcut", block(s, b)), u));
            }
        }
        // Readers: the blocks after the first of this stage (and its first block for stage
        // 0, which reads the stem), the next stage's first block, or the classifier.
        let readers = |stage: usize, blocks: std::ops::Range<usize>, m: &mut Vec<Member>| {
            for b in blocks {
                let p = block(stage, b);
                m.push(Member::new(format!("{p}.conv1.conv.weight"), 1, vec![u]));
                if c.has_projection(stage, b) {
                    m.push(Member::new(format!("{p}.shortcut.conv.weight"), 1, vec![u]));
                }
            }
        };
        let first = usize::from(s > 0);
        readers(s, first..c.stages[s].blocks.len(), &mut m);
        if s + 1 < c.stages.len() {
            readers(s + 1, 0..1, &mut m);
        } else {
            m.push(Member::new("classifier.weight", 0, vec![u]));
        }
        m
    }
    fn resize(&self, c: &ResNetConfig, keep: &[Vec<usize>]) -> ResNetConfig {
        let mut out = c.clone();
        for (s, kept) in keep.iter().enumerate() {
            out.stages[s].width = kept.len();
        }
        out
    }
    fn limits(&self) -> &'static [&'static Limit] {
        &[&HIDDEN_MULTIPLE]
    }
    fn rule(&self, l: &UnitLimits) -> Rule {
        Rule::multiple_of_limit(&HIDDEN_MULTIPLE, l)
    }
}

/// Every tensor of block `b` of stage `s` (two convolutions with their BatchNorms; no
/// projection: only a stage's first block has one), whole.
fn block_members(c: &ResNetConfig, s: usize, b: usize) -> Vec<Member> {
    let p = block(s, b);
    let (inner, width) = (c.stages[s].blocks[b], c.stages[s].width);
    let mut m = conv_bn_members(&format!("{p}.conv1"), (0..inner).collect());
    m.extend(conv_bn_members(&format!("{p}.conv2"), (0..width).collect()));
    m
}

impl GroupKind for Blocks {
    type Config = ResNetConfig;
    fn name(&self) -> &'static str {
        "blocks"
    }
    fn scopes(&self, c: &ResNetConfig) -> usize {
        c.stages.len()
    }
    fn layer_scoped(&self) -> bool {
        false
    }
    fn scope_path(&self, s: usize) -> String {
        format!("stage.{s}.blocks")
    }
    fn units(&self, c: &ResNetConfig, s: usize) -> usize {
        c.stages[s].blocks.len() - 1
    }
    fn members(&self, c: &ResNetConfig, s: usize, u: usize) -> Vec<Member> {
        block_members(c, s, u + 1)
    }
    fn resize(&self, c: &ResNetConfig, keep: &[Vec<usize>]) -> ResNetConfig {
        let mut out = c.clone();
        for (s, kept) in keep.iter().enumerate() {
            let blocks = &c.stages[s].blocks;
            out.stages[s].blocks = std::iter::once(blocks[0])
                .chain(kept.iter().map(|&u| blocks[u + 1]))
                .collect();
        }
        out
    }
    /// Removed blocks' tensors go; the kept ones move up (`stages.S.3` → `stages.S.1`).
    fn shrink(&self, c: &ResNetConfig, table: &mut ParamTable, keep: &[Vec<usize>]) {
        let mut moved = Vec::new();
        for (s, kept) in keep.iter().enumerate() {
            for b in 1..c.stages[s].blocks.len() {
                let prefix = format!("{}.", block(s, b));
                let names: Vec<String> = table
                    .0
                    .keys()
                    .filter(|k| k.starts_with(&prefix))
                    .cloned()
                    .collect();
                let new = kept.iter().position(|&u| u + 1 == b).map(|k| k + 1);
                for name in names {
                    let a = table.0.remove(&name).expect("listed");
                    if let Some(k) = new {
                        moved.push((format!("{}.{}", block(s, k), &name[prefix.len()..]), a));
                    }
                }
            }
        }
        table.0.extend(moved);
    }
    /// A stage may lose every removable block.
    fn rule(&self, _: &UnitLimits) -> Rule {
        Rule {
            min_keep: 0,
            multiple: 1,
            ..Rule::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::module::Module;
    use burn::prelude::*;
    use mopt_core::prune::Keep;
    use mopt_core::{Checkpoint, ParamTable};

    fn values(t: Tensor<2>) -> Vec<f32> {
        t.into_data().convert::<f32>().try_to_vec().unwrap()
    }

    /// A two-stage ResNet (widths 6 and 8, two blocks each) whose BatchNorm statistics are
    /// non-trivial (one training-mode pass), in eval mode.
    fn trained() -> (ResNet, ResNetConfig) {
        let c = ResNetConfig::new(&[6, 8], 2, 1, 8);
        let ad = Device::flex().autodiff();
        ad.seed(3);
        let m = ResNet::new(&c, &ad);
        let x = Tensor::<4>::random(
            [16, 1, 8, 8],
            burn::tensor::Distribution::Normal(0.3, 1.5),
            &ad,
        );
        let _ = m.forward(x);
        (m.valid(), c)
    }

    /// Zero every removed unit's reading weights (what no longer reaches anything after removal).
    fn masked(model: &ResNet, c: &ResNetConfig, keep: &Keep) -> ResNet {
        let mut table = ParamTable::weights(model);
        let kinds: [&dyn GroupKind<Config = ResNetConfig>; 2] = [&Channels, &Residual];
        for kind in kinds {
            for (s, kept) in keep[kind.name()].iter().enumerate() {
                for u in (0..kind.units(c, s)).filter(|u| !kept.contains(u)) {
                    for m in kind.members(c, s, u) {
                        let reader = m.axis == 1 || m.param == "classifier.weight";
                        if !reader {
                            continue;
                        }
                        let a = table.0.get_mut(&m.param).unwrap();
                        let outer: usize = a.shape[..m.axis].iter().product();
                        let inner: usize = a.shape[m.axis + 1..].iter().product();
                        let len = a.shape[m.axis];
                        for o in 0..outer {
                            let start = (o * len + m.index[0]) * inner;
                            a.data[start..start + inner].fill(0.0);
                        }
                    }
                }
            }
        }
        table.load_into(ResNet::init(c, &Device::flex())).unwrap()
    }

    #[test]
    fn pruned_channels_and_residual_streams_equal_the_masked_network() {
        let (model, c) = trained();
        let mut keep = Keep::new();
        // Inner channels of the four blocks; residual channels of the two stages.
        keep.insert(
            "channels".into(),
            vec![
                vec![0, 2, 5],
                vec![1, 2, 3, 4],
                vec![0, 7],
                vec![2, 3, 4, 5, 6],
            ],
        );
        keep.insert("residual".into(), vec![vec![1, 2, 4], vec![0, 3, 5, 6, 7]]);
        let device = Device::flex();
        let (pruned, pc) = mopt_prune::prune(&model, &c, &keep, &device);
        assert_eq!(pc.stages[0].width, 3);
        assert_eq!(pc.stages[1].width, 5);
        assert_eq!(pc.stages[0].blocks, vec![3, 4]);
        assert_eq!(pc.stages[1].blocks, vec![2, 5]);
        assert_eq!(pc.parameters() + 2 * bn(&pc), pruned.num_params());
        let x = Tensor::<4>::random(
            [5, 1, 8, 8],
            burn::tensor::Distribution::Normal(0.3, 1.5),
            &device,
        );
        let want = values(masked(&model, &c, &keep).forward(x.clone()));
        let got = values(pruned.forward(x.clone()));
        let err = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(err < 1e-5, "pruned vs masked: {err}");
        // Not vacuous: the full network differs from the masked one.
        let full = values(model.forward(x));
        let moved = full
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(moved > 1e-3, "masking changed the logits ({moved})");
        // The pruned network saves and reloads with its own shape.
        let dir = tempfile::tempdir().unwrap();
        pruned.save(&pc, dir.path()).unwrap();
        let (back, bc) = ResNet::load(dir.path(), &device).unwrap();
        assert_eq!(bc, pc);
        let x = Tensor::<4>::ones([2, 1, 8, 8], &device);
        assert_eq!(values(back.forward(x.clone())), values(pruned.forward(x)));
    }

    /// Removing a stage's second block equals the network whose block adds nothing to the
    /// stream (its second BatchNorm's scale and shift zeroed: the identity shortcut carries the
    /// stream, already non-negative, through the ReLU unchanged); kept blocks move up.
    #[test]
    fn removed_blocks_equal_blocks_that_add_nothing() {
        let (model, c) = trained();
        let mut keep = Keep::new();
        keep.insert("blocks".into(), vec![vec![], vec![0]]);
        let device = Device::flex();
        let (pruned, pc) = mopt_prune::prune(&model, &c, &keep, &device);
        assert_eq!(pc.stages[0].blocks, vec![6]);
        assert_eq!(pc.stages[1].blocks, vec![8, 8]);
        assert_eq!(pc.parameters() + 2 * bn(&pc), pruned.num_params());
        let mut table = ParamTable::weights(&model);
        for t in ["gamma", "beta"] {
            table
                .0
                .get_mut(&format!("stages.0.1.conv2.bn.{t}"))
                .unwrap()
                .data
                .fill(0.0);
        }
        let silenced = table.load_into(ResNet::init(&c, &device)).unwrap();
        let x = Tensor::<4>::random(
            [5, 1, 8, 8],
            burn::tensor::Distribution::Normal(0.3, 1.5),
            &device,
        );
        let want = values(silenced.forward(x.clone()));
        let got = values(pruned.forward(x.clone()));
        let err = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(err < 1e-5, "pruned vs silenced: {err}");
        let full = values(model.forward(x));
        assert!(full.iter().zip(&want).any(|(a, b)| (a - b).abs() > 1e-3));
        // With channels pruned in the same step, the kept block carries its sliced widths.
        keep.insert(
            "channels".into(),
            vec![vec![0, 1], vec![0, 1, 2], vec![0], vec![1, 2]],
        );
        let (_, pc) = mopt_prune::prune(&model, &c, &keep, &device);
        assert_eq!(pc.stages[0].blocks, vec![2]);
        assert_eq!(pc.stages[1].blocks, vec![1, 2]);
    }

    /// BatchNorm channels (two running statistics each, which Burn counts as parameters).
    fn bn(c: &ResNetConfig) -> usize {
        let mut n = c.stages[0].width;
        for (s, st) in c.stages.iter().enumerate() {
            for (b, &inner) in st.blocks.iter().enumerate() {
                n += inner + st.width + if c.has_projection(s, b) { st.width } else { 0 };
            }
        }
        n
    }
}
