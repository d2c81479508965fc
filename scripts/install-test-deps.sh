#!/usr/bin/env bash
# Installs what the test suite needs on a fresh Debian machine: redis-server
# (the Redis tests start their own throwaway servers on free loopback
# ports), redis-cli (for the cluster), redis-sentinel (the Sentinel failover
# tests run `redis-server --sentinel`, the same binary; the package makes
# sure it is built with Sentinel), wrk and nginx for the benchmark and
# nginx tests, openssl for the TLS test certificates. Idempotent; does nothing that is already done.
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
redis-server --version
