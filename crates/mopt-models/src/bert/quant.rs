//! Quantizers on BERT's linear layers. Each quantizable `Linear` has an
//! `Option<LinearQuant>` beside it (`query` → `query_quant`); [`slots`] lists them by path
//! (`bert.encoder.layer.0.attention.self_attn.query`) so that placement patterns, calibration
//! and export see one list. LayerNorm, softmax and GELU stay float; the word and position
//! embedding tables can be stored as int8 with one scale per row
//! ([`Quantizable::embedding_tables`]).

use burn::module::Param;
use burn::prelude::*;
use mopt_core::quant::{QuantSlot as Slot, QuantSlotRef as SlotRef};
use mopt_core::Quantizable;
use mopt_quant::node::{Phase, QuantConfig};

use super::{BertConfig, BertForSequenceClassification};

impl Quantizable for BertForSequenceClassification {
    fn quantization(c: &BertConfig) -> Option<&QuantConfig> {
        c.mopt_quant.as_ref()
    }

    /// The pooler and the classifier: tiny, and right before the logits.
    fn default_float_paths() -> Vec<String> {
        vec!["bert.pooler.dense".into(), "classifier".into()]
    }

    fn with_quantization(c: &BertConfig, q: Option<QuantConfig>) -> BertConfig {
        BertConfig {
            mopt_quant: q,
            ..c.clone()
        }
    }

    fn quant_slots(&mut self) -> Vec<Slot<'_>> {
        slots(self)
    }

    fn quant_slots_ref(&self) -> Vec<SlotRef<'_>> {
        slots_ref(self)
    }

    /// The word and position tables (the token-type table has two rows).
    fn embedding_tables(&mut self) -> Vec<(String, &mut Param<Tensor<2>>)> {
        let e = &mut self.bert.embeddings;
        vec![
            (WORD_EMBEDDINGS.into(), &mut e.word_embeddings.weight),
            (
                POSITION_EMBEDDINGS.into(),
                &mut e.position_embeddings.weight,
            ),
        ]
    }
}

/// The word embedding table's module path.
pub const WORD_EMBEDDINGS: &str = "bert.embeddings.word_embeddings";
/// The position embedding table's module path.
pub const POSITION_EMBEDDINGS: &str = "bert.embeddings.position_embeddings";

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
            out.push(Slot::linear(format!("{p}.{name}"), linear, quant));
        }
    }
    let pooler = &mut model.bert.pooler;
    out.push(Slot::linear(
        "bert.pooler.dense".into(),
        &mut pooler.dense,
        &mut pooler.dense_quant,
    ));
    out.push(Slot::linear(
        "classifier".into(),
        &mut model.classifier,
        &mut model.classifier_quant,
    ));
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
            out.push(SlotRef::linear(format!("{p}.{name}"), linear, quant));
        }
    }
    out.push(SlotRef::linear(
        "bert.pooler.dense".into(),
        &model.bert.pooler.dense,
        &model.bert.pooler.dense_quant,
    ));
    out.push(SlotRef::linear(
        "classifier".into(),
        &model.classifier,
        &model.classifier_quant,
    ));
    out
}

impl BertForSequenceClassification {
    /// Quantizers (placeholder scales) on the layers `config.mopt_quant` lists, in `phase`;
    /// every other layer float. Without `mopt_quant` the model is returned as it is.
    pub fn with_quantizers(mut self, config: &BertConfig, phase: Phase, device: &Device) -> Self {
        if let Some(q) = &config.mopt_quant {
            self.attach_quantizers(q, phase, device);
        }
        self
    }
}

pub use mopt_core::quant::calibrate;

#[cfg(test)]
mod tests {
    use super::*;

    fn vals<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
    }

    pub fn int8(layers: Vec<String>) -> QuantConfig {
        QuantConfig::int8(8, layers)
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
        let paths = BertForSequenceClassification::linear_paths(&c);
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
