#!/usr/bin/env bash
# Memory path against governor, in alternating rounds: `Limiter::check` over
# `MemoryBackend` and governor's keyed limiter, each case of
# crates/tollgate-memory/benches/memory.rs (1 and 10k keys, admitting and
# refusing, 1 and 2 threads) measured ROUNDS times per library, the two
# libraries' runs alternating and the first of each round swapping sides.
#
# One criterion run of a case moves by ±20 % (±40 % on 2 threads) on this
# project's 2-core VMs, with both libraries moving together over minutes:
# single ratios are noise. This prints, per case, the median time of each
# library, the ratio of the medians (governor / tollgate: above 1.0x
# tollgate is ahead), and the range of the rounds' own ratios.
#
# Rounds a few seconds apart still straddle the VM's own swings (both
# libraries slow down together, up to 3x, for seconds): for differences of
# a few percent use the interleaved pairs instead, which alternate the two
# libraries every ~10 ms on the same pinned threads:
#   cargo run --release -p tollgate-memory --example paired [PAIRS] [CHUNK] [FILTER]
#
#   scripts/bench-memory.sh [ROUNDS] [MEASUREMENT_SECS] [FILTER]
#       ROUNDS 5, MEASUREMENT_SECS 2 (plus 1 s of warm-up a run): ~11
#       minutes for the 16 cases; FILTER, a regex on the case
#       (e.g. 'refuse/1-keys'), runs only the cases it matches.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
SECS=${2:-2}
FILTER=${3:-.}
bench=$(cargo bench -p tollgate-memory --bench memory --no-run 2>&1 |
    sed -n 's/.*(\(.*target\/release\/deps\/memory-[0-9a-f]*\)).*/\1/p' | tail -1)
[ -x "$bench" ] || { echo "bench binary not found" >&2; exit 1; }

# time LIB CASE: criterion's median estimate for one library on one case, in ns.
time_of() {
    "$bench" --bench "^limiter/$1/$2\$" --warm-up-time 1 --measurement-time "$SECS" 2>/dev/null |
        awk '/time:/ {
            sub(/.*time: *\[/, "")
            v = $3; u = $4
            if (u == "ps") v /= 1000; else if (u == "us" || u == "µs") v *= 1000; else if (u == "ms") v *= 1e6
            print v; exit
        }'
}

printf '%-32s %12s %12s %9s  %s\n' case tollgate_ns governor_ns ratio "rounds' ratios"
for workload in admit refuse; do
    for keys in 1 10000; do
        for threads in 1 2; do
            case="$workload/$keys-keys/$threads-threads"
            grep -Eq "$FILTER" <<<"$case" || continue
            ts=() gs=()
            for r in $(seq "$ROUNDS"); do
                if (( r % 2 )); then
                    ts+=("$(time_of tollgate-limiter "$case")")
                    gs+=("$(time_of governor-keyed "$case")")
                else
                    gs+=("$(time_of governor-keyed "$case")")
                    ts+=("$(time_of tollgate-limiter "$case")")
                fi
            done
            python3 - "$case" "${ts[*]}" "${gs[*]}" <<'EOF'
import statistics, sys
case, ts, gs = sys.argv[1], [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
t, g = statistics.median(ts), statistics.median(gs)
rounds = sorted(b / a for a, b in zip(ts, gs))
print(f"{case:<32} {t:12.1f} {g:12.1f} {g / t:8.2f}x  {rounds[0]:.2f}x-{rounds[-1]:.2f}x")
EOF
        done
    done
done
