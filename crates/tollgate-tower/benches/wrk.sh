#!/usr/bin/env bash
# HTTP layer overhead: wrk against the axum-api-keys example with and
# without the rate-limit layers, in one run, on loopback only: the bare
# router, the per-API-key layer alone, and the example's two layers (per IP
# + per API key), all on the memory backend. Runs are short and bounded; rounds alternate
# between the two servers so drift affects both alike.
#
#   crates/tollgate-tower/benches/wrk.sh [ROUNDS] [SECONDS] [CONNECTIONS]
#
# Needs `wrk` (Debian package). Prints requests/s per round, then the
# ratio limited/bare of the medians and of the best rounds (on a shared
# machine other work only ever lowers a round, so the best rounds are the
# least disturbed estimate of each server's capacity), and the server's
# CPU time per request, which other load barely moves: bare/limited is the
# throughput ratio of a CPU-bound server.
set -euo pipefail

ROUNDS=${1:-8}
SECS=${2:-3}
CONNS=${3:-32}
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}

command -v wrk >/dev/null || { echo "wrk not found (apt-get install wrk)" >&2; exit 1; }
cargo build --release -q -p axum-api-keys --manifest-path "$ROOT/Cargo.toml"
BIN=$TARGET/release/axum-api-keys

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
BARE_PORT=$(free_port)
LIMITED_PORT=$(free_port)
KEY_PORT=$(free_port)

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
"$BIN" --serve "127.0.0.1:$KEY_PORT" --key-only 2>/dev/null &
KEY_PID=$!
trap 'kill $BARE_PID $LIMITED_PID $KEY_PID 2>/dev/null || true' EXIT

for port in "$BARE_PORT" "$LIMITED_PORT" "$KEY_PORT"; do
  for _ in $(seq 50); do
    curl -sf -o /dev/null -H 'x-api-key: bench_key' "http://127.0.0.1:$port/v1/items" && break
    sleep 0.1
  done
done

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
run() { # port pid -> "requests/s server-CPU-µs/request"
  local before after out
  before=$(cpu_ticks "$2")
  out=$(wrk -t1 -c"$CONNS" -d"${SECS}s" --timeout 2s -H 'x-api-key: bench_key' "http://127.0.0.1:$1/v1/items")
  after=$(cpu_ticks "$2")
  awk -v t="$((after - before))" -v hz="$(getconf CLK_TCK)" '
    /requests in/ {n = $1}
    /Requests\/sec/ {rps = $2}
    END {printf "%s %.2f\n", rps, t / hz * 1e6 / n}' <<<"$out"
}
check_all_ok() { # the limited server must have answered 200 to everything
  local non2xx
  non2xx=$(wrk -t1 -c4 -d1s -H 'x-api-key: bench_key' "http://127.0.0.1:$1/v1/items" | awk '/Non-2xx/ {print $NF}')
  [ -z "$non2xx" ] || { echo "non-2xx answers on port $1: $non2xx" >&2; exit 1; }
}

check_all_ok "$LIMITED_PORT"
check_all_ok "$KEY_PORT"
run "$BARE_PORT" "$BARE_PID" >/dev/null   # warm-up
run "$LIMITED_PORT" "$LIMITED_PID" >/dev/null
run "$KEY_PORT" "$KEY_PID" >/dev/null

bare=(); limited=(); key=(); bare_cpu=(); limited_cpu=(); key_cpu=()
for r in $(seq "$ROUNDS"); do
  read -r b bc < <(run "$BARE_PORT" "$BARE_PID")
  read -r k kc < <(run "$KEY_PORT" "$KEY_PID")
  read -r l lc < <(run "$LIMITED_PORT" "$LIMITED_PID")
  bare+=("$b"); limited+=("$l"); key+=("$k")
  bare_cpu+=("$bc"); limited_cpu+=("$lc"); key_cpu+=("$kc")
  echo "round $r: bare $b req/s ($bc µs CPU/req), key only $k req/s ($kc µs), ip+key $l req/s ($lc µs)"
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
best() { printf '%s\n' "$@" | sort -g | tail -1; }
ratio() { awk -v l="$1" -v b="$2" 'BEGIN {printf "%.3f", l/b}'; }
report() { # label rps[] cpu[] (as names)
  local -n r=$2 c=$3
  local mb ml bb bl cb cl
  mb=$(median "${bare[@]}"); ml=$(median "${r[@]}")
  bb=$(best "${bare[@]}"); bl=$(best "${r[@]}")
  cb=$(median "${bare_cpu[@]}"); cl=$(median "${c[@]}")
  echo "$1: median $ml vs $mb req/s, ratio $(ratio "$ml" "$mb"); best $bl vs $bb, ratio $(ratio "$bl" "$bb"); CPU/req $cl vs $cb µs, ratio $(ratio "$cb" "$cl")"
}
# Server CPU per request barely depends on how much CPU others leave us.
report "key only" key key_cpu
report "ip + key" limited limited_cpu
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "(wrk -t1 -c$CONNS -d${SECS}s, $ROUNDS rounds, $(nproc) cores, $(date -u +%F))"
