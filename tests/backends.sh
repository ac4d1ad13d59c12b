#!/usr/bin/env bash
# The GPU backends cannot run without a GPU; check that they still build, so neither rots.
#   cuda: type-checked (DOCS_RS=1 skips cubecl-cuda's LLVM-bundle download; the whole graph checks)
#   wgpu: type-checked too, in the same check. A `cargo check` runs every build script and type-checks every crate of
#         the graph; what only a full build adds is code generation and linking, which for these
#         pure-Rust backends (no native library is linked at build time: CUDA and Vulkan are opened at
#         run time) has not caught anything a check missed, and costs 30-60 minutes cold on 2 cores.
# Not checked here: `tch` (needs PyTorch 2.9's wheels, see the README). A separate target folder
# keeps these feature sets from invalidating the CPU build's artifacts.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/gpu-check"
# One check with both features: the backend code has one `#[cfg(feature = ...)]` arm per backend
# and nothing that needs exactly one of them, and the two share the whole CubeCL graph (checked
# once: 8m52s cold here, against about 10 minutes for two separate checks).
# The opt-in `remote` feature (Burn's remote backend, `mopt-train serve`) is type-checked in the
# same check: the test build leaves it out (its Iroh stack is a quarter of a cold build).
echo "backends: type-checking --features cuda,wgpu,remote"
DOCS_RS=1 cargo check --bin mopt-train --no-default-features --features cuda,wgpu,remote
echo "backends: cuda, wgpu and remote type-check"
