//! A model's shape as the runner carries it from stage to stage: the family's own config,
//! type-erased, so that planning, `--check` and the report never name a model family. A kind
//! that needs the typed config asks for it with [`Shape::get`].

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use mopt_core::{MemoryEstimate, ModelConfig};

use crate::error::StageError;

/// A family's model config behind a pointer.
#[derive(Clone)]
pub struct Shape(Arc<dyn ErasedConfig>);

trait ErasedConfig: Send + Sync {
    fn any(&self) -> &dyn Any;
    fn arch(&self) -> &'static str;
    fn describe(&self) -> String;
    fn num_params(&self) -> usize;
    fn training_memory(&self, batch: usize, size: usize) -> MemoryEstimate;
    fn logit_values(&self, size: usize) -> usize;
    fn num_labels(&self) -> usize;
    fn logit_rows(&self, size: usize) -> usize;
}

impl<C: ModelConfig> ErasedConfig for C {
    fn any(&self) -> &dyn Any {
        self
    }
    fn arch(&self) -> &'static str {
        ModelConfig::arch(self)
    }
    fn describe(&self) -> String {
        ModelConfig::describe(self)
    }
    fn num_params(&self) -> usize {
        ModelConfig::num_params(self)
    }
    fn training_memory(&self, batch: usize, size: usize) -> MemoryEstimate {
        ModelConfig::training_memory(self, batch, size)
    }
    fn logit_values(&self, size: usize) -> usize {
        self.logit_rows(size) * self.num_labels()
    }
    fn num_labels(&self) -> usize {
        ModelConfig::num_labels(self)
    }
    fn logit_rows(&self, size: usize) -> usize {
        ModelConfig::logit_rows(self, size)
    }
}

impl Shape {
    /// The shape of a model with config `config`.
    pub fn new<C: ModelConfig>(config: C) -> Self {
        Self(Arc::new(config))
    }

    /// The typed config; an error when the model is of another family than the kind expects.
    pub fn get<C: ModelConfig>(&self) -> Result<&C, StageError> {
        self.0.any().downcast_ref::<C>().ok_or_else(|| {
            StageError::Unsupported(format!(
                "the model is a `{}`, not the model family this step was built for",
                self.0.arch()
            ))
        })
    }

    /// The family's `[model] arch` name.
    pub fn arch(&self) -> &'static str {
        self.0.arch()
    }

    /// One line for `--check`: [`ModelConfig::describe`] and the parameter count.
    pub fn describe(&self) -> String {
        format!(
            "{}, {:.2}M params",
            self.0.describe(),
            self.num_params() as f64 / 1e6
        )
    }

    /// Parameters of the shape.
    pub fn num_params(&self) -> usize {
        self.0.num_params()
    }

    /// Training memory at `batch` examples of `size` ([`ModelConfig::training_memory`]).
    pub fn training_memory(&self, batch: usize, size: usize) -> MemoryEstimate {
        self.0.training_memory(batch, size)
    }

    /// The labels a logit row scores (classes; a language model's vocabulary).
    pub fn num_labels(&self) -> usize {
        self.0.num_labels()
    }

    /// Logit rows one example of `size` yields (one for a classifier, a row a position for a
    /// language model).
    pub fn logit_rows(&self, size: usize) -> usize {
        self.0.logit_rows(size)
    }

    /// Logit values one example of `size` yields: its rows ([`ModelConfig::logit_rows`]) times
    /// the labels (a language model's vocabulary a position).
    pub fn logit_values(&self, size: usize) -> usize {
        self.0.logit_values(size)
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Shape({}: {})", self.arch(), self.describe())
    }
}
