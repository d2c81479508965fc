//! Faults on real servers: a network that goes silent, a server stopped
//! (`SIGSTOP`), killed and restarted, and a soak of decisions under all of
//! them. Each test runs on Redis (`<test>::redis`) and on Valkey
//! (`<test>::valkey`).
//!
//! Every decision goes through a [`Limiter`] with its default per-decision
//! timeout (50 ms): callers give up long before a connection's own response
//! timeout, so these tests show that the backend, not its callers, detects
//! and replaces connections that stopped answering.
//!
//! The breaker is the default one with a 1 s maximum back-off, the value
//! `docs/redis.md` recommends: with the 30 s default, recovery after an
//! outage of ten seconds waits up to 8 s for the breaker's next probe.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures_util::future::join_all;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tokio::time::Instant;
use tollgate_limiter::{
    Backend, BreakerConfig, Composite, Concurrency, FailMode, Key, Limiter, Op, Policy,
    ProgressiveDelay, Request, SlidingWindow, TokenBucket, Verdict,
};
use tollgate_redis::{Durability, RedisBackend, RedisError, Refusal};
use tollgate_testkit::conformance::{PATIENT_TIMEOUT, assert_fail_mode_held, unique_name};
use tollgate_testkit::redis_server::{ACL_RULES, RedisServer, Server};
use tollgate_testkit::relay::Relay;

const S: Duration = Duration::from_secs(1);

/// How soon decisions must resume once the path to a server is usable.
const RESUME_WITHIN: Duration = Duration::from_secs(2);

async fn backend(url: &str) -> RedisBackend {
    RedisBackend::builder(url)
        .prefix(unique_name("faults"))
        .durability(Durability::Skip)
        .build()
        .await
        .expect("connect")
}

fn limiter(name: &str, mode: FailMode, capacity: u64, b: RedisBackend) -> Limiter<RedisBackend> {
    let policy = TokenBucket::new(capacity, 1, 3600 * S).unwrap();
    // The default breaker: its 1 s ceiling is what bounds recovery.
    Limiter::builder(name, policy, b).fail_mode(mode).build()
}

/// Keeps asking for `len` while the fault lasts: no call may be decided
/// (the fault is real), and none may wait much beyond the limiter's
/// timeout.
async fn outage(l: &Limiter<RedisBackend>, k: &Key, len: Duration) {
    let end = Instant::now() + len;
    let mut calls = 0;
    while Instant::now() < end {
        let t = Instant::now();
        let r = l.try_acquire(k, 1).await;
        assert!(r.is_err(), "decided during the outage: {r:?}");
        assert!(t.elapsed() < 300 * Duration::from_millis(1), "a call hung");
        calls += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(calls > 10, "the outage was exercised");
}

/// Asks every 10 ms until a call is decided; how long that took.
async fn resumes(l: &Limiter<RedisBackend>, k: &Key) -> Duration {
    let start = Instant::now();
    while start.elapsed() < 15 * S {
        if l.try_acquire(k, 1).await.is_ok() {
            return start.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let last = l.try_acquire(k, 1).await;
    panic!("decisions did not resume within 15 s; the last call: {last:?}");
}

tollgate_testkit::on_every_server! {
    /// A path that goes silent (connections open, nothing answers) for 10 s,
    /// then new connections reach a second server, as after a failover behind
    /// one address: decisions resume on the new server within 2 s, though every
    /// caller gave up on the silent connection after 50 ms.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn silent_path_then_new_server(server: Server) {
        let start = || RedisServer::builder().server(server).start();
        let (Some(old), Some(new)) = (start(), start()) else {
            return;
        };
        let relay = Relay::start(old.addr());
        let l = limiter("api", FailMode::Closed, 100, backend(&relay.url()).await);
        let k = Key::new("k");
        assert!(l.try_acquire(&k, 1).await.unwrap().is_allowed());
        relay.silence();
        outage(&l, &k, 10 * S).await;
        relay.retarget(new.addr());
        let took = resumes(&l, &k).await;
        println!("resumed {took:?} after the new path");
        assert!(took <= RESUME_WITHIN, "resumed {took:?} after the new path");
        // The decision came from the new server: the key is fresh there.
        let d = l.try_acquire(&k, 1).await.unwrap();
        assert_eq!(d.remaining(), 98, "{d:?}");
    }
}

tollgate_testkit::on_every_server! {
    /// Which timeout ends a decision on a path gone silent. A limiter whose
    /// timeout is shorter than the connection's response timeout (the
    /// default: 50 ms against 500 ms) is the decision's only timer
    /// (`Backend::decide_within`): its own timeout ends it. One whose
    /// timeout is longer still has the response timeout end the call
    /// first, the backend's timeout error, as when every call armed both.
    /// Each limiter has a backend of its own: one keeper taking a silent
    /// connection out would fail the other's call at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_shorter_timeout_ends_a_decision_on_a_silent_path(server: Server) {
        let Some(s) = RedisServer::builder().server(server).start() else {
            return;
        };
        let relay = Relay::start(s.addr());
        let response = Duration::from_millis(300);
        let with = async |timeout| {
            let b = RedisBackend::builder(relay.url())
                .prefix(unique_name("timeouts"))
                .durability(Durability::Skip)
                .response_timeout(response)
                .build()
                .await
                .expect("connect");
            let policy = TokenBucket::new(100, 1, 3600 * S).unwrap();
            Limiter::builder("api", policy, b).timeout(timeout).build()
        };
        let quick = with(Duration::from_millis(100)).await;
        let patient = with(10 * S).await;
        let k = Key::new("k");
        for l in [&quick, &patient] {
            assert!(l.try_acquire(&k, 1).await.unwrap().is_allowed());
        }
        relay.silence();
        let (q, p) = tokio::join!(quick.try_acquire(&k, 1), patient.try_acquire(&k, 1));
        assert!(
            matches!(q, Err(tollgate_limiter::Error::Timeout(t)) if t == Duration::from_millis(100)),
            "the quick limiter's own timeout: {q:?}"
        );
        let e = p.expect_err("decided on a silent path");
        assert!(
            matches!(&e, tollgate_limiter::Error::Backend(b) if format!("{b:?}").contains("timed out")),
            "the response timeout, not the limiter's 10 s: {e:?}"
        );
    }
}

tollgate_testkit::on_every_server! {
    /// The backend, not its callers, replaces a connection that stopped
    /// answering: one call given up after 20 ms (its future dropped, its reply
    /// never seen) and no caller since; once new connections reach a second
    /// server, the next call, with no timeout of its own, is answered at once
    /// by that server instead of hanging on the silent connection.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_call_is_enough_to_replace_a_silent_connection(server: Server) {
        let start = || RedisServer::builder().server(server).start();
        let (Some(old), Some(new)) = (start(), start()) else {
            return;
        };
        let relay = Relay::start(old.addr());
        let b = backend(&relay.url()).await;
        let policy = Policy::from(TokenBucket::new(5, 1, 3600 * S).unwrap());
        let k = Key::new("k");
        let req = Request {
            limiter: "api",
            key: &k,
            policy: &policy,
            op: Op::Acquire(1),
        };
        assert!(b.decide(req).await.unwrap().is_allowed());
        relay.silence();
        let gave_up = tokio::time::timeout(Duration::from_millis(20), b.decide(req)).await;
        assert!(gave_up.is_err(), "the silent path answered");
        relay.retarget(new.addr());
        // The keeper's PING times out (500 ms), its reconnection reaches the new
        // server, which answers its check of a new connection (`ROLE`); nobody
        // calls meanwhile. Waited for on the server, not slept on: on a loaded
        // machine that took more than the 2 s this test used to sleep.
        let deadline = Instant::now() + 15 * S;
        while !tokio::task::block_in_place(|| new.cli(&["info", "commandstats"]))
            .contains("cmdstat_role:")
        {
            assert!(
                Instant::now() < deadline,
                "no connection reached the new server in 15 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The reply reaches the keeper, which puts the connection in place.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let d = tokio::time::timeout(Duration::from_millis(500), b.decide(req))
            .await
            .expect("the call hung: the silent connection was kept")
            .expect("decided");
        // A fresh key on the new server.
        assert_eq!(d.remaining(), 4, "{d:?}");
    }
}

tollgate_testkit::on_every_server! {
    /// A server stopped for 10 s (`SIGSTOP`: its sockets open, nothing
    /// answers), then continued: decisions resume within 2 s, and the counter
    /// is the one from before.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stopped_server_then_continued(server: Server) {
        let Some(server) = RedisServer::builder().server(server).start() else {
            return;
        };
        let l = limiter("api", FailMode::Closed, 100, backend(&server.url()).await);
        let k = Key::new("k");
        assert!(l.try_acquire(&k, 1).await.unwrap().is_allowed());
        let fresh = Key::new("fresh");
        server.pause();
        outage(&l, &k, 10 * S).await;
        server.resume();
        let took = resumes(&l, &fresh).await;
        println!("resumed {took:?} after SIGCONT");
        assert!(took <= RESUME_WITHIN, "resumed {took:?} after SIGCONT");
    }
}

tollgate_testkit::on_every_server! {
    /// A server killed and restarted on the same port: decisions resume within
    /// 2 s of the server answering again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn killed_server_then_restarted(server: Server) {
        let Some(mut server) = RedisServer::builder().server(server).start() else {
            return;
        };
        let l = limiter("api", FailMode::Closed, 100, backend(&server.url()).await);
        let k = Key::new("k");
        assert!(l.try_acquire(&k, 1).await.unwrap().is_allowed());
        server = tokio::task::spawn_blocking(move || {
            server.kill();
            server
        })
        .await
        .unwrap();
        outage(&l, &k, 3 * S).await;
        let _server = tokio::task::spawn_blocking(move || {
            server.restart();
            server
        })
        .await
        .unwrap();
        let took = resumes(&l, &k).await;
        println!("resumed {took:?} after the restart");
        assert!(took <= RESUME_WITHIN, "resumed {took:?} after the restart");
    }
}

/// A failover behind one address (a virtual IP, a DNS name, a proxy): new
/// connections to the relay reach server `new`, a master, and `old`, which
/// the backend's open connection still reaches, is demoted in place
/// (`REPLICAOF`), so that connection stays open and every write on it is
/// answered `READONLY`. Decisions must resume on `new` within 2 s, `url`
/// (the relay's, with the user's credentials) the backend's; with
/// `candidate`, the limiter evaluates it beside its policy. `old`
/// replicates from `upstream` (`new`'s address, or a path to it).
async fn demoted_behind_one_address(
    old: &RedisServer,
    new: &RedisServer,
    relay: &Relay,
    url: &str,
    candidate: Option<Policy>,
    upstream: std::net::SocketAddr,
) {
    // The default prefix, which the ACL's key pattern names.
    let b = RedisBackend::builder(url)
        .durability(Durability::Skip)
        .build()
        .await
        .expect("connect");
    let policy = TokenBucket::new(100, 1, 3600 * S).unwrap();
    let mut l = Limiter::builder("api", policy, b).fail_mode(FailMode::Closed);
    if let Some(c) = candidate {
        l = l.candidate(c);
    }
    let l = l.build();
    let k = Key::new("k");
    assert!(l.try_acquire(&k, 1).await.unwrap().is_allowed());
    relay.retarget(new.addr());
    let port = upstream.port().to_string();
    let demoted = old.cli(&["replicaof", "127.0.0.1", &port]);
    assert_eq!(demoted.trim(), "OK");
    let start = Instant::now();
    let mut last = String::new();
    // Calls the limiter gave up on (its 50 ms): `new` may still have run
    // them, charging the key.
    let mut given_up = 0;
    let d = loop {
        match l.try_acquire(&k, 1).await {
            Ok(d) => break d,
            Err(e) if start.elapsed() > RESUME_WITHIN => panic!(
                "no decision {:?} after the master was demoted behind its address: {} \
                 (the last backend error: {last})",
                start.elapsed(),
                chain(&e)
            ),
            Err(e) => {
                given_up += u64::from(matches!(e, tollgate_limiter::Error::Timeout(_)));
                if !matches!(e, tollgate_limiter::Error::BreakerOpen) {
                    last = chain(&e);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    println!(
        "resumed {:?} after the demotion ({given_up} calls given up)",
        start.elapsed()
    );
    // Decided by `new`: the key is fresh there (`old` had 99 left), and
    // `new` itself, asked directly, holds what the decision says.
    let direct = RedisBackend::builder(new.url())
        .durability(Durability::Skip)
        .build()
        .await
        .expect("connect to the new master");
    let on_new = Limiter::builder("api", policy, direct)
        .timeout(PATIENT_TIMEOUT)
        .build()
        .try_peek(&k, 1)
        .await
        .expect("the new master decides");
    assert_eq!(
        on_new.remaining(),
        d.remaining(),
        "not decided by new: {d:?}"
    );
    // Exactly one unit, unless a call given up on was run there too.
    assert!(
        d.remaining() <= 99 && d.remaining() + given_up >= 99,
        "{d:?} after {given_up} calls given up"
    );
}

tollgate_testkit::on_every_server! {
    /// A master demoted in place behind its address, which now leads to the
    /// new master: the `READONLY` replies replace the connection, and
    /// decisions resume on the new master.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn master_demoted_behind_its_address(server: Server) {
        let start = || RedisServer::builder().server(server).start();
        let (Some(old), Some(new)) = (start(), start()) else {
            return;
        };
        let relay = Relay::start(old.addr());
        demoted_behind_one_address(&old, &new, &relay, &relay.url(), None, new.addr()).await;
    }
}

tollgate_testkit::on_every_server! {
    /// The same for a limiter with a candidate policy, whose decisions are
    /// one pipeline of two scripts, each answered on its own: their
    /// `READONLY` replies replace the connection too.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn master_demoted_behind_its_address_with_a_candidate(server: Server) {
        let start = || RedisServer::builder().server(server).start();
        let (Some(old), Some(new)) = (start(), start()) else {
            return;
        };
        let relay = Relay::start(old.addr());
        let candidate = Policy::from(SlidingWindow::new(100, 3600 * S).unwrap());
        let url = relay.url();
        demoted_behind_one_address(&old, &new, &relay, &url, Some(candidate), new.addr()).await;
    }
}

tollgate_testkit::on_every_server! {
    /// The same, but the demoted master cannot reach the new one (its
    /// replication goes through a relay gone silent) and does not serve
    /// stale data (`replica-serve-stale-data no`): every command on the open
    /// connection is answered `MASTERDOWN`, a reply only a replica gives,
    /// which replaces the connection as `READONLY` does.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn master_demoted_behind_its_address_cut_off(server: Server) {
        let start = || RedisServer::builder().server(server).start();
        let (Some(old), Some(new)) = (start(), start()) else {
            return;
        };
        let stale = old.cli(&["config", "set", "replica-serve-stale-data", "no"]);
        assert_eq!(stale.trim(), "OK");
        let cut = Relay::start(new.addr());
        cut.silence();
        let relay = Relay::start(old.addr());
        let url = relay.url();
        demoted_behind_one_address(&old, &new, &relay, &url, None, cut.addr()).await;
    }
}

tollgate_testkit::on_every_server! {
    /// The same with an ACL user denied `ROLE` (docs/redis.md: "denied, ... a
    /// connection that followed its address to a demoted master is then only
    /// replaced on a `READONLY` reply"): the keeper cannot ask the role, but a
    /// `READONLY` reply is proof enough that the connection reaches a replica.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn master_demoted_behind_its_address_role_denied(server: Server) {
        let start = || RedisServer::builder().server(server).start();
        let (Some(old), Some(new)) = (start(), start()) else {
            return;
        };
        for s in [&old, &new] {
            // Its URL is the relay's.
            s.acl_user("limiter", ACL_RULES.into_iter().filter(|r| *r != "+role"));
        }
        let relay = Relay::start(old.addr());
        let url = format!("redis://limiter:s3cret@{}", relay.addr());
        demoted_behind_one_address(&old, &new, &relay, &url, None, new.addr()).await;
    }
}

tollgate_testkit::on_every_server! {
    /// Callers that give up mid-decision never leave a shared connection out
    /// of step: 32 tasks ask 16 limiters (sliding windows, each of its own
    /// limit, whose reply carries it) over one connection, each call given
    /// up after 0 to 500 µs, so many are dropped before, while and after
    /// their command is written. Every answer that arrives is the answer to
    /// its own call: its limit is its limiter's, and its remaining within it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dropped_calls_leave_no_reply_to_another_caller(server: Server) {
        let Some(server) = RedisServer::builder().server(server).start() else {
            return;
        };
        let b = backend(&server.url()).await;
        let policies: Vec<Policy> = (0..16)
            .map(|i| Policy::from(SlidingWindow::new(1_000_000 + i, 3600 * S).unwrap()))
            .collect();
        let policies = Arc::new(policies);
        let (answered, dropped) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let tasks = (0..32u64).map(|t| {
            let (b, policies) = (b.clone(), policies.clone());
            let (answered, dropped) = (answered.clone(), dropped.clone());
            tokio::spawn(async move {
                for n in 0..300u64 {
                    let i = usize::try_from((t + n) % 16).unwrap();
                    let name = format!("l{i}");
                    let k = Key::new(format!("k{i}"));
                    let req = Request {
                        limiter: &name,
                        key: &k,
                        policy: &policies[i],
                        op: Op::Acquire(1),
                    };
                    let wait = Duration::from_micros((t * 131 + n * 37) % 500);
                    match tokio::time::timeout(wait, b.decide(req)).await {
                        Err(_) => dropped.fetch_add(1, Ordering::Relaxed),
                        Ok(d) => {
                            let d = d.expect("decided");
                            let limit = 1_000_000 + i as u64;
                            assert_eq!(d.limit(), limit, "limiter {name} read another's reply");
                            assert!(d.remaining() < limit, "{name}: {d:?}");
                            answered.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                }
            })
        });
        for t in join_all(tasks).await {
            t.unwrap();
        }
        let (answered, dropped) = (answered.load(Ordering::Relaxed), dropped.load(Ordering::Relaxed));
        println!("{answered} answered, {dropped} given up");
        assert!(answered > 0 && dropped > 0, "{answered} answered, {dropped} given up");
    }
}

/// What the soak saw.
#[derive(Default)]
struct Tally {
    decided: AtomicU64,
    failed_open: AtomicU64,
    failed_closed: AtomicU64,
    /// The longest wait for one verdict, in microseconds.
    max_wait_us: AtomicU64,
}

tollgate_testkit::on_every_server! {
    /// The soak: 32 tasks on 500 keys ask a fail-open and a fail-closed limiter
    /// over one backend while the server (append-only) is
    /// stopped and continued, and killed and restarted, `TOLLGATE_SOAK_CYCLES`
    /// times (default 2; `scripts/soak.sh` runs the long form).
    ///
    /// Asserts: no panic; the fail-closed limiter admits only on a real
    /// decision and the fail-open one refuses only on a real decision; no
    /// verdict waits as long as a fault (1 s, against faults of 2 s: the
    /// 50 ms timeout bounds each wait); both limiters decide
    /// again after every fault; and after the last restart a fresh key gets
    /// exactly its capacity.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn soak_under_faults(server: Server) {
        // `appendfsync everysec`, not the testkit's `always`: on a machine
        // shared with builds an fsync can outlast the limiter's 50 ms for
        // seconds on end (one run with `always` stalled for 15 s while the disk
        // was full), and the disk is not under test. The exactness check below
        // uses a key created after the last restart, so the second of writes a
        // kill may lose does not matter to it.
        let Some(server) = RedisServer::builder()
            .server(server)
            .appendonly(true)
            .arg("appendfsync", "everysec")
            .start()
        else {
            return;
        };
        let cycles: u32 = std::env::var("TOLLGATE_SOAK_CYCLES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2);
        let b = backend(&server.url()).await;
        // Small buckets, so real refusals happen too.
        let open = limiter("open", FailMode::Open, 20, b.clone());
        let closed = limiter("closed", FailMode::Closed, 20, b.clone());
        // Half the 2 s faults: a wait the timeout did not bound (one that
        // lasted the fault) shows, and a loaded machine's scheduling (a
        // task polled late, seen at ~300 ms with a second test run beside
        // this one on two cores) does not fail the soak.
        let bound = S;
        let tally = Arc::new(Tally::default());
        let stop = Arc::new(AtomicBool::new(false));
        let tasks: Vec<_> = (0..32u64)
            .map(|t| {
                let (open, closed) = (open.clone(), closed.clone());
                let (tally, stop) = (tally.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut i = t;
                    while !stop.load(Ordering::Relaxed) {
                        i = i
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        let k = Key::new(format!("k{}", (i >> 33) % 500));
                        let l = if i & 1 == 0 { &open } else { &closed };
                        let start = Instant::now();
                        let v = l.check(&k).await;
                        let waited = start.elapsed();
                        tally
                            .max_wait_us
                            .fetch_max(waited.as_micros() as u64, Ordering::Relaxed);
                        assert!(waited <= bound, "{} waited {waited:?}", l.name());
                        match &v {
                            Verdict::Decided(_) | Verdict::Shadowed(_) => &tally.decided,
                            Verdict::FailedOpen(_) => &tally.failed_open,
                            Verdict::FailedClosed(..) => &tally.failed_closed,
                        }
                        .fetch_add(1, Ordering::Relaxed);
                        assert_fail_mode_held(l.fail_mode(), &v);
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                })
            })
            .collect();
        let recovered = |name: &'static str| {
            let (open, closed) = (open.clone(), closed.clone());
            async move {
                for l in [&open, &closed] {
                    let took = resumes(l, &Key::new(unique_name("probe"))).await;
                    assert!(took <= 3 * S, "{} resumed {took:?} after {name}", l.name());
                }
            }
        };
        let mut server = Some(server);
        for _ in 0..cycles {
            tokio::time::sleep(S).await;
            let s = server.take().unwrap();
            s.pause();
            tokio::time::sleep(2 * S).await;
            s.resume();
            recovered("SIGCONT").await;
            tokio::time::sleep(S).await;
            let s = tokio::task::spawn_blocking(move || {
                let mut s = s;
                s.kill();
                std::thread::sleep(2 * S);
                s.restart();
                s
            })
            .await
            .unwrap();
            server = Some(s);
            recovered("restart").await;
        }
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await.expect("no load task panicked");
        }
        // Exact again: a fresh key gets exactly its capacity, on the backend
        // that went through the faults, in either fail mode. The limiters
        // wait for each decision here: a call given up at the default 50 ms
        // (a loaded machine) fails the check with a timeout, and the server
        // may still run it, so exactness could not be told.
        for (name, mode) in [("open", FailMode::Open), ("closed", FailMode::Closed)] {
            let l = Limiter::builder(name, TokenBucket::new(20, 1, 3600 * S).unwrap(), b.clone())
                .fail_mode(mode)
                .timeout(PATIENT_TIMEOUT)
                .build();
            let k = Key::new(unique_name("exact"));
            let mut allowed = 0;
            for _ in 0..25 {
                match l.check(&k).await {
                    Verdict::Decided(d) if d.is_allowed() => allowed += 1,
                    Verdict::Decided(_) => {}
                    other => panic!("{} failed after recovery: {other:?}", l.name()),
                }
            }
            assert_eq!(allowed, 20, "{}: exact after recovery", l.name());
        }
        println!(
            "soak: {cycles} cycles, {} decided, {} failed open, {} failed closed, max wait {:?}",
            tally.decided.load(Ordering::Relaxed),
            tally.failed_open.load(Ordering::Relaxed),
            tally.failed_closed.load(Ordering::Relaxed),
            Duration::from_micros(tally.max_wait_us.load(Ordering::Relaxed)),
        );
        assert!(tally.decided.load(Ordering::Relaxed) > 0);
        assert!(
            tally.failed_open.load(Ordering::Relaxed) > 0,
            "faults reached the fail-open limiter"
        );
        assert!(
            tally.failed_closed.load(Ordering::Relaxed) > 0,
            "faults reached the fail-closed limiter"
        );
    }
}

// ---------------------------------------------------------------------------
// A Redis that answers, but refuses: out of memory, a failed RDB save, too few
// replicas, a script that keeps the server busy.

/// The test's own connection, for the commands that make and clear a fault
/// (one connection for the whole test, so the server's connection count says
/// what the backend did).
async fn admin(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("admin connection")
}

/// One command, from its words.
async fn run<T: redis::FromRedisValue>(
    c: &mut redis::aio::MultiplexedConnection,
    args: &[&str],
) -> redis::RedisResult<T> {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(c).await
}

/// A numeric field of `INFO <section>`.
async fn info(c: &mut redis::aio::MultiplexedConnection, section: &str, field: &str) -> u64 {
    let text: String = run(c, &["INFO", section]).await.expect("INFO");
    let prefix = format!("{field}:");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {field} in INFO {section}"))
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{field} is not a number"))
}

/// How many `SCRIPT LOAD`s the server ran (a NOSCRIPT-style reload loop
/// would show here).
async fn script_loads(c: &mut redis::aio::MultiplexedConnection) -> u64 {
    let text: String = run(c, &["INFO", "commandstats"]).await.expect("INFO");
    text.lines()
        .find_map(|l| l.strip_prefix("cmdstat_script|load:calls="))
        .and_then(|v| v.split(',').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Every key under `prefix`, with its serialised value (`DUMP`, no TTL): what
/// a decision wrote, whatever the strategy.
async fn snapshot(
    c: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut keys: Vec<String> = run(c, &["KEYS", &format!("{prefix}:*")]).await.unwrap();
    keys.sort();
    let mut out = std::collections::BTreeMap::new();
    for k in keys {
        let v: Option<Vec<u8>> = run(c, &["DUMP", &k]).await.unwrap();
        out.insert(k, v.unwrap_or_default());
    }
    out
}

/// The backend's [`Refusal`] behind a limiter's error, if that is what it
/// is.
fn refusal_of(e: &tollgate_limiter::Error) -> Option<Refusal> {
    match e {
        tollgate_limiter::Error::Backend(b) => b.downcast_ref::<RedisError>()?.refusal(),
        _ => None,
    }
}

/// The non-zero counts of `tollgate_backend_errors_total`, by `reason`,
/// summed over the limiters registered with the snapshotter's recorder.
fn backend_errors(snapshotter: &Snapshotter) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        if key.name() != tollgate_limiter::metrics::BACKEND_ERRORS {
            continue;
        }
        let reason = key.labels().find(|l| l.key() == "reason").unwrap();
        let reason = reason.value().to_owned();
        match value {
            DebugValue::Counter(0) => {}
            // Summed over the limiters.
            DebugValue::Counter(n) => *out.entry(reason).or_default() += n,
            other => panic!("{reason}: {other:?}"),
        }
    }
    out
}

/// The error and its sources, `: `-joined: what a log line shows.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut next = e.source();
    while let Some(e) = next {
        s.push_str(": ");
        s.push_str(&e.to_string());
        next = e.source();
    }
    s
}

/// A condition under which Redis answers but refuses writes.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// `maxmemory` reached under `noeviction`: `-OOM`.
    OutOfMemory,
    /// An RDB save failed, `stop-writes-on-bgsave-error yes`: `-MISCONF`.
    SaveFailed,
    /// `min-replicas-to-write 1`, no replica: `-NOREPLICAS`.
    NoReplicas,
}

impl Fault {
    /// The server's error code, and what the error tollgate reports names.
    fn code(self) -> (&'static str, &'static str) {
        match self {
            Fault::OutOfMemory => ("OOM", "out of memory"),
            Fault::SaveFailed => ("MISCONF", "cannot persist to disk"),
            Fault::NoReplicas => ("NOREPLICAS", "not enough replicas"),
        }
    }

    /// The `reason` label of the backend-errors metric.
    fn reason(self) -> &'static str {
        match self {
            Fault::OutOfMemory => "out_of_memory",
            Fault::SaveFailed => "persistence_failed",
            Fault::NoReplicas => "not_enough_replicas",
        }
    }

    /// The backend's name for it.
    fn refusal(self) -> Refusal {
        match self {
            Fault::OutOfMemory => Refusal::OutOfMemory,
            Fault::SaveFailed => Refusal::PersistenceFailed,
            Fault::NoReplicas => Refusal::NotEnoughReplicas,
        }
    }

    /// Makes the server refuse writes.
    async fn start(self, server: &RedisServer, c: &mut redis::aio::MultiplexedConnection) {
        match self {
            Fault::OutOfMemory => {
                // As in production: the limit a little above what is used,
                // then writes until Redis refuses them.
                let used = info(c, "memory", "used_memory").await;
                let limit = (used + 256 * 1024).to_string();
                let _: () = run(c, &["CONFIG", "SET", "maxmemory", &limit])
                    .await
                    .unwrap();
                let filler = "x".repeat(1024);
                for i in 0.. {
                    let r: redis::RedisResult<()> =
                        run(c, &["SET", &format!("filler:{i}"), &filler]).await;
                    if r.is_err() {
                        break;
                    }
                    assert!(i < 10_000, "maxmemory never reached");
                }
                // Then well below what is used: a refused write frees its
                // buffers, and memory right at the limit would let some
                // writes through and not others.
                let used = info(c, "memory", "used_memory").await;
                let limit = (used - 64 * 1024).to_string();
                let _: () = run(c, &["CONFIG", "SET", "maxmemory", &limit])
                    .await
                    .unwrap();
            }
            Fault::SaveFailed => {
                // The testkit runs without save points, which keeps MISCONF
                // off whatever the last save did; one save point puts it on.
                // The save cannot rename its temporary file onto a
                // directory (root ignores permissions).
                let _: () = run(c, &["CONFIG", "SET", "save", "3600 1"]).await.unwrap();
                std::fs::create_dir_all(server.dir().join("dump.rdb")).unwrap();
                let _: () = run(c, &["BGSAVE"]).await.unwrap();
                let start = Instant::now();
                while info_text(c, "persistence")
                    .await
                    .contains("rdb_last_bgsave_status:ok")
                {
                    assert!(start.elapsed() < 10 * S, "the save did not fail");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            Fault::NoReplicas => {
                let _: () = run(c, &["CONFIG", "SET", "min-replicas-to-write", "1"])
                    .await
                    .unwrap();
            }
        }
        let r: redis::RedisResult<()> = run(c, &["SET", "probe", "1"]).await;
        let err = r.expect_err("writes refused");
        assert_eq!(err.code(), Some(self.code().0), "{err}");
    }

    /// Clears the condition.
    async fn end(self, server: &RedisServer, c: &mut redis::aio::MultiplexedConnection) {
        match self {
            Fault::OutOfMemory => {
                let _: () = run(c, &["CONFIG", "SET", "maxmemory", "0"]).await.unwrap();
            }
            Fault::SaveFailed => {
                // A save that succeeds clears it.
                std::fs::remove_dir(server.dir().join("dump.rdb")).unwrap();
                let _: () = run(c, &["BGSAVE"]).await.unwrap();
                let start = Instant::now();
                while !info_text(c, "persistence")
                    .await
                    .contains("rdb_last_bgsave_status:ok")
                {
                    assert!(start.elapsed() < 10 * S, "the save did not succeed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            Fault::NoReplicas => {
                let _: () = run(c, &["CONFIG", "SET", "min-replicas-to-write", "0"])
                    .await
                    .unwrap();
            }
        }
        let _: () = run(c, &["SET", "probe", "1"])
            .await
            .expect("writes accepted");
    }
}

async fn info_text(c: &mut redis::aio::MultiplexedConnection, section: &str) -> String {
    run(c, &["INFO", section]).await.expect("INFO")
}

/// The refusal tests' per-decision timeout: generous, as these tests are
/// about what Redis answers, not how fast (a timeout on a loaded machine
/// would hide the answer).
const VERDICT_TIMEOUT: Duration = Duration::from_secs(5);

/// A limiter of each strategy, fail-closed and fail-open, without a breaker
/// (each verdict is then the backend's answer; the breaker has a test of its
/// own below), and whether its refusal writes (a penalised window records
/// the refused request, a progressive delay every attempt).
fn limiters(b: &RedisBackend) -> Vec<(Limiter<RedisBackend>, Limiter<RedisBackend>, bool)> {
    let hour = 3600 * S;
    let policies: [(Policy, bool); 5] = [
        (TokenBucket::new(5, 1, hour).unwrap().into(), false),
        (SlidingWindow::new(3, hour).unwrap().into(), false),
        (
            SlidingWindow::new(3, hour)
                .unwrap()
                .penalise_refused(true)
                .into(),
            true,
        ),
        (
            Composite::new([
                Policy::from(TokenBucket::new(4, 1, hour).unwrap()),
                Policy::from(SlidingWindow::new(2, hour).unwrap()),
            ])
            .unwrap()
            .into(),
            false,
        ),
        (
            ProgressiveDelay::new(2, S, 2, hour, hour).unwrap().into(),
            true,
        ),
    ];
    let off = BreakerConfig {
        threshold: 0,
        ..BreakerConfig::default()
    };
    policies
        .into_iter()
        .enumerate()
        .map(|(i, (p, refusal_writes))| {
            let name = format!("{:?}{i}", p.strategy()).to_lowercase();
            let make = |mode: FailMode| {
                Limiter::builder(name.clone(), p, b.clone())
                    .fail_mode(mode)
                    .breaker(off)
                    .timeout(VERDICT_TIMEOUT)
                    .build()
            };
            (make(FailMode::Closed), make(FailMode::Open), refusal_writes)
        })
        .collect()
}

/// While Redis refuses writes: a decision that writes nothing (a refusal, a
/// peek, a concurrency limit's hold when its slots are all held) is still
/// decided, exactly; one that would write gets the refusal as an
/// error, which the fail mode answers (closed: refused, open: passed), and
/// whose message names the condition; no key changes; the connection is
/// kept (no reconnection) and no script is reloaded; the default breaker
/// opens after five such failures. Once the condition clears, decisions
/// resume exactly where they were, and the breaker closes within 2 s.
async fn refused_writes(server: Server, fault: Fault) {
    let Some(server) = RedisServer::builder().server(server).start() else {
        return;
    };
    let mut c = admin(&server).await;
    let b = backend(&server.url()).await;
    let prefix = b.prefix().to_owned();
    let all = limiters(&b);
    let (used, full, fresh) = (Key::new("used"), Key::new("full"), Key::new("fresh"));
    // Each limiter: `used` one unit in, `full` at its limit.
    for (closed, _, _) in &all {
        assert!(closed.try_acquire(&used, 1).await.unwrap().is_allowed());
        while closed.try_acquire(&full, 1).await.unwrap().is_allowed() {}
    }
    // A concurrency limit, fail-closed and fail-open over the same slots:
    // `used` one slot held of two, `full` both.
    let held = |mode: FailMode| {
        Limiter::builder("held", Concurrency::new(2, 3600 * S).unwrap(), b.clone())
            .fail_mode(mode)
            .breaker(BreakerConfig {
                threshold: 0,
                ..BreakerConfig::default()
            })
            .timeout(VERDICT_TIMEOUT)
            .build()
    };
    let (held_closed, held_open) = (held(FailMode::Closed), held(FailMode::Open));
    let mut permits = Vec::new();
    for k in [&used, &full, &full] {
        let (v, permit) = held_closed.hold(k).await;
        assert!(v.is_allowed(), "{v:?}");
        permits.push(permit.expect("a permit"));
    }
    let before = snapshot(&mut c, &prefix).await;
    let connections = info(&mut c, "stats", "total_connections_received").await;
    let loads = script_loads(&mut c).await;

    fault.start(&server, &mut c).await;
    let (code, named) = fault.code();
    for (closed, open, refusal_writes) in &all {
        for l in [closed, open] {
            let failed = |k: &Key, v: &Verdict| {
                let e = v
                    .error()
                    .unwrap_or_else(|| panic!("{} {}: decided {v:?}", l.name(), k.as_str()));
                assert_eq!(v.is_allowed(), l.fail_mode() == FailMode::Open, "{v:?}");
                let shown = chain(e);
                assert!(shown.contains(code), "{shown}");
                assert!(shown.to_lowercase().contains(named), "{shown}");
                assert_eq!(refusal_of(e), Some(fault.refusal()), "{shown}");
            };
            // A refusal that writes nothing is decided, exactly.
            let v = l.check(&full).await;
            match refusal_writes {
                false => assert!(
                    v.decision()
                        .is_some_and(|d| d.is_denied() && d.remaining() == 0),
                    "{} full: {v:?}",
                    l.name()
                ),
                true => failed(&full, &v),
            }
            // An admission would write: the fail mode answers.
            for k in [&used, &fresh] {
                failed(k, &l.check(k).await);
            }
        }
    }
    // The concurrency limit: a look, and a hold refused, write nothing,
    // and are decided exactly; a fail-open limiter lets no request past
    // the slots it can still count.
    for l in [&held_closed, &held_open] {
        for (k, remaining) in [(&used, 1), (&full, 0)] {
            let d = l.try_peek(k, 1).await;
            assert!(
                d.as_ref()
                    .is_ok_and(|d| d.is_allowed() == (remaining > 0) && d.remaining() == remaining),
                "{} peek {}: {d:?}",
                fault.code().0,
                k.as_str()
            );
        }
        let (v, permit) = l.hold(&full).await;
        assert!(
            v.decision()
                .is_some_and(|d| d.is_denied() && d.remaining() == 0),
            "{} hold of a full key, {:?}: {v:?}",
            fault.code().0,
            l.fail_mode()
        );
        assert!(permit.is_none());
    }
    assert_eq!(snapshot(&mut c, &prefix).await, before, "a key changed");
    // A hold on a fresh key of a concurrency limit takes a slot, a write:
    // the fail mode answers, and no key is made.
    let slots = Limiter::builder("slots", Concurrency::new(2, 3600 * S).unwrap(), b.clone())
        .fail_mode(FailMode::Open)
        .build();
    let (v, permit) = slots.hold(&fresh).await;
    assert!(matches!(v, Verdict::FailedOpen(_)), "{v:?}");
    assert!(permit.is_none());
    assert_eq!(snapshot(&mut c, &prefix).await, before, "a slot was taken");
    // The default breaker counts the refusals as failures: it opens after
    // five, and the fail mode answers at once until a probe succeeds. The
    // metrics name the condition of each refused call. (The limiter
    // registers its series with this test's own recorder when built, so
    // tests running beside it count elsewhere.)
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let guarded = metrics::with_local_recorder(&recorder, || {
        Limiter::builder(
            "guarded",
            TokenBucket::new(5, 1, 3600 * S).unwrap(),
            b.clone(),
        )
        .timeout(VERDICT_TIMEOUT)
        .build()
    });
    for _ in 0..5 {
        let v = guarded.check(&fresh).await;
        assert_eq!(
            v.error().and_then(refusal_of),
            Some(fault.refusal()),
            "{v:?}"
        );
    }
    let v = guarded.check(&fresh).await;
    assert!(
        matches!(
            v,
            Verdict::FailedClosed(tollgate_limiter::Error::BreakerOpen, _)
        ),
        "{v:?}"
    );
    let errors = backend_errors(&snapshotter);
    let want = BTreeMap::from([
        (fault.reason().to_owned(), 5),
        ("breaker_open".to_owned(), 1),
    ]);
    assert_eq!(
        errors, want,
        "tollgate_backend_errors_total{{limiter=guarded}}"
    );

    fault.end(&server, &mut c).await;
    drop(permits);
    let took = resumes(&guarded, &Key::new("probe")).await;
    assert!(took <= RESUME_WITHIN, "the breaker closed {took:?} after");
    // Exactly where they were: `used` has its limit less one.
    for (closed, open, _) in &all {
        let mut admitted = 0;
        while closed.try_acquire(&used, 1).await.unwrap().is_allowed() {
            admitted += 1;
        }
        let limit = closed.try_peek(&fresh, 1).await.unwrap().limit();
        assert_eq!(admitted, limit - 1, "{}", closed.name());
        assert!(open.try_acquire(&full, 1).await.unwrap().is_denied());
    }
    assert_eq!(
        info(&mut c, "stats", "total_connections_received").await,
        connections,
        "the backend reconnected"
    );
    assert_eq!(script_loads(&mut c).await, loads, "scripts were reloaded");
}

tollgate_testkit::on_every_server! {
    /// `maxmemory` reached under `noeviction` (`-OOM`), then
    /// `CONFIG SET maxmemory 0`: see [`refused_writes`].
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn out_of_memory_refuses_writes_then_resumes(server: Server) {
        refused_writes(server, Fault::OutOfMemory).await;
    }
}

tollgate_testkit::on_every_server! {
    /// A failed RDB save with `stop-writes-on-bgsave-error yes` (`-MISCONF`),
    /// then a save that succeeds: see [`refused_writes`].
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn failed_save_refuses_writes_then_resumes(server: Server) {
        refused_writes(server, Fault::SaveFailed).await;
    }
}

tollgate_testkit::on_every_server! {
    /// `min-replicas-to-write 1` with no replica (`-NOREPLICAS`), then 0: see
    /// [`refused_writes`].
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn too_few_replicas_refuses_writes_then_resumes(server: Server) {
        refused_writes(server, Fault::NoReplicas).await;
    }
}

tollgate_testkit::on_every_server! {
    /// Another client's script runs past `busy-reply-threshold` (100 ms), and
    /// Redis answers every other command `-BUSY` until `SCRIPT KILL`.
    /// Meanwhile every verdict is the fail mode (closed: refused, open:
    /// passed), none waits much beyond the limiter's timeout, and the errors
    /// name the condition; the backend keeps its connection (no new one
    /// reaches the server: a busy server is not a dead one) and reloads no
    /// script. After `SCRIPT KILL`, decisions resume within 2 s, exactly
    /// where they were.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn busy_script_then_killed(server: Server) {
        let Some(server) = RedisServer::builder().server(server).start() else {
            return;
        };
        let mut c = admin(&server).await;
        let mut busy = admin(&server).await;
        let b = backend(&server.url()).await;
        // This test's own recorder, to count the errors by reason.
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let (closed, open) = metrics::with_local_recorder(&recorder, || {
            (
                limiter("closed", FailMode::Closed, 5, b.clone()),
                limiter("open", FailMode::Open, 5, b),
            )
        });
        let k = Key::new("k");
        assert!(closed.try_acquire(&k, 1).await.unwrap().is_allowed());
        let _: () = run(&mut c, &["CONFIG", "SET", "busy-reply-threshold", "100"])
            .await
            .unwrap();
        let connections = info(&mut c, "stats", "total_connections_received").await;
        let loads = script_loads(&mut c).await;

        let script = tokio::spawn(async move {
            // Its client gives up after 500 ms; the script runs on.
            let r: redis::RedisResult<()> = redis::cmd("EVAL")
                .arg("local i = 0 while true do i = i + 1 end")
                .arg(0)
                .query_async(&mut busy)
                .await;
            r
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        // From the start: the first calls get no answer at all (the server
        // answers nothing until the threshold), the later ones `-BUSY`.
        // Half the 2 s faults: a wait the timeout did not bound (one that
        // lasted the fault) shows, and a loaded machine's scheduling (a
        // task polled late, seen at ~300 ms with a second test run beside
        // this one on two cores) does not fail the soak.
        let bound = S;
        let (mut calls, mut named, mut breaker) = (0, 0, 0);
        let end = Instant::now() + S;
        while Instant::now() < end {
            for l in [&closed, &open] {
                let start = Instant::now();
                let v = l.check(&k).await;
                assert!(start.elapsed() <= bound, "waited {:?}", start.elapsed());
                let e = v.error().unwrap_or_else(|| panic!("decided while busy: {v:?}"));
                assert_eq!(v.is_allowed(), l.fail_mode() == FailMode::Open, "{v:?}");
                let shown = chain(e);
                match e {
                    // No answer yet (before the threshold), or the breaker.
                    tollgate_limiter::Error::Timeout(_) => {}
                    tollgate_limiter::Error::BreakerOpen => breaker += 1,
                    // Else the refusal, never a lost connection.
                    _ => {
                        assert_eq!(refusal_of(e), Some(Refusal::Busy), "{shown}");
                        // Ours, not the server's words: the condition named.
                        assert!(shown.contains("busy-reply-threshold"), "{shown}");
                        named += 1;
                    }
                }
                calls += 1;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(named > 0, "no error named the busy script ({calls} calls)");
        assert!(breaker > 0, "the breakers never opened ({calls} calls)");
        // The metric names the condition of each refused call.
        let timeouts = calls - named - breaker;
        let mut want = BTreeMap::from([
            ("busy".to_owned(), named),
            ("breaker_open".to_owned(), breaker),
        ]);
        if timeouts > 0 {
            want.insert("timeout".to_owned(), timeouts);
        }
        assert_eq!(backend_errors(&snapshotter), want);
        let _: () = run(&mut c, &["SCRIPT", "KILL"]).await.expect("SCRIPT KILL");
        let _ = script.await.unwrap();

        for l in [&closed, &open] {
            let took = resumes(l, &Key::new(unique_name("probe"))).await;
            assert!(took <= RESUME_WITHIN, "{} resumed {took:?} after SCRIPT KILL", l.name());
        }
        // Exact: `k` has its 4 remaining tokens, no more.
        let mut admitted = 0;
        while closed.try_acquire(&k, 1).await.unwrap().is_allowed() {
            admitted += 1;
        }
        assert_eq!(admitted, 4);
        assert_eq!(
            info(&mut c, "stats", "total_connections_received").await,
            connections,
            "the backend reconnected"
        );
        assert_eq!(script_loads(&mut c).await, loads, "scripts were reloaded");
        println!("busy: {calls} calls, {named} named BUSY, {breaker} breaker open");
    }
}

// ---------------------------------------------------------------------------
// A restart behind the same address: the server answers `-LOADING` to every
// command until its dataset is loaded.

/// The loading tests' dataset: keys besides the limiters' state. The
/// server is made to wait after loading each (`key-load-delay`, in
/// microseconds; Redis 7 and Valkey 9 both have it): 10 000 keys at 100 µs
/// make a load of about 2 s. A real dataset that takes as long is millions
/// of keys (3 million, 112 MB of RDB: 2.7 s on the 2-core test machine),
/// too slow to write in a test.
const FILLER_KEYS: usize = 10_000;

/// Whether `INFO persistence` says the server is loading its dataset.
async fn loading(c: &mut redis::aio::MultiplexedConnection) -> bool {
    info(c, "persistence", "loading").await == 1
}

/// A server with a dataset (limiters' state, and 10 000 other keys)
/// saved to its RDB, killed and restarted behind the same address: it
/// loads the RDB slowly (`key-load-delay`), answering every command
/// `-LOADING` (seen on `INFO persistence`, `loading:1`) between batches of
/// `events_every` bytes read (`loading-process-events-interval-bytes`).
///
/// Meanwhile no verdict is a decision, neither a refusal nor an admission
/// on a key read as fresh: every verdict is the fail mode (closed: refused,
/// open: passed). Without a breaker and with a 5 s timeout the error is the
/// refusal, named `Refusal::Loading`, from the moment the backend
/// reconnected (before, the connection error of the kill); with the
/// defaults (50 ms, breaker) it is the refusal, or a timeout when the
/// server answers later than 50 ms, then `BreakerOpen` once five calls
/// failed in a row. The backend reconnects once, not per call: a loading
/// server is not a dead one.
///
/// Once loaded, decisions resume by themselves (at once without a breaker;
/// within 2 s with the default one) and exactly: every key admits what it
/// had left before the restart (its state came back from the RDB), and a
/// key at its limit is refused. The one allowance: a call the default
/// limiter gave up (its 50 ms timeout) may still be run by the server once
/// loaded, so such a key may admit up to that many fewer, never more.
/// The backend-errors metric counts every failed verdict of the load under
/// its reason (`loading`, `timeout`, `breaker_open`, `error` for the kill's
/// connection errors). Returns the calls of the default limiters
/// that timed out (`None`: the server is not installed, outside CI).
async fn loading_restart(
    server: Server,
    events_every: &str,
    key_load_delay_us: &str,
) -> Option<u32> {
    let server = RedisServer::builder()
        .server(server)
        .arg("key-load-delay", key_load_delay_us)
        // The server answers clients between batches of this many bytes
        // read (2 MB by default: the whole of this small RDB, so nothing
        // would be answered before the end).
        .arg("loading-process-events-interval-bytes", events_every)
        .start()?;
    let mut c = admin(&server).await;
    let b = backend(&server.url()).await;
    // The strategies whose refusal writes nothing (a penalised window
    // and a progressive delay record refusals: not at stake here).
    // Every limiter registers its series with this test's own recorder.
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let (all, guarded) = metrics::with_local_recorder(&recorder, || {
        let all: Vec<_> = limiters(&b)
            .into_iter()
            .filter(|(_, _, refusal_writes)| !refusal_writes)
            .map(|(closed, open, _)| (closed, open))
            .collect();
        // And the defaults: a 50 ms timeout and the breaker.
        let guarded = [
            limiter("guarded", FailMode::Closed, 5, b.clone()),
            limiter("guarded", FailMode::Open, 5, b.clone()),
        ];
        (all, guarded)
    });
    let (used, full, fresh, g) = (
        Key::new("used"),
        Key::new("full"),
        Key::new("fresh"),
        Key::new("g"),
    );
    // What each key has left: `used` its limit less one (by limiter),
    // `full` nothing, `g` 3 of its 5 tokens.
    let mut left = std::collections::HashMap::new();
    for (closed, _) in &all {
        assert!(closed.try_acquire(&used, 1).await.unwrap().is_allowed());
        while closed.try_acquire(&full, 1).await.unwrap().is_allowed() {}
        let limit = closed.try_peek(&fresh, 1).await.unwrap().limit();
        left.insert(closed.name().to_owned(), limit - 1);
    }
    for _ in 0..2 {
        assert!(guarded[0].try_acquire(&g, 1).await.unwrap().is_allowed());
    }
    let mut pipe = redis::pipe();
    for i in 0..FILLER_KEYS {
        pipe.cmd("SET").arg(format!("filler:{i}")).arg("x").ignore();
    }
    let () = pipe.query_async(&mut c).await.unwrap();
    let _: () = run(&mut c, &["SAVE"]).await.unwrap();
    drop(c);

    let restarted = Instant::now();
    let server = tokio::task::spawn_blocking(move || {
        let mut server = server;
        server.kill();
        server.restart_loading();
        server
    })
    .await
    .unwrap();
    let mut c = admin(&server).await;
    assert!(loading(&mut c).await, "the restarted server is not loading");
    let connections = info(&mut c, "stats", "total_connections_received").await;

    // While it loads: every verdict is the fail mode. A round's
    // verdicts are checked against `loading:1` read after the round: a
    // decision before that read was made during the load.
    let (mut rounds, mut named, mut breaker, mut timeouts, mut lost) = (0, 0, 0, 0, 0);
    // Whether the backend answered `LOADING` yet: before, the kill's
    // connection errors.
    let mut reconnected = false;
    let mut spent = std::collections::HashMap::<(String, Key), u64>::new();
    // Calls given up by the limiter's timeout, per key: the server may
    // still run one after its load (it reads a call sent late in the load
    // only once loaded), so it may have been charged, unseen.
    let mut unanswered = std::collections::HashMap::<(String, Key), u64>::new();
    let bound = tollgate_limiter::limiter::DEFAULT_TIMEOUT + Duration::from_millis(250);
    let loaded = loop {
        // All at once, as a service's requests come: the calls share the
        // backend's connection, and a round lasts one batch of the load.
        let mut calls = Vec::new();
        for (closed, open) in &all {
            for l in [closed, open] {
                for k in [&used, &full, &fresh] {
                    calls.push((l, k));
                }
            }
        }
        // Five each, so that the breaker opens within a round.
        calls.extend(guarded.iter().flat_map(|l| [(l, &g); 5]));
        let verdicts = join_all(calls.into_iter().map(|(l, k)| async move {
            let start = Instant::now();
            let v = l.check(k).await;
            if l.name() == "guarded" {
                assert!(start.elapsed() <= bound, "waited {:?}", start.elapsed());
            }
            (l, k, v)
        }))
        .await;
        let still = loading(&mut c).await;
        for (l, k, v) in &verdicts {
            assert_fail_mode_held(l.fail_mode(), v);
            if v.decision().is_some() {
                let (name, key) = (l.name(), k.as_str());
                assert!(!still, "{name} {key}: decided while loading: {v:?}");
                if v.is_allowed() {
                    *spent.entry((name.to_owned(), (*k).clone())).or_default() += 1;
                }
                continue;
            }
            let e = v.error().unwrap();
            assert_eq!(v.is_allowed(), l.fail_mode() == FailMode::Open, "{v:?}");
            let shown = chain(e);
            match e {
                tollgate_limiter::Error::BreakerOpen => breaker += 1,
                tollgate_limiter::Error::Timeout(_) => {
                    timeouts += 1;
                    *unanswered
                        .entry((l.name().to_owned(), (*k).clone()))
                        .or_default() += 1;
                }
                _ if refusal_of(e) == Some(Refusal::Loading) => {
                    assert!(shown.contains("loading its dataset"), "{shown}");
                    reconnected = true;
                    named += 1;
                }
                // The kill's: the old connection, closed, or none yet.
                _ => {
                    assert!(!reconnected, "a connection error while loading: {shown}");
                    lost += 1;
                }
            }
        }
        rounds += 1;
        if !still {
            break restarted.elapsed();
        }
        assert!(restarted.elapsed() < 15 * S, "still loading after 15 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    println!(
        "loaded {loaded:?} after the restart: {rounds} rounds, {named} named LOADING, \
         {breaker} breaker open, {timeouts} timeouts, {lost} connection errors"
    );
    assert!(
        rounds >= 3,
        "the load was too short to be seen ({loaded:?})"
    );
    assert!(named > 0, "no error named the load");
    assert!(breaker > 0, "the default breaker never opened");
    // The backend-errors metric counted each verdict's failure under its
    // reason (each is recorded before the verdict is returned).
    let expected: BTreeMap<String, u64> = [
        ("loading", named),
        ("breaker_open", breaker),
        ("timeout", timeouts),
        ("error", lost),
    ]
    .into_iter()
    .filter(|(_, n)| *n > 0)
    .map(|(reason, n)| (reason.to_owned(), u64::from(n)))
    .collect();
    assert_eq!(backend_errors(&snapshotter), expected);

    // Loaded: exactly where they were. Without a breaker, decided at
    // once (an error fails the `unwrap`): each key admits what it had
    // left, less what the last round spent after the load ended.
    let drain = |l: &Limiter<RedisBackend>, k: &Key, had: u64| {
        let id = (l.name().to_owned(), k.clone());
        let spent = spent.get(&id).copied().unwrap_or(0);
        let unanswered = unanswered.get(&id).copied().unwrap_or(0);
        let (l, k) = (l.clone(), k.clone());
        async move {
            let mut admitted = 0;
            while l.try_acquire(&k, 1).await.unwrap().is_allowed() {
                admitted += 1;
            }
            let (name, key) = (l.name(), k.as_str());
            // Never more than it had (nothing admitted twice, no key read
            // as fresh); less only by calls given up that the server ran
            // once loaded.
            assert!(
                admitted + spent <= had && had <= admitted + spent + unanswered,
                "{name} {key}: {admitted} admitted after, {spent} spent after the load, \
                 {unanswered} given up, of {had}"
            );
        }
    };
    for (closed, open) in &all {
        drain(closed, &used, left[closed.name()]).await;
        for l in [closed, open] {
            let d = l.try_acquire(&full, 1).await.unwrap();
            assert!(d.is_denied(), "{} full: {d:?}", l.name());
        }
    }
    // With the default breaker, within 2 s (its next probe).
    for l in &guarded {
        let took = resumes(l, &Key::new(unique_name("probe"))).await;
        let name = l.name();
        assert!(
            took <= RESUME_WITHIN,
            "{name} resumed {took:?} after the load"
        );
    }
    drain(&guarded[0], &g, 3).await;
    let since = info(&mut c, "stats", "total_connections_received").await - connections;
    println!("{since} connections after the admin's");
    // The backend's one connection, made before or after the admin's.
    assert!(since <= 1, "the backend reconnected {since} times");
    Some(timeouts)
}

tollgate_testkit::on_every_server! {
    /// A restarted server loading its dataset for about 2 s, answering
    /// every 8 ms or so (batches of 1 KB): see [`loading_restart`].
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn restarted_server_loading_its_dataset(server: Server) {
        loading_restart(server, "1024", "100").await;
    }
}

tollgate_testkit::on_every_server! {
    /// A restarted server loading its dataset for about 3 s that answers
    /// later than the limiter's 50 ms timeout (batches of 8 KB, about
    /// 150 ms each), as a
    /// large dataset's 2 MB batches can (3 million keys answered `PING` in
    /// 38 ms, 56 at most, on the 2-core test machine): the default
    /// limiters' calls time out (each given-up call makes the backend's
    /// keeper check the connection: its `ROLE` is answered within its
    /// 500 ms, so the connection is kept), and the rest is as in
    /// [`loading_restart`].
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn restarted_server_loading_answers_late(server: Server) {
        if let Some(timeouts) = loading_restart(server, "8192", "200").await {
            assert!(timeouts > 0, "no call timed out");
        }
    }
}
