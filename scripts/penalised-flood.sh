#!/usr/bin/env bash
# Per-decision time of the sliding-window script under a penalised flood on
# one key: the first 1,000 decisions, then (after 18,000 more) the last
# 1,000 of a 20,000-request flood, one client, one connection.
#
#   scripts/penalised-flood.sh [git-rev]   # default: the working tree
#
# With a rev (e.g. `main`), the Lua is taken from that commit, to compare.
# Starts its own redis-server on a free loopback port and stops it (by its
# pid) when done. The figures are in docs/redis.md; they are not a test.
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-}
lua=crates/tollgate-redis/lua
if [ -n "$rev" ]; then
  tmp=$(mktemp -d)
  git archive "$rev" "$lua" | tar -x -C "$tmp"
  lua=$tmp/$lua
fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" --daemonize yes --pidfile "$dir/pid" >/dev/null
trap 'kill "$(cat "$dir/pid")" 2>/dev/null; rm -rf "$dir" ${tmp:+"$tmp"}' EXIT
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
. scripts/lua-assemble.sh
sha=$(assemble_lua "$lua" sliding_window | redis-cli -p "$port" -x SCRIPT LOAD)
# 10 per minute, penalise refused; acquire 1. KEYS and ARGV as the client
# sends them since the scripts took one key per state, its override and its
# log (a rev older than that took four keys and more arguments: its script
# answers an error, and the run stops on it).
k='tollgate:flood:{k}'
call=(EVALSHA "$sha" 3 "$k" "$k:override" "$k:log" 1 '1:w:10:60000000:1')
# One call first: an error (a wrong layout) stops the run instead of
# timing error replies.
out=$(redis-cli -p "$port" "${call[@]}")
case $out in *ERR*) echo "the script answers an error: $out" >&2; exit 1 ;; esac
rb() { redis-benchmark -p "$port" -c 1 -n "$1" -q "${call[@]}" 2>/dev/null | tr '\r' '\n' | grep -E 'requests per second' | tail -1 | sed 's/.*: \([0-9.]* requests per second\)/\1/'; }
echo "first 1000: $(rb 1000)"
rb 18000 >/dev/null
echo "last 1000:  $(rb 1000)"
echo "log items (2 per event): $(redis-cli -p "$port" LLEN "$k:log")"
