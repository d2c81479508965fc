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
# decisions are refusals; and rate-limiter-flexible's script, as its
# RateLimiterRedis sends it (when scripts/peers/rlf is installed). Unlike
# wall-clock figures it does not
# move with the machine's load, so a change to a script can be judged on a
# shared machine.
#
# Then the sliding window (three keys: the state, the key's override, the
# log) and a composite of a token bucket and a sliding window (six keys:
# the state, the override, the parts' four logs), as the backend sends
# them, the same way: 10,000 keys admitted, one hot key refused. Their keys
# must name one key (a state and its log), and redis-benchmark gives each
# __rand_int__ of a command its own number: these rows are driven by a
# small client written below (load.py) that gives every __rand_int__ of one
# command the same number, with redis-benchmark's shape (4 connections,
# one call in flight on each, keys drawn from 10,000), and that checks
# every reply (an error, or an admission in a refusing row, fails the
# run). Driven by it, the five rows above count 1-2 % fewer instructions
# than through redis-benchmark (docs/benchmarks.md): compare rows of one
# driver.
#
#   scripts/script-cost.sh [decisions] [--only tb|window|composite]
#                          [--lua-from <commit or dir>] [--evalsha]
#
# decisions: default 5000. --only: one group of rows (tb: the five rows
# above; window; composite). --lua-from: the scripts of crates/tollgate-redis/lua
# at another commit (or in a directory) instead of the work tree's, to
# count a change before and after with the same harness. --evalsha: a
# column more, the instructions inside the EVALSHA command alone (the
# script, its redis.call's, its reply): the total also holds serverCron,
# which runs 10 times a second of wall clock, so it moves by 1-2 % with
# the machine's load; this column moved by 0.1-0.5 % between runs of the
# same scripts (once by 1 %), the measure for a change of about 1 %.
# Needs valgrind.
set -euo pipefail
cd "$(dirname "$0")/.."
n=5000 only=all from= evalsha=
usage="usage: $0 [decisions] [--only tb|window|composite] [--lua-from <commit or dir>] [--evalsha]"
while [ $# -gt 0 ]; do
    case $1 in
    --only) only=${2:?$usage}; shift 2 ;;
    --lua-from) from=${2:?$usage}; shift 2 ;;
    --evalsha) evalsha=1; shift ;;
    [0-9]*) n=$1; shift ;;
    *) echo "$usage" >&2; exit 2 ;;
    esac
done
case $only in all | tb | window | composite) ;; *) echo "--only: tb, window or composite" >&2; exit 2 ;; esac
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install -y valgrind)" >&2; exit 2; }
work=$(mktemp -d)
vpid=
# A failed run leaves no server behind.
trap '[ -z "$vpid" ] || kill "$vpid" 2>/dev/null; rm -rf "$work"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

lua=crates/tollgate-redis/lua
if [ -d "$from" ]; then
    lua=$from
elif [ -n "$from" ]; then
    mkdir "$work/lua"
    git archive "$from" "$lua" | tar -x -C "$work/lua"
    lua=$work/lua/$lua
fi

# load.py <port> <n> <seed> <expect: admit|refuse|any> <command...>: n calls
# of the command over 4 connections, one in flight on each (as
# redis-benchmark -c 4), every __rand_int__ of a call replaced by one
# number below 10,000 (12 digits, as redis-benchmark writes it); fails on
# an error reply, or on a verdict the row does not expect.
cat >"$work/load.py" <<'PY'
import random, selectors, socket, sys

port, n, seed, expect = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
args = [a.encode() for a in sys.argv[5:]]
rng = random.Random(seed)

def command():
    r = b'%012d' % rng.randrange(10000)
    out = [b'*%d\r\n' % len(args)]
    for a in args:
        a = a.replace(b'__rand_int__', r)
        out.append(b'$%d\r\n%s\r\n' % (len(a), a))
    return b''.join(out)

def parse(buf, i):
    """One RESP value at buf[i:]: (value, next index), or None if incomplete."""
    j = buf.find(b'\r\n', i)
    if j < 0:
        return None
    kind, line = buf[i:i + 1], buf[i + 1:j]
    if kind == b'+':
        return line.decode(), j + 2
    if kind == b'-':
        sys.exit('error reply: ' + line.decode())
    if kind == b':':
        return int(line), j + 2
    if kind == b'$':
        size = int(line)
        if size < 0:
            return None, j + 2
        if len(buf) < j + 2 + size + 2:
            return None
        return buf[j + 2:j + 2 + size].decode(), j + 2 + size + 2
    if kind == b'*':
        items, k = [], j + 2
        for _ in range(int(line)):
            got = parse(buf, k)
            if got is None:
                return None
            items.append(got[0])
            k = got[1]
        return items, k
    sys.exit('unexpected reply: %r' % buf[i:i + 40])

def admitted(reply):
    # The token bucket's plain acquire answers its debt (>= 0 admitted);
    # every other reply is common.lua's table, its verdict first.
    if isinstance(reply, int):
        return reply >= 0
    if reply[0] not in (0, 1):
        sys.exit('unexpected verdict: %r' % reply)
    return reply[0] == 1

sel = selectors.DefaultSelector()
bufs, sent, done, yes = {}, 0, 0, 0
for _ in range(4):
    s = socket.create_connection(('127.0.0.1', port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sel.register(s, selectors.EVENT_READ)
    bufs[s] = b''
    if sent < n:
        s.sendall(command())
        sent += 1
while done < n:
    for key, _ in sel.select():
        s = key.fileobj
        data = s.recv(65536)
        if not data:
            sys.exit('connection closed')
        bufs[s] += data
        got = parse(bufs[s], 0)
        if got is None:
            continue
        reply, end = got
        bufs[s] = bufs[s][end:]
        done += 1
        yes += admitted(reply)
        if sent < n:
            s.sendall(command())
            sent += 1
if (expect == 'admit' and yes != n) or (expect == 'refuse' and yes != 0):
    sys.exit('expected every decision to %s: %d of %d admitted' % (expect, yes, n))
PY

# cost <label> <driver: bench|own> <script file> <numkeys> <args...>
cost() {
    local label=$1 driver=$2 file=$3
    shift 3
    valgrind --tool=callgrind --callgrind-out-file="$work/cg.%p" \
        redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >"$work/log" 2>&1 &
    vpid=$!
    for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.2; done
    local sha
    sha=$(redis-cli -p "$port" script load "$(cat "$file")")
    # Warm up (keys created, allocator settled), then count only the run.
    if [ "$driver" = bench ]; then
        redis-benchmark -p "$port" -c 4 -n 2000 -r 10000 -q evalsha "$sha" "$@" >/dev/null 2>&1
        callgrind_control -z "$vpid" >/dev/null 2>&1
        redis-benchmark -p "$port" -c 4 -n "$n" -r 10000 -q evalsha "$sha" "$@" >/dev/null 2>&1
    else
        # Refusing rows: the warm-up's first decision is admitted.
        local expect=admit
        case $label in *refusing*) expect=refuse ;; esac
        python3 "$work/load.py" "$port" 2000 1 any evalsha "$sha" "$@"
        callgrind_control -z "$vpid" >/dev/null 2>&1
        python3 "$work/load.py" "$port" "$n" 2 "$expect" evalsha "$sha" "$@"
    fi
    callgrind_control -d "$vpid" >/dev/null 2>&1
    kill "$vpid"
    wait "$vpid" 2>/dev/null || true
    local cg=$work/cg.$vpid.1
    vpid=
    local ir
    ir=$(callgrind_annotate "$cg" 2>/dev/null | awk '/PROGRAM TOTALS/{gsub(",","",$1); if (!d) print $1; d = 1}')
    if [ -z "$evalsha" ]; then
        printf '%-40s %8d instructions/decision\n' "$label" $((ir / n))
        return
    fi
    local ev
    ev=$(callgrind_annotate --inclusive=yes --threshold=100 "$cg" 2>/dev/null |
        awk '/:evalShaCommand /{gsub(",","",$1); if (!d) print $1; d = 1}')
    printf '%-40s %8d instructions/decision, EVALSHA %8d\n' "$label" $((ir / n)) $((ev / n))
}

# Assembled as crates/tollgate-redis/src/scripts.rs does (older commits
# too, for --lua-from).
. scripts/lua-assemble.sh
assemble_lua "$lua" token_bucket >"$work/tb.lua"
assemble_lua "$lua" sliding_window >"$work/sw.lua"
assemble_lua "$lua" composite >"$work/c.lua"
# The token bucket's arguments as a check sends them: its interval and tau
# alone (lua/token_bucket.lua's own order); before it had one (--lua-from
# an older commit), the operation and the policy's encoding.
if grep -q "this script's own order" "$work/tb.lua"; then
    bucket=(10 1000000) hot=(3600000000 3600000000)
else
    bucket=(1 '2:t:100000:10:100000:1000000') hot=(1 '2:t:1:3600000000:1:3600000000')
fi
if [ "$only" = all ] || [ "$only" = tb ]; then
    # 10,000 keys, every decision admitted (a bucket of 100,000 refilling 1/10 µs).
    cost "minimal GCRA (bare client's script)" bench crates/tollgate-bench/lua/minimal_gcra.lua \
        1 'bench:{__rand_int__}' 10 1000000
    cost "tollgate token bucket" bench "$work/tb.lua" \
        1 'tollgate:bench:{__rand_int__}' "${bucket[@]}"
    cost "tollgate, limiter with key overrides" bench "$work/tb.lua" \
        2 'tollgate:bench:{__rand_int__}' 'tollgate:bench:{__rand_int__}:override' \
        "${bucket[@]}"
    # One hot key, every decision past the first refused (capacity 1, one
    # token an hour): what a flooded key costs the server.
    cost "minimal GCRA, one hot key refusing" bench crates/tollgate-bench/lua/minimal_gcra.lua \
        1 'bench:{hot}' 3600000000 3600000000
    cost "tollgate, one hot key refusing" bench "$work/tb.lua" \
        1 'tollgate:bench:{hot}' "${hot[@]}"
    # rate-limiter-flexible's script (RateLimiterRedis's incrTtlLuaScript,
    # read from the version scripts/peers/rlf pins, when installed), sent as
    # consume(key) sends it: KEYS the key; ARGV the points consumed (1), the
    # window in seconds, the limiter's points and duration. A window of an
    # hour, as the rows above keep their state through the count; its
    # refusals (points 1) write too (INCRBY), as it always does.
    rlf=scripts/peers/rlf
    if [ -d "$rlf/node_modules/rate-limiter-flexible" ] && command -v node >/dev/null; then
        node -e '
            const fs = require("fs");
            const src = fs.readFileSync(require.resolve("rate-limiter-flexible/lib/RateLimiterRedis.js", { paths: [process.argv[1]] }), "utf8");
            // A template literal: a backslash before a newline continues the line.
            process.stdout.write(src.match(/const incrTtlLuaScript = `([^`]*)`/)[1].replace(/\\\n/g, ""));
        ' "$rlf" >"$work/rlf.lua"
        cost "rate-limiter-flexible's script" bench "$work/rlf.lua" \
            1 'rlf:{__rand_int__}' 1 3600 1000000000 3600
        cost "rate-limiter-flexible, hot key refusing" bench "$work/rlf.lua" \
            1 'rlf:{hot}' 1 3600 1 3600
    else
        echo "(rate-limiter-flexible rows skipped: cd $rlf && npm ci, and node)"
    fi
fi
# A window of an hour, longer than any run: its events never leave it
# during the count (a decision reads the log's ends, appends, writes the
# HASH and both TTLs); the limit is never reached at 10,000 keys.
k='tollgate:bench:{__rand_int__}'
# The rows that name "$k:override" are a limiter with key overrides (and
# every call before the scripts found their own keys from the end, so
# --lua-from an older commit compares them); "without key overrides", the
# common call since, names one key less and reads no override.
if [ "$only" = all ] || [ "$only" = window ]; then
    cost "sliding window" own "$work/sw.lua" \
        3 "$k" "$k:override" "$k:log" \
        1 '1:w:1000000:3600000000:0'
    if [ -z "$from" ]; then
        cost "sliding window, without key overrides" own "$work/sw.lua" \
            2 "$k" "$k:log" \
            1 '1:w:1000000:3600000000:0'
    fi
    # One hot key, a limit of 1 an hour: every decision past the first
    # refused (and reads the log for its retry-after).
    cost "sliding window, one hot key refusing" own "$work/sw.lua" \
        3 'tollgate:bench:{hot}' 'tollgate:bench:{hot}:override' 'tollgate:bench:{hot}:log' \
        1 '1:w:1:3600000000:0'
fi
if [ "$only" = all ] || [ "$only" = composite ]; then
    # The token bucket above (version 1 of its encoding, as composite parts
    # are sent) and the window above, in one composite.
    cost "composite (token bucket + window)" own "$work/c.lua" \
        6 "$k" "$k:override" "$k:log1" "$k:log2" "$k:log3" "$k:log4" \
        1 '1:c|t:100000:100000:1000000:10|w:1000000:3600000000:0'
    if [ -z "$from" ]; then
        cost "composite, without key overrides" own "$work/c.lua" \
            5 "$k" "$k:log1" "$k:log2" "$k:log3" "$k:log4" \
            1 '1:c|t:100000:100000:1000000:10|w:1000000:3600000000:0'
    fi
    h='tollgate:bench:{hot}'
    cost "composite, one hot key refusing" own "$work/c.lua" \
        6 "$h" "$h:override" "$h:log1" "$h:log2" "$h:log3" "$h:log4" \
        1 '1:c|t:1:1:3600000000:3600000000|w:1:3600000000:0'
fi
