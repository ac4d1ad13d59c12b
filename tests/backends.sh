#!/usr/bin/env bash
# The GPU backends cannot run without a GPU; check that they still build, so neither rots.
#   cuda: type-checked (DOCS_RS=1 skips cubecl-cuda's LLVM-bundle download; the whole graph checks)
#   wgpu: the mopt-train binary is built
# Not checked here: `tch` (needs PyTorch 2.9's wheels, see the README). A separate target folder
# keeps these feature sets from invalidating the CPU build's artifacts.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/gpu-check"
echo "backends: type-checking --features cuda"
DOCS_RS=1 cargo check --bin mopt-train --features cuda
echo "backends: building --features wgpu"
cargo build --bin mopt-train --features wgpu
echo "backends: cuda type-checks and wgpu builds"
