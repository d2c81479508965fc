#!/usr/bin/env bash
# HTTP layer cost, deterministic: the user-space instructions an axum server
# executes per request under callgrind, for the servers that
# scripts/bench-http.sh and crates/tollgate-tower/benches/wrk.sh time with
# wrk, side by side:
#
#   http_app    bare / tollgate (one per-IP layer) / governor (tower_governor)
#   api-keys    bare / one per-key layer (with its candidate policy) /
#               the example's two layers (per IP, then per key)
#
# Wall-clock ratios on a shared two-core machine move by ±15 % between
# rounds (wrk shares the cores, and a slower server leaves wrk asleep more
# often, so each response also costs a wake-up); these counts do not move
# with the load, so a change to a layer can be judged by them.
#
# Under valgrind the CPU has no SHA extensions: the API key's HMAC-SHA256
# runs in software (~7,000 instructions; ~100 ns natively with them). Its
# share is printed apart, and the "without SHA" column leaves it out.
#
#   scripts/http-instructions.sh [SECONDS]     (default 4; needs valgrind, wrk)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-4}
TARGET=${CARGO_TARGET_DIR:-$PWD/target}
for tool in valgrind wrk; do
    command -v $tool >/dev/null || { echo "needs $tool (apt-get install -y $tool)" >&2; exit 2; }
done
cargo build --release -q -p tollgate-bench --bins --examples
cargo build --release -q -p axum-api-keys
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Limits far above the load: every request is admitted (the cost of
# deciding, not of answering 429).
export TOLLGATE_LIMITERS__API_FREE__CAPACITY=1000000000 TOLLGATE_LIMITERS__API_FREE__REFILL=1000000/s
export TOLLGATE_LIMITERS__API_IP__CAPACITY=1000000000 TOLLGATE_LIMITERS__API_IP__REFILL=1000000/s
unset REDIS_URL

# count <label> <port> <command...>: prints "label requests instr/req sha/req"
count() {
    local label=$1 port=$2
    shift 2
    valgrind --tool=callgrind --callgrind-out-file="$work/cg.%p" "$@" >"$work/log" 2>&1 &
    local vpid=$! url="http://127.0.0.1:$port/v1/items"
    for _ in $(seq 150); do
        curl -sf -o /dev/null -H 'x-api-key: bench_key' "$url" && break
        sleep 0.2
    done
    # Warm up (connections, caches, the allocator), then count only the run.
    wrk -t1 -c8 -d2s -H 'x-api-key: bench_key' "$url" >/dev/null
    callgrind_control -z "$vpid" >/dev/null 2>&1
    local out
    out=$(wrk -t1 -c8 -d"${SECS}s" --timeout 5s -H 'x-api-key: bench_key' "$url")
    callgrind_control -d "$vpid" >/dev/null 2>&1
    kill "$vpid"
    wait "$vpid" 2>/dev/null || true
    if grep -q 'Non-2xx' <<<"$out"; then
        echo "$label: some answers were not 200" >&2
        exit 1
    fi
    local n ir sha
    n=$(awk '/requests in/ {print $1}' <<<"$out")
    ir=$(callgrind_annotate "$work/cg.$vpid.1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1; exit}')
    sha=$(callgrind_annotate --threshold=100 "$work/cg.$vpid.1" 2>/dev/null |
        awk '/sha256::(soft::)?compress256|sha256::x86::digest_blocks/ && !/\*/ {gsub(",", "", $1); s += $1} END {print s + 0}')
    echo "$label $n $((ir / n)) $((sha / n))"
}

APP=$TARGET/release/examples/http_app
KEYS=$TARGET/release/axum-api-keys
rows=()
for mode in bare tollgate governor; do
    p=$(free_port)
    rows+=("$(count "http_app:$mode" "$p" "$APP" --mode "$mode" --listen "127.0.0.1:$p")")
done
for mode in bare key-only two-layers; do
    p=$(free_port)
    case $mode in
        bare) flag=--no-limit ;;
        key-only) flag=--key-only ;;
        two-layers) flag= ;;
    esac
    # shellcheck disable=SC2086 # an empty $flag is no argument
    rows+=("$(count "api-keys:$mode" "$p" "$KEYS" --serve "127.0.0.1:$p" $flag)")
done

echo "| server | requests | instructions/request | of which SHA-256 (software) | without SHA | ÷ its bare router (without SHA) |"
echo "|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}" | awk '
    { split($1, a, ":"); app = a[1]; without = $3 - $4
      if (a[2] == "bare") base[app] = without
      printf "| %s | %d | %d | %d | %d | %.2fx |\n", $1, $2, $3, $4, without, without / base[app] }'
echo
echo "(callgrind, user space of the server only, wrk -t1 -c8 -d${SECS}s after a 2 s warm-up; $(date -u +%F))"
