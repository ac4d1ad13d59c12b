//! # mopt-quant
//!
//! Quantization-aware training and post-training quantization, computed exactly as ONNX
//! `QuantizeLinear` / `DequantizeLinear` do so that an exported QDQ model matches:
//!
//! - [`scheme`]: integer formats (INT8, INT4, the 7-bit weight range), symmetric or asymmetric,
//!   per tensor or per channel; scale and zero point from a range.
//! - [`fake`]: quantize → dequantize on host values (the reference) and on Burn tensors with a
//!   straight-through estimator (gradient 1 inside the representable range, 0 outside) and,
//!   optionally, a learned scale (LSQ).
//! - [`observer`]: ranges from calibration data: min-max, moving-average min-max, percentile,
//!   MSE-minimising search.
//! - [`node`]: [`node::FakeQuant`], a Burn module holding one quantizer's scale and zero point
//!   (saved with the checkpoint), its observer while calibrating, and its phase.
//! - [`integer`]: a quantized linear layer run in integers (exact `u8 · s8` sums over a weight
//!   packed once), the deployed form, for inference.

#![deny(missing_docs)]
pub mod fake;
pub mod integer;
pub mod node;
pub mod observer;
pub mod scheme;

pub use integer::IntegerLinear;
pub use node::{FakeQuant, LinearQuant, Phase};
pub use observer::{Observer, ObserverKind};
pub use scheme::{Granularity, IntFormat, QParams, QuantScheme};
