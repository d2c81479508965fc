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

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tollgate_limiter::{
    Backend, FailMode, Key, Limiter, Op, Policy, Request, TokenBucket, Verdict,
};
use tollgate_redis::{Durability, RedisBackend};
use tollgate_testkit::conformance::{assert_fail_mode_held, unique_name};
use tollgate_testkit::redis_server::RedisServer;
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
        // server; nobody calls meanwhile.
        tokio::time::sleep(2 * S).await;
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
    /// verdict waits more than the timeout plus 250 ms; both limiters decide
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
        let closed = limiter("closed", FailMode::Closed, 20, b);
        let bound = tollgate_limiter::limiter::DEFAULT_TIMEOUT + Duration::from_millis(250);
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
        // Exact again: a fresh key gets exactly its capacity, through either
        // limiter.
        for l in [&open, &closed] {
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
