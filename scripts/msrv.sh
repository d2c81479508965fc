#!/usr/bin/env bash
# Checks every published crate, with all its features, on the Rust the
# workspace declares (`rust-version` in Cargo.toml): the promise a user's
# older toolchain relies on, kept true by CI rather than by hope. The lock
# file is the workspace's (resolver 3 picks versions that keep this Rust).
# A target directory of its own, so the stable build's cache is kept.
#
#   scripts/msrv.sh            (installs that toolchain through rustup)
set -euo pipefail
cd "$(dirname "$0")/.."
msrv=$(sed -n 's/^rust-version *= *"\(.*\)"/\1/p' Cargo.toml)
[[ -n $msrv ]] || { echo "no rust-version in Cargo.toml" >&2; exit 1; }
rustup toolchain install "$msrv" --profile minimal >/dev/null
crates=(tollgate-limiter tollgate-memory tollgate-redis tollgate-tower tollgate-testkit tollgate tollgate-cli)
args=()
for c in "${crates[@]}"; do args+=(-p "$c"); done
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/msrv" \
    cargo "+$msrv" check --locked --all-features "${args[@]}"
echo "checked on Rust $msrv: ${crates[*]}"
