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

/// A penalised flood of 20,000 requests on one key: every decision equals
/// the model's, and the log keeps at most `limit + 1` events (two list
/// items each), not one per request.
#[tokio::test]
async fn penalised_flood_keeps_the_log_bounded() {
    let (backend, clock) = setup().await;
    let (name, key, limit) =
        tollgate_testkit::conformance::penalised_flood(&backend, &clock, 20_000).await;
    let server = RedisServer::shared().expect("redis-server");
    let log = format!("{}:log", backend.state_key(&name, &key));
    let server = server.lock().unwrap_or_else(|e| e.into_inner());
    let items: u64 = server.cli(&["LLEN", &log]).trim().parse().expect("LLEN");
    assert!(items >= 2 && items / 2 <= limit + 1, "{items} list items");
}
