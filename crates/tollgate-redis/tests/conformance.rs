//! The Redis backend (single server, caller-time mode) against the
//! conformance suite and the reference model.

use std::time::Duration;

use tollgate_limiter::MockClock;
use tollgate_redis::{Durability, RedisBackend};
use tollgate_testkit::redis_server::RedisServer;

async fn setup() -> (RedisBackend, MockClock) {
    let url = RedisServer::shared_url().expect("the Redis conformance suite needs redis-server");
    let clock = MockClock::new();
    let backend = RedisBackend::builder(url)
        .prefix(tollgate_testkit::conformance::unique_name("conf"))
        .caller_time(clock.clone())
        // The mock clock stands still while real time passes.
        .min_ttl(Duration::from_secs(600))
        .durability(Durability::Skip)
        .build()
        .await
        .expect("connect to redis");
    (backend, clock)
}

tollgate_testkit::conformance_tests!(setup(), cases = 1000);
