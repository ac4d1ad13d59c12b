//! `mopt-train`'s whole command line with the fastText family registered beside the shipped
//! ones: `cargo run --release -- ../../examples/fasttext/distill_fasttext.toml` from this folder
//! (see README.md).

fn main() -> std::process::ExitCode {
    mopt::cli::main(mopt::builtin().with_family(mopt_fasttext::FastTextFamily))
}
