//! The quantizable contract: the layers that take fake-quantization nodes. A family lists its
//! quantizable layers once ([`Quantizable::quant_slots`]), each an `Option<LinearQuant>` beside
//! its `Linear` (`query` → `query_quant`), in forward order; placement patterns, calibration,
//! QAT, weight baking and the QDQ exporter all read that one list. (Convolutions take the same
//! place with a 4-D per-output-channel weight once a family has them.)

use burn::module::Param;
use burn::nn::Linear;
use burn::prelude::*;
use mopt_quant::node::{LinearQuant, Phase, QuantConfig};

use crate::model::Checkpoint;

/// One quantizable linear layer: its module path, the layer and its quantizers.
pub struct QuantSlot<'a> {
    pub path: String,
    pub linear: &'a mut Linear,
    pub quant: &'a mut Option<LinearQuant>,
}

/// One quantizable linear layer, read-only.
pub struct QuantSlotRef<'a> {
    pub path: String,
    pub linear: &'a Linear,
    pub quant: &'a Option<LinearQuant>,
}

/// A model whose linear layers take quantizers. Implement the two slot lists and where the
/// config records the quantization (so that a quantized checkpoint reloads quantized); the rest
/// is provided.
pub trait Quantizable: Checkpoint {
    /// The quantization the config records (`None`: a float model).
    fn quantization(config: &Self::Config) -> Option<&QuantConfig>;

    /// `config` recording `q` (`None`: the float model's config).
    fn with_quantization(config: &Self::Config, q: Option<QuantConfig>) -> Self::Config;

    /// Layers kept float unless a recipe says otherwise (layers right before the logits, say).
    /// None by default.
    fn default_float_paths() -> Vec<String> {
        Vec::new()
    }

    /// The quantizable layers' paths of a model shaped `config` (built on the CPU to list them).
    fn linear_paths(config: &Self::Config) -> Vec<String> {
        let float = Self::with_quantization(config, None);
        Self::init(&float, &Device::flex()).quant_paths()
    }

    /// Every quantizable linear layer, in forward order.
    fn quant_slots(&mut self) -> Vec<QuantSlot<'_>>;

    /// [`quant_slots`](Quantizable::quant_slots), read-only.
    fn quant_slots_ref(&self) -> Vec<QuantSlotRef<'_>>;

    /// The paths of the quantizable layers.
    fn quant_paths(&self) -> Vec<String> {
        self.quant_slots_ref().into_iter().map(|s| s.path).collect()
    }

    /// Quantizers (placeholder scales) on the layers `q.layers` lists, in `phase`; the others
    /// float.
    fn attach_quantizers(&mut self, q: &QuantConfig, phase: Phase, device: &Device) {
        for s in self.quant_slots() {
            let d_out = s.linear.weight.val().dims()[1];
            *s.quant = q.linear(&s.path, d_out, phase, device);
        }
    }

    /// Whether any layer is quantized.
    fn is_quantized(&self) -> bool {
        self.quant_slots_ref().iter().any(|s| s.quant.is_some())
    }

    /// Put every quantizer in `phase` (inputs and weights).
    fn set_quant_phase(&self, phase: Phase) {
        for s in self.quant_slots_ref() {
            if let Some(q) = s.quant {
                q.input.set_phase(phase);
                q.weight.set_phase(phase);
            }
        }
    }

    /// For inference: every quantized weight replaced by its fake-quantized value and its
    /// weight quantizer switched off, so that a forward pass no longer re-quantizes every
    /// weight. Outputs are identical; inputs are still fake-quantized. Not for training (the
    /// straight-through estimator needs the float weights).
    fn with_baked_weights(mut self) -> Self {
        for s in self.quant_slots() {
            if let Some(q) = s.quant.as_ref() {
                if q.weight.phase() == Phase::Quantize {
                    let w = q.weight.forward(s.linear.weight.val());
                    s.linear.weight = Param::from_tensor(w);
                    q.weight.set_phase(Phase::Off);
                }
            }
        }
        self
    }
}

/// Post-training calibration: quantizers on the layers `q.layers` lists, inputs observed over
/// the forward passes `feed` runs (on the float model: weights stay float meanwhile), then
/// frozen; weights get per-channel (or per-tensor) scales from their values. Returns the model
/// in phase `Quantize` and the paths whose input saw no data (left at their placeholder scale).
pub fn calibrate<M: Quantizable>(
    mut model: M,
    q: &QuantConfig,
    device: &Device,
    feed: impl FnOnce(&M),
) -> (M, Vec<String>) {
    model.attach_quantizers(q, Phase::Observe, device);
    for s in model.quant_slots_ref() {
        if let Some(lq) = s.quant {
            lq.weight.set_phase(Phase::Off);
        }
    }
    feed(&model);
    let mut unseen = Vec::new();
    for s in model.quant_slots() {
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
