#!/usr/bin/env bash
# The GPU backends cannot run without a GPU; check that they still build, so neither rots.
#   cuda: type-checked (DOCS_RS=1 skips cubecl-cuda's LLVM-bundle download; the whole graph checks)
#   wgpu: type-checked too. A `cargo check` runs every build script and type-checks every crate of
#         the graph; what only a full build adds is code generation and linking, which for these
#         pure-Rust backends (no native library is linked at build time: CUDA and Vulkan are opened at
#         run time) has not caught anything a check missed, and costs 30-60 minutes cold on 2 cores.
# Not checked here: `tch` (needs PyTorch 2.9's wheels, see the README). A separate target folder
# keeps these feature sets from invalidating the CPU build's artifacts.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/gpu-check"
echo "backends: type-checking --features cuda"
DOCS_RS=1 cargo check --bin mopt-train --features cuda
echo "backends: type-checking --features wgpu"
cargo check --bin mopt-train --features wgpu
echo "backends: cuda and wgpu type-check"
