#!/usr/bin/env bash
# tollgate's Redis path side by side with its peers, on one throwaway
# redis-server (loopback, no persistence), alternating rounds:
#
#   library  tollgate's Limiter::check, default settings (crates/tollgate-bench)
#   bare     the same script through a bare redis client
#   gcra     a bare redis client + the smallest correct token bucket
#            (crates/tollgate-bench/lua/minimal_gcra.lua)
#   rlf      rate-limiter-flexible's RateLimiterRedis over ioredis (node,
#            scripts/peers/rlf), as its docs call it: consume(key)
#
# Two scenarios (10,000 keys at random; one hot key), two runs each in
# opposite orders (library, bare, gcra, rlf; then rlf, gcra, bare,
# library), ROUNDS rounds of SECONDS per path in each run. Concurrency: C
# tokio tasks for the Rust paths (2 worker threads), C async loops on one
# node thread for rlf; each awaits one decision at a time, so at most C
# decisions are in flight on each path's one connection.
#
#   scripts/bench-peers.sh [SECONDS] [ROUNDS] [CONCURRENCY]   # default 2 3 50
#
# Prints, per scenario and run, decisions/s of each path and the ratios
# library / peer in wall-clock throughput and in decisions per second of
# redis-server CPU (INFO cpu read around every round), and the errors of
# each path (for the library: verdicts without a decision, i.e. its default
# 50 ms timeout or its breaker; pass e.g. TIMEOUT=1s to the environment to
# give it longer on a loaded machine). RLF_AUTOPIPELINING=1 in the
# environment turns on ioredis's auto-pipelining for rlf (off by default,
# as in rate-limiter-flexible's docs; the Rust paths' multiplexed
# connection always batches concurrent calls: see docs/benchmarks.md,
# "rate-limiter-flexible and pipelining"). Needs redis-server,
# node >= 20 and npm (npm ci installs the pinned peer).
set -euo pipefail

SECS=${1:-2}
ROUNDS=${2:-3}
CONC=${3:-50}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}

command -v redis-server >/dev/null || { echo "redis-server not found" >&2; exit 1; }
command -v node >/dev/null || { echo "node not found (node >= 20)" >&2; exit 1; }
# The same build as scripts/bench-http.sh (same features: no rebuild).
cargo build --release -q -p tollgate-bench --bins --examples --manifest-path "$ROOT/Cargo.toml"
BENCH=$TARGET/release/tollgate-bench
RLF=$ROOT/scripts/peers/rlf
[ -d "$RLF/node_modules" ] || (cd "$RLF" && npm ci --silent --no-audit --no-fund)

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
DIR=$(mktemp -d)
# In a session of its own (setsid), as a production server runs apart from
# its clients: with the scheduler's autogroups, a server in the clients'
# session shares their group's CPU (docs/benchmarks.md, "Where the server
# runs").
setsid redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no \
  --dir "$DIR" --logfile "$DIR/redis.log" &
REDIS_PID=$!
trap 'kill $REDIS_PID 2>/dev/null || true; rm -rf "$DIR"' EXIT
URL=redis://127.0.0.1:$PORT
for _ in $(seq 50); do
  redis-cli -p "$PORT" ping >/dev/null 2>&1 && break
  sleep 0.1
done

rust_paths() { # keys peers-first? -> result lines of library, bare, gcra
  local order=()
  if [ "$2" = yes ]; then order=(--peers gcra,bare --peers-first); else order=(--peers bare,gcra); fi
  "$BENCH" --backend redis --url "$URL" --concurrency "$CONC" --keys "$1" \
    --duration "${SECS}s" --rounds 1 ${TIMEOUT:+--timeout "$TIMEOUT"} "${order[@]}" | grep '^result '
}
RLF_FLAGS=() RLF_NOTE=
if [ "${RLF_AUTOPIPELINING:-0}" = 1 ]; then RLF_FLAGS=(--autopipelining 1) RLF_NOTE=" (rlf auto-pipelined)"; fi
rlf_path() { # keys -> result line of rlf
  node "$RLF/bench.js" --url "$URL" --concurrency "$CONC" --keys "$1" \
    --duration "$SECS" "${RLF_FLAGS[@]}" | grep '^result '
}

RESULTS=$DIR/results
: >"$RESULTS"
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
for keys in 10000 1; do
  for run in 1 2; do
    for r in $(seq "$ROUNDS"); do
      if [ "$run" = 1 ]; then
        { rust_paths "$keys" no; rlf_path "$keys"; }
      else
        { rlf_path "$keys"; rust_paths "$keys" yes; }
      fi | sed "s/^result /result keys=$keys run=$run /" >>"$RESULTS"
      echo "keys $keys, run $run, round $r done" >&2
    done
  done
done

echo "## tollgate vs peers: $CONC tasks / loops, $ROUNDS rounds of ${SECS}s per path and run$RLF_NOTE"
echo "(load average before: $LOAD_BEFORE, after: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores; redis $(redis-server --version | cut -d' ' -f3 | cut -d= -f2); $(date -u +%FT%RZ))"
echo
echo "| keys | run (order) | library/s | bare/s | gcra/s | rlf/s | lib/bare | lib/gcra | lib/rlf | per server-CPU s: lib/gcra | lib/rlf | per client-CPU s: lib/bare | errors lib, bare, gcra, rlf |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
awk '
  {
    for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
    id = f["keys"] SUBSEP f["run"] SUBSEP f["path"]
    d[id] += f["decisions"]; s[id] += f["seconds"]; c[id] += f["server_cpu"]; u[id] += f["client_cpu"]; e[id] += f["errors"]
  }
  function rate(k, r, p) { return d[k, r, p] / s[k, r, p] }
  function eff(k, r, p) { return c[k, r, p] > 0 ? d[k, r, p] / c[k, r, p] : 0 }
  # The load tool process CPU per decision: the client side of a path (the
  # library and the bare client run in one process; rlf is node, not counted).
  function ceff(k, r, p) { return u[k, r, p] > 0 ? d[k, r, p] / u[k, r, p] : 0 }
  function ratio(a, b) { return b > 0 ? sprintf("%.2fx", a / b) : "-" }
  END {
    split("10000 1", ks, " ")
    for (ki = 1; ki <= 2; ki++) for (r = 1; r <= 2; r++) {
      k = ks[ki]
      printf "| %s | %s | %.0f | %.0f | %.0f | %.0f | %s | %s | %s | %s | %s | %s | %d, %d, %d, %d |\n",
        k == 1 ? "1 (hot)" : k, r == 1 ? "1 (library first)" : "2 (rlf first)",
        rate(k, r, "library"), rate(k, r, "bare"), rate(k, r, "gcra"), rate(k, r, "rlf"),
        ratio(rate(k, r, "library"), rate(k, r, "bare")),
        ratio(rate(k, r, "library"), rate(k, r, "gcra")),
        ratio(rate(k, r, "library"), rate(k, r, "rlf")),
        ratio(eff(k, r, "library"), eff(k, r, "gcra")),
        ratio(eff(k, r, "library"), eff(k, r, "rlf")),
        ratio(ceff(k, r, "library"), ceff(k, r, "bare")),
        e[k, r, "library"], e[k, r, "bare"], e[k, r, "gcra"], e[k, r, "rlf"]
    }
  }' "$RESULTS"
