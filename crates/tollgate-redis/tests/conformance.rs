//! The Redis backend (single server, caller-time mode) against the
//! conformance suite and the reference model, on Redis (`redis::…`) and on
//! Valkey (`valkey::…`).

use std::time::Duration;

use tollgate_limiter::MockClock;
use tollgate_redis::{Durability, RedisBackend};
use tollgate_testkit::redis_server::{RedisServer, Server};

async fn setup(server: Server) -> (RedisBackend, MockClock) {
    let url = RedisServer::shared_url_on(server)
        .unwrap_or_else(|| panic!("the Redis conformance suite needs {server}"));
    let clock = MockClock::new();
    let backend = RedisBackend::builder(url)
        .prefix(tollgate_testkit::conformance::unique_name("conf"))
        .caller_time(clock.clone())
        // The mock clock stands still while real time passes.
        .min_ttl(Duration::from_secs(600))
        // A suite of semantics, not of latency: a starved 2-core CI machine
        // can stall a server past the 500 ms defaults (a connection's, a
        // reply's), which is the fault tests' business, not this suite's.
        .connect_timeout(Duration::from_secs(10))
        .response_timeout(Duration::from_secs(10))
        .durability(Durability::Skip)
        .build()
        .await
        .expect("connect to the server");
    (backend, clock)
}

mod redis {
    use super::*;
    tollgate_testkit::conformance_tests!(setup(Server::Redis), cases = 1000);
}

/// The same scripts on Valkey: the model comparison runs fewer random
/// cases (the scripts' paths are the same; this checks the server).
mod valkey {
    use super::*;
    tollgate_testkit::conformance_tests!(setup(Server::Valkey), cases = 300);
}

tollgate_testkit::on_every_server! {
    /// A penalised flood of 20,000 requests on one key: every decision equals
    /// the model's, and the log keeps at most `limit + 1` events (two list
    /// items each), not one per request.
    #[tokio::test]
    async fn penalised_flood_keeps_the_log_bounded(server: Server) {
        let (backend, clock) = setup(server).await;
        let (name, key, limit) =
            tollgate_testkit::conformance::penalised_flood(&backend, &clock, 20_000).await;
        let shared = RedisServer::shared_on(server).expect("a shared server");
        let log = format!("{}:log", backend.state_key(&name, &key));
        let shared = shared.lock().unwrap_or_else(|e| e.into_inner());
        let items: u64 = shared.cli(&["LLEN", &log]).trim().parse().expect("LLEN");
        assert!(items >= 2 && items / 2 <= limit + 1, "{items} list items");
    }
}

tollgate_testkit::on_every_server! {
    /// During a rolling upgrade, a worker of the release before remembered
    /// ids decides on the same keys: its script drops every member of
    /// `:slots` scored below now with the expired slots (the remembered
    /// ids' scores are negative), and leaves the HASH's `r` and `c`. The
    /// slots held are still counted as held: no request more than the
    /// limit gets in.
    #[tokio::test]
    async fn remembered_ids_dropped_by_an_older_script_are_not_counted(server: Server) {
        use tollgate_limiter::{Backend, Clock, Concurrency, Key, Op, Policy, Request};
        let (backend, clock) = setup(server).await;
        let name = tollgate_testkit::conformance::unique_name("upgrade");
        let key = Key::new("k");
        let policy = Policy::from(Concurrency::new(1, Duration::from_secs(10)).unwrap());
        let decide = |op| {
            let req = Request {
                limiter: &name,
                key: &key,
                policy: &policy,
                op,
            };
            backend.decide(req)
        };
        // 5 is remembered (its hold given up), 1 takes the only slot.
        assert!(decide(Op::Withdraw(5)).await.unwrap().is_allowed());
        clock.advance(Duration::from_secs(1));
        assert!(decide(Op::Hold(1)).await.unwrap().is_allowed());
        // The older script's look: ZREMRANGEBYSCORE :slots -inf <now>.
        clock.advance(Duration::from_secs(1));
        let slots = format!("{}:slots", backend.state_key(&name, &key));
        let now = clock.now().to_string();
        let shared = RedisServer::shared_on(server).expect("a shared server");
        let dropped = shared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .cli(&["ZREMRANGEBYSCORE", &slots, "-inf", &now]);
        assert_eq!(dropped.trim(), "1", "the older script dropped 5");
        clock.advance(Duration::from_secs(1));
        let d = decide(Op::Hold(2)).await.unwrap();
        assert!(d.is_denied(), "a second slot of 1 was taken: {d:?}");
    }
}

tollgate_testkit::on_every_server! {
    /// A look at a concurrency limit counts the slots held by halving
    /// ranks (no `ZCOUNT` in the documented ACL, and not every lease read
    /// into Lua): exact at every size, across the set's change of encoding
    /// (128 members) and at 50,001 slots, with expired leases not yet swept
    /// below them. (What it costs is measured, not asserted: 50 looks at
    /// 50,001 slots took 278 ms reading every lease, about what they take
    /// at one slot by halving.)
    #[tokio::test]
    async fn a_look_counts_the_slots_held_at_every_size(server: Server) {
        use tollgate_limiter::{Backend, Clock, Concurrency, Key, Op, Policy, Request};
        let (backend, clock) = setup(server).await;
        let name = tollgate_testkit::conformance::unique_name("many");
        let max = 1_000_000;
        let policy = Policy::from(Concurrency::new(max, Duration::from_secs(3600)).unwrap());
        let shared = RedisServer::shared_on(server).expect("a shared server");
        for held in [1u64, 2, 3, 127, 128, 129, 50_001] {
            let key = Key::new(format!("held-{held}"));
            let req = |op| Request {
                limiter: &name,
                key: &key,
                policy: &policy,
                op,
            };
            assert!(backend.decide(req(Op::Hold(1))).await.unwrap().is_allowed());
            // The other slots, leases of half an hour; and five expired a
            // second ago, which a look counts as free.
            let slots = format!("{}:slots", backend.state_key(&name, &key));
            let (until, gone) = (clock.now() + 1_800_000_000, clock.now() - 1_000_000);
            shared.lock().unwrap_or_else(|e| e.into_inner()).cli(&[
                "EVAL",
                "for i = 2, tonumber(ARGV[3]) do redis.call('ZADD', KEYS[1], ARGV[1], 'm' .. i) end \
                 for i = 1, 5 do redis.call('ZADD', KEYS[1], ARGV[2], 'x' .. i) end",
                "1",
                &slots,
                &until.to_string(),
                &gone.to_string(),
                &held.to_string(),
            ]);
            let d = backend.decide(req(Op::PEEK)).await.unwrap();
            assert_eq!(d.remaining(), max - held, "{held} slots held: {d:?}");
            assert!(d.is_allowed());
        }
    }
}
