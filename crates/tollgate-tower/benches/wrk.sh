#!/usr/bin/env bash
# HTTP layer overhead: wrk against the axum-api-keys example with and
# without the rate-limit layers (per IP + per API key, memory backend), in
# one run, on loopback only. Runs are short and bounded; rounds alternate
# between the two servers so drift affects both alike.
#
#   crates/tollgate-tower/benches/wrk.sh [ROUNDS] [SECONDS] [CONNECTIONS]
#
# Needs `wrk` (Debian package). Prints requests/s per round, the medians
# and the ratio limited/bare.
set -euo pipefail

ROUNDS=${1:-3}
SECS=${2:-5}
CONNS=${3:-32}
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}

command -v wrk >/dev/null || { echo "wrk not found (apt-get install wrk)" >&2; exit 1; }
cargo build --release -q -p axum-api-keys --manifest-path "$ROOT/Cargo.toml"
BIN=$TARGET/release/axum-api-keys

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
BARE_PORT=$(free_port)
LIMITED_PORT=$(free_port)

# Limits high enough that no request is refused: this measures the cost of
# deciding, not the speed of answering 429.
export TOLLGATE_LIMITERS__API_FREE__CAPACITY=1000000000
export TOLLGATE_LIMITERS__API_FREE__REFILL=1000000/s
export TOLLGATE_LIMITERS__API_IP__CAPACITY=1000000000
export TOLLGATE_LIMITERS__API_IP__REFILL=1000000/s
unset REDIS_URL

"$BIN" --serve "127.0.0.1:$BARE_PORT" --no-limit 2>/dev/null &
BARE_PID=$!
"$BIN" --serve "127.0.0.1:$LIMITED_PORT" 2>/dev/null &
LIMITED_PID=$!
trap 'kill $BARE_PID $LIMITED_PID 2>/dev/null || true' EXIT

for port in "$BARE_PORT" "$LIMITED_PORT"; do
  for _ in $(seq 50); do
    curl -sf -o /dev/null -H 'x-api-key: bench_key' "http://127.0.0.1:$port/v1/items" && break
    sleep 0.1
  done
done

run() { # port -> requests/s
  wrk -t1 -c"$CONNS" -d"${SECS}s" --timeout 2s -H 'x-api-key: bench_key' \
    "http://127.0.0.1:$1/v1/items" | awk '/Requests\/sec/ {print $2}'
}
check_all_ok() { # the limited server must have answered 200 to everything
  local non2xx
  non2xx=$(wrk -t1 -c4 -d1s -H 'x-api-key: bench_key' "http://127.0.0.1:$1/v1/items" | awk '/Non-2xx/ {print $NF}')
  [ -z "$non2xx" ] || { echo "non-2xx answers on port $1: $non2xx" >&2; exit 1; }
}

check_all_ok "$LIMITED_PORT"
run "$BARE_PORT" >/dev/null   # warm-up
run "$LIMITED_PORT" >/dev/null

bare=(); limited=()
for r in $(seq "$ROUNDS"); do
  b=$(run "$BARE_PORT"); l=$(run "$LIMITED_PORT")
  bare+=("$b"); limited+=("$l")
  echo "round $r: bare $b req/s, limited $l req/s"
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
mb=$(median "${bare[@]}"); ml=$(median "${limited[@]}")
echo "median: bare $mb req/s, limited $ml req/s, ratio $(awk -v l="$ml" -v b="$mb" 'BEGIN {printf "%.3f", l/b}')"
echo "(wrk -t1 -c$CONNS -d${SECS}s, $ROUNDS rounds, $(nproc) cores, $(date -u +%F))"
