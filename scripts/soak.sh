#!/usr/bin/env bash
# The long form of the soak under faults (crates/tollgate-redis/tests/faults.rs,
# `soak_under_faults`): 32 tasks on 500 keys through a fail-open and a
# fail-closed limiter over one Redis backend, while the append-only
# redis-server is stopped (SIGSTOP 2 s) and continued, then killed and
# restarted (down 2 s), CYCLES times (default 20, about 8 s a cycle).
# It prints the verdict counts and the longest wait; see docs/redis.md.
# SERVERS: redis, valkey or both (default; one after the other).
#
#   scripts/soak.sh [CYCLES] [SERVERS]
set -euo pipefail
cd "$(dirname "$0")/.."
cycles="${1:-20}"
case "${2:-both}" in
    both) tests=(soak_under_faults::redis soak_under_faults::valkey) ;;
    redis | valkey) tests=("soak_under_faults::$2") ;;
    *) echo "usage: $0 [CYCLES] [redis|valkey|both]" >&2; exit 2 ;;
esac
TOLLGATE_SOAK_CYCLES="$cycles" CI="${CI:-true}" cargo test --release -p tollgate-redis \
    --all-features --test faults -- --exact --nocapture --test-threads=1 "${tests[@]}"
