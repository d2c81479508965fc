#!/usr/bin/env bash
# The batch behind docs/benchmarks.md's Summary: every comparison of issue
# 15's goals, one after another, on the commit checked out. Each command
# pairs tollgate with its peer in the same run (alternating rounds), and
# the runs that depend on order are made twice, in opposite orders. Run it
# on an otherwise idle machine; about 15 minutes on two cores.
#
#   scripts/bench-batch.sh [OUT]     (default /tmp/bench-batch.txt)
#
# Needs redis-server, node >= 20 with npm (rate-limiter-flexible), wrk and
# valgrind. The output is the raw record: the Summary's table is read from
# it by hand, each row naming the command it comes from.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/bench-batch.txt}
TARGET=${CARGO_TARGET_DIR:-$PWD/target}
BENCH=$TARGET/release/tollgate-bench
PAIRED=$TARGET/release/examples/paired
exec > >(tee "$OUT") 2>&1
set -x
git log --oneline -1
cargo build --release -q -p tollgate-bench --bins --examples
cargo build --release -q -p tollgate-memory --example paired
uptime
# Memory: Limiter::check over MemoryBackend against governor's keyed
# limiter, in pairs of ~20 ms, twice.
"$PAIRED"
"$PAIRED"
uptime
# Redis: against a bare client sending the smallest correct GCRA script
# and one sending tollgate's script; per second of redis-server CPU.
for keys in 1 10000; do
    "$BENCH" --spawn-server --keys $keys --concurrency 50 --duration 16s --rounds 16 --peers gcra,bare
    "$BENCH" --spawn-server --keys $keys --concurrency 50 --duration 16s --rounds 16 --peers gcra,bare --peers-first
done
uptime
# Redis: against rate-limiter-flexible (node, ioredis).
scripts/bench-peers.sh 2 2 50
uptime
# HTTP: one per-IP layer against tower_governor, and the API-key
# example's two layers against its bare router (wrk, alternating rounds).
scripts/bench-http.sh 8 1 32
crates/tollgate-tower/benches/wrk.sh 8 1 32
uptime
# Deterministic counts: the server's instructions a decision, and the
# HTTP servers' instructions a request (callgrind).
scripts/script-cost.sh 5000
scripts/http-instructions.sh 3
# Lease mode and local denials against the Redis path.
"$BENCH" --spawn-server --concurrency 64 --keys 1000 --duration 4s --rounds 2 --no-bare --lease 10
"$BENCH" --spawn-server --concurrency 64 --keys 1000 --duration 4s --rounds 2 --no-bare
"$BENCH" --spawn-server --concurrency 50 --keys 1 --duration 4s --rounds 2 --no-bare --local-denials 1s
"$BENCH" --spawn-server --concurrency 50 --keys 1 --duration 4s --rounds 2 --no-bare
# The order-dependent HTTP runs again, in the other order of the batch.
crates/tollgate-tower/benches/wrk.sh 8 1 32
scripts/bench-http.sh 8 1 32
uptime
echo BATCH DONE
