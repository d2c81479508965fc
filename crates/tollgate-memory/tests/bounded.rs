//! Memory stays bounded by the live keys, however many keys pass through.

use std::time::Duration;

use tollgate_limiter::{Backend, Key, MockClock, Op, Policy, Request, SlidingWindow};
use tollgate_memory::MemoryBackend;

#[tokio::test]
async fn a_million_keys_leave_only_the_live_ones() {
    let clock = MockClock::new();
    let backend = MemoryBackend::with_clock(clock.clone());
    // Each key stays live for 1s; one new key every 10µs keeps about
    // 100k keys live at any moment.
    let policy = Policy::from(SlidingWindow::new(5, Duration::from_secs(1)).unwrap());
    let mut peak = 0;
    for i in 0..1_000_000u32 {
        let key = Key::new(format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255));
        let d = backend
            .decide(Request {
                limiter: "ip",
                key: &key,
                policy: &policy,
                op: Op::Acquire(1),
            })
            .await
            .unwrap();
        assert!(d.is_allowed());
        clock.advance_micros(10);
        if i % 50_000 == 0 {
            peak = peak.max(backend.len());
        }
    }
    // Sweeps run as shards double: at most about twice the live keys, plus
    // each shard's minimum before it sweeps at all.
    assert!(peak < 2 * 100_000 + 64 * 1024, "peak {peak}");
    assert!(backend.len() < 2 * 100_000 + 64 * 1024);
    clock.advance(Duration::from_secs(1));
    backend.sweep();
    assert!(backend.is_empty());
}

#[tokio::test]
async fn fresh_state_is_not_stored() {
    let clock = MockClock::new();
    let backend = MemoryBackend::with_clock(clock.clone());
    let policy = Policy::from(SlidingWindow::new(1, Duration::from_secs(1)).unwrap());
    let key = Key::new("k");
    let ask = |op| {
        backend.decide(Request {
            limiter: "l",
            key: &key,
            policy: &policy,
            op,
        })
    };
    // Peeks at an unknown key keep nothing.
    ask(Op::PEEK).await.unwrap();
    assert!(backend.is_empty());
    ask(Op::Acquire(1)).await.unwrap();
    assert_eq!(backend.len(), 1);
    // A reset removes the key at once.
    ask(Op::Reset).await.unwrap();
    assert!(backend.is_empty());
    // An expired key is dropped when next touched.
    ask(Op::Acquire(1)).await.unwrap();
    clock.advance(Duration::from_secs(1));
    ask(Op::PEEK).await.unwrap();
    assert!(backend.is_empty());
}
