//! A fixed loop of decisions, for instruction counts under
//! `valgrind --tool=callgrind` (repeatable where wall-clock time is not):
//!
//! ```sh
//! cargo build --release -p tollgate-memory --example decide_loop
//! valgrind --tool=callgrind target/release/examples/decide_loop tollgate 10000
//! valgrind --tool=callgrind target/release/examples/decide_loop governor 10000
//! perf stat -e instructions:u target/release/examples/decide_loop limiter 1
//! ```
//!
//! Arguments: `tollgate|limiter|governor`, the number of keys,
//! optionally the workload of `benches/memory.rs`, `admit` (a bucket no run
//! drains) or `refuse` (10 tokens, one back an hour). Without it, a bucket
//! of 1000 refilled a token a microsecond: natively it drains and refuses,
//! under valgrind (slower than its refill) it admits, each charge on a full
//! bucket; and optionally the number of decisions (a million by default).
//! It prints the wall-clock time per decision on stderr, for quick
//! comparisons between builds (criterion's `benches/memory.rs` is the
//! reference). `tollgate` is the backend's `decide` alone, `limiter` the whole
//! `Limiter::check` (default settings) on a current-thread runtime.

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tollgate_limiter::*;
use tollgate_memory::MemoryBackend;
fn ready<F: Future>(f: F) -> F::Output {
    let mut cx = Context::from_waker(Waker::noop());
    match pin!(f).poll(&mut cx) {
        Poll::Ready(v) => v,
        Poll::Pending => unreachable!(),
    }
}
fn main() {
    let mut args = std::env::args().skip(1);
    let which = args.next().unwrap_or_else(|| "tollgate".into());
    let keys: usize = args.next().and_then(|k| k.parse().ok()).unwrap_or(1);
    let (capacity, refill, period) = match args.next().as_deref() {
        Some("admit") => (4_000_000_000u32, 1_000_000u32, Duration::from_secs(1)),
        Some("refuse") => (10, 1, Duration::from_secs(3_600)),
        _ => (1_000, 1_000_000, Duration::from_secs(1)),
    };
    let decisions: usize = args
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_000_000);
    let begin = std::time::Instant::now();
    let bucket = TokenBucket::new(capacity.into(), refill.into(), period).unwrap();
    let quota = governor::Quota::with_period(period / refill)
        .unwrap()
        .allow_burst(NonZeroU32::new(capacity).unwrap());
    let mut n = 0u64;
    if which == "tollgate" {
        let policy = Policy::from(bucket);
        let b = MemoryBackend::new();
        let ks: Vec<Key> = (0..keys).map(|i| Key::new(format!("user-{i}"))).collect();
        for i in 0..decisions {
            let d = ready(b.decide(Request {
                limiter: "bench",
                key: &ks[i % keys],
                policy: &policy,
                op: Op::Acquire(1),
            }))
            .unwrap();
            n += d.remaining();
        }
    } else if which == "limiter" {
        let limiter = Limiter::new("bench", bucket, MemoryBackend::new());
        let ks: Vec<Key> = (0..keys).map(|i| Key::new(format!("user-{i}"))).collect();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        n = rt.block_on(async {
            let mut n = 0;
            for i in 0..decisions {
                n += u64::from(limiter.check(&ks[i % keys]).await.is_allowed());
            }
            n
        });
    } else {
        let g = governor::RateLimiter::keyed(quota);
        let ks: Vec<String> = (0..keys).map(|i| format!("user-{i}")).collect();
        for i in 0..decisions {
            n += g.check_key(&ks[i % keys]).is_ok() as u64;
        }
    }
    let per = begin.elapsed().as_nanos() as f64 / decisions as f64;
    eprintln!("{which} {keys} keys: {per:.1} ns per decision");
    println!("{n}");
}
