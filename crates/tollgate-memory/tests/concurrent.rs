//! Threads racing on one key: exactly the policy's capacity passes.

use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate_limiter::{Key, Limiter, TokenBucket};
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
