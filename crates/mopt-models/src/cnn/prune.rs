//! The plain CNN's dependency groups: a block's output channel is its convolution's output row,
//! its BatchNorm entry (γ the scale `bn-scale` reads, the running statistics carried) and the
//! input slice of what reads the block (the next convolution, or the classifier's row after the
//! last block). Pooling has no parameters. Scope: the block (`block.N`).

use mopt_core::prune::{GroupKind, Limit, Member, Prunable, Rule, UnitLimits};

use crate::limits::HIDDEN_MULTIPLE;

use super::{Cnn, CnnConfig};
use crate::norm::conv_bn_members;

/// A block's output channels.
pub struct Channels;

impl Prunable for Cnn {
    fn group_kinds() -> Vec<&'static dyn GroupKind<Config = CnnConfig>> {
        vec![&Channels]
    }
}

impl GroupKind for Channels {
    type Config = CnnConfig;
    fn name(&self) -> &'static str {
        "channels"
    }
    fn scopes(&self, c: &CnnConfig) -> usize {
        c.widths.len()
    }
    fn layer_scoped(&self) -> bool {
        false
    }
    fn scope_path(&self, b: usize) -> String {
        format!("block.{b}")
    }
    fn units(&self, c: &CnnConfig, b: usize) -> usize {
        c.widths[b]
    }
    fn members(&self, c: &CnnConfig, b: usize, u: usize) -> Vec<Member> {
        let mut m = conv_bn_members(&format!("blocks.{b}"), vec![u]);
        m.push(if b + 1 < c.widths.len() {
            Member::new(format!("blocks.{}.conv.weight", b + 1), 1, vec![u])
        } else {
            Member::new("classifier.weight", 0, vec![u])
        });
        m
    }
    fn resize(&self, c: &CnnConfig, keep: &[Vec<usize>]) -> CnnConfig {
        let mut out = c.clone();
        for (b, kept) in keep.iter().enumerate() {
            out.widths[b] = kept.len();
        }
        out
    }
    fn limits(&self) -> &'static [&'static Limit] {
        &[&HIDDEN_MULTIPLE]
    }
    /// Widths stay multiples of `hidden-multiple`.
    fn rule(&self, l: &UnitLimits) -> Rule {
        Rule::multiple_of_limit(&HIDDEN_MULTIPLE, l)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::module::Module;
    use burn::prelude::*;
    use mopt_core::prune::Keep;
    use mopt_core::{Checkpoint, ParamTable};

    /// Removing channels equals zeroing what reads them (eval mode), within 1e-5.
    #[test]
    fn pruned_channels_equal_the_masked_network() {
        let ad = Device::flex().autodiff();
        ad.seed(5);
        let c = CnnConfig::new(&[6, 8], 1, 8);
        let m = Cnn::new(&c, &ad);
        let x = Tensor::<4>::random(
            [8, 1, 8, 8],
            burn::tensor::Distribution::Normal(0.3, 1.5),
            &ad,
        );
        let _ = m.forward(x);
        let m = m.valid();
        let mut keep = Keep::new();
        keep.insert("channels".into(), vec![vec![0, 2, 3, 5], vec![1, 2, 6]]);
        let dev = Device::flex();
        let (pruned, pc) = mopt_prune::prune(&m, &c, &keep, &dev);
        assert_eq!(pc.widths, vec![4, 3]);
        let mut table = ParamTable::weights(&m);
        for (b, kept) in keep["channels"].iter().enumerate() {
            for u in (0..c.widths[b]).filter(|u| !kept.contains(u)) {
                let reader = Channels.members(&c, b, u).pop().unwrap();
                let a = table.0.get_mut(&reader.param).unwrap();
                let outer: usize = a.shape[..reader.axis].iter().product();
                let inner: usize = a.shape[reader.axis + 1..].iter().product();
                let len = a.shape[reader.axis];
                for o in 0..outer {
                    let start = (o * len + u) * inner;
                    a.data[start..start + inner].fill(0.0);
                }
            }
        }
        let masked = table.load_into(Cnn::init(&c, &dev)).unwrap();
        let x = Tensor::<4>::random(
            [3, 1, 8, 8],
            burn::tensor::Distribution::Normal(0.3, 1.5),
            &dev,
        );
        let (a, b) = (
            pruned.forward(x.clone()).into_data(),
            masked.forward(x).into_data(),
        );
        let (a, b): (Vec<f32>, Vec<f32>) = (a.try_to_vec().unwrap(), b.try_to_vec().unwrap());
        let err = a
            .iter()
            .zip(&b)
            .map(|(p, q)| (p - q).abs())
            .fold(0.0, f32::max);
        assert!(err < 1e-5, "pruned vs masked: {err}");
        assert_eq!(pruned.num_params(), pc.parameters() + 2 * (4 + 3));
    }
}
