//! The public types an application shares between tasks are `Send + Sync`,
//! and a limiter's futures are `Send` (a multi-threaded runtime spawns
//! them): checked at compile time, so a field that loses one of them fails
//! this build rather than a user's. Losing one would be a breaking change.

use std::future::Future;
use std::time::Duration;

use tollgate_limiter::{
    AimdConfig, AimdLimiter, BreakerConfig, Config, ConfigError, Decision, Denied, Error, FailMode,
    KeptPermit, Key, KeyHasher, Limiter, MockClock, Permit, Policy, PolicyError, Reservation,
    SlidingWindow, SystemClock, Verdict,
};
use tollgate_memory::{MemoryBackend, MemoryError};

fn send_sync<T: Send + Sync>() {}

fn send<F: Future + Send>(_: F) {}

#[test]
fn shared_types_are_send_and_sync() {
    send_sync::<Limiter<MemoryBackend>>();
    send_sync::<Limiter<MemoryBackend<MockClock>>>();
    send_sync::<AimdLimiter<MemoryBackend>>();
    send_sync::<Permit<MemoryBackend>>();
    send_sync::<KeptPermit<MemoryBackend>>();
    send_sync::<Reservation<MemoryBackend>>();
    send_sync::<Config>();
    send_sync::<AimdConfig>();
    send_sync::<BreakerConfig>();
    send_sync::<Policy>();
    send_sync::<FailMode>();
    send_sync::<Key>();
    send_sync::<KeyHasher>();
    send_sync::<MockClock>();
    send_sync::<SystemClock>();
    // Results and errors, which cross tasks and go into `Box<dyn Error +
    // Send + Sync>`.
    send_sync::<Decision>();
    send_sync::<Verdict>();
    send_sync::<Denied>();
    send_sync::<Error>();
    send_sync::<ConfigError>();
    send_sync::<PolicyError>();
    send_sync::<MemoryError>();
}

#[test]
fn limiter_futures_are_send() {
    let limiter = Limiter::new(
        "auto-traits",
        SlidingWindow::new(1, Duration::from_secs(1)).unwrap(),
        MemoryBackend::new(),
    );
    let key = Key::new("k");
    // Built, never polled: only their types matter.
    send(limiter.check(&key));
    send(limiter.check_cost(&key, 2));
    send(limiter.hold(&key));
    send(limiter.reserve(&key, 1));
    send(limiter.reset(&key));
    let aimd =
        AimdLimiter::new("auto-traits", AimdConfig::default(), MemoryBackend::new()).unwrap();
    send(aimd.acquire(&key));
}
