//! `mopt-train`: run a mopt recipe with the shipped model families and stage kinds
//! (the command line is [`mopt::cli`]).

fn main() -> std::process::ExitCode {
    mopt::cli::main(mopt::builtin())
}
