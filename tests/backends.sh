#!/usr/bin/env bash
# The GPU backends cannot run without a GPU; check that they still build, so neither rots.
#   cuda: type-checked (DOCS_RS=1 skips cubecl-cuda's LLVM-bundle download; the whole graph checks)
#   wgpu: type-checked too, in the same check. A `cargo check` runs every build script and type-checks every crate of
#         the graph; what only a full build adds is code generation and linking, which for these
#         pure-Rust backends (no native library is linked at build time: CUDA and Vulkan are opened at
#         run time) has not caught anything a check missed, and costs 30-60 minutes cold on 2 cores.
# Not checked here: `tch` (needs PyTorch 2.9's wheels, see the README), and by default the opt-in
# `remote` feature (Burn's remote backend, `mopt-train serve`: its Iroh networking stack adds
# about 4 minutes to a cold check on 2 cores); `tests/backends.sh --remote` checks it too (do so
# when touching `crates/mopt-train/src/remote*` or `serve`).
#
# The check shares the test build's target folder: its build scripts and proc macros (host
# artifacts, the same features) are reused, and the feature sets' own artifacts sit beside the
# CPU build's under other hashes (a check writes no binary), so neither invalidates the other.
set -euo pipefail
cd "$(dirname "$0")/.."
features=cuda,wgpu
if [[ "${1:-}" == "--remote" ]]; then
    features=cuda,wgpu,remote
fi
# One check with both features: the backend code has one `#[cfg(feature = ...)]` arm per backend
# and nothing that needs exactly one of them, and the two share the whole CubeCL graph (checked
# once: 8m52s cold here, against about 10 minutes for two separate checks).
echo "backends: type-checking --features $features"
DOCS_RS=1 cargo check --bin mopt-train --no-default-features --features "$features"
echo "backends: $features type-check"
