#!/usr/bin/env bash
# The whole test suite, as a new user runs it (README) and as CI runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-test-deps.sh
# Every failing test binary is reported, not only the first.
cargo test --workspace --all-features --no-fail-fast
