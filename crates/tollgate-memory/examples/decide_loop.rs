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
//! Arguments: `tollgate|limiter|governor` and the number of keys:
//! `tollgate` is the backend's `decide` alone, `limiter` the whole
//! `Limiter::check` (default settings) on a current-thread runtime.

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use tollgate_limiter::*;
use tollgate_memory::MemoryBackend;
fn ready<F: Future>(f: F) -> F::Output {
    let mut cx = Context::from_waker(Waker::noop());
    match pin!(f).poll(&mut cx) {
        Poll::Ready(v) => v,
        Poll::Pending => unreachable!(),
    }
}
const N: usize = 1_000_000;
fn main() {
    let mut args = std::env::args().skip(1);
    let which = args.next().unwrap_or_else(|| "tollgate".into());
    let keys: usize = args.next().and_then(|k| k.parse().ok()).unwrap_or(1);
    let mut n = 0u64;
    if which == "tollgate" {
        let policy = Policy::from(TokenBucket::per_second(1_000, 1_000_000).unwrap());
        let b = MemoryBackend::new();
        let ks: Vec<Key> = (0..keys).map(|i| Key::new(format!("user-{i}"))).collect();
        for i in 0..N {
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
        let policy = TokenBucket::per_second(1_000, 1_000_000).unwrap();
        let limiter = Limiter::new("bench", policy, MemoryBackend::new());
        let ks: Vec<Key> = (0..keys).map(|i| Key::new(format!("user-{i}"))).collect();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        n = rt.block_on(async {
            let mut n = 0;
            for i in 0..N {
                n += u64::from(limiter.check(&ks[i % keys]).await.is_allowed());
            }
            n
        });
    } else {
        let q = governor::Quota::per_second(NonZeroU32::new(1_000_000).unwrap())
            .allow_burst(NonZeroU32::new(1000).unwrap());
        let g = governor::RateLimiter::keyed(q);
        let ks: Vec<String> = (0..keys).map(|i| format!("user-{i}")).collect();
        for i in 0..N {
            n += g.check_key(&ks[i % keys]).is_ok() as u64;
        }
    }
    println!("{n}");
}
