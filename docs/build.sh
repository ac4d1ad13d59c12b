#!/usr/bin/env bash
# Build the mopt book (docs/src -> docs/book) with mdBook, installing mdBook from crates.io
# (pinned, into ~/.cargo/bin) when it is missing. Open docs/book/index.html afterwards.
set -euo pipefail
cd "$(dirname "$0")"
MDBOOK_VERSION=0.4.52
if ! command -v mdbook >/dev/null || ! mdbook --version | grep -q "v$MDBOOK_VERSION"; then
  echo "installing mdBook $MDBOOK_VERSION (cargo install, a few minutes once)" >&2
  cargo install mdbook --version "$MDBOOK_VERSION" --locked
fi
mdbook build
echo "book: $(pwd)/book/index.html" >&2
