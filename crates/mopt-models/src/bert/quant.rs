//! Quantizers on BERT's linear layers. Each quantizable `Linear` has an
//! `Option<LinearQuant>` beside it (`query` → `query_quant`); [`slots`] lists them by path
//! (`bert.encoder.layer.0.attention.self_attn.query`) so that placement patterns, calibration
//! and export see one list. LayerNorm, softmax, GELU and the embeddings stay float.

use burn::nn::Linear;
use burn::prelude::*;
use mopt_quant::node::{LinearQuant, Phase, QuantConfig};

use super::{BertConfig, BertForSequenceClassification};

/// One quantizable linear layer: its path, the layer and its quantizers.
pub struct Slot<'a> {
    pub path: String,
    pub linear: &'a mut Linear,
    pub quant: &'a mut Option<LinearQuant>,
}

/// One quantizable linear layer, read-only.
pub struct SlotRef<'a> {
    pub path: String,
    pub linear: &'a Linear,
    pub quant: &'a Option<LinearQuant>,
}

/// Every quantizable linear layer of `model`, in forward order.
pub fn slots(model: &mut BertForSequenceClassification) -> Vec<Slot<'_>> {
    let mut out = Vec::new();
    for (l, layer) in model.bert.encoder.layer.iter_mut().enumerate() {
        let p = format!("bert.encoder.layer.{l}");
        let sa = &mut layer.attention.self_attn;
        let ao = &mut layer.attention.output;
        let (it, o) = (&mut layer.intermediate, &mut layer.output);
        for (name, linear, quant) in [
            (
                "attention.self_attn.query",
                &mut sa.query,
                &mut sa.query_quant,
            ),
            ("attention.self_attn.key", &mut sa.key, &mut sa.key_quant),
            (
                "attention.self_attn.value",
                &mut sa.value,
                &mut sa.value_quant,
            ),
            ("attention.output.dense", &mut ao.dense, &mut ao.dense_quant),
            ("intermediate.dense", &mut it.dense, &mut it.dense_quant),
            ("output.dense", &mut o.dense, &mut o.dense_quant),
        ] {
            out.push(Slot {
                path: format!("{p}.{name}"),
                linear,
                quant,
            });
        }
    }
    let pooler = &mut model.bert.pooler;
    out.push(Slot {
        path: "bert.pooler.dense".into(),
        linear: &mut pooler.dense,
        quant: &mut pooler.dense_quant,
    });
    out.push(Slot {
        path: "classifier".into(),
        linear: &mut model.classifier,
        quant: &mut model.classifier_quant,
    });
    out
}

/// [`slots`], read-only.
pub fn slots_ref(model: &BertForSequenceClassification) -> Vec<SlotRef<'_>> {
    let mut out = Vec::new();
    for (l, layer) in model.bert.encoder.layer.iter().enumerate() {
        let p = format!("bert.encoder.layer.{l}");
        let sa = &layer.attention.self_attn;
        for (name, linear, quant) in [
            ("attention.self_attn.query", &sa.query, &sa.query_quant),
            ("attention.self_attn.key", &sa.key, &sa.key_quant),
            ("attention.self_attn.value", &sa.value, &sa.value_quant),
            (
                "attention.output.dense",
                &layer.attention.output.dense,
                &layer.attention.output.dense_quant,
            ),
            (
                "intermediate.dense",
                &layer.intermediate.dense,
                &layer.intermediate.dense_quant,
            ),
            (
                "output.dense",
                &layer.output.dense,
                &layer.output.dense_quant,
            ),
        ] {
            out.push(SlotRef {
                path: format!("{p}.{name}"),
                linear,
                quant,
            });
        }
    }
    out.push(SlotRef {
        path: "bert.pooler.dense".into(),
        linear: &model.bert.pooler.dense,
        quant: &model.bert.pooler.dense_quant,
    });
    out.push(SlotRef {
        path: "classifier".into(),
        linear: &model.classifier,
        quant: &model.classifier_quant,
    });
    out
}

/// The paths of every quantizable linear layer of a model of shape `config`.
pub fn linear_paths(config: &BertConfig) -> Vec<String> {
    let mut m = BertForSequenceClassification::new(
        &BertConfig {
            mopt_quant: None,
            ..config.clone()
        },
        &Device::flex(),
    );
    slots(&mut m).into_iter().map(|s| s.path).collect()
}

impl BertForSequenceClassification {
    /// Quantizers (placeholder scales) on the layers `config.mopt_quant` lists, in `phase`;
    /// every other layer float. Without `mopt_quant` the model is returned as it is.
    pub fn with_quantizers(mut self, config: &BertConfig, phase: Phase, device: &Device) -> Self {
        if let Some(q) = &config.mopt_quant {
            attach(&mut self, q, phase, device);
        }
        self
    }

    /// For inference: every quantized weight replaced by its fake-quantized value (what each
    /// forward pass would compute from it) and its weight quantizer switched off, so that a
    /// forward pass no longer re-quantizes every weight. Outputs are identical; inputs are
    /// still fake-quantized. Not for training (the STE needs the float weights). The weight
    /// quantizers' phase is shared with clones of this model.
    pub fn with_baked_weights(mut self) -> Self {
        for s in slots(&mut self) {
            if let Some(q) = s.quant.as_ref() {
                if q.weight.phase() == Phase::Quantize {
                    let w = q.weight.forward(s.linear.weight.val());
                    s.linear.weight = burn::module::Param::from_tensor(w);
                    q.weight.set_phase(Phase::Off);
                }
            }
        }
        self
    }

    /// Whether any layer is quantized.
    pub fn is_quantized(&self) -> bool {
        slots_ref(self).iter().any(|s| s.quant.is_some())
    }

    /// Put every quantizer in `phase` (inputs and weights).
    pub fn set_quant_phase(&self, phase: Phase) {
        for s in slots_ref(self) {
            if let Some(q) = s.quant {
                q.input.set_phase(phase);
                q.weight.set_phase(phase);
            }
        }
    }
}

/// Quantizers (placeholder scales) on the layers `q.layers` lists; the others float.
pub fn attach(
    model: &mut BertForSequenceClassification,
    q: &QuantConfig,
    phase: Phase,
    device: &Device,
) {
    for s in slots(model) {
        let d_out = s.linear.weight.val().dims()[1];
        *s.quant = q.linear(&s.path, d_out, phase, device);
    }
}

/// Post-training calibration: quantizers on the layers `q.layers` lists, inputs observed over
/// the forward passes `feed` runs (on the float model: weights stay float meanwhile), then
/// frozen; weights get per-channel (or per-tensor) min-max scales. Returns the model in phase
/// `Quantize` and the paths whose input saw no data (left at their placeholder scale).
pub fn calibrate(
    mut model: BertForSequenceClassification,
    q: &QuantConfig,
    device: &Device,
    feed: impl FnOnce(&BertForSequenceClassification),
) -> (BertForSequenceClassification, Vec<String>) {
    attach(&mut model, q, Phase::Observe, device);
    for s in slots_ref(&model) {
        if let Some(lq) = s.quant {
            lq.weight.set_phase(Phase::Off);
        }
    }
    feed(&model);
    let mut unseen = Vec::new();
    for s in slots(&mut model) {
        if let Some(lq) = s.quant.take() {
            let (input, seen) = lq.input.freeze(&q.activation);
            if !seen {
                unseen.push(s.path.clone());
            }
            let weight = lq
                .weight
                .calibrate_weight(&s.linear.weight.val(), &q.weight);
            *s.quant = Some(LinearQuant { input, weight });
        }
    }
    (model, unseen)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mopt_quant::observer::ObserverKind;
    use mopt_quant::scheme::{Granularity, IntFormat, QuantScheme};

    fn vals<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
    }

    pub fn int8(layers: Vec<String>) -> QuantConfig {
        QuantConfig {
            weight: QuantScheme {
                format: IntFormat::INT8,
                symmetric: true,
                granularity: Granularity::PerChannel(1),
            },
            activation: QuantScheme {
                format: IntFormat::UINT8,
                symmetric: false,
                granularity: Granularity::PerTensor,
            },
            learned_scales: false,
            observer: ObserverKind::MinMax,
            layers,
        }
    }

    fn batch(dev: &Device, seed: i64) -> [Tensor<2, Int>; 2] {
        let ids: Vec<i64> = (0..32).map(|i| 1 + (i * 7 + seed * 13) % 99).collect();
        [
            Tensor::from_data(TensorData::new(ids, [4, 8]), dev),
            Tensor::zeros([4, 8], dev),
        ]
    }

    fn logits(m: &BertForSequenceClassification, dev: &Device) -> Vec<f32> {
        let [ids, types] = batch(dev, 0);
        vals(m.forward(ids, Tensor::ones([4, 8], dev), types))
    }

    #[test]
    fn calibrated_int8_is_close_to_float_and_reloads_to_identical_logits() {
        let dev = Device::flex();
        let mut c = BertConfig::tiny(100, 2);
        c.hidden_dropout_prob = 0.0;
        c.attention_probs_dropout_prob = 0.0;
        dev.seed(5);
        let float = BertForSequenceClassification::new(&c, &dev);
        let paths = linear_paths(&c);
        assert_eq!(paths.len(), 2 * 6 + 2);
        // Everything but the classifier (a path can stay float).
        let q = int8(paths[..paths.len() - 1].to_vec());
        let (m, unseen) = calibrate(float.clone(), &q, &dev, |m| {
            for seed in 0..3 {
                let [ids, types] = batch(&dev, seed);
                let _ = m.forward(ids, Tensor::ones([4, 8], &dev), types);
            }
        });
        assert!(unseen.is_empty());
        assert!(m.classifier_quant.is_none() && m.bert.pooler.dense_quant.is_some());
        let (lf, lq) = (logits(&float, &dev), logits(&m, &dev));
        let err = lf
            .iter()
            .zip(&lq)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(err > 0.0 && err < 0.05, "int8 vs float {err}");
        // The quantizer's scale is what the observer range gives.
        let s = &m.bert.encoder.layer[0]
            .intermediate
            .dense_quant
            .as_ref()
            .unwrap();
        assert_eq!(s.weight.scale.val().dims(), [64]);
        // Saved with its config, it reloads with the same scales and identical logits.
        let dir = std::env::temp_dir().join(format!("mopt-quant-reload-{}", std::process::id()));
        let qc = BertConfig {
            mopt_quant: Some(q.clone()),
            ..c.clone()
        };
        super::super::weights::save_checkpoint(&m, &qc, &dir).unwrap();
        let (r, rc) = super::super::weights::load_checkpoint(&dir, &dev).unwrap();
        assert_eq!(rc.mopt_quant, Some(q));
        assert!(r.is_quantized());
        assert_eq!(logits(&r, &dev), lq);
        // Baked weights give the same logits without re-quantizing the weights.
        let baked = r.with_baked_weights();
        assert_eq!(logits(&baked, &dev), lq);
        assert!(slots_ref(&baked)
            .iter()
            .filter_map(|s| s.quant.as_ref())
            .all(|q| q.weight.phase() == Phase::Off));
        std::fs::remove_dir_all(&dir).ok();
        // A float checkpoint loads into the float model as before (no quantizers).
        assert!(!float.is_quantized());
    }
}
