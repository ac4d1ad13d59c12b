//! Export errors.

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
    /// Loading the checkpoint (a bad file is an input error).
    #[error(transparent)]
    Model(#[from] mopt_core::ModelFault),
    #[error("python: {0}")]
    Python(String),
    #[error("parity check failed: ONNX Runtime differs from mopt by {max_abs_err:e} (tolerance {tolerance:e}) on {samples} samples; the export was not written")]
    Parity {
        max_abs_err: f64,
        tolerance: f64,
        samples: usize,
    },
    #[error("parity check failed: ONNX Runtime and mopt's fake-quantized forward agree on {agreement:.4} of {samples} predictions (at least {min} needed; max logit difference {max_abs_err:e}); the export was not written")]
    Agreement {
        agreement: f64,
        min: f64,
        max_abs_err: f64,
        samples: usize,
    },
    #[error("{0}")]
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
