//! Export errors.

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
    #[error(transparent)]
    Model(#[from] mopt_models::ModelError),
    #[error("python: {0}")]
    Python(String),
    #[error("parity check failed: ONNX Runtime differs from mopt by {max_abs_err:e} (tolerance {tolerance:e}) on {samples} samples; the export was not written")]
    Parity {
        max_abs_err: f64,
        tolerance: f64,
        samples: usize,
    },
    #[error("{0}")]
    Invalid(String),
}
