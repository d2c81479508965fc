//! The memory backend against the `governor` crate, in the same run.
//!
//! Both decide a token bucket (governor's GCRA is the same algorithm) for
//! one hot key and spread over 10k keys, with a generous quota so every
//! decision is an admission that writes state. Run with
//! `cargo bench -p tollgate-memory --bench memory`; docs/benchmarks.md
//! reports the ratios.

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

/// Polls a future that is ready at once (the memory backend's always is).
fn ready<F: Future>(f: F) -> F::Output {
    let mut cx = Context::from_waker(Waker::noop());
    match pin!(f).poll(&mut cx) {
        Poll::Ready(v) => v,
        Poll::Pending => unreachable!("the memory backend decides at once"),
    }
}

fn bench(c: &mut Criterion) {
    let policy = Policy::from(TokenBucket::per_second(1_000, 1_000_000).unwrap());
    let quota = Quota::per_second(NonZeroU32::new(1_000_000).unwrap())
        .allow_burst(NonZeroU32::new(1_000).unwrap());
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
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
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

criterion_group!(benches, bench);
criterion_main!(benches);
