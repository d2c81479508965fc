//! The memory backend against the `governor` crate, in the same run.
//!
//! Group `limiter`: the path users call, `Limiter::check(&key).await` over
//! `MemoryBackend` with the default settings, next to governor's keyed
//! limiter (`RateLimiter::keyed(..).check_key`), for 1 key and 10k keys,
//! an admitting workload (a bucket of four billion tokens refilled at a
//! million a second: no run drains it, so every decision admits and writes
//! state, even on one key at tens of millions of decisions a second)
//! and a refusing one (10 tokens, one back an hour: after the first ten
//! every decision is a refusal), on 1 and 2 threads (each thread does half
//! the iterations, so a reported time is the inverse of the aggregate
//! throughput).
//!
//! Group `decide`: the backend's `decide` alone (no `Limiter`), admitting.
//!
//! Both sides decide a token bucket (governor's GCRA is the same
//! algorithm). Run with `cargo bench -p tollgate-memory --bench memory`
//! (measurement time 2 s per case by default: about two minutes);
//! docs/benchmarks.md reports the ratios.

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::pin;
use std::sync::Barrier;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use governor::{Quota, RateLimiter};
use tollgate_limiter::{Backend, Key, Limiter, Op, Policy, Request, TokenBucket};
use tollgate_memory::MemoryBackend;

/// Polls a future that is ready at once (the memory backend's always is).
fn ready<F: Future>(f: F) -> F::Output {
    let mut cx = Context::from_waker(Waker::noop());
    match pin!(f).poll(&mut cx) {
        Poll::Ready(v) => v,
        Poll::Pending => unreachable!("the memory backend decides at once"),
    }
}

/// Runs `iters` decisions split over `threads` threads, started together;
/// `work(thread, n)` makes `n` decisions and returns how long they took.
/// The slowest thread's time is the run's: the aggregate throughput.
fn split<W>(threads: usize, iters: u64, work: W) -> Duration
where
    W: Fn(usize, u64) -> Duration + Sync,
{
    let per_thread = iters.div_ceil(threads as u64);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let work = &work;
                s.spawn(move || work(t, per_thread))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread"))
            .max()
            .unwrap_or_default()
    })
}

/// The admitting workload's burst. A bucket of 1000 (refilled at the most
/// a policy allows, a token a microsecond) drained within a millisecond on
/// one key, and the "admitting" cases measured mostly refusals on both
/// sides; four billion tokens outlast any run (each decision adds at most a
/// microsecond of debt).
const ADMIT_BURST: u32 = 4_000_000_000;

/// An admitting or a refusing workload, for both libraries.
#[derive(Clone, Copy)]
enum Workload {
    Admitting,
    Refusing,
}

impl Workload {
    fn name(self) -> &'static str {
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
}

/// `Limiter::check` (default settings) against governor's keyed limiter.
fn limiter_vs_governor(c: &mut Criterion) {
    let mut group = c.benchmark_group("limiter");
    for workload in [Workload::Admitting, Workload::Refusing] {
        for keys in [1usize, 10_000] {
            let names: Vec<Key> = (0..keys).map(|i| Key::new(format!("user-{i}"))).collect();
            let gnames: Vec<String> = (0..keys).map(|i| format!("user-{i}")).collect();
            let limiter = Limiter::new("bench", workload.policy(), MemoryBackend::new());
            let governor = RateLimiter::keyed(workload.quota());
            // Past the first capacity of every key, the workload is what
            // it says on both sides.
            let rt = runtime();
            rt.block_on(async {
                for name in names.iter().cycle().take(keys * 11) {
                    let _ = limiter.check(name).await;
                }
                let expect = matches!(workload, Workload::Admitting);
                assert_eq!(limiter.check(&names[0]).await.is_allowed(), expect);
            });
            for name in gnames.iter().cycle().take(keys * 11) {
                let _ = governor.check_key(name);
            }
            assert_eq!(
                governor.check_key(&gnames[0]).is_ok(),
                matches!(workload, Workload::Admitting)
            );
            for threads in [1usize, 2] {
                let id =
                    |lib: &str| format!("{lib}/{}/{keys}-keys/{threads}-threads", workload.name());
                // Each thread starts at its own place in the key set.
                let start = |t: usize| t * keys / threads;
                group.bench_function(id("tollgate-limiter"), |b| {
                    b.iter_custom(|iters| {
                        let barrier = Barrier::new(threads);
                        split(threads, iters, |t, n| {
                            let rt = runtime();
                            barrier.wait();
                            rt.block_on(async {
                                let mut i = start(t);
                                let begin = Instant::now();
                                for _ in 0..n {
                                    i = (i + 1) % keys;
                                    black_box(limiter.check(&names[i]).await.is_allowed());
                                }
                                begin.elapsed()
                            })
                        })
                    })
                });
                group.bench_function(id("governor-keyed"), |b| {
                    b.iter_custom(|iters| {
                        let barrier = Barrier::new(threads);
                        split(threads, iters, |t, n| {
                            barrier.wait();
                            let mut i = start(t);
                            let begin = Instant::now();
                            for _ in 0..n {
                                i = (i + 1) % keys;
                                black_box(governor.check_key(&gnames[i]).is_ok());
                            }
                            begin.elapsed()
                        })
                    })
                });
            }
            // And still is after the runs: the cases measured what their
            // names say.
            let expect = matches!(workload, Workload::Admitting);
            let still = rt.block_on(limiter.check(&names[0])).is_allowed();
            assert_eq!(still, expect, "tollgate {}", workload.name());
            let still = governor.check_key(&gnames[0]).is_ok();
            assert_eq!(still, expect, "governor {}", workload.name());
        }
    }
    group.finish();
}

/// A runtime per bench thread, as a user's `.await` runs on one (the
/// limiter's timeout needs its timer).
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

fn bench(c: &mut Criterion) {
    let policy = Policy::from(TokenBucket::per_second(ADMIT_BURST.into(), 1_000_000).unwrap());
    let quota = Quota::per_second(NonZeroU32::new(1_000_000).unwrap())
        .allow_burst(NonZeroU32::new(ADMIT_BURST).unwrap());
    let mut group = c.benchmark_group("decide");
    for keys in [1usize, 10_000] {
        let names: Vec<Key> = (0..keys).map(|i| Key::new(format!("user-{i}"))).collect();
        let backend = MemoryBackend::new();
        group.bench_with_input(BenchmarkId::new("tollgate-memory", keys), &keys, |b, _| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) % keys;
                let d = ready(backend.decide(Request {
                    limiter: "bench",
                    key: &names[i],
                    policy: &policy,
                    op: Op::Acquire(1),
                }));
                black_box(d.unwrap())
            })
        });
        let governor = RateLimiter::keyed(quota);
        let gnames: Vec<String> = (0..keys).map(|i| format!("user-{i}")).collect();
        group.bench_with_input(BenchmarkId::new("governor-keyed", keys), &keys, |b, _| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) % keys;
                black_box(governor.check_key(&gnames[i]).is_ok())
            })
        });
    }
    // The same with a mock clock: what the system clock read costs.
    let mocked = MemoryBackend::with_clock(tollgate_limiter::MockClock::new());
    let key0 = Key::new("user-0");
    group.bench_function("tollgate-memory-mockclock/1", |b| {
        b.iter(|| {
            let d = ready(mocked.decide(Request {
                limiter: "bench",
                key: &key0,
                policy: &policy,
                op: Op::Acquire(1),
            }));
            black_box(d.unwrap())
        })
    });
    group.bench_function("system-clock-read", |b| {
        b.iter(|| black_box(tollgate_limiter::Clock::now(&tollgate_limiter::SystemClock)))
    });
    // The whole Limiter path (timeout and breaker) on a runtime.
    let rt = runtime();
    let limiter = Limiter::builder("bench", policy, MemoryBackend::new())
        .timeout(Duration::from_millis(50))
        .build();
    let key = Key::new("user-0");
    group.bench_function("tollgate-limiter/1", |b| {
        // All iterations inside one block_on: entering the runtime is not
        // part of a decision.
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = std::time::Instant::now();
                for _ in 0..iters {
                    black_box(limiter.check(&key).await.is_allowed());
                }
                start.elapsed()
            })
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    // Short by default: the whole bench in a few minutes on a shared
    // machine (`--measurement-time 10` for a longer run).
    config = Criterion::default()
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500))
        .sample_size(30);
    targets = limiter_vs_governor, bench
}
criterion_main!(benches);
