//! The quantizable contract: the layers that take fake-quantization nodes. A family lists its
//! quantizable layers once ([`Quantizable::quant_slots`]), each an `Option<LinearQuant>` beside
//! its `Linear` (`query` → `query_quant`) or `Conv2d`, in forward order; placement patterns,
//! calibration, QAT, weight baking and the QDQ exporter all read that one list. A family whose
//! normalisation folds into the layer before it (BatchNorm into a convolution) folds it first
//! ([`Quantizable::fold_for_quantization`]), so that the quantized weights are the deployed ones.

use burn::module::Param;
use burn::nn::conv::Conv2d;
use burn::nn::Linear;
use burn::prelude::*;
use mopt_quant::node::{LinearQuant, Phase, QuantConfig};

use crate::model::Checkpoint;

/// A quantizable layer's weight: where its output channels are.
pub enum QuantWeight<'a> {
    /// A linear layer's `[d_in, d_out]`: output channels on axis 1.
    Linear(&'a mut Param<Tensor<2>>),
    /// A convolution's `[out, in / groups, kh, kw]`: output channels on axis 0.
    Conv(&'a mut Param<Tensor<4>>),
}

/// [`QuantWeight`], read-only.
pub enum QuantWeightRef<'a> {
    /// A linear layer's `[d_in, d_out]`.
    Linear(&'a Param<Tensor<2>>),
    /// A convolution's `[out, in / groups, kh, kw]`.
    Conv(&'a Param<Tensor<4>>),
}

impl QuantWeightRef<'_> {
    /// (output channels, their axis).
    pub fn channels(&self) -> (usize, usize) {
        match self {
            Self::Linear(w) => (w.val().dims()[1], 1),
            Self::Conv(w) => (w.val().dims()[0], 0),
        }
    }
}

/// One quantizable layer: its module path, its weight and its quantizers.
pub struct QuantSlot<'a> {
    /// The layer's module path (`bert.encoder.layer.0.output.dense`, `stages.1.0.conv2`).
    pub path: String,
    /// The layer's weight.
    pub weight: QuantWeight<'a>,
    /// The layer's quantizers (`None`: float).
    pub quant: &'a mut Option<LinearQuant>,
}

/// One quantizable layer, read-only.
pub struct QuantSlotRef<'a> {
    /// The layer's module path.
    pub path: String,
    /// The layer's weight.
    pub weight: QuantWeightRef<'a>,
    /// The layer's quantizers (`None`: float).
    pub quant: &'a Option<LinearQuant>,
}

impl<'a> QuantSlot<'a> {
    /// A linear layer at `path` and its quantizers.
    pub fn linear(path: String, l: &'a mut Linear, quant: &'a mut Option<LinearQuant>) -> Self {
        Self {
            path,
            weight: QuantWeight::Linear(&mut l.weight),
            quant,
        }
    }

    /// A convolution at `path` and its quantizers.
    pub fn conv(path: String, c: &'a mut Conv2d, quant: &'a mut Option<LinearQuant>) -> Self {
        Self {
            path,
            weight: QuantWeight::Conv(&mut c.weight),
            quant,
        }
    }

    fn weight_ref(&self) -> QuantWeightRef<'_> {
        match &self.weight {
            QuantWeight::Linear(w) => QuantWeightRef::Linear(w),
            QuantWeight::Conv(w) => QuantWeightRef::Conv(w),
        }
    }

    /// The weight quantizer's per-channel (or per-tensor) parameters from the weight's values.
    fn calibrate_weight(
        &self,
        q: mopt_quant::FakeQuant,
        scheme: &mopt_quant::QuantScheme,
    ) -> mopt_quant::FakeQuant {
        match &self.weight {
            QuantWeight::Linear(w) => q.calibrate_weight(&w.val(), scheme),
            QuantWeight::Conv(w) => q.calibrate_weight(&w.val(), scheme),
        }
    }

    /// The weight replaced by its fake-quantized value.
    fn bake(&mut self, q: &mopt_quant::FakeQuant) {
        match &mut self.weight {
            QuantWeight::Linear(w) => **w = Param::from_tensor(q.forward(w.val())),
            QuantWeight::Conv(w) => **w = Param::from_tensor(q.forward(w.val())),
        }
    }
}

impl<'a> QuantSlotRef<'a> {
    /// A linear layer at `path` and its quantizers.
    pub fn linear(path: String, l: &'a Linear, quant: &'a Option<LinearQuant>) -> Self {
        Self {
            path,
            weight: QuantWeightRef::Linear(&l.weight),
            quant,
        }
    }

    /// A convolution at `path` and its quantizers.
    pub fn conv(path: String, c: &'a Conv2d, quant: &'a Option<LinearQuant>) -> Self {
        Self {
            path,
            weight: QuantWeightRef::Conv(&c.weight),
            quant,
        }
    }
}

/// A model whose linear (and convolution) layers take quantizers. Implement the two slot lists
/// and where the config records the quantization (so that a quantized checkpoint reloads
/// quantized); the rest is provided.
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

    /// The model quantization starts from and its config: a family whose normalisation folds
    /// into the layer before it (BatchNorm into a convolution) returns the folded model, so
    /// that calibration and QAT see the weights the deployed graph runs. Unchanged by default.
    fn fold_for_quantization(self, config: &Self::Config) -> (Self, Self::Config) {
        (self, config.clone())
    }

    /// Of the quantized layers `layers`, those whose output is quantized too (per tensor): where
    /// the deployed integer kernel must write integers (ONNX Runtime's `QLinearConv` needs a
    /// `QuantizeLinear` on a convolution's output, `MatMulIntegerToFloat` does not). None by
    /// default.
    fn quantized_outputs(_layers: &[String]) -> Vec<String> {
        Vec::new()
    }

    /// The quantizable layers' paths of a model shaped `config` (built on the CPU to list them).
    fn linear_paths(config: &Self::Config) -> Vec<String> {
        let float = Self::with_quantization(config, None);
        Self::init(&float, &Device::flex()).quant_paths()
    }

    /// The embedding tables a deployment can store as int8 with one scale per row (`[rows,
    /// dim]`), by module path; none by default. A `ptq` / `qat` stage with `embeddings = true`
    /// keeps them on that grid ([`Quantizable::snap_embeddings`]) and records them in
    /// [`QuantConfig::embeddings`]; the family's exporter writes them as int8.
    fn embedding_tables(&mut self) -> Vec<(String, &mut Param<Tensor<2>>)> {
        Vec::new()
    }

    /// The paths of [`embedding_tables`](Quantizable::embedding_tables) of a model shaped
    /// `config`.
    fn embedding_paths(config: &Self::Config) -> Vec<String> {
        let float = Self::with_quantization(config, None);
        let mut m = Self::init(&float, &Device::flex());
        m.embedding_tables().into_iter().map(|(p, _)| p).collect()
    }

    /// Every table `q.embeddings` lists replaced by its int8 values
    /// ([`mopt_quant::fake::fake_quant_rows`]): the model then computes what the deployed
    /// int8 tables give.
    fn snap_embeddings(&mut self, q: &QuantConfig) {
        for (path, table) in self.embedding_tables() {
            if !q.embeddings.contains(&path) {
                continue;
            }
            let t = table.val();
            let [rows, cols] = t.dims();
            let values = t
                .to_data()
                .convert::<f32>()
                .try_to_vec::<f32>()
                .expect("f32 table");
            let snapped = mopt_quant::fake::fake_quant_rows(&values, cols);
            let data = TensorData::new(snapped, [rows, cols]).convert_dtype(t.dtype());
            *table = Param::from_tensor(Tensor::from_data(data, &t.device()));
        }
    }

    /// The `k`-th place (from 0; `None` past the last) where SmoothQuant may move a
    /// per-channel scale from a layer's input into its weight ([`crate::smooth`]): a producer
    /// (a normalisation's gain, a linear layer's output columns) and the quantizable layers
    /// that read its channels. One group at a time, since one weight can be a consumer in
    /// one group and the producer of the next (Llama's `v_proj`). None by default: a
    /// `smooth` key on such a family is refused when the recipe is checked.
    fn smoothing_group(&mut self, _k: usize) -> Option<crate::smooth::SmoothGroup<'_>> {
        None
    }

    /// The producers' paths of [`smoothing_group`](Quantizable::smoothing_group) of a model
    /// shaped `config`.
    fn smoothing_paths(config: &Self::Config) -> Vec<String> {
        let float = Self::with_quantization(config, None);
        let mut m = Self::init(&float, &Device::flex());
        let mut out = Vec::new();
        while let Some(g) = m.smoothing_group(out.len()) {
            out.push(g.producer_path);
        }
        out
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
            let (channels, axis) = s.weight_ref().channels();
            *s.quant = q.layer(&s.path, channels, axis, phase, device);
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
                q.set_phase(phase);
            }
        }
    }

    /// For inference: every quantized weight replaced by its fake-quantized value and its
    /// weight quantizer switched off, so that a forward pass no longer re-quantizes every
    /// weight. Outputs are identical; inputs are still fake-quantized. Not for training (the
    /// straight-through estimator needs the float weights).
    fn with_baked_weights(mut self) -> Self {
        for mut s in self.quant_slots() {
            if let Some(q) = s.quant.as_ref() {
                if q.weight.phase() == Phase::Quantize {
                    let weight = q.weight.clone();
                    s.bake(&weight);
                    weight.set_phase(Phase::Off);
                }
            }
        }
        self
    }

    /// For inference: every quantized linear layer given its integer form
    /// ([`LinearQuant::pack`]: exact `u8 · s8` sums over int8 weights packed once), which the
    /// family's forward pass runs where it asks for it (Llama's projections). Returns the model
    /// and how many layers got one (schemes the integer kernel cannot run exactly keep their
    /// fake-quantized product). Not for training: the packed weights do not follow the float
    /// ones.
    fn with_integer_kernels(mut self) -> (Self, usize) {
        let mut packed = 0;
        for s in self.quant_slots() {
            if let (QuantWeight::Linear(w), Some(q)) = (s.weight, s.quant.as_mut()) {
                packed += usize::from(q.pack(&w.val()));
            }
        }
        (self, packed)
    }
}

/// Quantizers on the layers `q.layers` lists that observe their inputs while the weights stay
/// float: what calibration (and SmoothQuant's measuring pass) runs the data through. Returns
/// the inputs' quantizers.
pub(crate) fn observe_inputs<'a, M: Quantizable>(
    model: &'a mut M,
    q: &QuantConfig,
    device: &Device,
) -> Vec<&'a mopt_quant::FakeQuant> {
    model.attach_quantizers(q, Phase::Observe, device);
    let mut inputs = Vec::new();
    for s in model.quant_slots_ref() {
        if let Some(lq) = s.quant {
            lq.weight.set_phase(Phase::Off);
            inputs.push(&lq.input);
        }
    }
    inputs
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
    observe_inputs(&mut model, q, device);
    feed(&model);
    let mut unseen = Vec::new();
    for s in model.quant_slots() {
        if let Some(lq) = s.quant.take() {
            let (input, seen) = lq.input.freeze(&q.activation);
            let output = lq.output.map(|o| {
                let (o, seen) = o.freeze(&q.activation);
                if !seen {
                    unseen.push(format!("{} (output)", s.path));
                }
                o
            });
            if !seen {
                unseen.push(s.path.clone());
            }
            let weight = s.calibrate_weight(lq.weight, &q.weight);
            *s.quant = Some(LinearQuant {
                input,
                weight,
                output,
                integer: None,
            });
        }
    }
    (model, unseen)
}
