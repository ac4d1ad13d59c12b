//! Export errors.

#[derive(Debug, thiserror::Error)]
/// What went wrong exporting a model.
pub enum ExportError {
    #[error("{0}: {1}")]
    /// A file could not be read or written (the path, the error).
    Io(String, #[source] std::io::Error),
    /// Loading the checkpoint (a bad file is an input error).
    #[error(transparent)]
    Model(#[from] mopt_core::ModelFault),
    #[error("python: {0}")]
    /// The Python side (onnx, onnxruntime) failed or is missing.
    Python(String),
    #[error("parity check failed: ONNX Runtime differs from mopt by {max_abs_err:e} (tolerance {tolerance:e}) on {samples} samples; the export was not written (where the difference is f32 rounding on large logits, raise the export stage's `tolerance` or pass `mopt-train export --tolerance`)")]
    /// A float export's logits differ from mopt's by more than the tolerance.
    Parity {
        /// The largest |ONNX Runtime − mopt| logit difference.
        max_abs_err: f64,
        /// The tolerance it exceeded.
        tolerance: f64,
        /// Examples compared.
        samples: usize,
    },
    #[error("parity check failed: ONNX Runtime and mopt's fake-quantized forward agree on {agreement:.4} of {samples} predictions (at least {min} needed; max logit difference {max_abs_err:e}); the export was not written")]
    /// A quantized export predicts differently from mopt's fake-quantized forward too often.
    Agreement {
        /// Share of examples with the same predicted class.
        agreement: f64,
        /// The share required.
        min: f64,
        /// The largest logit difference.
        max_abs_err: f64,
        /// Examples compared.
        samples: usize,
    },
    #[error("parity check failed: ONNX Runtime's next-token distributions are {mean_kl:.4} nats (mean KL) from mopt's fake-quantized forward's over {samples} positions (at most {max} allowed; {agreement:.4} of the positions pick the same token); the export was not written")]
    /// A quantized language model's export whose distributions drift from mopt's.
    Divergence {
        /// Mean KL divergence a position, in nats.
        mean_kl: f64,
        /// The most allowed.
        max: f64,
        /// Share of positions with the same most likely token.
        agreement: f64,
        /// Positions compared.
        samples: usize,
    },
    #[error("{0}")]
    /// An export that cannot be written as asked (the message says why).
    Invalid(String),
}

impl ExportError {
    /// Whether the user can fix this by changing the input (exit code 2).
    pub fn is_input_error(&self) -> bool {
        match self {
            ExportError::Invalid(_) => true,
            ExportError::Model(e) => e.input,
            _ => false,
        }
    }
}
