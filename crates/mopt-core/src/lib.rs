//! # mopt-core
//!
//! The contracts between mopt's algorithms and the models they compress. A model family (BERT in
//! `mopt-models`, a user's own network in `examples/custom_model.rs`) implements these traits in
//! its own folder; the trainer, distillation, pruning, quantization and export are generic over
//! them and never name a model.
//!
//! In the order a family implements them:
//! 1. [`ModelConfig`]: parameters and classes (the trainer reads them), a training-memory
//!    estimate and a one-line description (`--check`), FLOPs and facts (pruning rounds'
//!    records), the arch name.
//! 2. [`Examples`]: a data split that batches itself; its batch carries labels ([`Labeled`]).
//! 3. [`Classifier`]: a Burn module with a forward pass from a batch to logits. This is all
//!    fine-tuning and evaluation need.
//! 4. [`Checkpoint`]: build the model from its config, save and reload it with its config, so
//!    that a trained (or shrunk) model comes back with its own shape.
//! 5. [`Prunable`]: its dependency groups ([`prune::GroupKind`]) over the model's parameter
//!    table ([`ParamTable`]): unlocks structured pruning.
//! 6. [`Quantizable`]: its quantizable layers ([`quant::QuantSlot`]): unlocks post-training
//!    quantization and quantization-aware training.
//! 7. [`Tapped`]: its intermediate outputs ([`Taps`]: hidden states, attention maps) and their
//!    shapes ([`TapLayout`]): unlocks distillation with intermediate matches (text).
//! 8. [`FeatureMaps`]: its feature maps (a CNN's stem and stage outputs): unlocks distillation
//!    with feature-map matches (FitNets with 1×1-convolution projections, attention transfer).
//! 9. `mopt_data::VocabPrunable` (with the text data it reads, not here): its token-embedding
//!    table can lose rows: unlocks `vocab` stages (vocabulary pruning to a corpus).
//!
//! Each capability beyond these unlocks more stage kinds; a stage that needs one the model
//! lacks says so in `--check`.

#![deny(missing_docs)]
mod data;
mod error;
pub mod features;
mod ids;
pub mod manifest;
mod memory;
mod model;
pub mod prune;
pub mod quant;
pub mod smooth;
mod table;
pub mod taps;

pub use data::{Examples, Labeled};
pub use error::ModelFault;
pub use features::FeatureMaps;
pub use ids::{renumber_params, WithoutIds};
pub use memory::MemoryEstimate;
pub use model::{Checkpoint, Classifier, ModelConfig};
pub use prune::Prunable;
pub use quant::Quantizable;
pub use table::{Array, ParamTable};
pub use taps::{TapLayout, TapRequest, Tapped, Taps};
