#!/usr/bin/env bash
# The whole test suite, as a new user runs it (README) and as CI runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-test-deps.sh
cargo test --workspace --all-features
