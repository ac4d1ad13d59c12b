//! The pruning limits the shipped families' group kinds declare ([`Limit`]): a `prune` stage
//! takes the ones its targets read, and lists only those in its plan.

use mopt_core::prune::Limit;

/// Attention heads (query heads for a Llama) a layer keeps, at least.
pub const MIN_HEADS: Limit = Limit {
    key: "min-heads",
    default: 1,
    about: "attention heads kept per layer, at least",
};

/// FFN widths kept are a multiple of this (and at least this).
pub const FFN_MULTIPLE: Limit = Limit {
    key: "ffn-multiple",
    default: 8,
    about: "FFN widths kept are a multiple of it",
};

/// Hidden (residual or channel) widths kept are a multiple of this (and at least this).
pub const HIDDEN_MULTIPLE: Limit = Limit {
    key: "hidden-multiple",
    default: 8,
    about: "hidden widths kept are a multiple of it",
};
