#!/usr/bin/env bash
# Server cost of one decision, deterministic: the instructions redis-server
# executes per EVALSHA under callgrind, for tollgate's token-bucket script
# as the Redis backend sends it for Limiter::check (see Call::invocation in
# crates/tollgate-redis/src/lib.rs): in the common case, a limiter without
# per-key overrides, one key (the state) and two arguments (the operation
# and the policy); on a limiter with per-key overrides (its marker set), two
# keys, the state and the key's override (absent here: the other keys'
# overrides are what set the marker). And for the load tool's minimal GCRA
# script (one key, two arguments); then both on one hot key whose
# decisions are refusals. Unlike wall-clock figures it does not
# move with the machine's load, so a change to a script can be judged on a
# shared machine.
#
#   scripts/script-cost.sh [decisions]      (default 5000; needs valgrind)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-5000}
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install -y valgrind)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

# cost <label> <script file> <numkeys> <args...>
cost() {
    local label=$1 file=$2
    shift 2
    valgrind --tool=callgrind --callgrind-out-file="$work/cg.%p" \
        redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >"$work/log" 2>&1 &
    local vpid=$!
    for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.2; done
    local sha
    sha=$(redis-cli -p "$port" script load "$(cat "$file")")
    # Warm up (keys created, allocator settled), then count only the run.
    redis-benchmark -p "$port" -c 4 -n 2000 -r 10000 -q evalsha "$sha" "$@" >/dev/null 2>&1
    callgrind_control -z "$vpid" >/dev/null 2>&1
    redis-benchmark -p "$port" -c 4 -n "$n" -r 10000 -q evalsha "$sha" "$@" >/dev/null 2>&1
    callgrind_control -d "$vpid" >/dev/null 2>&1
    kill "$vpid"
    wait "$vpid" 2>/dev/null || true
    local ir
    ir=$(callgrind_annotate "$work/cg.$vpid.1" 2>/dev/null | awk '/PROGRAM TOTALS/{gsub(",","",$1); print $1; exit}')
    printf '%-40s %8d instructions/decision\n' "$label" $((ir / n))
}

# Assembled as crates/tollgate-redis/src/scripts.rs does (TOKEN_BUCKET_CODE).
lua=crates/tollgate-redis/lua
cat $lua/token_bucket.lua $lua/common.lua $lua/token_bucket_ops.lua >"$work/tb.lua"
# 10,000 keys, every decision admitted (a bucket of 100,000 refilling 1/10 µs).
cost "minimal GCRA (bare client's script)" crates/tollgate-bench/lua/minimal_gcra.lua \
    1 'bench:{__rand_int__}' 10 1000000
cost "tollgate token bucket" "$work/tb.lua" \
    1 'tollgate:bench:{__rand_int__}' \
    1 '2:t:100000:10:100000:1000000'
cost "tollgate, limiter with key overrides" "$work/tb.lua" \
    2 'tollgate:bench:{__rand_int__}' 'tollgate:bench:{__rand_int__}:override' \
    1 '2:t:100000:10:100000:1000000'
# One hot key, every decision past the first refused (capacity 1, one
# token an hour): what a flooded key costs the server.
cost "minimal GCRA, one hot key refusing" crates/tollgate-bench/lua/minimal_gcra.lua \
    1 'bench:{hot}' 3600000000 3600000000
cost "tollgate, one hot key refusing" "$work/tb.lua" \
    1 'tollgate:bench:{hot}' \
    1 '2:t:1:3600000000:1:3600000000'
