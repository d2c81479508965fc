//! Expiring overrides on the memory backend's clock.

use std::time::Duration;

use tollgate_limiter::{Backend, Key, MockClock, Op, Policy, Request, Scope, TokenBucket};
use tollgate_memory::MemoryBackend;

#[tokio::test]
async fn an_expiring_override_rules_until_its_ttl_then_is_gone() {
    let clock = MockClock::new();
    let backend = MemoryBackend::with_clock(clock.clone());
    let base = Policy::from(TokenBucket::new(1, 1, Duration::from_secs(3600)).unwrap());
    let wide = Policy::from(TokenBucket::new(100, 1, Duration::from_secs(1)).unwrap());
    let k = Key::new("k");
    let remaining = |backend: MemoryBackend<MockClock>| {
        let k = k.clone();
        async move {
            let req = Request {
                limiter: "l",
                key: &k,
                policy: &base,
                op: Op::PEEK,
            };
            backend.decide(req).await.unwrap().limit()
        }
    };
    backend
        .set_expiring_override(Scope::Key("l", &k), &wide, Duration::from_secs(10))
        .await
        .unwrap();
    // A permanent limiter-wide override is untouched by the key's expiry.
    backend
        .set_override(Scope::Limiter("l"), Some(&base))
        .await
        .unwrap();
    assert_eq!(remaining(backend.clone()).await, 100);
    clock.advance(Duration::from_secs(10) - Duration::from_micros(1));
    assert_eq!(
        backend.get_override(Scope::Key("l", &k)).await.unwrap(),
        Some(wide)
    );
    clock.advance(Duration::from_micros(1));
    assert_eq!(
        backend.get_override(Scope::Key("l", &k)).await.unwrap(),
        None
    );
    assert_eq!(remaining(backend.clone()).await, 1);
    assert_eq!(
        backend.get_override(Scope::Limiter("l")).await.unwrap(),
        Some(base)
    );
}
