//! Threads racing on one key: exactly the policy's capacity passes.

use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate_limiter::{Backend, Key, Limiter, MockClock, Op, Policy, Request, TokenBucket};
use tollgate_memory::MemoryBackend;

#[test]
fn threads_on_one_key_admit_exactly_the_capacity() {
    const THREADS: u64 = 8;
    const CAPACITY: u64 = 1_000;
    // One token back an hour: no refill within the test.
    let policy = TokenBucket::new(CAPACITY, 1, Duration::from_secs(3_600)).unwrap();
    for round in 0..5 {
        let limiter = Limiter::new("race", policy, MemoryBackend::new());
        let key = Key::new(format!("hot-{round}"));
        let admitted = AtomicU64::new(0);
        let start = Barrier::new(THREADS as usize);
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_time()
                        .build()
                        .unwrap();
                    start.wait();
                    // Each thread alone could take the whole bucket.
                    for _ in 0..CAPACITY {
                        if rt.block_on(limiter.check(&key)).is_allowed() {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(admitted.load(Ordering::Relaxed), CAPACITY, "round {round}");
        assert!(!rt_check(&limiter, &key));
    }
}

fn rt_check(limiter: &Limiter<MemoryBackend>, key: &Key) -> bool {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
        .block_on(limiter.check(key))
        .is_allowed()
}

/// Decides at once: the memory backend's futures are ready when made.
fn ready<F: std::future::Future>(f: F) -> F::Output {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match std::pin::pin!(f).poll(&mut cx) {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => unreachable!("the memory backend decides at once"),
    }
}

/// `threads` threads each try `tries` charges of one token on `key` at
/// once (on the lock-free path once the key is held); how many passed.
fn race(backend: &MemoryBackend<MockClock>, policy: &Policy, key: &Key, threads: u64) -> u64 {
    let admitted = AtomicU64::new(0);
    let start = Barrier::new(threads as usize);
    let tries = policy.max_cost().unwrap();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                start.wait();
                for _ in 0..tries {
                    let d = ready(backend.decide(request(policy, key, Op::Acquire(1)))).unwrap();
                    if d.is_allowed() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    admitted.into_inner()
}

fn request<'a>(policy: &'a Policy, key: &'a Key, op: Op) -> Request<'a> {
    Request {
        limiter: "race",
        key,
        policy,
        op,
    }
}

/// A bucket's new life starts under contention (every thread finds it
/// full at once: one swaps its arrival time and birth, the others wait
/// for it), and reservations settle against the right life: a refund
/// within its life gives its units back to exactly one racer each, a
/// receipt of an older life refunds nothing.
#[test]
fn lives_start_and_settle_exactly_under_contention() {
    const THREADS: u64 = 8;
    const CAPACITY: u64 = 200;
    let clock = MockClock::new();
    let backend = MemoryBackend::with_clock(clock.clone());
    let policy = Policy::from(TokenBucket::new(CAPACITY, 1, Duration::from_secs(3_600)).unwrap());
    let key = Key::new("hot");
    let reserve = |units| {
        let req = request(&policy, &key, Op::Acquire(units));
        let (d, receipt) = ready(backend.reserve(req)).unwrap();
        assert!(d.is_allowed());
        receipt
    };
    // What a refund of the whole receipt leaves available.
    let settle = |receipt| {
        let op = Op::Settle { receipt, actual: 0 };
        ready(backend.decide(request(&policy, &key, op)))
            .unwrap()
            .remaining()
    };
    let race = || race(&backend, &policy, &key, THREADS);
    let old = reserve(CAPACITY);
    for round in 0..20 {
        // Full again: the next charge starts a new life.
        clock.advance(Duration::from_secs(3_600 * CAPACITY));
        assert_eq!(race(), CAPACITY, "round {round}");
        // The first life's receipt refunds nothing to this one.
        assert_eq!(settle(old), 0, "round {round}");
        // A reservation of this life, then racers on the lock-free path:
        // its refund lands in the same life, once.
        clock.advance(Duration::from_secs(3_600 * CAPACITY));
        let half = CAPACITY / 2;
        let this = reserve(half);
        assert_eq!(race(), half, "round {round}");
        assert_eq!(settle(this), half, "round {round}");
        assert_eq!(race(), half, "round {round}");
    }
}
