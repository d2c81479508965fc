//! The Redis backend on a 3-master Redis Cluster (feature `cluster`, always
//! on for the tests): the conformance suite, the durability check of every
//! master, and keys of one decision sharing a slot; on a Redis cluster
//! (`redis::…`, `<test>::redis`) and on a Valkey one (`valkey::…`,
//! `<test>::valkey`).

use std::time::Duration;

use tollgate_limiter::{
    Backend, Key, Limiter, MockClock, Policy, Scope, SlidingWindow, TokenBucket,
};
use tollgate_redis::{Durability, RedisBackend};
use tollgate_testkit::redis_server::{RedisCluster, Server};

const S: Duration = Duration::from_secs(1);

async fn backend(server: Server, prefix: &str, clock: &MockClock) -> RedisBackend {
    let prefix = tollgate_testkit::conformance::unique_name(prefix);
    backend_with_prefix(server, &prefix, clock).await
}

async fn backend_with_prefix(server: Server, prefix: &str, clock: &MockClock) -> RedisBackend {
    let cluster = RedisCluster::shared_on(server)
        .unwrap_or_else(|| panic!("the cluster tests need {server}"));
    RedisBackend::cluster_builder(cluster.urls())
        .prefix(prefix)
        .caller_time(clock.clone())
        .min_ttl(Duration::from_secs(600))
        // A suite of semantics, not of latency: a starved 2-core CI machine
        // can stall a server past the 500 ms default, which is the fault
        // tests' business, not this suite's.
        .response_timeout(Duration::from_secs(10))
        .durability(Durability::Skip)
        .build()
        .await
        .expect("connect to the cluster")
}

async fn setup(server: Server) -> (RedisBackend, MockClock) {
    let clock = MockClock::new();
    (backend(server, "cconf", &clock).await, clock)
}

mod redis {
    use super::*;
    tollgate_testkit::conformance_tests!(setup(Server::Redis), cases = 300);
}

mod valkey {
    use super::*;
    tollgate_testkit::conformance_tests!(setup(Server::Valkey), cases = 100);
}

tollgate_testkit::on_every_server! {
    /// Keys spread over the three masters all decide (no CROSSSLOT error): the
    /// state, log and per-key override share the key's hash tag.
    #[tokio::test]
    async fn keys_on_every_master_decide(server: Server) {
        let clock = MockClock::new();
        let b = backend(server, "slots", &clock).await;
        let l = Limiter::new(
            "spread",
            SlidingWindow::new(1, Duration::from_secs(60)).unwrap(),
            b.clone(),
        );
        let per_key = Policy::from(SlidingWindow::new(2, Duration::from_secs(60)).unwrap());
        for i in 0..50 {
            let k = Key::new(format!("user-{i}"));
            b.set_override(Scope::Key("spread", &k), Some(&per_key))
                .await
                .unwrap();
            assert!(l.try_acquire(&k, 1).await.unwrap().is_allowed());
            assert!(l.try_acquire(&k, 1).await.unwrap().is_allowed());
            assert!(l.try_acquire(&k, 1).await.unwrap().is_denied());
        }
    }
}

tollgate_testkit::on_every_server! {
    /// Overrides set by one worker reach another one within the client
    /// cache's TTL, per key and limiter-wide (the limiter-wide override and
    /// the per-key marker live in another slot than the keys).
    #[tokio::test]
    async fn overrides_reach_other_workers_within_cache_ttl(server: Server) {
        let clock = MockClock::new();
        let cluster = RedisCluster::shared_on(server).expect("a cluster");
        let prefix = tollgate_testkit::conformance::unique_name("ovr");
        let ttl = Duration::from_millis(200);
        let make = || {
            RedisBackend::cluster_builder(cluster.urls())
                .prefix(prefix.clone())
                .caller_time(clock.clone())
                .override_cache_ttl(ttl)
                .durability(Durability::Skip)
                .build()
        };
        let (a, b) = (make().await.unwrap(), make().await.unwrap());
        tollgate_testkit::conformance::overrides_reach_other_workers(a, b, ttl).await;
    }
}

tollgate_testkit::on_every_server! {
    /// The durability check asks every master.
    #[tokio::test]
    async fn durability_check_covers_every_master(server: Server) {
        let clock = MockClock::new();
        let b = backend(server, "dur", &clock).await;
        let report = b.check_durability().await.unwrap();
        assert_eq!(report.nodes.len(), 3, "{report:?}");
        // The test cluster runs without AOF: reported, and strict mode refuses.
        assert!(report.is_known_bad());
        let cluster = RedisCluster::shared_on(server).unwrap();
        let strict = RedisBackend::cluster_builder(cluster.urls())
            .durability(Durability::Strict)
            .build()
            .await;
        assert!(matches!(
            strict,
            Err(tollgate_redis::RedisError::NotDurable(_))
        ));
    }
}

tollgate_testkit::on_every_server! {
    /// A lazily built cluster backend: no I/O at build time, the keeper
    /// connects in the background, and decisions follow.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lazy_cluster_backend_connects_in_the_background(server: Server) {
        let cluster = RedisCluster::shared_on(server).expect("a cluster");
        let b = RedisBackend::cluster_builder(cluster.urls())
            .prefix(tollgate_testkit::conformance::unique_name("clazy"))
            .build_lazy()
            .expect("no I/O at build time");
        let l = Limiter::new(
            "api",
            TokenBucket::new(5, 1, Duration::from_secs(60)).unwrap(),
            b,
        );
        let k = Key::new("k");
        let start = std::time::Instant::now();
        let d = loop {
            if let Ok(d) = l.try_acquire(&k, 1).await {
                break d;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the lazy cluster backend never connected"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(d.is_allowed());
    }
}

tollgate_testkit::on_every_server! {
    /// `mark_keyed_overrides` walks every master: per-key overrides in
    /// several slots, of limiters that lost their marker (as an older
    /// version stored them), are all found, and apply again once marked.
    #[tokio::test]
    async fn marking_per_key_overrides_on_every_master(server: Server) {
        let cluster = RedisCluster::shared_on(server).unwrap();
        let clock = MockClock::new();
        let b = backend(server, "mark", &clock).await;
        let prefix = b.prefix().to_owned();
        let vip = Policy::TokenBucket(TokenBucket::new(50, 50, S).unwrap());
        let mut raw = ::redis::cluster::ClusterClient::new(cluster.urls())
            .unwrap()
            .get_async_connection()
            .await
            .unwrap();
        // One limiter per key: keys in 12 slots, so on every master, and
        // each limiter is found only if its master is scanned.
        let limiters: Vec<String> = (10..22).map(|i| format!("l{i}")).collect();
        for (i, l) in limiters.iter().enumerate() {
            let k = Key::new(format!("account-{i}"));
            b.set_override(Scope::Key(l, &k), Some(&vip)).await.unwrap();
            let _: () = ::redis::cmd("DEL")
                .arg(format!("{prefix}:{l}:keyed{{{prefix}:{l}:override}}"))
                .query_async(&mut raw)
                .await
                .unwrap();
        }
        let fresh = backend_with_prefix(server, &prefix, &clock).await;
        let limiter = |i: usize| {
            let name = limiters[i].clone();
            Limiter::new(name, TokenBucket::new(10, 10, S).unwrap(), fresh.clone())
        };
        let limit = |i: usize| {
            let l = limiter(i);
            async move {
                let k = Key::new(format!("account-{i}"));
                l.check(&k).await.decision().unwrap().limit()
            }
        };
        assert_eq!(limit(0).await, 10, "no marker: the key's override is ignored");

        assert_eq!(fresh.mark_keyed_overrides().await.unwrap(), limiters);
        for (i, name) in limiters.iter().enumerate() {
            assert_eq!(limit(i).await, 50, "{name}");
        }
    }
}
