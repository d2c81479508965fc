#!/usr/bin/env bash
# The long form of the failover tests (crates/tollgate-redis/tests/failover.rs):
# load through a fail-open and a fail-closed limiter while the master is
# killed (SIGKILL), CYCLES times in a row (default 10), on a Redis Sentinel
# setup (master, replica, 3 sentinels) and on a Redis Cluster (3 masters,
# 3 replicas). After each failover the killed server is restarted and
# rejoins as a replica; the next cycle kills the new master. It prints, per
# cycle, when the replica was promoted and when decisions resumed, then the
# totals: acknowledged vs recorded decisions (what was lost), the longest
# gap, the verdict counts. See docs/redis.md, "High availability".
#
#   scripts/failover-soak.sh [CYCLES]
set -euo pipefail
cd "$(dirname "$0")/.."
cycles="${1:-10}"
TOLLGATE_FAILOVER_CYCLES="$cycles" CI="${CI:-true}" cargo test -p tollgate-redis \
    --all-features --test failover -- --nocapture --test-threads 1
