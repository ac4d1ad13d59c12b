//! Quantizers on the ResNet's convolutions and classifier. BatchNorm is folded into every
//! convolution first ([`ResNet::folded`]), so calibration and QAT see the weights the deployed
//! graph runs; each convolution then fake-quantizes its input (per tensor) and weight (per
//! output channel, axis 0 of `[out, in, k, k]`). A block's second convolution and its
//! projection shortcut also quantize their outputs, and an identity shortcut reads the input
//! as the block's first convolution quantizes it: ONNX Runtime then runs every convolution as
//! `QLinearConv` and the residual sums as `QLinearAdd`, on the values mopt computed. The stem
//! (one input channel) and the classifier stay float by default.

use mopt_core::quant::{QuantSlot as Slot, QuantSlotRef as SlotRef};
use mopt_core::Quantizable;
use mopt_quant::node::QuantConfig;

use super::{ResNet, ResNetConfig};

impl Quantizable for ResNet {
    fn quantization(c: &ResNetConfig) -> Option<&QuantConfig> {
        c.quant.as_ref()
    }

    /// A quantized config is a folded one.
    fn with_quantization(c: &ResNetConfig, q: Option<QuantConfig>) -> ResNetConfig {
        ResNetConfig {
            folded: c.folded || q.is_some(),
            quant: q,
            ..c.clone()
        }
    }

    /// The stem (one grey channel in, the most sensitive layer) and the classifier.
    fn default_float_paths() -> Vec<String> {
        vec!["stem".into(), "classifier".into()]
    }

    fn fold_for_quantization(self, c: &ResNetConfig) -> (Self, ResNetConfig) {
        let folded = ResNetConfig {
            folded: true,
            ..c.clone()
        };
        (self.folded(), folded)
    }

    /// Second convolutions and projection shortcuts: their outputs meet at the residual `Add`.
    fn quantized_outputs(layers: &[String]) -> Vec<String> {
        layers
            .iter()
            .filter(|p| p.ends_with(".conv2") || p.ends_with(".shortcut"))
            .cloned()
            .collect()
    }

    fn quant_slots(&mut self) -> Vec<Slot<'_>> {
        let mut out = vec![Slot::conv(
            "stem".into(),
            &mut self.stem.conv,
            &mut self.stem.quant,
        )];
        for (s, stage) in self.stages.iter_mut().enumerate() {
            for (b, block) in stage.iter_mut().enumerate() {
                let p = format!("stages.{s}.{b}");
                let c1 = &mut block.conv1;
                out.push(Slot::conv(
                    format!("{p}.conv1"),
                    &mut c1.conv,
                    &mut c1.quant,
                ));
                let c2 = &mut block.conv2;
                out.push(Slot::conv(
                    format!("{p}.conv2"),
                    &mut c2.conv,
                    &mut c2.quant,
                ));
                if let Some(sc) = &mut block.shortcut {
                    out.push(Slot::conv(
                        format!("{p}.shortcut"),
                        &mut sc.conv,
                        &mut sc.quant,
                    ));
                }
            }
        }
        out.push(Slot::linear(
            "classifier".into(),
            &mut self.classifier,
            &mut self.classifier_quant,
        ));
        out
    }

    fn quant_slots_ref(&self) -> Vec<SlotRef<'_>> {
        let mut out = vec![SlotRef::conv(
            "stem".into(),
            &self.stem.conv,
            &self.stem.quant,
        )];
        for (s, stage) in self.stages.iter().enumerate() {
            for (b, block) in stage.iter().enumerate() {
                let p = format!("stages.{s}.{b}");
                let (c1, c2) = (&block.conv1, &block.conv2);
                out.push(SlotRef::conv(format!("{p}.conv1"), &c1.conv, &c1.quant));
                out.push(SlotRef::conv(format!("{p}.conv2"), &c2.conv, &c2.quant));
                if let Some(sc) = &block.shortcut {
                    out.push(SlotRef::conv(format!("{p}.shortcut"), &sc.conv, &sc.quant));
                }
            }
        }
        out.push(SlotRef::linear(
            "classifier".into(),
            &self.classifier,
            &self.classifier_quant,
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use burn::module::Module;
    use burn::prelude::*;
    use mopt_core::quant::calibrate;
    use mopt_core::{Checkpoint, Quantizable};
    use mopt_quant::node::QuantConfig;

    use super::super::{ResNet, ResNetConfig};

    fn values(t: Tensor<2>) -> Vec<f32> {
        t.into_data().convert::<f32>().try_to_vec().unwrap()
    }

    fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    /// A two-stage net whose BatchNorms hold moved statistics (one training forward), and an
    /// input batch.
    fn trained_net() -> (ResNet, ResNetConfig, Tensor<4>) {
        let ad = Device::flex().autodiff();
        ad.seed(7);
        let c = ResNetConfig::new(&[4, 8], 1, 1, 6);
        let model = ResNet::new(&c, &ad);
        let x = Tensor::<4>::random(
            [6, 1, 6, 6],
            burn::tensor::Distribution::Normal(0.3, 1.5),
            &ad,
        );
        let _ = model.forward(x.clone());
        (model.valid(), c, x.inner())
    }

    #[test]
    fn folding_batchnorm_keeps_eval_logits_and_drops_the_batchnorms() {
        let (model, c, x) = trained_net();
        let before = values(model.forward(x.clone()));
        let (folded, fc) = model.fold_for_quantization(&c);
        assert!(fc.folded && folded.stem.bn.is_none() && folded.stem.conv.bias.is_some());
        assert_eq!(folded.num_params(), fc.parameters());
        let after = values(folded.forward(x));
        assert!(max_diff(&before, &after) < 1e-5, "{before:?} vs {after:?}");
    }

    /// Calibrated on the batch: per-output-channel conv weight scales, quantized outputs on the
    /// second convolution and the projection, logits near the float ones (not equal), and a
    /// saved and reloaded quantized network gives identical logits.
    #[test]
    fn calibrated_convolutions_save_and_reload_quantized() {
        let (model, c, x) = trained_net();
        let dev = Device::flex();
        let (folded, fc) = model.fold_for_quantization(&c);
        let float = values(folded.forward(x.clone()));
        let paths = ResNet::linear_paths(&fc);
        assert_eq!(
            paths,
            [
                "stem",
                "stages.0.0.conv1",
                "stages.0.0.conv2",
                "stages.1.0.conv1",
                "stages.1.0.conv2",
                "stages.1.0.shortcut",
                "classifier"
            ]
        );
        let layers: Vec<String> = paths[1..6].to_vec();
        let mut q = QuantConfig::int8(8, layers.clone());
        q.outputs = ResNet::quantized_outputs(&layers);
        assert_eq!(
            q.outputs,
            [
                "stages.0.0.conv2",
                "stages.1.0.conv2",
                "stages.1.0.shortcut"
            ]
        );
        let (m, unseen) = calibrate(folded, &q, &dev, |m| {
            let _ = m.forward(x.clone());
        });
        assert!(unseen.is_empty(), "{unseen:?}");
        let conv2 = m.stages[1][0].conv2.quant.as_ref().unwrap();
        assert_eq!(conv2.weight.scale.val().dims(), [8]);
        assert_eq!(conv2.weight.axis, Some(0));
        assert!(
            conv2.output.is_some()
                && m.stages[1][0]
                    .conv1
                    .quant
                    .as_ref()
                    .unwrap()
                    .output
                    .is_none()
        );
        assert!(m.stem.quant.is_none());
        let quantized = values(m.forward(x.clone()));
        let err = max_diff(&float, &quantized);
        assert!(err > 0.0 && err < 0.2, "quantization error {err}");
        let qc = ResNet::with_quantization(&fc, Some(q));
        let dir = tempfile::tempdir().unwrap();
        m.save(&qc, dir.path()).unwrap();
        let (back, bc) = ResNet::load(dir.path(), &dev).unwrap();
        assert_eq!(bc, qc);
        assert_eq!(values(back.forward(x)), quantized);
    }
}
