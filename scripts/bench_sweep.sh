#!/usr/bin/env bash
# Runs the load tool (crates/tollgate-bench) over a range of concurrencies
# against a throwaway redis-server on a loopback port, and writes its raw
# output, run after run, to one file (default docs/bench-sweep.txt) for
# scripts/plot_bench.py.
#
#   scripts/bench_sweep.sh [OUT] [CONCURRENCIES...]
#   scripts/bench_sweep.sh docs/bench-sweep.txt 1 4 16 64 256
#
# Each run: token bucket, 10,000 keys, 8 interleaved rounds of 1 s per path (library,
# then a bare redis client sending the same script), so about 17 s a run.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-docs/bench-sweep.txt}"
shift || true
levels=("$@")
[ ${#levels[@]} -gt 0 ] || levels=(1 4 16 64 256)
cargo build --release -q -p tollgate-bench
bin="${CARGO_TARGET_DIR:-target}/release/tollgate-bench"
{
  echo "# tollgate-bench sweep: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, redis $(redis-server --version | cut -d' ' -f3 | cut -d= -f2), load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
  for c in "${levels[@]}"; do
    "$bin" --backend redis --spawn-server --concurrency "$c" --keys 10000 \
      --duration 8s --rounds 8
    echo
  done
} | tee "$out"
