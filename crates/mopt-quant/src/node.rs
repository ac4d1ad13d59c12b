//! [`FakeQuant`]: one quantizer as a Burn module, and [`LinearQuant`], what a quantized linear
//! or convolution layer holds (its input, per tensor; its weight, per output channel; its output,
//! per tensor, where an integer kernel must write integers).
//!
//! The scale and zero point are parameters, so they are saved with the checkpoint and reload
//! to identical outputs; the format, axis and whether the scale is learned (LSQ) are constants
//! the model rebuilds from its config. A quantizer moves through phases: `Observe` (calibrate:
//! values pass unchanged and feed the observer) → [`FakeQuant::freeze`] (ranges become
//! scales) → `Quantize` (fake quantization in the forward pass, training included). `Off`
//! passes values through (the float model). The phase and observer live behind a shared cell:
//! clones of a module share them.

use std::sync::{Arc, Mutex};

use burn::module::{Module, Param};
use burn::prelude::*;
use serde::{Deserialize, Serialize};

use crate::fake::{fake_quant, scale_gradient};
use crate::integer::IntegerLinear;
use crate::observer::{Observer, ObserverKind};
use crate::scheme::{Granularity, IntFormat, QParams, QuantScheme};

/// A quantizer's phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Values pass unchanged (a float layer).
    Off,
    /// Values pass unchanged and feed the observer (calibration).
    Observe,
    /// Values are fake-quantized.
    Quantize,
}

/// Phase and observer, shared by clones.
#[derive(Debug)]
pub struct NodeState {
    /// The current phase.
    pub phase: Phase,
    /// The observer calibration feeds.
    pub observer: Observer,
    /// Whether observing also keeps each last-axis channel's largest magnitude (a linear
    /// layer's input, for SmoothQuant); off unless asked for ([`FakeQuant::track_channels`]).
    pub channels: bool,
}

/// One quantizer.
#[derive(Module, Debug)]
pub struct FakeQuant {
    /// `[1]` (per tensor) or `[channels]`.
    pub scale: Param<Tensor<1>>,
    /// Integers held as floats, like `scale`.
    pub zero_point: Param<Tensor<1>>,
    /// The smallest integer of the format.
    pub qmin: i32,
    /// The largest integer of the format.
    pub qmax: i32,
    /// The channel axis of the quantized tensor (per channel), or `None`.
    pub axis: Option<usize>,
    /// LSQ: the scale trains (with LSQ's gradient scale).
    pub learned: bool,
    #[module(skip)]
    /// Phase and observer, shared by clones.
    pub state: Arc<Mutex<NodeState>>,
}

impl FakeQuant {
    /// A quantizer for `scheme` over `channels` channels (1 per tensor), with placeholder
    /// parameters (scale 1, zero point 0) until it is calibrated or loaded, in phase `phase`.
    pub fn new(
        scheme: &QuantScheme,
        channels: usize,
        learned: bool,
        observer: ObserverKind,
        phase: Phase,
        device: &Device,
    ) -> Self {
        let (qmin, qmax) = scheme.format.range();
        let (n, axis) = match scheme.granularity {
            Granularity::PerTensor => (1, None),
            Granularity::PerChannel(a) => (channels, Some(a)),
        };
        Self {
            scale: Param::from_tensor(Tensor::ones([n], device)),
            zero_point: Param::from_tensor(Tensor::zeros([n], device)),
            qmin,
            qmax,
            axis,
            learned,
            state: Arc::new(Mutex::new(NodeState {
                phase,
                observer: Observer::new(observer),
                channels: false,
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, NodeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        self.lock().phase
    }

    /// Switch to `phase` (every clone sees it).
    pub fn set_phase(&self, phase: Phase) {
        self.lock().phase = phase;
    }

    /// The current parameters.
    pub fn qparams(&self) -> QParams {
        let v = |t: Tensor<1>| t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
        QParams {
            scale: v(self.scale.val()),
            zero_point: v(self.zero_point.val())
                .into_iter()
                .map(|z| z as i32)
                .collect(),
        }
    }

    /// From now on, observing also keeps the largest magnitude of each channel of the last
    /// axis (a linear layer's input `[.., d_in]`), for [`FakeQuant::channel_absmax`].
    pub fn track_channels(&self) {
        self.lock().channels = true;
    }

    /// The largest magnitude each channel of the last axis has reached while observing with
    /// [`FakeQuant::track_channels`] on; empty before any data.
    pub fn channel_absmax(&self) -> Vec<f32> {
        self.lock().observer.channel_absmax().to_vec()
    }

    /// Set the parameters (lengths must match the quantizer's).
    pub fn set_qparams(mut self, p: &QParams) -> Self {
        let device = self.scale.val().device();
        let n = p.scale.len();
        assert_eq!(n, self.scale.val().dims()[0], "scale count");
        self.scale = Param::from_tensor(Tensor::from_data(
            TensorData::new(p.scale.clone(), [n]),
            &device,
        ));
        let z: Vec<f32> = p.zero_point.iter().map(|&z| z as f32).collect();
        self.zero_point = Param::from_tensor(Tensor::from_data(TensorData::new(z, [n]), &device));
        self
    }

    /// Parameters from the observer's range (per tensor), phase `Quantize`. Without observed
    /// data it stays as it is and says so (`false`).
    pub fn freeze(self, scheme: &QuantScheme) -> (Self, bool) {
        let range = self.lock().observer.range(scheme);
        match range {
            Some((lo, hi)) => {
                let p = scheme.qparams(&[lo], &[hi]);
                let me = self.set_qparams(&p);
                me.set_phase(Phase::Quantize);
                (me, true)
            }
            None => (self, false),
        }
    }

    /// Per-channel (or per-tensor) min-max parameters of a static tensor (a weight: `[d_in,
    /// d_out]` with channels on axis 1, or a convolution's `[out, in, kh, kw]` with channels on
    /// axis 0), phase `Quantize`.
    pub fn calibrate_weight<const D: usize>(self, w: &Tensor<D>, scheme: &QuantScheme) -> Self {
        let dims = w.dims();
        let v = w
            .clone()
            .into_data()
            .convert::<f32>()
            .try_to_vec::<f32>()
            .unwrap();
        let p = match self.axis {
            Some(a) => {
                // Channel of element i: (i / inner) % channels, inner = product of later dims.
                let channels = dims[a];
                let inner: usize = dims[a + 1..].iter().product();
                let (mut lo, mut hi) = (
                    vec![f32::INFINITY; channels],
                    vec![f32::NEG_INFINITY; channels],
                );
                for (i, x) in v.iter().enumerate() {
                    let c = (i / inner) % channels;
                    lo[c] = lo[c].min(*x);
                    hi[c] = hi[c].max(*x);
                }
                scheme.qparams(&lo, &hi)
            }
            None => {
                let lo = v.iter().copied().fold(f32::INFINITY, f32::min);
                let hi = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                scheme.qparams(&[lo], &[hi])
            }
        };
        let me = self.set_qparams(&p);
        me.set_phase(Phase::Quantize);
        me
    }

    /// Pass, observe or fake-quantize `x` by phase.
    ///
    /// # Shapes
    /// - x: any `[..]` (the channel axis, when per channel, of length `channels`); output: like x
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let phase = self.phase();
        match phase {
            Phase::Off => x,
            Phase::Observe => {
                let v = x
                    .clone()
                    .into_data()
                    .convert::<f32>()
                    .try_to_vec::<f32>()
                    .unwrap();
                let channels = x.dims()[D - 1];
                let mut state = self.lock();
                state.observer.observe(&v);
                if state.channels {
                    state.observer.observe_channels(&v, channels);
                }
                drop(state);
                x
            }
            Phase::Quantize => {
                let mut shape = [1usize; D];
                let n = self.scale.val().dims()[0];
                if let Some(a) = self.axis {
                    shape[a] = n;
                }
                let s = if self.learned {
                    let g = 1.0 / ((x.shape().num_elements() / n) as f32 * self.qmax as f32).sqrt();
                    scale_gradient(self.scale.val(), g)
                } else {
                    self.scale.val().detach()
                };
                let z = self.zero_point.val().detach().reshape(shape);
                fake_quant(x, s.reshape(shape), z, self.qmin, self.qmax)
            }
        }
    }
}

/// What a quantized linear or convolution layer holds.
#[derive(Module, Debug)]
pub struct LinearQuant {
    /// Its input, per tensor.
    pub input: FakeQuant,
    /// Its weight (`[d_in, d_out]`, or a convolution's `[out, in, kh, kw]`), per output
    /// channel or per tensor.
    pub weight: FakeQuant,
    /// Its output (after the bias), per tensor, on the layers [`QuantConfig::outputs`] lists:
    /// where the deployed integer kernel writes integers (ONNX Runtime's `QLinearConv`).
    pub output: Option<FakeQuant>,
    /// Its integer form, once [`LinearQuant::pack`] built it (inference: the packed weight does
    /// not follow later changes of the float one); not saved.
    #[module(skip)]
    pub integer: Option<Arc<IntegerLinear>>,
}

impl LinearQuant {
    /// Build the layer's integer form from its `[d_in, d_out]` weight, for an inference-only
    /// model; `false` (and none) where the scheme has none ([`IntegerLinear::new`]).
    pub fn pack(&mut self, weight: &Tensor<2>) -> bool {
        self.integer = IntegerLinear::new(self, weight).map(Arc::new);
        self.integer.is_some()
    }

    /// `x · W` in integers, the output quantizer after it (a bias-free layer's), once
    /// [`LinearQuant::pack`] built the integer form; `None` before, and whenever the float
    /// path must run instead: a quantizer switched out of `Quantize` since, or an input that
    /// needs gradients (the integer product has none).
    ///
    /// # Shapes
    /// - x: `[rows, d_in]`; output: `[rows, d_out]`
    pub fn integer_forward(&self, x: Tensor<2>) -> Option<Tensor<2>> {
        let integer = self.integer.as_ref()?;
        let quantizing = |q: &FakeQuant| q.phase() == Phase::Quantize;
        if !quantizing(&self.input) || !quantizing(&self.weight) || x.is_require_grad() {
            return None;
        }
        let y = integer.forward(x);
        Some(match &self.output {
            Some(o) => o.forward(y),
            None => y,
        })
    }

    /// Put the input, weight and output quantizers in `phase`.
    pub fn set_phase(&self, phase: Phase) {
        self.input.set_phase(phase);
        self.weight.set_phase(phase);
        if let Some(o) = &self.output {
            o.set_phase(phase);
        }
    }
}

/// Where and how a model is quantized: saved in its config, so the model rebuilds its
/// quantizers (then loads their scales).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuantConfig {
    /// How weights are quantized.
    pub weight: QuantScheme,
    /// How activations (inputs and quantized outputs) are quantized.
    pub activation: QuantScheme,
    /// LSQ: scales train with the weights.
    pub learned_scales: bool,
    /// The activation observer of calibration.
    pub observer: ObserverKind,
    /// Module paths of the quantized linear layers (`bert.encoder.layer.0.attention.self_attn.query`).
    pub layers: Vec<String>,
    /// The layers of `layers` whose output is quantized too (per tensor, like inputs); none by
    /// default (a family's [`outputs`](QuantConfig::outputs) choice, recorded so that the model
    /// rebuilds them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<String>,
    /// Module paths of the embedding tables stored as int8, one scale per row
    /// ([`crate::fake::quantize_rows`]); their float values are kept on that grid. None by
    /// default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub embeddings: Vec<String>,
}

impl QuantConfig {
    /// The usual INT8 deployment scheme on the layers at `layers`: symmetric per-output-channel
    /// signed weights of `weight_bits` bits (8, or 7 for ONNX Runtime's u8·s8 kernels on CPUs
    /// without VNNI), asymmetric per-tensor uint8 inputs, min-max observers, fixed scales.
    pub fn int8(weight_bits: u32, layers: Vec<String>) -> Self {
        Self {
            weight: QuantScheme {
                format: IntFormat {
                    bits: weight_bits,
                    signed: true,
                },
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
            outputs: Vec::new(),
            embeddings: Vec::new(),
        }
    }

    /// The quantizers of the linear layer at `path` (`None` when it stays float), in `phase`:
    /// weights `[d_in, d_out]`, per output channel on axis 1.
    pub fn linear(
        &self,
        path: &str,
        d_out: usize,
        phase: Phase,
        device: &Device,
    ) -> Option<LinearQuant> {
        self.layer(path, d_out, 1, phase, device)
    }

    /// The quantizers of the layer at `path` (`None` when it stays float), in `phase`, its
    /// weight's `channels` output channels on `axis` (1 for a linear layer's `[d_in, d_out]`, 0
    /// for a convolution's `[out, in, kh, kw]`) when weights are per channel.
    pub fn layer(
        &self,
        path: &str,
        channels: usize,
        axis: usize,
        phase: Phase,
        device: &Device,
    ) -> Option<LinearQuant> {
        let per_tensor = |observer| {
            FakeQuant::new(
                &self.activation,
                1,
                self.learned_scales,
                observer,
                phase,
                device,
            )
        };
        let weight = QuantScheme {
            granularity: match self.weight.granularity {
                Granularity::PerChannel(_) => Granularity::PerChannel(axis),
                g => g,
            },
            ..self.weight
        };
        self.layers.iter().any(|p| p == path).then(|| LinearQuant {
            input: per_tensor(self.observer),
            weight: FakeQuant::new(
                &weight,
                channels,
                self.learned_scales,
                ObserverKind::MinMax,
                phase,
                device,
            ),
            output: self
                .outputs
                .iter()
                .any(|p| p == path)
                .then(|| per_tensor(self.observer)),
            integer: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::fake_quant_value;
    use crate::scheme::IntFormat;

    fn vals<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
    }

    #[test]
    fn observe_freeze_quantize() {
        let dev = Device::flex();
        let scheme = QuantScheme {
            format: IntFormat::UINT8,
            symmetric: false,
            granularity: Granularity::PerTensor,
        };
        let q = FakeQuant::new(
            &scheme,
            1,
            false,
            ObserverKind::MinMax,
            Phase::Observe,
            &dev,
        );
        let x = Tensor::<2>::from_data([[-1.0f32, 0.2], [0.7, 2.55]], &dev);
        // Observing passes values unchanged.
        assert_eq!(vals(q.forward(x.clone())), vals(x.clone()));
        let (q, ok) = q.freeze(&scheme);
        assert!(ok && q.phase() == Phase::Quantize);
        let p = q.qparams();
        assert_eq!(p, scheme.qparams(&[-1.0], &[2.55]));
        let want: Vec<f32> = vals(x.clone())
            .iter()
            .map(|&v| fake_quant_value(v, p.scale[0], p.zero_point[0], 0, 255))
            .collect();
        assert_eq!(vals(q.forward(x)), want);
    }

    #[test]
    fn per_channel_weights_get_a_scale_per_output_column() {
        let dev = Device::flex();
        let scheme = QuantScheme {
            format: IntFormat::INT8,
            symmetric: true,
            granularity: Granularity::PerChannel(1),
        };
        let w = Tensor::<2>::from_data([[0.5f32, -2.0, 0.01], [-1.0, 1.0, 0.02]], &dev);
        let q = FakeQuant::new(&scheme, 3, false, ObserverKind::MinMax, Phase::Off, &dev)
            .calibrate_weight(&w, &scheme);
        assert_eq!(q.scale.val().dims(), [3]);
        let p = q.qparams();
        for (c, m) in [1.0f32, 2.0, 0.02].iter().enumerate() {
            assert!((p.scale[c] - m / 127.5).abs() < 1e-9, "{:?}", p.scale);
        }
        let y = vals(q.forward(w.clone()));
        let want: Vec<f32> = vals(w)
            .iter()
            .enumerate()
            .map(|(i, &v)| fake_quant_value(v, p.scale[i % 3], 0, -128, 127))
            .collect();
        assert_eq!(y, want);
    }
}
