//! # mopt
//!
//! The `mopt-train` command line as a library ([`cli::main`]), so that a program that registers
//! a model family of its own runs recipes exactly as `mopt-train` does. The algorithms live in
//! the `mopt-*` crates; [`Registry`] is how a family or a stage kind joins a run.

pub mod cli;

pub use mopt_families::builtin;
pub use mopt_stages::Registry;
