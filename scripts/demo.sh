#!/usr/bin/env bash
# The README's demo command, as CI checks it: it must run to completion and
# show requests being refused.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(cargo run -q -p axum-api-keys)
printf '%s\n' "$out"
grep -q "200 OK" <<<"$out"
grep -q "429 Too Many Requests" <<<"$out"
