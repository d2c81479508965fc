//! Failovers on real servers: Redis Sentinel (a master, a replica, three
//! sentinels) and Redis Cluster (three masters, three replicas). Load runs
//! through a fail-open and a fail-closed limiter while the master is
//! killed (`SIGKILL`); the tests assert that decisions resume on the
//! promoted replica, that the fail modes hold in between, and (cluster)
//! that the other masters keep deciding while one has no master. They measure the gap and what
//! the failover lost, and print both (`--nocapture`).
//!
//! `sentinel_failover_of_a_frozen_master` freezes the master instead
//! (`SIGSTOP`: its connections stay open and nothing answers), then lets it
//! continue after the promotion, a stale master until the sentinels demote
//! it: no decision may land on it.
//!
//! The `sentinel_silent_first_sentinel_*` tests put a network that went
//! silent (a relay that keeps connections and forwards nothing) in front
//! of the first of two sentinels: the backend must start, and follow a
//! failover, on the second's answers within bounds derived from its
//! timeouts.
//!
//! `sentinel_stale_sentinel_asked_first_does_not_name_the_master` lists
//! first a sentinel cut off with an old master that still says `master`
//! after a failover: decisions must reach the newest configuration's
//! master. `sentinel_silent_sentinel_does_not_hold_up_a_lookup` silences
//! one of three sentinels: the two others are a majority, and lookups do
//! not wait on it. `sentinel_acl_user_of_the_sentinels` runs with the
//! least grants a sentinels' user needs.
//!
//! `sentinel_master_check_is_one_per_backend` counts the backend's
//! questions to the sentinels while it is idle;
//! `sentinel_suspicion_is_not_held_up_by_a_stuck_master_check` has a
//! keeper check its connection while that question waits on silence.
//!
//! `cluster_failover_of_a_frozen_master` freezes a cluster master
//! (`SIGSTOP`: connections stay open, nothing answers) instead of killing
//! it: decisions must resume on the promoted replica, and go on once the
//! frozen node continues and rejoins as a replica.
//!
//! `cluster_master_behind_a_path_that_died` silences the open connections
//! to a healthy master (a relay the cluster announces for it), while new
//! ones reach it; `cluster_masters_behind_paths_that_died_are_asked_together`
//! does so to two masters at once, and times the keeper's check;
//! `cluster_master_loading_is_no_dead_path` has a master answer
//! `-LOADING` to every connection, which no new connection changes.
//!
//! `sentinel_durability_check_reads_the_master_it_names` and
//! `cluster_strict_start_with_a_master_frozen` run the durability check
//! after a Sentinel failover and while a cluster master is frozen.
//!
//! `TOLLGATE_FAILOVER_CYCLES` (default 1) repeats the failover: the killed
//! server is restarted, rejoins as a replica, and the new master is killed
//! next; `scripts/failover-soak.sh` runs the long form.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tollgate_limiter::{
    Backend, BreakerConfig, Decision, Error, FailMode, Key, Limiter, Op, Policy, Request, Scope,
    TokenBucket, Verdict,
};
use tollgate_redis::{
    CLUSTER_DOMAINS, Durability, NodeRole, RedisBackend, RedisBackendBuilder, RedisError,
};
use tollgate_testkit::conformance::{assert_fail_mode_held, patient, unique_name};
use tollgate_testkit::ha::{RedisSentinel, wait_synced};
use tollgate_testkit::redis_server::{RedisCluster, TlsCerts};
use tollgate_testkit::relay::Relay;

const S: Duration = Duration::from_secs(1);

/// The ledger's capacity: never reached, so every acquisition the backend
/// answers is admitted and recorded. Its refill, one token per
/// [`LEDGER_DRIP`] (the slowest a bucket this size may refill), adds under
/// one token in a 5-minute soak.
const LEDGER: u64 = 1_000_000;
const LEDGER_DRIP: Duration = Duration::from_secs(300);

/// How long decisions may take to resume after a master is killed: the
/// failure detection (`down-after-milliseconds` 500 / `cluster-node-timeout`
/// 1000), the election and promotion, the client's reconnection, with
/// room for a machine shared with builds.
const RESUME_WITHIN: Duration = Duration::from_secs(20);

fn cycles() -> u32 {
    std::env::var("TOLLGATE_FAILOVER_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// Builds with the start-up durability check and a short connect timeout,
/// as `docs/redis.md` recommends for HA (a reconnection that reaches a dead
/// address gives up sooner).
async fn build(b: tollgate_redis::RedisBackendBuilder) -> RedisBackend {
    build_with_prefix(b, &unique_name("failover")).await
}

/// [`build`], with this key prefix.
async fn build_with_prefix(b: tollgate_redis::RedisBackendBuilder, prefix: &str) -> RedisBackend {
    b.prefix(prefix)
        .connect_timeout(Duration::from_millis(250))
        .durability(Durability::Report)
        .build()
        .await
        .expect("connect")
}

/// [`build`] for a test of trust, not of failover: 10 s connect and
/// response timeouts, as a TLS handshake of a debug build on a loaded
/// machine can outlast `build`'s 250 ms.
async fn build_patiently(b: tollgate_redis::RedisBackendBuilder) -> RedisBackend {
    b.prefix(unique_name("failover"))
        .connect_timeout(10 * S)
        .response_timeout(10 * S)
        .durability(Durability::Report)
        .build()
        .await
        .expect("connect")
}

fn limiter(name: &str, mode: FailMode, capacity: u64, b: &RedisBackend) -> Limiter<RedisBackend> {
    let policy = TokenBucket::new(capacity, 1, LEDGER_DRIP).unwrap();
    Limiter::builder(name, policy, b.clone())
        .fail_mode(mode)
        .breaker(BreakerConfig {
            max_backoff: S,
            ..BreakerConfig::default()
        })
        .build()
}

/// What `l` has counted on `k`: a peek, asked again until it is decided
/// (up to [`RESUME_WITHIN`]). A peek writes nothing, so asking again does
/// not change the count; the limiters here keep the default 50 ms timeout
/// (the load measures it), which a single read on a loaded machine can
/// outlast, failing the test on a timeout instead of on the count.
async fn counted(l: &Limiter<RedisBackend>, k: &Key) -> Decision {
    let start = Instant::now();
    loop {
        match l.try_peek(k, 1).await {
            Ok(d) => return d,
            Err(e) if start.elapsed() > RESUME_WITHIN => {
                panic!(
                    "{} did not decide within {RESUME_WITHIN:?}: {e:?}",
                    l.name()
                )
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

/// What the load saw.
#[derive(Default)]
struct Tally {
    decided: AtomicU64,
    failed_open: AtomicU64,
    failed_closed: AtomicU64,
    /// Failed verdicts on keys whose master was not killed (cluster).
    failed_elsewhere: AtomicU64,
    /// Failed verdicts on keys of a failure domain apart from the failed
    /// master (see [`Place`]), and those of them its breaker answered.
    failed_apart: AtomicU64,
    breaker_apart: AtomicU64,
    /// Set while the failed master is the only node that fails (a frozen
    /// master's first second, before the cluster can fail it over), and
    /// what the load saw meanwhile on keys apart from it.
    only_victim: AtomicBool,
    failed_apart_alone: AtomicU64,
    breaker_apart_alone: AtomicU64,
    /// Ledger acquisitions sent, and admitted by Redis.
    attempted: AtomicU64,
    acked: AtomicU64,
    /// The longest time without a decision on the ledger key, in µs.
    gap_us: AtomicU64,
    /// Failed verdicts of the steady probe (its own limiter, on a master
    /// that is never killed).
    steady_failed: AtomicU64,
    steady_decided: AtomicU64,
    /// The steady probe's longest wait for a verdict, in µs.
    steady_max_us: AtomicU64,
}

/// Where a load key lives, seen from the master a test fails.
#[derive(Clone, Copy)]
struct Place {
    /// On the failed master.
    on_victim: bool,
    /// In a failure domain (a range of [`CLUSTER_DOMAINS`] slots) that
    /// holds no slot of the failed master: the failed master's failures
    /// never reach the breaker its limiter keeps for the key.
    apart: bool,
}

/// Load on one backend: a ledger task (acquisitions of 1 on one key, in the
/// killed master's slot), 8 tasks on 200 keys through a fail-open and a
/// fail-closed limiter, and optionally a steady probe.
struct Load {
    tally: Arc<Tally>,
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<()>>,
    ledger: Limiter<RedisBackend>,
    ledger_key: Key,
}

impl Load {
    /// `place(key)`: where the key lives, seen from the master that fails.
    fn start(
        b: &RedisBackend,
        ledger_key: Key,
        steady_key: Option<Key>,
        place: impl Fn(&str) -> Place,
    ) -> Self {
        let tally = Arc::new(Tally::default());
        let stop = Arc::new(AtomicBool::new(false));
        let ledger = limiter("ledger", FailMode::Closed, LEDGER, b);
        let mut tasks = Vec::new();
        {
            let (l, k, tally, stop) = (
                ledger.clone(),
                ledger_key.clone(),
                tally.clone(),
                stop.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let mut last = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    tally.attempted.fetch_add(1, Ordering::Relaxed);
                    match l.check(&k).await {
                        Verdict::Decided(d) => {
                            assert!(d.is_allowed(), "the ledger is never full: {d:?}");
                            tally.acked.fetch_add(1, Ordering::Relaxed);
                            let gap = last.elapsed().as_micros() as u64;
                            tally.gap_us.fetch_max(gap, Ordering::Relaxed);
                            last = Instant::now();
                        }
                        v => assert!(!v.is_allowed(), "fail-closed admitted: {v:?}"),
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }));
        }
        if let Some(k) = steady_key {
            // A patient caller (1 s), to tell a stall from a stop: the
            // cluster client holds every request while it refreshes its slot
            // map.
            let policy = TokenBucket::new(LEDGER, 1, LEDGER_DRIP).unwrap();
            let l = Limiter::builder("steady", policy, b.clone())
                .fail_mode(FailMode::Closed)
                .timeout(S)
                .build();
            let (tally, stop) = (tally.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let start = Instant::now();
                    let v = l.check(&k).await;
                    let waited = start.elapsed().as_micros() as u64;
                    tally.steady_max_us.fetch_max(waited, Ordering::Relaxed);
                    if v.decision().is_none() && tally.steady_failed.load(Ordering::Relaxed) < 3 {
                        println!("steady probe failed: {v:?}");
                    }
                    match v {
                        Verdict::Decided(_) => &tally.steady_decided,
                        _ => &tally.steady_failed,
                    }
                    .fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }));
        }
        // Small buckets, so real refusals happen too.
        let open = limiter("open", FailMode::Open, 20, b);
        let closed = limiter("closed", FailMode::Closed, 20, b);
        let keys: Arc<Vec<(Key, Place)>> = Arc::new(
            (0..200)
                .map(|i| {
                    let name = format!("k{i}");
                    let p = place(&name);
                    (Key::new(name), p)
                })
                .collect(),
        );
        for t in 0..8u64 {
            let (open, closed, keys) = (open.clone(), closed.clone(), keys.clone());
            let (tally, stop) = (tally.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                let mut i = t;
                while !stop.load(Ordering::Relaxed) {
                    i = i
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let (k, place) = &keys[((i >> 33) % 200) as usize];
                    let l = if i & 1 == 0 { &open } else { &closed };
                    let v = l.check(k).await;
                    match &v {
                        Verdict::Decided(_) | Verdict::Shadowed(_) => &tally.decided,
                        Verdict::FailedOpen(_) => &tally.failed_open,
                        Verdict::FailedClosed(..) => &tally.failed_closed,
                    }
                    .fetch_add(1, Ordering::Relaxed);
                    if v.decision().is_none() && !place.on_victim {
                        tally.failed_elsewhere.fetch_add(1, Ordering::Relaxed);
                    }
                    if v.decision().is_none() && place.apart {
                        let alone = tally.only_victim.load(Ordering::Relaxed);
                        let breaker = matches!(v.error(), Some(Error::BreakerOpen));
                        for (count, counted) in [
                            (&tally.failed_apart, true),
                            (&tally.breaker_apart, breaker),
                            (&tally.failed_apart_alone, alone),
                            (&tally.breaker_apart_alone, alone && breaker),
                        ] {
                            if counted {
                                count.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    assert_fail_mode_held(l.fail_mode(), &v);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }));
        }
        Self {
            tally,
            stop,
            tasks,
            ledger,
            ledger_key,
        }
    }

    /// How many verdicts of the load were failures (no decision) so far.
    fn failed(&self) -> u64 {
        let t = &self.tally;
        t.failed_open.load(Ordering::Relaxed) + t.failed_closed.load(Ordering::Relaxed)
    }

    /// How many verdicts of the steady probe were decisions so far.
    fn steady_decided(&self) -> u64 {
        self.tally.steady_decided.load(Ordering::Relaxed)
    }

    /// Asks the ledger every 10 ms until it is decided; how long that took
    /// from `since`.
    async fn resumed(&self, since: Instant) -> Duration {
        while since.elapsed() < RESUME_WITHIN {
            if self.ledger.try_peek(&self.ledger_key, 1).await.is_ok() {
                return since.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let last = self.ledger.try_peek(&self.ledger_key, 1).await;
        panic!("decisions did not resume within {RESUME_WITHIN:?}: {last:?}");
    }

    /// Stops the load and reports; panics if a task did (a fail mode was
    /// broken).
    async fn finish(self, what: &str) -> Figures {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.expect("no load task panicked");
        }
        let d = counted(&self.ledger, &self.ledger_key).await;
        let t = &self.tally;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let f = Figures {
            recorded: LEDGER - d.remaining(),
            acked: get(&t.acked),
            attempted: get(&t.attempted),
            gap: Duration::from_micros(get(&t.gap_us)),
            decided: get(&t.decided),
            failed_open: get(&t.failed_open),
            failed_closed: get(&t.failed_closed),
            failed_elsewhere: get(&t.failed_elsewhere),
            failed_apart: get(&t.failed_apart),
            breaker_apart: get(&t.breaker_apart),
            steady_decided: get(&t.steady_decided),
            steady_failed: get(&t.steady_failed),
            steady_max: Duration::from_micros(get(&t.steady_max_us)),
        };
        println!(
            "{what}: ledger acked {} (sent {}), recorded after the failover {}, lost {}; \
             longest gap {:?}; load {} decided, {} failed open, {} failed closed \
             ({} on other masters' keys, {} in failure domains apart from the failed master, \
             {} of them by the breaker); steady probe {} decided, {} failed, longest wait {:?}",
            f.acked,
            f.attempted,
            f.recorded,
            f.acked.saturating_sub(f.recorded),
            f.gap,
            f.decided,
            f.failed_open,
            f.failed_closed,
            f.failed_elsewhere,
            f.failed_apart,
            f.breaker_apart,
            f.steady_decided,
            f.steady_failed,
            f.steady_max,
        );
        f
    }
}

#[derive(Debug)]
struct Figures {
    recorded: u64,
    acked: u64,
    attempted: u64,
    gap: Duration,
    decided: u64,
    failed_open: u64,
    failed_closed: u64,
    failed_elsewhere: u64,
    failed_apart: u64,
    breaker_apart: u64,
    steady_decided: u64,
    steady_failed: u64,
    steady_max: Duration,
}

impl Figures {
    /// What holds after any failover.
    fn check(&self) {
        // Redis cannot record more than was sent (it may record a call whose
        // reply was lost: sent but not acknowledged).
        assert!(self.recorded <= self.attempted, "{self:?}");
        assert!(self.decided > 0 && self.acked > 0, "{self:?}");
        assert!(
            self.failed_closed > 0 && self.failed_open > 0,
            "the failover reached both limiters: {self:?}"
        );
    }
}

/// Runs blocking testkit work (process control, `redis-cli`) on this
/// worker thread, letting the runtime move its other tasks away.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// Sentinel: the master is killed; the sentinels promote the replica;
/// decisions resume on it, through the same `redis+sentinel://` backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_under_load() {
    let Some(mut ha) = blocking(RedisSentinel::start) else {
        return;
    };
    let b = build(RedisBackend::builder(ha.url())).await;

    // The durability check covers the master and the replica that can
    // become it.
    let report = b.check_durability().await.unwrap();
    let roles: Vec<NodeRole> = report.nodes.iter().map(|n| n.role).collect();
    assert_eq!(roles, [NodeRole::Master, NodeRole::Replica], "{report:?}");
    let master = blocking(|| ha.master_port()).unwrap();
    assert_eq!(report.nodes[0].node, format!("127.0.0.1:{master}"));

    let one_master = |_: &str| Place {
        on_victim: true,
        apart: false,
    };
    let load = Load::start(&b, Key::new("ledger"), None, one_master);
    for cycle in 0..cycles() {
        tokio::time::sleep(S).await;
        let killed_at = Instant::now();
        let old = blocking(|| ha.kill_master());
        let new = blocking(|| ha.wait_promoted(old, RESUME_WITHIN));
        let new = new.expect("the sentinels promoted the replica");
        let promoted = killed_at.elapsed();
        let took = load.resumed(killed_at).await;
        println!(
            "sentinel cycle {cycle}: master :{old} killed; :{new} promoted after {promoted:?}, \
             decisions resumed after {took:?}"
        );
        if cycle + 1 < cycles() {
            // The killed server comes back and the sentinels make it a
            // replica of the new master: the next cycle kills that one.
            blocking(|| {
                let s = ha.servers_mut().iter_mut().find(|s| s.port() == old);
                let s = s.expect("ours");
                s.restart();
                assert!(wait_synced(s, 60 * S), "the old master did not rejoin");
            });
        }
    }
    tokio::time::sleep(S).await;
    let f = load.finish("sentinel").await;
    f.check();

    // After the failover the report names the new master.
    let report = b.check_durability().await.unwrap();
    let now = blocking(|| ha.master_port()).unwrap();
    assert_eq!(report.nodes[0].node, format!("127.0.0.1:{now}"));
    assert_eq!(report.nodes[0].role, NodeRole::Master);
}

/// Sentinel: the master freezes (`SIGSTOP`, a hung host: its sockets stay
/// open, the kernel still acknowledges, nothing answers) and the sentinels
/// promote the replica. Every call on the connections to the frozen master
/// times out; decisions must resume on the new master, which the backend
/// only finds by asking the sentinels again. Then the frozen process
/// continues (`SIGCONT`), a master in its own eyes until the sentinels
/// demote it: no decision may be written to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_of_a_frozen_master() {
    let Some(mut ha) = blocking(RedisSentinel::start) else {
        return;
    };
    let b = build(RedisBackend::builder(ha.url())).await;
    let one_master = |_: &str| Place {
        on_victim: true,
        apart: false,
    };
    let load = Load::start(&b, Key::new("ledger"), None, one_master);
    tokio::time::sleep(S).await;

    let failed_before = load.failed();
    let paused_at = Instant::now();
    let old = blocking(|| ha.pause_master());
    let new = blocking(|| ha.wait_promoted(old, RESUME_WITHIN));
    let new = new.expect("the sentinels promoted the replica");
    let promoted = paused_at.elapsed();
    let after = load.resumed(Instant::now()).await;
    let failed = load.failed() - failed_before;
    println!(
        "sentinel: master :{old} frozen; :{new} promoted after {promoted:?}, decisions \
         resumed {after:?} later; {failed} failed verdicts in between"
    );

    // A probe of its own from before the frozen process continues until
    // after it is a replica: one acquisition at a time, so that every one
    // acknowledged is on the new master at the end. The sentinels leave the
    // old master a master for seconds after it continues (they wait out
    // four 2 s hello periods before demoting it), taking writes from anyone
    // still connected to it; one it acknowledged is missing on the new
    // master (its data is replaced when it resyncs as a replica).
    let probe = limiter("probe", FailMode::Closed, LEDGER, &b);
    let probe_key = Key::new("probe");
    let stop = Arc::new(AtomicBool::new(false));
    let task = tokio::spawn({
        let (l, k, stop) = (probe.clone(), probe_key.clone(), stop.clone());
        async move {
            let (mut sent, mut acked) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                sent += 1;
                if l.check(&k).await.decision().is_some() {
                    acked += 1;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            (sent, acked)
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let demoted = blocking(|| {
        let s = ha.server(old).expect("ours");
        let resumed_at = Instant::now();
        s.resume();
        assert!(wait_synced(s, 60 * S), "the old master was not demoted");
        resumed_at.elapsed()
    });
    tokio::time::sleep(S).await;
    stop.store(true, Ordering::Relaxed);
    let (sent, acked) = task.await.expect("the probe did not panic");
    let d = counted(&probe, &probe_key).await;
    let recorded = LEDGER - d.remaining();
    println!(
        "resumed :{old}, a replica in sync after {demoted:?}; probe sent {sent}, \
         acknowledged {acked}, recorded {recorded}"
    );
    assert!(acked > 0, "no decision after the resume");
    assert!(
        acked <= recorded && recorded <= sent,
        "a decision landed on the stale master: sent {sent}, acknowledged {acked}, \
         recorded {recorded}"
    );

    let f = load.finish("sentinel, frozen master").await;
    f.check();
    let report = b.check_durability().await.unwrap();
    assert_eq!(report.nodes[0].node, format!("127.0.0.1:{new}"));
    assert_eq!(report.nodes[0].role, NodeRole::Master);
}

/// The connect and response timeouts of the silent-sentinel tests: shorter
/// than the redis crate's own (1 s to connect, 500 ms for a reply), which
/// its sentinel client uses whatever the backend's are.
const CONNECT: Duration = Duration::from_millis(100);
const RESPONSE: Duration = Duration::from_millis(100);

/// The keeper's least time between two connection attempts.
const RETRY: Duration = Duration::from_millis(250);

/// What one lookup cost when the sentinels were asked one at a time,
/// `asked` of them, each within 2 x (connect + response). Asked together, a
/// lookup takes at most one such bound (docs/redis.md, "A silent
/// sentinel"); the tests keep the looser one: "did not hang", not a speed.
fn lookup_bound(asked: u32) -> Duration {
    (CONNECT + RESPONSE) * 2 * asked
}

/// A backend whose first sentinel is reached through `relay` (to the
/// topology's first sentinel), its second directly (the topology's second).
fn behind_relay(ha: &RedisSentinel, relay: &Relay) -> RedisBackendBuilder {
    let url = format!(
        "redis+sentinel://{},{}/{}",
        relay.addr(),
        ha.sentinels()[1].addr(),
        ha.master_name()
    );
    RedisBackend::builder(url)
        .prefix(unique_name("silent-sentinel"))
        .connect_timeout(CONNECT)
        .response_timeout(RESPONSE)
}

/// Relays in front of the topology's first two sentinels (to silence
/// them), and a backend that knows the sentinels only through them.
fn behind_relays(ha: &RedisSentinel, prefix: &str) -> ([Relay; 2], RedisBackendBuilder) {
    let relays = [0, 1].map(|i| Relay::start(ha.sentinels()[i].addr()));
    let url = format!(
        "redis+sentinel://{},{}/{}",
        relays[0].addr(),
        relays[1].addr(),
        ha.master_name()
    );
    let b = RedisBackend::builder(url)
        .prefix(unique_name(prefix))
        .connect_timeout(CONNECT)
        .response_timeout(RESPONSE);
    (relays, b)
}

/// One decision straight from the backend (no limiter: no breaker, no
/// fail mode in the way).
async fn decide(b: &RedisBackend) -> Result<Decision, RedisError> {
    let policy = Policy::from(TokenBucket::new(1_000, 1, S).unwrap());
    let key = Key::new("k");
    let req = Request {
        limiter: "silent",
        key: &key,
        policy: &policy,
        op: Op::Acquire(1),
    };
    b.decide(req).await
}

/// The master's port as sentinel `i` names it.
fn named_by(ha: &RedisSentinel, i: usize) -> Option<u16> {
    let out = ha.sentinels()[i].cli(&["sentinel", "get-master-addr-by-name", ha.master_name()]);
    out.lines().nth(1)?.trim().parse().ok()
}

/// The first sentinel's network is silent (a relay that keeps every
/// connection and forwards nothing), the second is healthy: the backend
/// starts (two slots, and the durability check, which asks the sentinels
/// for the master and the replicas) on the second's answers. Every lookup
/// asks both (one alone is no majority of two): each gives the silent
/// sentinel its bound, once, and takes the answer it has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_silent_first_sentinel_at_start() {
    let Some(ha) = blocking(RedisSentinel::start) else {
        return;
    };
    let relay = Relay::start(ha.sentinels()[0].addr());
    relay.silence();
    // Four lookups; the silent sentinel may cost each its bound. A few
    // times that is "did not hang", not a speed.
    let bound = 4 * lookup_bound(2);
    let started = Instant::now();
    let build = behind_relay(&ha, &relay)
        .pool_size(2)
        .durability(Durability::Report)
        .build();
    let b = tokio::time::timeout(bound, build)
        .await
        .unwrap_or_else(|_| panic!("the start hung past {bound:?}"))
        .expect("the second sentinel names the master");
    println!(
        "started in {:?}, the silent sentinel dialled {} times",
        started.elapsed(),
        relay.accepted()
    );
    let d = decide(&b).await.expect("decided on the master");
    assert!(d.is_allowed(), "{d:?}");
    let master = blocking(|| ha.master_port()).unwrap();
    let report = tokio::time::timeout(bound, b.check_durability())
        .await
        .unwrap_or_else(|_| panic!("the durability check hung past {bound:?}"))
        .unwrap();
    let roles: Vec<NodeRole> = report.nodes.iter().map(|n| n.role).collect();
    assert_eq!(roles, [NodeRole::Master, NodeRole::Replica], "{report:?}");
    assert_eq!(report.nodes[0].node, format!("127.0.0.1:{master}"));
}

/// The backend started with both sentinels answering (it holds a
/// connection to the first); then the first one's network goes silent and
/// the master is killed: once the healthy sentinel names the promoted
/// replica, decisions resume on it, every reconnection giving the silent
/// sentinel (its held connection, then new ones) its bound and moving on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_silent_first_sentinel_during_failover() {
    let Some(mut ha) = blocking(RedisSentinel::start) else {
        return;
    };
    let relay = Relay::start(ha.sentinels()[0].addr());
    let b = behind_relay(&ha, &relay)
        .durability(Durability::Skip)
        .build()
        .await
        .expect("connect");
    assert!(decide(&b).await.unwrap().is_allowed());

    relay.silence();
    let old = blocking(|| ha.kill_master());
    let new = blocking(|| ha.wait_promoted(old, RESUME_WITHIN));
    let new = new.expect("the sentinels promoted the replica");
    // Sentinels learn a failover from each other (hello messages, every
    // 2 s): wait until the one the backend can reach names the new master.
    let deadline = Instant::now() + RESUME_WITHIN;
    while blocking(|| named_by(&ha, 1)) != Some(new) {
        assert!(Instant::now() < deadline, "sentinel 1 never named :{new}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The keeper's attempt under way, its pause, the next one; a few times
    // that is "did not hang".
    let bound = 4 * (RETRY + lookup_bound(2));
    let since = Instant::now();
    let d = loop {
        match decide(&b).await {
            Ok(d) => break d,
            Err(e) => assert!(
                since.elapsed() < bound,
                "decisions did not resume within {bound:?} of sentinel 1 naming :{new}: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    println!(
        "resumed {:?} after sentinel 1 named :{new}",
        since.elapsed()
    );
    assert!(d.is_allowed(), "{d:?}");
    let report = b.check_durability().await.unwrap();
    assert_eq!(report.nodes[0].node, format!("127.0.0.1:{new}"));
}

/// Sentinel: a failover whose old master is cut off, not dead, with a
/// sentinel cut off with it. Made here by a planned failover
/// (`SENTINEL FAILOVER`), after which the old master leaves replication
/// (`REPLICAOF NO ONE`: it says `master` again) and the topology's
/// sentinels forget it (`SENTINEL RESET`), and by a sentinel of its own
/// that monitors the old master (it never hears of the failover, and
/// names the old master with the configuration before it). The backend
/// lists that stale sentinel first. Its decisions must reach the master
/// of the newest configuration: the old master says it is one too, and a
/// client whose decisions count there gets its limit a second time. They
/// went to the old master, which the stale sentinel named first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_stale_sentinel_asked_first_does_not_name_the_master() {
    let Some(ha) = blocking(RedisSentinel::start) else {
        return;
    };
    let name = ha.master_name().to_owned();
    let (old, new, stale) = blocking(|| {
        let old = ha.master_port().expect("a master");
        let out = ha.sentinels()[0].cli(&["sentinel", "failover", &name]);
        assert_eq!(out.trim(), "OK", "SENTINEL FAILOVER: {out}");
        let new = ha.wait_promoted(old, RESUME_WITHIN);
        let new = new.expect("the replica was promoted");
        assert!(
            ha.wait_sentinels_agree(new, RESUME_WITHIN),
            "the sentinels did not all come to name :{new}"
        );
        // The failover ends with the old master a replica of the new one.
        let old_server = ha.server(old).expect("ours");
        assert!(
            wait_synced(old_server, RESUME_WITHIN),
            "the old master did not become a replica"
        );
        // Cut off: a master again, which neither the new master nor the
        // sentinels know (they would make it a replica again 8 s later).
        let out = old_server.cli(&["replicaof", "no", "one"]);
        assert_eq!(out.trim(), "OK", "REPLICAOF NO ONE: {out}");
        let new_server = ha.server(new).expect("ours");
        let deadline = std::time::Instant::now() + RESUME_WITHIN;
        while !new_server
            .cli(&["info", "replication"])
            .contains("connected_slaves:0")
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the new master still lists the old one as its replica"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        for s in ha.sentinels() {
            let out = s.cli(&["sentinel", "reset", &name]);
            assert_eq!(out.trim(), "1", "SENTINEL RESET: {out}");
        }
        let stale = ha.start_sentinel(old);
        (old, new, stale)
    });
    let epoch = |s: &tollgate_testkit::redis_server::RedisServer| {
        let out = s.cli(&["sentinel", "master", &name]);
        let fields: Vec<&str> = out.lines().collect();
        let i = fields.iter().position(|l| *l == "config-epoch");
        i.and_then(|i| fields.get(i + 1)?.trim().parse::<u64>().ok())
    };
    let (stale_epoch, epochs) = blocking(|| {
        let epochs: Vec<Option<u64>> = ha.sentinels().iter().map(epoch).collect();
        (epoch(&stale), epochs)
    });
    println!(
        "the old master :{old} cut off, a master again; :{new} promoted; the stale sentinel \
         (epoch {stale_epoch:?}) names :{old}, the others (epochs {epochs:?}) :{new}"
    );
    let role = |port: u16| blocking(|| ha.server(port).expect("ours").cli(&["role"]));
    assert!(role(old).starts_with("master"), "{}", role(old));
    assert!(role(new).starts_with("master"), "{}", role(new));

    let hosts: Vec<String> = std::iter::once(&stale)
        .chain(ha.sentinels())
        .map(|s| s.addr().to_string())
        .collect();
    let url = format!("redis+sentinel://{}/{name}", hosts.join(","));
    let prefix = unique_name("stale-sentinel");
    let b = RedisBackend::builder(url)
        .prefix(&prefix)
        .durability(Durability::Skip)
        .build()
        .await
        .expect("connect");
    // Across several of the backend's master checks (every second).
    let policy = Policy::from(TokenBucket::new(1_000, 1, 60 * S).unwrap());
    let key = Key::new("twice");
    let acquire = |op| Request {
        limiter: "stale",
        key: &key,
        policy: &policy,
        op,
    };
    let mut decided = 0u64;
    let start = Instant::now();
    while start.elapsed() < 3 * S {
        if b.decide(acquire(Op::Acquire(1))).await.is_ok() {
            decided += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(decided > 0, "no decision");
    let mut counted = Vec::new();
    for port in [old, new] {
        let server = RedisBackend::builder(format!("redis://127.0.0.1:{port}"))
            .prefix(&prefix)
            .durability(Durability::Skip)
            .build()
            .await
            .expect("connect");
        let peek = server.decide(acquire(Op::Peek(1))).await.expect("a peek");
        counted.push(1_000 - peek.remaining());
    }
    println!("{decided} decided; counted by the old master :{old} and the new :{new}: {counted:?}");
    assert_eq!(
        counted,
        [0, decided],
        "decisions reached the old master :{old}, which a stale sentinel named first"
    );
}

/// Sentinel: the first of three sentinels goes silent (a relay that keeps
/// every connection and forwards nothing). The two others are a majority:
/// a lookup takes their answers and does not wait on the silent one. The
/// timeouts are long (5 s each: one question's bound is 10 s), so the
/// start, and decisions after the master is killed and the replica
/// promoted, must come within 5 s, half a bound: they do not wait it out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_silent_sentinel_does_not_hold_up_a_lookup() {
    const LONG: Duration = Duration::from_secs(5);
    let Some(mut ha) = blocking(RedisSentinel::start) else {
        return;
    };
    let relay = Relay::start(ha.sentinels()[0].addr());
    relay.silence();
    let url = format!(
        "redis+sentinel://{},{},{}/{}",
        relay.addr(),
        ha.sentinels()[1].addr(),
        ha.sentinels()[2].addr(),
        ha.master_name()
    );
    let started = Instant::now();
    let build = RedisBackend::builder(url)
        .prefix(unique_name("silent-minority"))
        .connect_timeout(LONG)
        .response_timeout(LONG)
        .pool_size(2)
        .durability(Durability::Report)
        .build();
    let b = tokio::time::timeout(LONG, build)
        .await
        .unwrap_or_else(|_| panic!("the start waited on the silent sentinel ({LONG:?})"))
        .expect("the other sentinels name the master");
    println!("started in {:?}", started.elapsed());
    assert!(decide(&b).await.expect("decided").is_allowed());
    assert!(relay.accepted() >= 1, "the silent sentinel was never asked");

    let old = blocking(|| ha.kill_master());
    let new = blocking(|| ha.wait_promoted(old, RESUME_WITHIN));
    let new = new.expect("the sentinels promoted the replica");
    // Both the others name it: a majority of the three, without the silent
    // one.
    let deadline = Instant::now() + RESUME_WITHIN;
    while blocking(|| (named_by(&ha, 1), named_by(&ha, 2))) != (Some(new), Some(new)) {
        assert!(
            Instant::now() < deadline,
            "the sentinels never named :{new}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let since = Instant::now();
    let d = loop {
        match decide(&b).await {
            Ok(d) => break d,
            Err(e) => assert!(
                since.elapsed() < LONG,
                "decisions did not resume within {LONG:?} of the sentinels naming :{new}: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    println!(
        "resumed {:?} after the sentinels named :{new}",
        since.elapsed()
    );
    assert!(d.is_allowed(), "{d:?}");
}

/// Sentinel: sentinels that require a user of their own
/// (`?sentinel_username=..&sentinel_password=..`), granted the least the
/// backend needs (docs/redis.md, "ACL"): `SENTINEL MASTER` and `SENTINEL
/// SLAVES`; and, as a user set up for an earlier release would be,
/// `SENTINEL MASTERS` instead of `SENTINEL MASTER` (asked once, then
/// `SENTINEL MASTERS` instead). The backend starts, decides, and the
/// durability check lists the replica, with either; a user granted
/// neither is refused (the user is the one the sentinels check).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_acl_user_of_the_sentinels() {
    let Some(ha) = blocking(RedisSentinel::start) else {
        return;
    };
    let url = |user: &str| {
        let hosts: Vec<String> = ha
            .sentinels()
            .iter()
            .map(|s| s.addr().to_string())
            .collect();
        format!(
            "redis+sentinel://{}/{}?sentinel_username={user}&sentinel_password=pw",
            hosts.join(","),
            ha.master_name()
        )
    };
    let setuser = |user: &str, grants: &str| {
        blocking(|| {
            for s in ha.sentinels() {
                let mut args = vec!["acl", "setuser", user, "on", ">pw", "-@all"];
                args.extend(grants.split(' '));
                let out = s.cli(&args);
                assert_eq!(out.trim(), "OK", "ACL SETUSER on a sentinel: {out}");
            }
        });
    };
    setuser("neither", "+sentinel|slaves");
    let refused = RedisBackend::builder(url("neither"))
        .durability(Durability::Skip)
        .build()
        .await;
    let e = refused.expect_err("a user granted neither is refused");
    println!("granted neither: {e}");
    for (user, grants) in [
        ("least", "+sentinel|master +sentinel|slaves"),
        ("earlier", "+sentinel|masters +sentinel|slaves"),
    ] {
        setuser(user, grants);
        let b = RedisBackend::builder(url(user))
            .prefix(unique_name("sentinel-acl"))
            .durability(Durability::Skip)
            .build()
            .await
            .unwrap_or_else(|e| panic!("{user} ({grants}): {e}"));
        let d = decide(&b).await;
        let d = d.unwrap_or_else(|e| panic!("{user} ({grants}): {e}"));
        assert!(d.is_allowed(), "{d:?}");
        let report = b.check_durability().await;
        let report = report.unwrap_or_else(|e| panic!("{user} ({grants}): {e}"));
        let roles: Vec<NodeRole> = report.nodes.iter().map(|n| n.role).collect();
        assert_eq!(
            roles,
            [NodeRole::Master, NodeRole::Replica],
            "{user}: {report:?}"
        );
    }
}

/// The hash slot of a key (CRC16/XMODEM of its hash tag, or of the whole
/// key), as Redis Cluster computes it.
fn slot(key: &str) -> u16 {
    let tagged = key
        .split_once('{')
        .and_then(|(_, r)| r.split_once('}'))
        .map(|(t, _)| t)
        .filter(|t| !t.is_empty())
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &b in tagged.as_bytes() {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

/// The failure domain of a key's slot in a cluster backend: its range of
/// [`CLUSTER_DOMAINS`] contiguous slots.
fn domain(slot: u16) -> usize {
    usize::from(slot) * CLUSTER_DOMAINS / 16384
}

/// The master of the ledger's slot (the one a cluster test fails), a key
/// of another master for the steady probe, and where a load key (`k0` to
/// `k199`) lives, seen from that master.
fn victim_of(cluster: &RedisCluster) -> (usize, String, impl Fn(&str) -> Place + use<>) {
    let (victim, steady, owners) = blocking(|| {
        let owners = cluster.masters_of(0..=16383);
        let victim = owners[usize::from(slot("ledger"))].expect("a master");
        let steady = (0..)
            .map(|i| format!("steady{i}"))
            .find(|k| owners[usize::from(slot(k))] != Some(victim))
            .unwrap();
        (victim, steady, owners)
    });
    let place = move |k: &str| {
        let s = slot(k);
        let range = owners.chunks(16384 / CLUSTER_DOMAINS).nth(domain(s));
        Place {
            on_victim: owners[usize::from(s)] == Some(victim),
            apart: !range.is_some_and(|r| r.contains(&Some(victim))),
        }
    };
    (victim, steady, place)
}

/// Decisions of the steady probe's limiter on `key`, with the default
/// timeout, one every 5 ms until stopped.
struct QuickProbe {
    failed: Arc<AtomicU64>,
    decided: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

fn quick_probe(b: &RedisBackend, key: Key) -> QuickProbe {
    let policy = TokenBucket::new(LEDGER, 1, LEDGER_DRIP).unwrap();
    let l = Limiter::builder("steady", policy, b.clone())
        .fail_mode(FailMode::Closed)
        .build();
    let (failed, decided) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (f, d) = (failed.clone(), decided.clone());
    let task = tokio::spawn(async move {
        loop {
            let v = l.check(&key).await;
            match v.decision() {
                Some(_) => &d,
                None => {
                    println!("quick probe failed: {v:?}");
                    &f
                }
            }
            .fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    QuickProbe {
        failed,
        decided,
        task,
    }
}

impl QuickProbe {
    /// Failed and decided verdicts so far.
    fn counts(&self) -> (u64, u64) {
        (
            self.failed.load(Ordering::Relaxed),
            self.decided.load(Ordering::Relaxed),
        )
    }

    fn stop(self) {
        self.task.abort();
    }
}

/// Waits until the ledger's slot has a master other than node `old`,
/// asserting that the steady probe (on another master) is decided from
/// now until then; the new master, the time from `since`, and how many
/// steady decisions were made meanwhile.
fn promotion(
    cluster: &RedisCluster,
    load: &Load,
    old: usize,
    since: Instant,
) -> (usize, Duration, u64) {
    let (before, from) = (load.steady_decided(), since.elapsed());
    let new = blocking(|| cluster.wait_promoted(slot("ledger"), old, RESUME_WITHIN));
    let new = new.expect("the replica was promoted");
    let promoted = since.elapsed();
    let meanwhile = load.steady_decided() - before;
    assert!(
        meanwhile > 0,
        "no decision on another master from {from:?} after the failure to the promotion \
         ({promoted:?})"
    );
    (new, promoted, meanwhile)
}

/// Cluster: the master of the ledger's slot is killed; its replica is
/// promoted; decisions on that slot resume, and a key on another master
/// is decided throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_failover_under_load() {
    let Some(mut cluster) = blocking(RedisCluster::start_with_replicas) else {
        return;
    };
    assert_eq!(slot("a:{ledger}"), blocking(|| cluster.keyslot("ledger")));
    let b = build(RedisBackend::cluster_builder(cluster.urls())).await;

    // The durability check covers every node: three masters and the three
    // replicas that can become one.
    let report = b.check_durability().await.unwrap();
    let masters = report.nodes.iter().filter(|n| n.role == NodeRole::Master);
    let replicas = report.nodes.iter().filter(|n| n.role == NodeRole::Replica);
    assert_eq!((masters.count(), replicas.count()), (3, 3), "{report:?}");

    let ledger_slot = slot("ledger");
    let (_, steady, place) = victim_of(&cluster);
    let load = Load::start(&b, Key::new("ledger"), Some(Key::new(steady)), place);
    for cycle in 0..cycles() {
        tokio::time::sleep(S).await;
        let old = blocking(|| {
            let old = cluster.master_of(ledger_slot).expect("a master");
            cluster.kill_node(old);
            old
        });
        let killed_at = Instant::now();
        let (new, promoted, meanwhile) = promotion(&cluster, &load, old, killed_at);
        let took = load.resumed(killed_at).await;
        println!(
            "cluster cycle {cycle}: master :{} killed; :{} promoted after {promoted:?}, \
             decisions on its slots resumed after {took:?}; meanwhile {meanwhile} decisions \
             on another master",
            cluster.nodes()[old].port(),
            cluster.nodes()[new].port()
        );
        if cycle + 1 < cycles() {
            // The killed node comes back as a replica of the new master.
            blocking(|| {
                cluster.restart_node(old);
                assert!(
                    wait_synced(&cluster.nodes()[old], 60 * S),
                    "the old master did not rejoin"
                );
            });
        }
    }
    tokio::time::sleep(S).await;
    let f = load.finish("cluster").await;
    f.check();
    // The other masters never stopped (asserted per cycle above). A
    // request to one of them can still fail, rarely: the cluster client
    // holds every request while it refreshes its slot map, and one that
    // waits past the response timeout fails (docs/redis.md); counted, not
    // asserted.
    assert!(f.steady_decided > 0, "{f:?}");
}

/// Cluster: the master of the ledger's slot freezes (`SIGSTOP`: its
/// sockets stay open, the kernel still acknowledges, nothing answers), so
/// no connection is reset and the cluster client meets only timeouts. The
/// cluster promotes its replica; decisions on that slot resume on it
/// within [`RESUME_WITHIN`] of the promotion, a key on another master is
/// decided throughout, and they keep being decided once the frozen node
/// continues (`SIGCONT`) and rejoins as a replica.
///
/// The key prefix is chosen so that the steady probe's limiter keeps its
/// limiter-wide override (`<prefix>:steady:override`, read by the client
/// once per `override_cache_ttl`, 200 ms here) on the frozen master: a
/// limiter's decisions on other masters must not wait on that read. So
/// the probe must be decided from 1 s after the pause (five TTLs; the
/// cluster cannot fail the master over before `cluster-node-timeout`,
/// 1 s) until the promotion, and a quick probe of the same limiter on
/// another worker, with the default timeout (50 ms, a tenth of the
/// response timeout), must not fail once from 0.3 s to 1 s after the
/// pause: the read is made beside the decisions, not by one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_failover_of_a_frozen_master() {
    let Some(cluster) = blocking(RedisCluster::start_with_replicas) else {
        return;
    };
    let ledger_slot = slot("ledger");
    let (old, steady, place) = victim_of(&cluster);
    let prefix = blocking(|| {
        let base = unique_name("frozen");
        (0..)
            .map(|i| format!("{base}-{i}"))
            .find(|p| cluster.master_of(slot(&format!("{p}:steady:override"))) == Some(old))
            .unwrap()
    });
    let b = RedisBackend::cluster_builder(cluster.urls())
        .override_cache_ttl(Duration::from_millis(200));
    let b = build_with_prefix(b, &prefix).await;
    // A worker of its own: the patient probe, holding the refresh's turn
    // for the response timeout, would otherwise spare it the wait.
    let quick = RedisBackend::cluster_builder(cluster.urls())
        .override_cache_ttl(Duration::from_millis(200));
    let quick = quick_probe(
        &build_with_prefix(quick, &prefix).await,
        Key::new(steady.clone()),
    );
    // The backend's failure domains are the test's, on the cluster's own
    // slots (`CLUSTER KEYSLOT`).
    let keys: Vec<String> = (0..200).map(|i| format!("k{i}")).collect();
    for k in &keys[..8] {
        let ours = b.failure_domain(Scope::Key("open", &Key::new(k)));
        assert_eq!(ours, domain(blocking(|| cluster.keyslot(k))), "{k}");
    }
    let apart = keys.iter().filter(|k| place(k).apart).count();
    let elsewhere = keys.iter().filter(|k| !place(k).on_victim).count();
    println!(
        "load keys: {elsewhere} of 200 on other masters, {apart} of them in failure domains \
         apart from the frozen master"
    );
    assert!(apart > 0, "no load key apart from the frozen master");
    let load = Load::start(&b, Key::new("ledger"), Some(Key::new(steady)), place);
    tokio::time::sleep(S).await;

    cluster.pause_node(old);
    let paused_at = Instant::now();
    load.tally.only_victim.store(true, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (failed, decided) = quick.counts();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let (failed_then, decided_then) = quick.counts();
    load.tally.only_victim.store(false, Ordering::Relaxed);
    // Every call on the frozen master's slots timed out meanwhile, and the
    // limiters keep a breaker per failure domain: those failures opened
    // the breakers of its domains only, never one that answers a key of a
    // domain apart from it. (Later, the cluster client can stall every
    // request while it follows the failover: a domain apart may then fail
    // on its own, counted below, not asserted.)
    let t = &load.tally;
    let (failed_alone, breaker_alone) = (
        t.failed_apart_alone.load(Ordering::Relaxed),
        t.breaker_apart_alone.load(Ordering::Relaxed),
    );
    println!(
        "first second of the freeze: {failed_alone} failed verdicts on keys apart from the \
         frozen master, {breaker_alone} of them by the breaker"
    );
    assert_eq!(
        breaker_alone, 0,
        "keys apart from the frozen master were answered by a breaker opened by its failures"
    );
    assert!(decided_then > decided, "the quick probe made no decision");
    assert_eq!(
        failed_then - failed,
        0,
        "a quick decision on another master failed while the override's master was silent"
    );
    quick.stop();
    let (new, promoted, meanwhile) = promotion(&cluster, &load, old, paused_at);
    let took = promoted + load.resumed(Instant::now()).await;
    println!(
        "frozen master :{} paused; :{} promoted after {promoted:?}, decisions on its slots \
         resumed after {took:?}; meanwhile {meanwhile} decisions on another master",
        cluster.nodes()[old].port(),
        cluster.nodes()[new].port()
    );

    // The frozen node continues: it learns it was failed over and follows
    // the new master as a replica. Decisions go on.
    cluster.resume_node(old);
    let resumed_at = Instant::now();
    let rejoined = blocking(|| wait_synced(&cluster.nodes()[old], 60 * S));
    assert!(rejoined, "the frozen master did not rejoin as a replica");
    println!(
        "frozen master continued; in sync as a replica after {:?}",
        resumed_at.elapsed()
    );
    assert_eq!(blocking(|| cluster.master_of(ledger_slot)), Some(new));
    let acked = load.tally.acked.load(Ordering::Relaxed);
    let steady = load.steady_decided();
    tokio::time::sleep(S).await;
    load.resumed(Instant::now()).await;
    assert!(
        load.tally.acked.load(Ordering::Relaxed) > acked && load.steady_decided() > steady,
        "decisions stopped once the frozen master rejoined"
    );
    let f = load.finish("cluster, frozen master").await;
    f.check();
}

/// Cluster: the path to one master dies under the open connection (a
/// NAT or firewall that lost its state, a load balancer failed over: the
/// socket stays open and forwards nothing), while the master itself is
/// healthy and a new connection reaches it: the relay the cluster
/// announces for that master (`cluster-announce-port`) goes silent for
/// the connections it has, and forwards new ones. Its keys must be
/// decided again, on a new connection; the cluster itself saw nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_master_behind_a_path_that_died() {
    const WITHIN: Duration = Duration::from_secs(10);
    let Some(cluster) = blocking(RedisCluster::start) else {
        return;
    };
    let (victim, steady, _) = victim_of(&cluster);
    let node = &cluster.nodes()[victim];
    let relay = Relay::start(node.addr());
    let (port, bus) = (relay.addr().port(), node.port() + 10_000);
    blocking(|| {
        for (name, value) in [
            ("cluster-announce-bus-port", bus),
            ("cluster-announce-port", port),
        ] {
            let out = node.cli(&["config", "set", name, &value.to_string()]);
            assert_eq!(out.trim(), "OK", "CONFIG SET {name}: {out}");
        }
        // Every node names the relay for the victim before the client
        // reads the topology.
        let announced = format!("127.0.0.1:{port}@");
        let start = std::time::Instant::now();
        while !cluster
            .nodes()
            .iter()
            .all(|n| n.cli(&["cluster", "nodes"]).contains(&announced))
        {
            assert!(
                start.elapsed() < 30 * S,
                "the relay's port was not announced"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let urls = cluster
        .nodes()
        .iter()
        .enumerate()
        .map(|(i, n)| if i == victim { relay.url() } else { n.url() });
    let b = build(RedisBackend::cluster_builder(urls.collect::<Vec<_>>())).await;
    let policy = Policy::from(TokenBucket::new(1_000_000, 1, S).unwrap());
    let decide = |key: &'static str| {
        let b = b.clone();
        async move {
            let key = Key::new(key);
            let req = Request {
                limiter: "path",
                key: &key,
                policy: &policy,
                op: Op::Acquire(1),
            };
            match tokio::time::timeout(S, b.decide(req)).await {
                Ok(r) => r.map_err(|e| e.to_string()),
                Err(_) => Err("no answer within 1 s".to_owned()),
            }
        }
    };
    let steady: &'static str = Box::leak(steady.into_boxed_str());
    decide("ledger").await.expect("decided through the relay");
    decide(steady).await.expect("decided on another master");
    let before = relay.accepted();

    // The open connections go silent; new ones reach the same master.
    relay.silence();
    relay.retarget(node.addr());
    let start = Instant::now();
    let mut last = None;
    let took = loop {
        match decide("ledger").await {
            Ok(_) => break Some(start.elapsed()),
            Err(e) => last = Some(e),
        }
        if start.elapsed() > WITHIN {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let dialled = relay.accepted() - before;
    let took = took.unwrap_or_else(|| {
        panic!(
            "no decision on the master behind the dead path within {WITHIN:?} ({dialled} new \
             connections to it; last error: {last:?})"
        )
    });
    println!("decided again after {took:?}, {dialled} new connection(s) through the relay");
    decide(steady).await.expect("decided on another master");
}

/// Cluster: the paths to two masters die at once (one NAT in front of
/// both lost its state), while both are healthy and new connections reach
/// them. The keeper asks each master again; the masters are asked side by
/// side, so decisions on both resume within about two of the check's
/// bounds (the `PING` to every master, then each master's), not one more
/// per master behind a dead path: with hundreds of masters that is
/// minutes. Timeouts are long here (4 s response) to tell them apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_masters_behind_paths_that_died_are_asked_together() {
    const RESPONSE: Duration = Duration::from_secs(4);
    const CONNECT: Duration = Duration::from_millis(250);
    let Some(cluster) = blocking(RedisCluster::start) else {
        return;
    };
    let owners = blocking(|| cluster.masters_of(0..=16383));
    let masters: Vec<usize> = (0..cluster.nodes().len())
        .filter(|i| owners.contains(&Some(*i)))
        .collect();
    let cut = [masters[0], masters[1]];
    let keys: Vec<&'static str> = cut
        .iter()
        .map(|&m| {
            let k = (0..)
                .map(|i| format!("cut{i}"))
                .find(|k| owners[usize::from(slot(k))] == Some(m))
                .unwrap();
            &*Box::leak(k.into_boxed_str())
        })
        .collect();
    let relays: Vec<Relay> = cut
        .iter()
        .map(|&i| Relay::start(cluster.nodes()[i].addr()))
        .collect();
    blocking(|| {
        for (&i, relay) in cut.iter().zip(&relays) {
            let node = &cluster.nodes()[i];
            let (port, bus) = (relay.addr().port(), node.port() + 10_000);
            for (name, value) in [
                ("cluster-announce-bus-port", bus),
                ("cluster-announce-port", port),
            ] {
                let out = node.cli(&["config", "set", name, &value.to_string()]);
                assert_eq!(out.trim(), "OK", "CONFIG SET {name}: {out}");
            }
        }
        let announced: Vec<String> = relays
            .iter()
            .map(|r| format!("127.0.0.1:{}@", r.addr().port()))
            .collect();
        let start = std::time::Instant::now();
        while !cluster.nodes().iter().all(|n| {
            let nodes = n.cli(&["cluster", "nodes"]);
            announced.iter().all(|a| nodes.contains(a))
        }) {
            assert!(
                start.elapsed() < 30 * S,
                "the relays' ports were not announced"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let urls =
        cluster
            .nodes()
            .iter()
            .enumerate()
            .map(|(i, n)| match cut.iter().position(|&c| c == i) {
                Some(r) => relays[r].url(),
                None => n.url(),
            });
    let b = RedisBackend::cluster_builder(urls.collect::<Vec<_>>())
        .prefix(unique_name("paths"))
        .connect_timeout(CONNECT)
        .response_timeout(RESPONSE)
        .durability(Durability::Skip)
        .build()
        .await
        .expect("connect");
    let policy = Policy::from(TokenBucket::new(1_000_000, 1, S).unwrap());
    let decide = |key: &'static str| {
        let b = b.clone();
        async move {
            let key = Key::new(key);
            let req = Request {
                limiter: "paths",
                key: &key,
                policy: &policy,
                op: Op::Acquire(1),
            };
            matches!(tokio::time::timeout(S, b.decide(req)).await, Ok(Ok(_)))
        }
    };
    for k in &keys {
        assert!(decide(k).await, "decided through the relay");
    }
    for (&i, relay) in cut.iter().zip(&relays) {
        relay.silence();
        relay.retarget(cluster.nodes()[i].addr());
    }
    let bound = CONNECT + RESPONSE;
    let start = Instant::now();
    let mut pending = keys.clone();
    while !pending.is_empty() && start.elapsed() < 6 * bound {
        let mut left = Vec::new();
        for k in pending {
            if !decide(k).await {
                left.push(k);
            }
        }
        pending = left;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = start.elapsed();
    println!(
        "both masters decided again after {took:?} (the check's bound {bound:?}; \
         still failing: {pending:?})"
    );
    assert!(
        pending.is_empty(),
        "not decided again within {:?}",
        6 * bound
    );
    assert!(
        took < bound * 5 / 2,
        "decisions on two masters behind dead paths resumed after {took:?}: \
         the masters were asked one after the other (a bound {bound:?} each)"
    );
}

/// Cluster: a master loading its data set (a restart with a large AOF;
/// here `DEBUG RELOAD`, slowed with `key-load-delay`) answers every
/// connection `-LOADING`, which the cluster client waits on and retries:
/// the keeper's `PING` through the connection gets no answer in time, and
/// the one on a connection of its own gets that reply. The path works; a
/// new connection changes nothing, and the keeper must not rebuild. It
/// took the reply for a dead path and rebuilt every second for as long as
/// the load lasted, each time connecting to every master. The other
/// masters, asked anew beside it, are dialled once a check, and a check
/// that found a master silent there too asks none anew for 5 s (`ANEW`):
/// at most two new connections to another master in the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_master_loading_is_no_dead_path() {
    const WINDOW: Duration = Duration::from_secs(5);
    let Some(cluster) = blocking(RedisCluster::start) else {
        return;
    };
    let owners = blocking(|| cluster.masters_of(0..=16383));
    let victim = owners[0].expect("a master");
    let key = (0..)
        .map(|i| format!("loading{i}"))
        .find(|k| owners[usize::from(slot(k))] == Some(victim))
        .unwrap();
    let steady = (0..cluster.nodes().len())
        .find(|&i| i != victim && owners.contains(&Some(i)))
        .expect("another master");
    let b = build(RedisBackend::cluster_builder(cluster.urls())).await;
    let policy = Policy::from(TokenBucket::new(1_000_000, 1, S).unwrap());
    let key = Key::new(&key);
    let decide = || {
        let (b, key) = (b.clone(), key.clone());
        async move {
            let req = Request {
                limiter: "loading",
                key: &key,
                policy: &policy,
                op: Op::Acquire(1),
            };
            tokio::time::timeout(S, b.decide(req)).await
        }
    };
    decide().await.expect("in time").expect("decided");
    let node = &cluster.nodes()[victim];
    let received = |i: usize| -> u64 {
        let info = cluster.nodes()[i].cli(&["info", "stats"]);
        info.lines()
            .find_map(|l| l.trim().strip_prefix("total_connections_received:"))
            .and_then(|n| n.parse().ok())
            .expect("total_connections_received")
    };
    let (before, mut reload) = blocking(|| {
        let out = node.cli(&["debug", "populate", "100000", "filler"]);
        assert_eq!(out.trim(), "OK", "DEBUG POPULATE: {out}");
        for (name, value) in [
            ("key-load-delay", "50"),
            ("loading-process-events-interval-bytes", "1024"),
        ] {
            let out = node.cli(&["config", "set", name, value]);
            assert_eq!(out.trim(), "OK", "CONFIG SET {name}: {out}");
        }
        let before = received(steady);
        let reload = std::process::Command::new("redis-cli")
            .args(["-p", &node.port().to_string(), "debug", "reload"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-cli debug reload");
        let start = std::time::Instant::now();
        while !node.cli(&["ping"]).contains("LOADING") {
            assert!(start.elapsed() < 10 * S, "the node never said LOADING");
            std::thread::sleep(Duration::from_millis(10));
        }
        (before, reload)
    });
    let start = Instant::now();
    let mut failed = 0;
    while start.elapsed() < WINDOW {
        failed += u32::from(!matches!(decide().await, Ok(Ok(_))));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (dialled, still) = blocking(|| {
        // The connection of this `INFO` is one.
        let dialled = received(steady) - before - 1;
        let still = node.cli(&["ping"]).contains("LOADING");
        let _ = node.cli(&["config", "set", "key-load-delay", "0"]);
        (dialled, still)
    });
    println!(
        "{WINDOW:?} of -LOADING ({failed} decisions failed, still loading: {still}): \
         {dialled} new connection(s) to another master"
    );
    assert!(still, "the load ended within the window: make it longer");
    assert!(
        dialled <= 2,
        "the keeper rebuilt its connection for a master that answers -LOADING: \
         {dialled} new connection(s) to another master in {WINDOW:?}"
    );
    blocking(|| reload.wait().expect("redis-cli debug reload"));
    let start = Instant::now();
    while !matches!(decide().await, Ok(Ok(_))) {
        assert!(
            start.elapsed() < RESUME_WITHIN,
            "no decision after the load"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sentinel: a planned failover (`SENTINEL FAILOVER`) promotes a replica
/// that is not durable (`appendonly no`, set at runtime), while the old
/// master, durable, stays up (a master in its own eyes until the
/// sentinels demote it). The durability check asked right after must
/// report the promoted server as a master that is not durable. It read
/// the master through a slot's connection, still the old master's until
/// the keepers moved it, and reported those settings under the new
/// master's name: durable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_durability_check_reads_the_master_it_names() {
    let builder = tollgate_testkit::redis_server::RedisServer::builder().appendonly(true);
    let Some(ha) = blocking(|| RedisSentinel::builder().server(builder).start()) else {
        return;
    };
    let b = build(RedisBackend::builder(ha.url())).await;
    let report = b.check_durability().await.unwrap();
    assert!(report.is_durable(), "{report}");
    let (old, new) = blocking(|| {
        let old = ha.master_port().expect("a master");
        let replica = ha
            .servers()
            .iter()
            .find(|s| s.port() != old)
            .expect("a replica");
        let out = replica.cli(&["config", "set", "appendonly", "no"]);
        assert_eq!(out.trim(), "OK", "CONFIG SET appendonly no: {out}");
        // Led by a sentinel the backend does not ask first; checked as
        // soon as the one it asks first names the new master (the
        // backend's own check, every second, would then move its
        // connection there).
        let out = ha.sentinels()[1].cli(&["sentinel", "failover", ha.master_name()]);
        assert_eq!(out.trim(), "OK", "SENTINEL FAILOVER: {out}");
        let new = ha.wait_promoted(old, RESUME_WITHIN);
        let start = std::time::Instant::now();
        while new.is_some() && named_by(&ha, 0) != new && start.elapsed() < RESUME_WITHIN {
            std::thread::sleep(Duration::from_millis(5));
        }
        (old, new)
    });
    let new = new.expect("the replica was promoted");
    let report = b.check_durability().await.unwrap();
    println!("after the failover from :{old} to :{new}: {report:?}");
    let named = format!("127.0.0.1:{new}");
    let master = report.nodes.iter().find(|n| n.node == named);
    let master = master.unwrap_or_else(|| panic!("{named} not in the report: {report:?}"));
    assert_eq!(
        (master.role, &master.appendonly),
        (
            NodeRole::Master,
            &tollgate_redis::Setting::Known("no".into())
        ),
        "{report}"
    );
    assert!(!report.is_durable(), "{report}");
}

/// Cluster: a worker starts in strict durability mode while a master and
/// its replica are frozen (`SIGSTOP`, a rack that hung) long enough for
/// the cluster to mark them failed: nothing can be promoted, the other
/// masters serve their slots (`cluster-require-full-coverage no`), and
/// every server that answers is durable. The frozen master still owns
/// its slots and serves them again when it continues: its settings are
/// unknown, so strict mode must refuse the start, and the report name it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_strict_start_with_a_master_frozen() {
    let Some(cluster) = blocking(RedisCluster::start_with_replicas) else {
        return;
    };
    let (victim, _, _) = victim_of(&cluster);
    let frozen = blocking(|| {
        for n in cluster.nodes() {
            assert_eq!(n.cli(&["config", "set", "appendonly", "yes"]).trim(), "OK");
        }
        let frozen = [replica_of(&cluster, victim), victim];
        for &i in &frozen {
            cluster.pause_node(i);
        }
        // Until a node that answers marks both failed.
        let failed = |i: usize| format!("127.0.0.1:{}@", cluster.nodes()[i].port());
        let live = (0..cluster.nodes().len())
            .find(|i| !frozen.contains(i))
            .unwrap();
        let start = std::time::Instant::now();
        loop {
            let nodes = cluster.nodes()[live].cli(&["cluster", "nodes"]);
            let marked = |i: usize| {
                nodes
                    .lines()
                    .any(|l| l.contains(&failed(i)) && l.contains(",fail"))
            };
            if frozen.iter().all(|&i| marked(i)) {
                break;
            }
            assert!(
                start.elapsed() < RESUME_WITHIN,
                "not marked failed: {nodes}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        frozen
    });
    let built = RedisBackend::cluster_builder(cluster.urls())
        .prefix(unique_name("strict"))
        .connect_timeout(Duration::from_millis(250))
        .durability(Durability::Strict)
        .build()
        .await;
    let master = format!("127.0.0.1:{}", cluster.nodes()[victim].port());
    for &i in &frozen {
        cluster.resume_node(i);
    }
    match built {
        Ok(b) => {
            let report = b.check_durability().await;
            panic!("strict mode started with the master {master} frozen; report {report:?}")
        }
        Err(RedisError::NotDurable(report)) => {
            println!("refused: {report}");
            let named = report.nodes.iter().find(|n| n.node == master);
            assert!(
                named.is_some_and(|n| matches!(n.appendonly, tollgate_redis::Setting::Unknown(_))),
                "{report:?}"
            );
        }
        Err(e) => panic!("build() failed otherwise: {e}"),
    }
}

/// The replica serving node `master` (its index), as `INFO replication`
/// says.
fn replica_of(cluster: &RedisCluster, master: usize) -> usize {
    let port = format!("master_port:{}", cluster.nodes()[master].port());
    let found = cluster.nodes().iter().position(|n| {
        let info = n.cli(&["info", "replication"]);
        info.contains("role:slave") && info.lines().any(|l| l.trim() == port)
    });
    found.expect("a replica of the master")
}

/// A Sentinel setup with TLS only (no plain port anywhere,
/// `tls-replication yes`, one throwaway CA whose certificates name
/// 127.0.0.1): `rediss+sentinel://` with that CA reaches the master over
/// TLS, by URL, by `sentinel_tls_builder` and from a configuration's
/// `tls_ca_file`; the durability check reaches the replica over TLS too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_tls_decisions_with_the_private_ca() {
    let Some(ha) = blocking(|| RedisSentinel::builder().tls(true).start()) else {
        return;
    };
    let url = ha.url();
    assert!(url.starts_with("rediss+sentinel://"), "{url}");
    let ca = ha.ca_cert_pem().unwrap();
    let b = build_patiently(RedisBackend::builder(&url).tls_root_cert(ca.clone())).await;
    let report = b.check_durability().await.unwrap();
    let roles: Vec<NodeRole> = report.nodes.iter().map(|n| n.role).collect();
    assert_eq!(roles, [NodeRole::Master, NodeRole::Replica], "{report:?}");
    let master = blocking(|| ha.master_port()).unwrap();
    assert_eq!(report.nodes[0].node, format!("127.0.0.1:{master}"));
    let l = patient(
        "tls",
        TokenBucket::new(1, 1, LEDGER_DRIP).unwrap(),
        b.clone(),
    );
    let k = Key::new("k");
    assert!(l.try_acquire(&k, 1).await.unwrap().is_allowed());
    assert!(l.try_acquire(&k, 1).await.unwrap().is_denied());

    let hosts: Vec<String> = ha
        .sentinels()
        .iter()
        .map(|s| s.addr().to_string())
        .collect();
    let b = build_patiently(
        RedisBackend::sentinel_tls_builder(&hosts, ha.master_name()).tls_root_cert(ca),
    )
    .await;
    assert!(decide(&b).await.unwrap().is_allowed());

    let toml = format!(
        "[redis]\nurl = '{url}'\ntls_ca_file = '{}'\ndurability = 'skip'\n\
         connect_timeout = '10s'\nresponse_timeout = '10s'",
        ha.ca_cert_file().unwrap().display()
    );
    let config = tollgate_limiter::Config::builder()
        .toml_str(&toml)
        .load()
        .unwrap();
    let b = RedisBackend::from_config(&config).await.expect("connect");
    assert!(decide(&b).await.unwrap().is_allowed());
}

/// TLS Sentinel: the master is killed; the sentinels promote the replica
/// (over TLS); decisions resume on it, over TLS, with the same CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_tls_failover() {
    let Some(mut ha) = blocking(|| RedisSentinel::builder().tls(true).start()) else {
        return;
    };
    let ca = ha.ca_cert_pem().unwrap();
    let b = build(RedisBackend::builder(ha.url()).tls_root_cert(ca)).await;
    assert!(decide(&b).await.unwrap().is_allowed());

    let killed_at = Instant::now();
    let old = blocking(|| ha.kill_master());
    let new = blocking(|| ha.wait_promoted(old, RESUME_WITHIN));
    let new = new.expect("the sentinels promoted the replica");
    let d = loop {
        match decide(&b).await {
            Ok(d) => break d,
            Err(e) => assert!(
                killed_at.elapsed() < RESUME_WITHIN,
                "decisions did not resume on :{new}: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    println!(
        "tls: master :{old} killed; decisions resumed on :{new} after {:?}",
        killed_at.elapsed()
    );
    assert!(d.is_allowed(), "{d:?}");
    let report = b.check_durability().await.unwrap();
    assert_eq!(report.nodes[0].node, format!("127.0.0.1:{new}"));
    assert_eq!(report.nodes[0].role, NodeRole::Master);
}

/// Without the topology's CA the sentinels' certificates are not trusted
/// (the system and Mozilla roots do not hold it): the build fails, and
/// nothing falls back to plain text (the servers have no plain port).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_tls_untrusted_ca_is_refused() {
    let Some(ha) = blocking(|| RedisSentinel::builder().tls(true).start()) else {
        return;
    };
    let started = Instant::now();
    let err = RedisBackend::builder(ha.url())
        .durability(Durability::Skip)
        .build()
        .await
        .expect_err("an unknown CA must be refused");
    let shown = format!("{err}: {:?}", std::error::Error::source(&err));
    println!("refused after {:?}: {shown}", started.elapsed());
    assert!(shown.to_lowercase().contains("certificate"), "{shown}");
}

/// Sentinel: the master is killed while this worker makes no call, the
/// sentinels promote the replica, and the killed server restarts on its
/// port, a master in its own eyes (its configuration names no master)
/// until the sentinels demote it. The worker's connection (a connection
/// manager, which reconnects by itself to the address it had) must not
/// make its next decisions on that stale master: every one is written to
/// the new master, whose count says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_idle_worker_after_the_old_master_restarts() {
    let Some(mut ha) = blocking(RedisSentinel::start) else {
        return;
    };
    // Not `stays`: in about half the runs on this machine, a second or so
    // after every sentinel named the promoted master, the first answering
    // sentinel named the restarted one again, both servers saying
    // `master` (a split brain of the test's sentinels, not of the
    // worker): half seconds of (22, 22), (23, 23), then (23, 0), (16, 0)
    // counted by the master named at their end. The defect this test was
    // written for (none counted until the old master's demotion) is
    // still caught.
    idle_worker_after_a_failover(&mut ha, "restarted", false, |ha| {
        let old = ha.kill_master();
        let new = ha.wait_promoted(old, RESUME_WITHIN);
        let s = ha.servers_mut().iter_mut().find(|s| s.port() == old);
        let s = s.expect("ours");
        s.restart();
        (old, new)
    })
    .await;
}

/// Sentinel: the master freezes (`SIGSTOP`) while this worker makes no
/// call, the sentinels promote the replica, and, the worker still idle 2 s
/// later, the frozen process continues (`SIGCONT`), a master in its own
/// eyes until the sentinels demote it (8 s). No call of the worker ever
/// failed on its connection to it: the keeper's own question to the
/// sentinels (every second) must have replaced it, and the worker's next
/// decisions must be written to the new master, whose count says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_idle_worker_after_the_old_master_continues() {
    let Some(mut ha) = blocking(RedisSentinel::start) else {
        return;
    };
    idle_worker_after_a_failover(&mut ha, "continued", true, |ha| {
        let old = ha.pause_master();
        let new = ha.wait_promoted(old, RESUME_WITHIN);
        std::thread::sleep(2 * S);
        ha.server(old).expect("ours").resume();
        (old, new)
    })
    .await;
}

/// A worker decides once, then stays idle while `fail_over` fails the
/// master over and brings the old one back (its port, the promoted one's
/// if any). Once every sentinel names the promoted master, the worker
/// decides in half seconds, each on a key of its own: within `CONVERGE`
/// one half second's decisions must all be counted by the promoted master,
/// and (`stays`) every later one's too (no way back to the old one). Before the
/// fixes none was counted until the sentinels demoted the old master, 8 s
/// after it came back. How soon is not asserted: a keeper that hears the
/// sentinels every second took from under one to four seconds in CI runs.
async fn idle_worker_after_a_failover(
    ha: &mut RedisSentinel,
    back: &str,
    stays: bool,
    fail_over: impl FnOnce(&mut RedisSentinel) -> (u16, Option<u16>),
) {
    const CONVERGE: Duration = Duration::from_secs(5);
    let prefix = unique_name("idle");
    let b = build_with_prefix(RedisBackend::builder(ha.url()), &prefix).await;
    // One token a minute: a key lives as long as the test.
    let policy = Policy::from(TokenBucket::new(1_000, 1, 60 * S).unwrap());
    fn req<'a>(key: &'a Key, policy: &'a Policy, op: Op) -> Request<'a> {
        Request {
            limiter: "idle",
            key,
            policy,
            op,
        }
    }
    b.decide(req(&Key::new("before"), &policy, Op::Acquire(1)))
        .await
        .expect("decided");
    let (old, new) = blocking(|| fail_over(ha));
    let new = new.expect("the sentinels promoted the replica");
    let agreed = blocking(|| ha.wait_sentinels_agree(new, RESUME_WITHIN));
    assert!(agreed, "the sentinels did not all come to name :{new}");
    let stale = blocking(|| {
        let s = ha.server(old).expect("ours");
        s.cli(&["role"]).starts_with("master")
    });
    println!("the old master :{old} {back}, a master in its own eyes: {stale}");
    // (decided, counted by the master the sentinels name), per half
    // second. Named at the end of each: on a loaded machine they have
    // failed back over to the restarted server in a run, and a worker
    // that followed them there was right.
    let mut halves: Vec<(u64, u64)> = Vec::new();
    let mut clean = None;
    let start = Instant::now();
    while start.elapsed() < CONVERGE && clean.is_none_or(|c| halves.len() < c + 4) {
        let key = Key::new(format!("after-{}", halves.len()));
        let (half, mut decided) = (Instant::now(), 0u64);
        while half.elapsed() < S / 2 {
            if b.decide(req(&key, &policy, Op::Acquire(1))).await.is_ok() {
                decided += 1;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let named = blocking(|| ha.master_port()).expect("a sentinel answers");
        let master = build_with_prefix(
            RedisBackend::builder(format!("redis://127.0.0.1:{named}")),
            &prefix,
        )
        .await;
        // A server the sentinels are demoting refuses the look: not clean.
        let counted = match master.decide(req(&key, &policy, Op::Peek(1))).await {
            Ok(peek) => 1_000 - peek.remaining(),
            Err(_) => 0,
        };
        if decided > 0 && counted == decided && clean.is_none() {
            clean = Some(halves.len());
        }
        halves.push((decided, counted));
    }
    println!("(decided, counted by the named master) per half second: {halves:?}");
    let first = clean.unwrap_or_else(|| {
        panic!(
            "no half second's decisions all reached the master the sentinels name within \
             {CONVERGE:?} after the old master :{old} {back}: {halves:?}"
        )
    });
    if stays {
        assert!(
            halves[first..].iter().all(|&(d, c)| d > 0 && c == d),
            "decisions left the master the sentinels name: {halves:?}"
        );
    }
}

/// Sentinel: the sentinels go silent (relays that keep every connection
/// and forward nothing) while the master stays healthy, and the master
/// closes the backend's connection (`CLIENT KILL`, as an idle `timeout`, a
/// proxy's reset or `maxclients` would). With no sentinel to ask where the
/// master is, the connection's own address, still a master, is kept:
/// decisions resume on it, and do not wait for the sentinels to return.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_silent_sentinels_keep_a_closed_connection_to_a_master() {
    let Some(ha) = blocking(RedisSentinel::start) else {
        return;
    };
    let (relays, b) = behind_relays(&ha, "silent-sentinels");
    let b = b.build().await.expect("connect");
    decide(&b).await.expect("decided on the master");
    for r in &relays {
        r.silence();
    }
    let master = blocking(|| ha.master_port()).expect("a master");
    let killed = blocking(|| {
        let s = ha.server(master).expect("ours");
        s.cli(&["client", "kill", "type", "normal", "skipme", "yes"])
    });
    println!("closed {} connection(s) on :{master}", killed.trim());
    // A few lookups of every sentinel: "did not wait for them", not a speed.
    let bound = 6 * lookup_bound(2) + RETRY;
    let start = Instant::now();
    let mut last = None;
    while start.elapsed() < bound {
        match decide(&b).await {
            Ok(d) => {
                println!("resumed {:?} after the connection closed", start.elapsed());
                assert!(d.is_allowed(), "{d:?}");
                return;
            }
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "no decision {bound:?} after the master closed the connection, the master healthy and \
         the sentinels silent: {last:?}"
    );
}

/// Sentinel: one sentinel names a server that is no master (a replica: a
/// stale or misconfigured sentinel, here one told to monitor the replica
/// under the master's name), and the sentinel that named the real master
/// goes silent. The keepers' master check hears only the wrong sentinel;
/// the server it names says it is a replica, so the connection to the
/// healthy master is kept: every decision goes on (a lookup, which checks
/// the `ROLE` of what a sentinel names, would not have followed it either).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_naming_a_replica_does_not_take_the_master_away() {
    let Some(ha) = blocking(RedisSentinel::start) else {
        return;
    };
    let master = blocking(|| ha.master_port()).expect("a master");
    let replica = ha
        .servers()
        .iter()
        .map(tollgate_testkit::redis_server::RedisServer::port)
        .find(|&p| p != master)
        .expect("a replica");
    let (wrong, name) = (&ha.sentinels()[0], ha.master_name());
    let replica_port = replica.to_string();
    blocking(|| {
        assert_eq!(wrong.cli(&["sentinel", "remove", name]).trim(), "OK");
        let monitor = ["sentinel", "monitor", name, "127.0.0.1", &replica_port, "2"];
        assert_eq!(wrong.cli(&monitor).trim(), "OK");
    });
    assert_eq!(blocking(|| named_by(&ha, 0)), Some(replica));
    let relay = Relay::start(ha.sentinels()[1].addr());
    let url = format!("redis+sentinel://{},{}/{name}", relay.addr(), wrong.addr());
    let b = RedisBackend::builder(url)
        .prefix(unique_name("wrong-sentinel"))
        .connect_timeout(CONNECT)
        .response_timeout(RESPONSE)
        .build()
        .await
        .expect("connect");
    decide(&b).await.expect("decided on the master");
    relay.silence();
    // Several master checks, each of which hears the wrong sentinel.
    let start = Instant::now();
    let mut decided = 0u64;
    while start.elapsed() < 3 * S {
        if let Err(e) = decide(&b).await {
            panic!(
                "a decision failed {:?} after the right sentinel went silent ({decided} \
                 before): {e}",
                start.elapsed()
            );
        }
        decided += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("{decided} decided in 3 s; the wrong sentinel names :{replica}");
    // The right sentinel answers again: the checks ask it first, not the
    // wrong one (whose every answer dials the replica to hear its role).
    relay.resume();
    let server = ha.server(replica).expect("ours");
    let dials = || -> u64 {
        let stats = server.cli(&["info", "stats"]);
        let line = stats
            .lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"));
        line.expect("a count").trim().parse().expect("a number")
    };
    tokio::time::sleep(S).await;
    let before = blocking(dials);
    tokio::time::sleep(3 * S).await;
    // This count's own connection, and a check that still asked the wrong
    // sentinel first.
    let dialled = blocking(dials) - before;
    assert!(
        dialled <= 2,
        "the checks dialled the replica {dialled} times in 3 s after the right sentinel answered \
         again"
    );
    decide(&b).await.expect("decided on the master");
}

/// The `calls=` of `stat` in `server`'s `INFO commandstats` (0 before the
/// first call).
fn calls(server: &tollgate_testkit::redis_server::RedisServer, stat: &str) -> u64 {
    let stats = server.cli(&["info", "commandstats"]);
    let line = stats
        .lines()
        .find_map(|l| l.strip_prefix(stat)?.strip_prefix(":calls="));
    line.map_or(0, |l| {
        let n = l.split(',').next().expect("a count");
        n.parse().expect("a number")
    })
}

/// Sentinel: the master check of an idle pool (`MASTER_CHECK`: every
/// second) is one per backend, not one per slot (the answer is the same
/// for every slot), and reuses one connection to each sentinel rather than
/// dialling it for every question: four idle slots for 4 s ask each
/// sentinel about four times (counted by relays in front of them: a
/// sentinel keeps no `INFO commandstats`), on the connection the start's
/// lookups opened (a sentinel that every worker dials each second spends
/// itself accepting and closing them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_master_check_is_one_per_backend() {
    let Some(ha) = blocking(RedisSentinel::start) else {
        return;
    };
    let (relays, b) = behind_relays(&ha, "one-check");
    let b = b
        .pool_size(4)
        .durability(Durability::Skip)
        .build()
        .await
        .expect("connect");
    decide(&b).await.expect("decided on the master");
    let accepted = || relays.iter().map(Relay::accepted).sum::<usize>();
    let before = accepted();
    for r in &relays {
        // `SENTINEL MASTER <name>` on the wire (not `MASTERS`).
        r.count(b"$6\r\nMASTER\r\n");
    }
    tokio::time::sleep(4 * S).await;
    let asked = relays.iter().map(Relay::counted).collect::<Vec<_>>();
    let dialled = accepted() - before;
    println!(
        "the sentinels were asked for the master {asked:?} times, and dialled {dialled} times, \
         in 4 s of four idle slots"
    );
    for asked in asked {
        // One a second, and one more for a check at either edge.
        assert!(
            asked <= 5,
            "{asked} master checks in 4 s: one per slot, not one per backend"
        );
        assert!(asked >= 2, "{asked} master checks in 4 s: none any more?");
    }
    // On a loaded machine, a question out of time drops its connection,
    // and the next dials the sentinel again.
    assert!(
        dialled <= 2,
        "the master checks dialled the sentinels {dialled} times"
    );
    decide(&b).await.expect("decided on the master");
}

/// Sentinel: the sentinels go silent (relays that keep every connection
/// and forward nothing), so the periodic master check waits on each for
/// its bound; then a call on every slot is given up. Each slot's keeper
/// checks its connection (`ROLE` on the master) at once, not after the
/// stuck check: within one sentinel's bound, every slot's `ROLE` has
/// reached the master. (Before, each keeper ran the periodic check itself,
/// and they queued on the sentinels' lookup lock behind the one waiting on
/// silence: a keeper rung there checked seconds later.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_suspicion_is_not_held_up_by_a_stuck_master_check() {
    // One sentinel's bound, 2 x (connect + response): long beside a `ROLE`
    // on loopback, so "within it" is an order of events, not a speed.
    const CONNECT: Duration = Duration::from_millis(250);
    const RESPONSE: Duration = Duration::from_millis(250);
    let per_sentinel = (CONNECT + RESPONSE) * 2;
    let Some(ha) = blocking(RedisSentinel::start) else {
        return;
    };
    let (relays, b) = behind_relays(&ha, "stuck-check");
    let b = b
        .connect_timeout(CONNECT)
        .response_timeout(RESPONSE)
        .pool_size(4)
        // The limiter's overrides read once: a call's first poll sends its
        // script, with no read of them first.
        .override_cache_ttl(60 * S)
        .durability(Durability::Skip)
        .build()
        .await
        .expect("connect");
    decide(&b).await.expect("decided on the master");
    for r in &relays {
        r.silence();
    }
    // Several checks' worth of silence: each asks both sentinels.
    tokio::time::sleep(3 * per_sentinel).await;
    let master = blocking(|| ha.master_port()).expect("a master");
    let server = ha.server(master).expect("ours");
    let before = blocking(|| calls(server, "cmdstat_role"));
    // Round robin: a call given up on each slot before its reply (one
    // poll sends it; on a loaded machine its reply may be in by then, and
    // that slot is tried again four calls later).
    let mut given_up = [false; 4];
    for i in 0..40 {
        let mut call = std::pin::pin!(decide(&b));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        given_up[i % 4] |= call.as_mut().poll(&mut cx).is_pending();
        if given_up.iter().all(|&g| g) {
            break;
        }
    }
    assert_eq!(given_up, [true; 4], "every call was answered at once");
    let within = per_sentinel / 2;
    tokio::time::sleep(within).await;
    let checked = blocking(|| calls(server, "cmdstat_role")) - before;
    println!("{checked} slot(s) of 4 checked their connection within {within:?}");
    assert!(
        checked >= 4,
        "{checked} of 4 keepers checked their connection within {within:?}, the sentinels silent"
    );
    decide(&b).await.expect("decided on the master");
}
