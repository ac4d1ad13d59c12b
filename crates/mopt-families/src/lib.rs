//! # mopt-families
//!
//! The model families `mopt-train` ships, each a [`Family`](mopt_stages::family::Family) built
//! on the stage runner's public API exactly as a user's family is in their own crate: BERT
//! text classifiers ([`bert`]), ResNet and plain-CNN image classifiers ([`resnet`], [`cnn`],
//! both through the generic [`image::ImageFamily`] a user's image model also uses) and Llama
//! decoder language models ([`llama`]). [`builtin`] is the registry `mopt-train` runs with.
#![deny(missing_docs)]

pub mod bert;
pub mod cnn;
pub mod image;
pub mod llama;
pub mod llama_score;
pub mod resnet;

use mopt_stages::Registry;

/// What `mopt-train` ships: every stage kind ([`Registry::builtin_kinds`]) and the BERT,
/// ResNet, CNN and Llama families, BERT answering for recipes that name no architecture.
pub fn builtin() -> Registry {
    Registry::builtin_kinds()
        .with_family(bert::Bert)
        .with_family(resnet::RESNET)
        .with_family(cnn::CNN)
        .with_family(llama::Llama)
        .with_default_family("bert")
}
