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
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use governor::{Quota, RateLimiter};
use tollgate_limiter::{Backend, Key, Limiter, Op, Policy, Request, TokenBucket};
use tollgate_memory::MemoryBackend;

#[allow(dead_code)] // measure_pairs serves examples/paired.rs
mod common;
use common::{ADMIT_BURST, Case, GOVERNOR, TOLLGATE, Workers, Workload, runtime};

/// Polls a future that is ready at once (the memory backend's always is).
fn ready<F: Future>(f: F) -> F::Output {
    let mut cx = Context::from_waker(Waker::noop());
    match pin!(f).poll(&mut cx) {
        Poll::Ready(v) => v,
        Poll::Pending => unreachable!("the memory backend decides at once"),
    }
}

/// `Limiter::check` (default settings) against governor's keyed limiter.
fn limiter_vs_governor(c: &mut Criterion) {
    let mut group = c.benchmark_group("limiter");
    for workload in [Workload::Admitting, Workload::Refusing] {
        for keys in [1usize, 10_000] {
            let case = Case::new(workload, keys);
            for threads in [1usize, 2] {
                let id =
                    |lib: &str| format!("{lib}/{}/{keys}-keys/{threads}-threads", workload.name());
                let work = |t, lib, n, rt: &_| case.run(t, threads, lib, n, rt);
                // One library at a time, each on threads of its own.
                for (name, lib) in [("tollgate-limiter", TOLLGATE), ("governor-keyed", GOVERNOR)] {
                    std::thread::scope(|s| {
                        let workers = Workers::spawn(s, threads, &work);
                        group.bench_function(id(name), |b| {
                            b.iter_custom(|iters| workers.run(lib, iters))
                        });
                    });
                }
            }
            case.assert_still();
        }
    }
    group.finish();
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
