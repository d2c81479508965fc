#!/usr/bin/env bash
# Differential check of a change to the sliding-window and composite
# scripts: the work tree's scripts against those of <rev>, on random traces
# (acquire, peek, penalise, reset, reserve, settle; a caller clock that
# steps forward and sometimes back; policies that change; the other
# strategy's script, and a token bucket's STRING, on the same key), each
# call sent to both, on twin keys of one throwaway redis-server; their
# replies and stored state (the HASH, the logs, and at second scale every
# key's PTTL within 300 ms) must be identical after every call. For changes
# meant to save instructions (scripts/script-cost.sh) without changing
# what the scripts do; the conformance suite checks both against the model.
#
#   scripts/script-diff.sh [rev] [traces]     (default HEAD, 1000; 40 calls a trace)
#
# Runs twice: at µs scale (windows of 10-120 µs, TTLs floored by ARGV[4]
# so that nothing expires in real time) and at second scale (TTLs as in
# production, compared). Only loopback; stops its server by its pid.
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-HEAD} traces=${2:-1000}
work=$(mktemp -d)
pid=
trap '[ -z "$pid" ] || kill "$pid" 2>/dev/null; rm -rf "$work"' EXIT
mkdir "$work/old"
git archive "$rev" crates/tollgate-redis/lua | tar -x -C "$work/old"
# Assembled as crates/tollgate-redis/src/scripts.rs does.
. scripts/lua-assemble.sh
for side in old new; do
    dir=crates/tollgate-redis/lua
    [ $side = new ] || dir=$work/old/crates/tollgate-redis/lua
    assemble_lua "$dir" sliding_window >"$work/$side-w.lua"
    assemble_lua "$dir" composite >"$work/$side-c.lua"
done
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >"$work/log" 2>&1 &
pid=$!
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done

cat >"$work/diff.py" <<'PY'
import random, socket, sys, time

port, work, traces, scale = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
conn = socket.create_connection(('127.0.0.1', port))
rd = conn.makefile('rb')

def call(*args):
    out = [b'*%d\r\n' % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b'$%d\r\n%s\r\n' % (len(a), a))
    conn.sendall(b''.join(out))
    return read()

def read():
    line = rd.readline()[:-2]
    kind, rest = line[:1], line[1:]
    if kind == b'+':
        return rest.decode()
    if kind == b'-':
        return ('error', rest.decode())
    if kind == b':':
        return int(rest)
    if kind == b'$':
        n = int(rest)
        return None if n < 0 else rd.read(n + 2)[:-2].decode()
    if kind == b'*':
        n = int(rest)
        return None if n < 0 else [read() for _ in range(n)]
    raise Exception('unexpected reply %r' % line)

sha = {}
for side in ('old', 'new'):
    for kind in ('w', 'c'):
        sha[side, kind] = call('SCRIPT', 'LOAD', open('%s/%s-%s.lua' % (work, side, kind)).read())
        assert not isinstance(sha[side, kind], tuple), sha[side, kind]

def keys(side, trial, kind):
    k = '%s:%d:%d:{k}' % (side, scale, trial)
    logs = [k + ':log'] if kind == 'w' else [k + ':log%d' % i for i in range(1, 5)]
    return [k, k + ':override'] + logs

def state(side, trial):
    ks = keys(side, trial, 'w') + keys(side, trial, 'c')[2:]
    t = call('TYPE', ks[0])
    h = call('HGETALL', ks[0]) if t == 'hash' else [call('GET', ks[0])] if t == 'string' else []
    fields = dict(zip(h[0::2], h[1::2])) if t == 'hash' else h
    logs = [call('LRANGE', k, 0, -1) for k in ks[2:]]
    ttls = [call('PTTL', k) for k in ks]
    return t, fields, logs, ttls

def same(a, b):
    if a[:3] != b[:3]:
        return False
    if scale == 1:
        return True
    return all(x == y if x < 0 or y < 0 else abs(x - y) < 300 for x, y in zip(a[3], b[3]))

rng = random.Random(traces * 1000 + scale)

def policy(kind):
    if kind == 'w':
        return '1:w:%d:%d:%d' % (rng.randint(1, 5), scale * rng.randint(10, 120), rng.randint(0, 1))
    parts = []
    for _ in range(rng.randint(1, 3)):
        if rng.random() < 0.5:
            parts.append('w:%d:%d:0' % (rng.randint(1, 5), scale * rng.randint(10, 120)))
        else:
            iv = scale * rng.randint(1, 30)
            parts.append('t:%d:1:%d:%d' % (rng.randint(1, 5), iv, iv))
    return '1:c|' + '|'.join(parts)

calls = differences = 0
for trial in range(traces):
    main = rng.choice('wc')
    now = 1_000_000 if scale == 1 else int(time.time() * 1e6)
    pol = {'w': policy('w'), 'c': policy('c')}
    marks = {'w': [], 'c': []}
    for step in range(40):
        kind = main if rng.random() < 0.9 else 'wc'[main == 'w']
        if rng.random() < 0.1:
            pol[kind] = policy(kind)
        now += scale * rng.choice([0, 0, 1, 3, 7, 15, 30, 60, 150, -5])
        if rng.random() < 0.02:
            # A token bucket's STRING state at the key.
            for side in ('old', 'new'):
                call('SET', keys(side, trial, kind)[0], 't:%d:%d' % (now + 5 * scale, now), 'PX', 60000)
        r = rng.random()
        if r < 0.45:
            op = str(rng.randint(0, 3))
        elif r < 0.55:
            op = '?%d' % rng.randint(1, 3)
        elif r < 0.62:
            op = '!%d' % rng.randint(1, 3)
        elif r < 0.66:
            op = '-1'
        elif r < 0.82 or not marks[kind]:
            op = 'r%d' % rng.randint(1, 3)
        else:
            units, mark = rng.choice(marks[kind])
            op = 's%d:%d:%s' % (units, rng.randint(0, units + 2), mark)
        floor = 600000 if scale == 1 else 0
        reply = {}
        for side in ('old', 'new'):
            ks = keys(side, trial, kind)
            reply[side] = call('EVALSHA', sha[side, kind], len(ks), *ks, op, pol[kind], now, floor)
            calls += 1
        before, after = state('old', trial), state('new', trial)
        if reply['old'] != reply['new'] or not same(before, after):
            differences += 1
            if differences <= 5:
                print('difference: %s %s %s now=%d' % (kind, pol[kind], op, now))
                print('  %s: %r %r' % (sys.argv[5], reply['old'], before))
                print('  work tree: %r %r' % (reply['new'], after))
        if op[0] == 'r' and isinstance(reply['old'], list) and reply['old'][0] == 1:
            # The receipt's marks: born, at[, per] per part.
            tail = reply['old'][6 if kind == 'w' else 7:]
            m = []
            for i in range(0, len(tail), 3):
                b, at, per = tail[i:i + 3]
                m.append('%d,%d,%d' % (b, at, per) if per else '%d,%d' % (b, at))
            marks[kind].append((int(op[1:]), ':'.join(m)))
print('scale %d: %d calls, %d differences' % (scale, calls, differences))
sys.exit(1 if differences else 0)
PY
status=0
python3 "$work/diff.py" "$port" "$work" "$traces" 1 "$rev" || status=1
python3 "$work/diff.py" "$port" "$work" "$traces" 1000000 "$rev" || status=1
exit $status
