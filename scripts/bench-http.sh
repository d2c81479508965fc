#!/usr/bin/env bash
# HTTP: one axum app (crates/tollgate-bench/examples/http_app.rs) served
# three ways side by side on loopback, wrk against each in alternating
# rounds:
#
#   bare      the router alone
#   tollgate  one per-IP RateLimitLayer (ClientIp, memory backend, headers on)
#   governor  tower_governor's GovernorLayer (peer IP, use_headers())
#
# Every request is admitted (limits far above the load): this measures the
# cost of deciding. Two runs in opposite orders (bare, tollgate, governor;
# then governor, tollgate, bare), ROUNDS rounds of SECONDS each.
# The two-layer API-key example against its bare router is
# crates/tollgate-tower/benches/wrk.sh.
#
#   scripts/bench-http.sh [ROUNDS] [SECONDS] [CONNECTIONS]   # default 3 2 32
#
# Prints requests/s (median of the rounds) and server CPU per request, and
# the ratios to bare and tollgate / governor. Needs wrk.
set -euo pipefail

ROUNDS=${1:-3}
SECS=${2:-2}
CONNS=${3:-32}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}

command -v wrk >/dev/null || { echo "wrk not found (apt-get install wrk)" >&2; exit 1; }
# The same build as scripts/bench-peers.sh (same features: no rebuild).
cargo build --release -q -p tollgate-bench --bins --examples --manifest-path "$ROOT/Cargo.toml"
APP=$TARGET/release/examples/http_app

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
MODES=(bare tollgate governor)
declare -A PORT PID
for m in "${MODES[@]}"; do
  PORT[$m]=$(free_port)
  "$APP" --mode "$m" --listen "127.0.0.1:${PORT[$m]}" &
  PID[$m]=$!
done
trap 'kill ${PID[*]} 2>/dev/null || true' EXIT
for m in "${MODES[@]}"; do
  for _ in $(seq 50); do
    curl -sf -o /dev/null "http://127.0.0.1:${PORT[$m]}/v1/items" && break
    sleep 0.1
  done
  # Every mode answers 200, and the limited ones with their headers.
  headers=$(curl -sf -D - -o /dev/null "http://127.0.0.1:${PORT[$m]}/v1/items")
  case $m in
    tollgate) grep -qi '^ratelimit' <<<"$headers" || { echo "no RateLimit headers from tollgate" >&2; exit 1; } ;;
    governor) grep -qi '^x-ratelimit' <<<"$headers" || { echo "no x-ratelimit headers from governor" >&2; exit 1; } ;;
  esac
done

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
run() { # mode -> "requests/s server-CPU-µs/request non2xx"
  local m=$1 before after out
  before=$(cpu_ticks "${PID[$m]}")
  out=$(wrk -t1 -c"$CONNS" -d"${SECS}s" --timeout 2s "http://127.0.0.1:${PORT[$m]}/v1/items")
  after=$(cpu_ticks "${PID[$m]}")
  awk -v t="$((after - before))" -v hz="$(getconf CLK_TCK)" '
    /requests in/ {n = $1}
    /Requests\/sec/ {rps = $2}
    /Non-2xx/ {bad = $NF}
    END {printf "%s %.2f %d\n", rps, t / hz * 1e6 / n, bad}' <<<"$out"
}
for m in "${MODES[@]}"; do run "$m" >/dev/null; done # warm-up

declare -A RPS CPU
for order in forward reverse; do
  if [ $order = forward ]; then seq_modes=(bare tollgate governor); else seq_modes=(governor tollgate bare); fi
  for r in $(seq "$ROUNDS"); do
    line="$order round $r:"
    for m in "${seq_modes[@]}"; do
      read -r rps cpu bad < <(run "$m")
      [ "$bad" = 0 ] || { echo "$m answered $bad non-2xx" >&2; exit 1; }
      RPS[$order,$m]+="$rps "; CPU[$order,$m]+="$cpu "
      line+=" $m $rps req/s ($cpu µs CPU/req)"
    done
    echo "$line"
  done
done

median() { printf '%s\n' $1 | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2fx", a/b}'; }
echo
echo "| run (order) | bare req/s | tollgate | governor | tollgate/bare | governor/bare | tollgate/governor | CPU/req bare, tollgate, governor (µs) | by CPU/req: tollgate/governor |"
echo "|---|---|---|---|---|---|---|---|---|"
for order in forward reverse; do
  b=$(median "${RPS[$order,bare]}"); t=$(median "${RPS[$order,tollgate]}"); g=$(median "${RPS[$order,governor]}")
  cb=$(median "${CPU[$order,bare]}"); ct=$(median "${CPU[$order,tollgate]}"); cg=$(median "${CPU[$order,governor]}")
  echo "| $order | $b | $t | $g | $(ratio "$t" "$b") | $(ratio "$g" "$b") | $(ratio "$t" "$g") | $cb, $ct, $cg | $(ratio "$cg" "$ct") |"
done
echo
echo "(medians of $ROUNDS rounds, wrk -t1 -c$CONNS -d${SECS}s; load average at the end: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores; $(date -u +%F))"
