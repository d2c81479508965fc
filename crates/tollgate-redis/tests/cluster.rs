//! The Redis backend on a 3-master Redis Cluster (feature `cluster`, always
//! on for the tests): the conformance suite, the durability check of every
//! master, keys of one decision sharing a slot, and the least ACL user;
//! on a Redis cluster (`redis::…`, `<test>::redis`) and on a Valkey one
//! (`valkey::…`, `<test>::valkey`).

use std::time::{Duration, Instant};

use tollgate_limiter::{
    Backend, Key, Limiter, MockClock, Policy, Scope, SlidingWindow, TokenBucket,
};
use tollgate_redis::{Durability, NodeRole, RedisBackend, Setting};
use tollgate_testkit::conformance::patient;
use tollgate_testkit::redis_server::{
    ACL_RULES, CLUSTER_ACL_RULES, RedisCluster, RedisServer, Server,
};

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
        // can stall a server past the 500 ms defaults (a connection's, a
        // reply's), which is the fault tests' business, not this suite's.
        .connect_timeout(Duration::from_secs(10))
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
        let l = patient(
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
        let l = patient(
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
            patient(name, TokenBucket::new(10, 10, S).unwrap(), fresh.clone())
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

        // `list_overrides` walks every master too: each key's override,
        // and a limiter-wide one set for a time, with what it has left.
        let hour = Duration::from_secs(3600);
        fresh
            .set_expiring_override(Scope::Limiter("l10"), &vip, hour)
            .await
            .unwrap();
        let listed = fresh.list_overrides(None).await.unwrap();
        let found: Vec<(String, Option<String>)> = listed
            .iter()
            .map(|o| (o.limiter.clone(), o.key.clone()))
            .collect();
        let mut want: Vec<(String, Option<String>)> = limiters
            .iter()
            .enumerate()
            .map(|(i, l)| (l.clone(), Some(format!("account-{i}"))))
            .collect();
        want.insert(0, ("l10".into(), None));
        assert_eq!(found, want);
        assert!(listed.iter().all(|o| o.policy == Ok(vip)), "{listed:?}");
        assert!(listed[0].ttl.is_some_and(|t| t <= hour && t > hour / 2), "{listed:?}");
        assert!(listed[1..].iter().all(|o| o.ttl.is_none()), "{listed:?}");
        assert_eq!(fresh.list_overrides(Some("l11")).await.unwrap().len(), 1);
    }
}

/// Creates user `limiter` (password `s3cret`) on node `n` with `rules`, or
/// adds them to it: a cluster does not share its ACL users, every node
/// needs its own.
fn acl_user(n: &RedisServer, rules: &[&str]) {
    let mut acl = vec!["ACL", "SETUSER", "limiter", "on", ">s3cret"];
    acl.extend(rules);
    assert_eq!(n.cli(&acl).trim(), "OK", "{rules:?}");
}

tollgate_testkit::on_every_server! {
    /// A cluster user with exactly the ACL docs/redis.md gives (the
    /// single server's list and `+cluster|slots`, `+asking`), on every
    /// node: decisions of every kind on every master, overrides, a settle,
    /// a slot migrated to another master (`-ASK`, then `-MOVED`), a node
    /// restarted; and the durability check, which without `+config|get`
    /// and `+cluster|nodes` reports unknown settings and lets the backend
    /// start in report mode (a refused `CLUSTER NODES` failed `build()`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn acl_user_on_every_node(server: Server) {
        // A cluster of its own: a slot moves and a node restarts.
        let Some(mut cluster) = RedisCluster::start_on(server) else {
            return;
        };
        let rules: Vec<&str> = ACL_RULES.into_iter().chain(CLUSTER_ACL_RULES).collect();
        for n in cluster.nodes() {
            acl_user(n, &rules);
        }
        let urls: Vec<String> = cluster
            .nodes()
            .iter()
            .map(|n| format!("redis://limiter:s3cret@127.0.0.1:{}", n.port()))
            .collect();
        // The default durability mode (report), as in production.
        let b = RedisBackend::cluster_builder(urls)
            // Semantics, not latency: a starved CI machine may stall a node.
            .response_timeout(10 * S)
            .build()
            .await
            .expect("connect as an ACL user");
        let unknown = |s: &Setting, why: &str| matches!(s, Setting::Unknown(w) if w.contains(why));
        let report = b.check_durability().await.unwrap();
        let masters: Vec<_> = report.nodes.iter().filter(|n| n.role == NodeRole::Master).collect();
        assert_eq!(masters.len(), 3, "{report:?}");
        assert!(masters.iter().all(|n| unknown(&n.appendonly, "config|get")), "{report:?}");
        // The replicas are not listed: unknown too, never left out.
        let replicas = report.nodes.iter().find(|n| n.role == NodeRole::Replica);
        assert!(
            replicas.is_some_and(|n| unknown(&n.appendonly, "cluster|nodes")),
            "{report:?}"
        );

        let limiter = |name: &str, policy: Policy| {
            Limiter::builder(name, policy, b.clone()).timeout(10 * S).build()
        };
        // Every master runs the scripts as this user: keys on all three.
        let l = limiter("api", SlidingWindow::new(2, 60 * S).unwrap().into());
        let keys: Vec<Key> = (0..12).map(|i| Key::new(format!("k{i}"))).collect();
        let mut owners: Vec<usize> = keys
            .iter()
            .map(|k| cluster.master_of(cluster.keyslot(k.as_str())).unwrap())
            .collect();
        owners.sort_unstable();
        owners.dedup();
        assert_eq!(owners.len(), 3, "the keys miss a master");
        for k in &keys {
            assert!(l.try_acquire(k, 1).await.unwrap().is_allowed());
            assert!(l.try_acquire(k, 1).await.unwrap().is_allowed());
            assert!(l.try_acquire(k, 1).await.unwrap().is_denied());
        }
        let k = &keys[0];
        // The steps that need the other grants (LSET, LTRIM, HGETALL,
        // HDEL, the sorted sets), on one master.
        tollgate_testkit::redis_server::use_every_grant(&limiter, k).await;
        // Overrides: limiter-wide (MGET in its own slot) and per key (the
        // marker, then the key's override read by the script).
        let tb = limiter("tb", TokenBucket::new(2, 1, 60 * S).unwrap().into());
        let bucket = |capacity| Some(Policy::from(TokenBucket::new(capacity, 1, 60 * S).unwrap()));
        tb.set_override(None, bucket(3)).await.unwrap();
        assert_eq!(tb.try_acquire(k, 1).await.unwrap().limit(), 3);
        tb.set_override(Some(&keys[1]), bucket(5)).await.unwrap();
        assert_eq!(tb.try_acquire(&keys[1], 1).await.unwrap().limit(), 5);
        tb.set_override(None, None).await.unwrap();
        assert_eq!(tb.try_acquire(k, 1).await.unwrap().limit(), 2);

        // A resharding moves the slot of "moving" to another master.
        let moving = Key::new("moving");
        let slot = cluster.keyslot(moving.as_str());
        let to = (cluster.master_of(slot).unwrap() + 1) % 3;
        let window = limiter("window", SlidingWindow::new(3, 60 * S).unwrap().into());
        assert!(window.try_acquire(&moving, 1).await.unwrap().is_allowed());
        let moved = limiter("moved", TokenBucket::new(3, 1, 60 * S).unwrap().into());
        assert!(moved.try_acquire(&moving, 1).await.unwrap().is_allowed());
        let from = cluster.start_migration(slot, to);
        // A key not moved yet: the old master holds its state and its log,
        // every key the call names (a limiter without per-key overrides
        // does not name the key's override, which does not exist: a
        // migrating slot answers -TRYAGAIN to a call naming keys it has
        // and keys it has not), so it decides, exactly.
        assert_eq!(window.try_acquire(&moving, 1).await.unwrap().remaining(), 1);
        // A new key: the old master answers -ASK, the client sends ASKING
        // to the new one, where the bucket lives from now on.
        let bucket = limiter("bucket", TokenBucket::new(2, 1, 60 * S).unwrap().into());
        assert!(bucket.try_acquire(&moving, 1).await.unwrap().is_allowed());
        assert!(bucket.try_acquire(&moving, 1).await.unwrap().is_allowed());
        assert!(bucket.try_acquire(&moving, 1).await.unwrap().is_denied());
        // A new key of a two-key script: none of its keys is anywhere, and
        // the new master answers a call naming several keys it lacks with
        // -TRYAGAIN until the migration ends (docs/redis.md, "Resharding").
        let fresh = limiter("fresh", SlidingWindow::new(3, 60 * S).unwrap().into());
        assert!(fresh.try_acquire(&moving, 1).await.is_err());
        // A moved key: -ASK, and its count goes on from the old master's.
        assert_eq!(cluster.migrate_keys(slot, from, to), 3, "window, log, moved");
        assert_eq!(moved.try_acquire(&moving, 1).await.unwrap().remaining(), 1);
        assert_eq!(window.try_acquire(&moving, 1).await.unwrap().remaining(), 0);
        // The slot is the new master's: -MOVED, and the client reads the
        // topology again (CLUSTER SLOTS).
        cluster.finish_migration(slot, to);
        assert!(window.try_acquire(&moving, 1).await.unwrap().is_denied());
        assert!(bucket.try_acquire(&moving, 1).await.unwrap().is_denied());
        assert_eq!(fresh.try_acquire(&moving, 1).await.unwrap().remaining(), 2);

        // A restart: users live in memory (an operator keeps them in an
        // aclfile), so it is created again; decisions resume as this user.
        cluster.restart_node(to);
        acl_user(&cluster.nodes()[to], &rules);
        let restarted = Instant::now();
        let after = limiter("after", TokenBucket::new(2, 1, 60 * S).unwrap().into());
        let d = loop {
            match after.try_acquire(&moving, 1).await {
                Ok(d) => break d,
                Err(e) => assert!(restarted.elapsed() < 10 * S, "no decision since: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(d.is_allowed(), "{d:?}");

        // The durability check's two grants: `CONFIG GET` reads the
        // settings, `CLUSTER NODES` lists the replicas (none here).
        for n in cluster.nodes() {
            acl_user(n, &["+config|get"]);
        }
        let report = b.check_durability().await.unwrap();
        let known = |s: &Setting| matches!(s, Setting::Known(_));
        let (masters, rest): (Vec<_>, Vec<_>) =
            report.nodes.iter().partition(|n| n.role == NodeRole::Master);
        assert!(masters.iter().all(|n| known(&n.appendonly)), "{report:?}");
        assert!(
            rest.len() == 1 && unknown(&rest[0].appendonly, "cluster|nodes"),
            "{report:?}"
        );
        for n in cluster.nodes() {
            acl_user(n, &["+cluster|nodes"]);
        }
        let report = b.check_durability().await.unwrap();
        assert_eq!(report.nodes.len(), 3, "{report:?}");
        assert!(
            report.nodes.iter().all(|n| n.role == NodeRole::Master
                && known(&n.appendonly)
                && known(&n.maxmemory_policy)),
            "{report:?}"
        );
    }
}

tollgate_testkit::on_every_server! {
    /// A resharding onto a node added for it: the slot of a key migrates
    /// (`-ASK`) to a new master, which holds no script (the backend loaded
    /// them on the masters it knew). A new key of the slot, then the key
    /// moved there, are decided on it during the migration, exactly, and
    /// once the migration ends (`-MOVED`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn migration_to_a_node_added_for_it(server: Server) {
        let Some(mut cluster) = RedisCluster::start_on(server) else {
            return;
        };
        let b = RedisBackend::cluster_builder(cluster.urls())
            // Semantics, not latency: a starved CI machine may stall a node.
            .response_timeout(10 * S)
            .durability(Durability::Skip)
            .build()
            .await
            .expect("connect");
        let limiter = |name: &str| {
            let policy = TokenBucket::new(3, 1, 60 * S).unwrap();
            Limiter::builder(name, policy, b.clone()).timeout(10 * S).build()
        };
        let (moved, fresh) = (limiter("moved"), limiter("fresh"));
        let moving = Key::new("moving");
        assert_eq!(moved.try_acquire(&moving, 1).await.unwrap().remaining(), 2);

        let to = cluster.add_node();
        let slot = cluster.keyslot(moving.as_str());
        let from = cluster.start_migration(slot, to);
        // A new key: the old master answers -ASK, the new one runs it.
        let d = fresh.try_acquire(&moving, 1).await;
        let got = d.as_ref().map(|d| d.remaining()).ok();
        assert_eq!(got, Some(2), "a new key on the new node: {d:?}");
        // The key moved: -ASK, and its count goes on from the old master's.
        assert_eq!(cluster.migrate_keys(slot, from, to), 1, "moved's state");
        let d = moved.try_acquire(&moving, 1).await;
        let got = d.as_ref().map(|d| d.remaining()).ok();
        assert_eq!(got, Some(1), "a moved key on the new node: {d:?}");
        cluster.finish_migration(slot, to);
        assert_eq!(moved.try_acquire(&moving, 1).await.unwrap().remaining(), 0);
        assert_eq!(fresh.try_acquire(&moving, 1).await.unwrap().remaining(), 1);
    }
}

tollgate_testkit::on_every_server! {
    /// A cluster that names its nodes by hostname
    /// (`cluster-preferred-endpoint-type hostname`, as a TLS cluster whose
    /// certificates name hosts does): the client knows each master as
    /// `localhost:port`, `CLUSTER NODES` lists it as
    /// `127.0.0.1:port@bus,localhost`. Each master is one server, reported
    /// once: it was reported a second time, by its address, as a master
    /// the client could not reach (and, where that address cannot be
    /// reached from the client, unknown: strict mode refused for ever).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn durability_check_of_a_cluster_named_by_hostname(server: Server) {
        let Some(cluster) = RedisCluster::start_on(server) else {
            return;
        };
        for n in cluster.nodes() {
            for (name, value) in [
                ("appendonly", "yes"),
                ("cluster-announce-hostname", "localhost"),
                ("cluster-preferred-endpoint-type", "hostname"),
            ] {
                let out = n.cli(&["config", "set", name, value]);
                assert_eq!(out.trim(), "OK", "CONFIG SET {name}: {out}");
            }
        }
        let start = Instant::now();
        while !cluster.nodes().iter().all(|n| {
            let nodes = n.cli(&["cluster", "nodes"]);
            n.cli(&["cluster", "slots"]).contains("localhost")
                && nodes.lines().filter(|l| l.contains(",localhost")).count() == 3
        }) {
            assert!(start.elapsed() < Duration::from_secs(30), "no hostnames");
            std::thread::sleep(Duration::from_millis(50));
        }
        let b = RedisBackend::cluster_builder(cluster.urls())
            .durability(Durability::Strict)
            .build()
            .await
            .expect("strict mode starts on a durable cluster");
        let report = b.check_durability().await.unwrap();
        let names: Vec<&str> = report.nodes.iter().map(|n| n.node.as_str()).collect();
        println!("{} server(s): {names:?}", names.len());
        assert_eq!(names.len(), 3, "each master once: {report:?}");
    }
}
