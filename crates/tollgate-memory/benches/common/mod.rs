//! The memory path's cases against governor, and the bench threads that
//! run them; shared by `benches/memory.rs` (criterion) and
//! `examples/paired.rs` (interleaved pairs). A directory, so that cargo does
//! not take it for a bench of its own.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::{Arc, Barrier, mpsc};
use std::thread::Scope;
use std::time::{Duration, Instant};

use governor::clock::{DefaultClock, QuantaInstant};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DashMapStateStore;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use hashbrown::DefaultHashBuilder;
use tollgate_limiter::{Key, Limiter, Policy, TokenBucket};
use tollgate_memory::MemoryBackend;

/// The admitting workload's burst. A bucket of 1000 (refilled at the most
/// a policy allows, a token a microsecond) drained within a millisecond on
/// one key, and the "admitting" cases measured mostly refusals on both
/// sides; four billion tokens outlast any run (each decision adds at most a
/// microsecond of debt).
pub(crate) const ADMIT_BURST: u32 = 4_000_000_000;

/// An admitting or a refusing workload, for both libraries.
#[derive(Clone, Copy)]
pub(crate) enum Workload {
    Admitting,
    Refusing,
}

impl Workload {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Admitting => "admit",
            Self::Refusing => "refuse",
        }
    }

    fn policy(self) -> Policy {
        match self {
            Self::Admitting => TokenBucket::per_second(ADMIT_BURST.into(), 1_000_000)
                .unwrap()
                .into(),
            Self::Refusing => TokenBucket::new(10, 1, Duration::from_secs(3_600))
                .unwrap()
                .into(),
        }
    }

    fn quota(self) -> Quota {
        match self {
            Self::Admitting => Quota::per_second(NonZeroU32::new(1_000_000).unwrap())
                .allow_burst(NonZeroU32::new(ADMIT_BURST).unwrap()),
            Self::Refusing => Quota::with_period(Duration::from_secs(3_600))
                .unwrap()
                .allow_burst(NonZeroU32::new(10).unwrap()),
        }
    }

    fn admits(self) -> bool {
        matches!(self, Self::Admitting)
    }
}

/// governor's keyed limiter (DashMap) over the hasher tollgate's memory
/// backend uses, hashbrown's default (foldhash), instead of governor's own
/// default (std's SipHash).
type FoldhashGovernor = RateLimiter<
    String,
    DashMapStateStore<String, DefaultHashBuilder>,
    DefaultClock,
    NoOpMiddleware<QuantaInstant>,
>;

/// governor's keyed limiter as its docs build it (`RateLimiter::keyed`,
/// std's SipHash), or, with `GOVERNOR_HASHER=foldhash` in the environment,
/// over the hasher tollgate's memory backend uses: the hasher is a large
/// part of a keyed check on both sides, so this tells the hasher's share
/// of a ratio from the limiter's.
pub(crate) enum Governor {
    Default(DefaultKeyedRateLimiter<String>),
    Foldhash(FoldhashGovernor),
}

impl Governor {
    fn new(quota: Quota) -> Self {
        match std::env::var("GOVERNOR_HASHER").as_deref() {
            Ok("foldhash") => Self::Foldhash(RateLimiter::dashmap_with_clock_and_hasher(
                quota,
                DefaultClock::default(),
                DefaultHashBuilder::default(),
            )),
            _ => Self::Default(RateLimiter::keyed(quota)),
        }
    }

    /// The hasher of the limiter [`Governor::new`] builds here, for a
    /// report's header.
    pub(crate) fn hasher() -> &'static str {
        match std::env::var("GOVERNOR_HASHER").as_deref() {
            Ok("foldhash") => "foldhash (hashbrown's default, as tollgate's memory backend)",
            _ => "std's SipHash (governor's default)",
        }
    }

    // governor's keys here are `String`s, and its `check_key` takes `&K`.
    #[allow(clippy::ptr_arg)]
    fn check_key(&self, key: &String) -> bool {
        match self {
            Self::Default(g) => g.check_key(key).is_ok(),
            Self::Foldhash(g) => g.check_key(key).is_ok(),
        }
    }
}

/// `n` checks by `check` over `names`, from after `i`: how long they took.
/// Generic, so that each governor's loop is its own, with no dispatch in it.
fn time_checks(
    names: &[String],
    mut i: usize,
    n: u64,
    check: impl Fn(&String) -> bool,
) -> Duration {
    let keys = names.len();
    let begin = Instant::now();
    for _ in 0..n {
        i = (i + 1) % keys;
        black_box(check(&names[i]));
    }
    begin.elapsed()
}

/// [`Case::run`]'s library: `Limiter::check` (default settings) over
/// `MemoryBackend`.
pub(crate) const TOLLGATE: usize = 0;
/// [`Case::run`]'s library: governor's keyed limiter.
pub(crate) const GOVERNOR: usize = 1;

/// One workload on a key set, for both libraries: a limiter and a
/// governor, each past the first capacity of every key, so that the
/// workload is what it says on both sides.
pub(crate) struct Case {
    workload: Workload,
    names: Vec<Key>,
    gnames: Vec<String>,
    limiter: Limiter<MemoryBackend>,
    governor: Governor,
}

impl Case {
    pub(crate) fn new(workload: Workload, keys: usize) -> Self {
        let names: Vec<Key> = (0..keys).map(|i| Key::new(format!("user-{i}"))).collect();
        let gnames: Vec<String> = (0..keys).map(|i| format!("user-{i}")).collect();
        let case = Self {
            limiter: Limiter::new("bench", workload.policy(), MemoryBackend::new()),
            governor: Governor::new(workload.quota()),
            workload,
            names,
            gnames,
        };
        runtime().block_on(async {
            for name in case.names.iter().cycle().take(keys * 11) {
                let _ = case.limiter.check(name).await;
            }
        });
        for name in case.gnames.iter().cycle().take(keys * 11) {
            case.governor.check_key(name);
        }
        case.assert_still();
        case
    }

    /// That both libraries decide as the workload says (checked before
    /// and after the runs: the cases measured what their names say).
    pub(crate) fn assert_still(&self) {
        let expect = self.workload.admits();
        let tollgate = runtime().block_on(self.limiter.check(&self.names[0]));
        assert_eq!(
            tollgate.is_allowed(),
            expect,
            "tollgate {}",
            self.workload.name()
        );
        let governor = self.governor.check_key(&self.gnames[0]);
        assert_eq!(governor, expect, "governor {}", self.workload.name());
    }

    /// `n` decisions of `lib` by thread `t` of `threads`, each thread from
    /// its own place in the key set, as a user calls it (the limiter on a
    /// runtime, `.await`ed): how long they took.
    pub(crate) fn run(
        &self,
        t: usize,
        threads: usize,
        lib: usize,
        n: u64,
        rt: &tokio::runtime::Runtime,
    ) -> Duration {
        let keys = self.names.len();
        let mut i = t * keys / threads;
        if lib == TOLLGATE {
            rt.block_on(async {
                let begin = Instant::now();
                for _ in 0..n {
                    i = (i + 1) % keys;
                    black_box(self.limiter.check(&self.names[i]).await.is_allowed());
                }
                begin.elapsed()
            })
        } else {
            match &self.governor {
                Governor::Default(g) => time_checks(&self.gnames, i, n, |k| g.check_key(k).is_ok()),
                Governor::Foldhash(g) => {
                    time_checks(&self.gnames, i, n, |k| g.check_key(k).is_ok())
                }
            }
        }
    }
}

/// `threads` bench threads that live through all the runs of one case,
/// each with its own runtime: [`run`](Self::run) has each make its share
/// of the decisions, started together, and answers the slowest thread's
/// time, the aggregate throughput.
///
/// Threads spawned afresh for every criterion sample started wherever the
/// scheduler put them, often beside each other on one core, or on a core
/// whose cache held none of the keys. So each is kept, and pinned to a core
/// of its own (on Linux: the `t`-th CPU this process may use), as a
/// server's busy workers spread over the cores with their keys in their
/// caches.
pub(crate) struct Workers {
    jobs: Vec<mpsc::Sender<(usize, u64)>>,
    done: mpsc::Receiver<Duration>,
}

impl Workers {
    /// Spawns the threads in `s`; `work(thread, which, n, runtime)` makes
    /// `n` decisions of the path `which` (an index the caller chooses) and
    /// answers how long they took.
    pub(crate) fn spawn<'scope, W>(
        s: &'scope Scope<'scope, '_>,
        threads: usize,
        work: &'scope W,
    ) -> Self
    where
        W: Fn(usize, usize, u64, &tokio::runtime::Runtime) -> Duration + Sync,
    {
        let (done_tx, done) = mpsc::channel();
        let barrier = Arc::new(Barrier::new(threads));
        let jobs = (0..threads)
            .map(|t| {
                let (tx, rx) = mpsc::channel::<(usize, u64)>();
                let (done_tx, barrier) = (done_tx.clone(), Arc::clone(&barrier));
                s.spawn(move || {
                    pin_to_cpu(t);
                    let rt = runtime();
                    for (which, n) in rx {
                        barrier.wait();
                        let _ = done_tx.send(work(t, which, n, &rt));
                    }
                });
                tx
            })
            .collect();
        Self { jobs, done }
    }

    /// `iters` decisions of path `which`, split over the threads: the
    /// slowest thread's time.
    pub(crate) fn run(&self, which: usize, iters: u64) -> Duration {
        let per_thread = iters.div_ceil(self.jobs.len() as u64);
        for job in &self.jobs {
            job.send((which, per_thread)).expect("bench thread");
        }
        (0..self.jobs.len())
            .map(|_| self.done.recv().expect("bench thread"))
            .max()
            .unwrap_or_default()
    }
}

/// A runtime per bench thread, as a user's `.await` runs on one (the
/// limiter's timeout needs its timer).
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

/// Pins the calling thread to the `t`-th CPU it may run on (wrapping
/// around); where that is refused, it runs unpinned.
#[cfg(target_os = "linux")]
fn pin_to_cpu(t: usize) {
    use rustix::thread::{CpuSet, sched_getaffinity, sched_setaffinity};
    let Ok(allowed) = sched_getaffinity(None) else {
        return;
    };
    let cpus: Vec<usize> = (0..CpuSet::MAX_CPU)
        .filter(|&c| allowed.is_set(c))
        .collect();
    if let Some(&cpu) = cpus.get(t % cpus.len().max(1)) {
        let mut one = CpuSet::new();
        one.set(cpu);
        let _ = sched_setaffinity(None, &one);
    }
}

#[cfg(not(target_os = "linux"))]
fn pin_to_cpu(_: usize) {}

/// What [`measure_pairs`] found: each library's median time per decision,
/// and the median and quartiles of the pairs' ratios (governor / tollgate:
/// above 1.0 tollgate is ahead).
pub(crate) struct Pairs {
    pub(crate) tollgate_ns: f64,
    pub(crate) governor_ns: f64,
    pub(crate) ratio: f64,
    pub(crate) ratio_quartiles: (f64, f64),
}

/// One case measured as `pairs` pairs of runs of `chunk` decisions,
/// tollgate then governor and governor then tollgate in turn, on the same
/// pinned threads: a pair's two runs see the same machine, where separate
/// runs of a shared VM do not (see `examples/paired.rs`).
pub(crate) fn measure_pairs(
    workload: Workload,
    keys: usize,
    threads: usize,
    pairs: usize,
    chunk: u64,
) -> Pairs {
    let case = Case::new(workload, keys);
    let work = |t, lib, n, rt: &_| case.run(t, threads, lib, n, rt);
    let per = |d: Duration| d.as_nanos() as f64 / chunk as f64;
    let (mut ts, mut gs, mut ratios) = (vec![], vec![], vec![]);
    std::thread::scope(|s| {
        let workers = Workers::spawn(s, threads, &work);
        // Warm-up: threads settled, keys in their caches.
        workers.run(TOLLGATE, chunk);
        workers.run(GOVERNOR, chunk);
        for p in 0..pairs.max(1) {
            let (t, g) = if p % 2 == 0 {
                let t = workers.run(TOLLGATE, chunk);
                (t, workers.run(GOVERNOR, chunk))
            } else {
                let g = workers.run(GOVERNOR, chunk);
                (workers.run(TOLLGATE, chunk), g)
            };
            ts.push(per(t));
            gs.push(per(g));
            ratios.push(per(g) / per(t));
        }
    });
    case.assert_still();
    for v in [&mut ts, &mut gs, &mut ratios] {
        v.sort_by(f64::total_cmp);
    }
    Pairs {
        tollgate_ns: quantile(&ts, 0.5),
        governor_ns: quantile(&gs, 0.5),
        ratio: quantile(&ratios, 0.5),
        ratio_quartiles: (quantile(&ratios, 0.25), quantile(&ratios, 0.75)),
    }
}

/// The `q` quantile of sorted `v` (nearest rank).
fn quantile(v: &[f64], q: f64) -> f64 {
    v[((v.len() - 1) as f64 * q).round() as usize]
}
