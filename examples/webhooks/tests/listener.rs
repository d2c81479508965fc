//! The listener stream on both backends: a flooded channel is cut at its
//! limit and the excess counted, other channels flow; with `Delay`, the
//! excess waits for the window instead (tokio's paused time drives a mock
//! clock), in order.

use std::time::Duration;

use futures_util::stream;
use tollgate_limiter::{Backend, Limiter, MockClock, SlidingWindow};
use tollgate_memory::MemoryBackend;
use tollgate_redis::RedisBackend;
use tollgate_testkit::redis_server::RedisServer;
use tollgate_tower::stream::Excess;
use webhooks::listener::{self, Event};

async fn drops_the_flood_and_counts_it<B: Backend + Clone>(backend: B) {
    let config = webhooks::limits().unwrap();
    // The documented limits, with a patient per-decision timeout: the test
    // counts what passes, and the configured 50 ms can pass on a loaded
    // machine before Redis answers (the fail mode would then decide).
    let mut channel = config.limiter("listener_channel").unwrap().clone();
    channel.timeout = tollgate_testkit::conformance::PATIENT_TIMEOUT;
    let limiter = channel.build(backend);
    let (handled, stats) = listener::run(
        listener::fake_source(listener::storm()),
        limiter,
        Excess::Drop,
    )
    .await;
    assert_eq!(handled.per_channel["town-square"], 30);
    assert_eq!(handled.per_channel["dev"], 10);
    assert_eq!(
        (stats.limited(), stats.dropped(), stats.passed()),
        (20, 20, 40)
    );
    // The first 30 of the flood got through, in order.
    let flood: Vec<_> = handled
        .events
        .iter()
        .filter(|e| e.channel == "town-square")
        .map(|e| e.text.as_str())
        .collect();
    assert_eq!(flood[29], "spam 29");
}

#[tokio::test]
async fn memory_backend_drops() {
    drops_the_flood_and_counts_it(MemoryBackend::with_clock(MockClock::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_backend_drops() {
    let Some(url) = RedisServer::shared_url() else {
        return;
    };
    let backend = RedisBackend::builder(url)
        .prefix("listener-test")
        .caller_time(MockClock::new())
        .min_ttl(Duration::from_secs(3600))
        .build()
        .await
        .unwrap();
    drops_the_flood_and_counts_it(backend).await;
}

#[tokio::test(start_paused = true)]
async fn delay_holds_the_excess_until_the_window_moves() {
    let clock = MockClock::new();
    let backend = MemoryBackend::with_clock(clock.clone());
    let limiter = Limiter::new(
        "listener_channel",
        SlidingWindow::new(2, Duration::from_secs(60)).unwrap(),
        backend,
    );
    // The mock clock follows tokio's paused clock.
    let ticker = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            clock.advance(Duration::from_secs(1));
        }
    });
    let start = tokio::time::Instant::now();
    let events = (0..5).map(|i| Event::new("acme", "town-square", format!("post {i}")));
    let (handled, stats) = listener::run(
        stream::iter(events.collect::<Vec<_>>()),
        limiter,
        Excess::Delay,
    )
    .await;
    ticker.abort();
    let texts: Vec<_> = handled.events.iter().map(|e| e.text.as_str()).collect();
    assert_eq!(texts, ["post 0", "post 1", "post 2", "post 3", "post 4"]);
    assert_eq!(stats.dropped(), 0);
    assert!(stats.delayed() >= 2);
    // Two per minute: the fifth post waited two windows.
    assert!(
        start.elapsed() >= Duration::from_secs(120),
        "{:?}",
        start.elapsed()
    );
}

/// `Delay` over a real Redis, in real time (the server's clock): a short
/// window, so the held events wait a fraction of a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_backend_delays() {
    let Some(url) = RedisServer::shared_url() else {
        return;
    };
    let backend = RedisBackend::builder(url)
        .prefix("listener-delay-test")
        .build()
        .await
        .unwrap();
    let window = Duration::from_millis(300);
    let limiter = Limiter::new(
        "listener_channel",
        SlidingWindow::new(2, window).unwrap(),
        backend,
    );
    let events: Vec<_> = (0..5)
        .map(|i| Event::new("acme", "town-square", format!("post {i}")))
        .collect();
    let start = std::time::Instant::now();
    let (handled, stats) = listener::run(stream::iter(events), limiter, Excess::Delay).await;
    let texts: Vec<_> = handled.events.iter().map(|e| e.text.as_str()).collect();
    assert_eq!(texts, ["post 0", "post 1", "post 2", "post 3", "post 4"]);
    assert_eq!(stats.dropped(), 0);
    assert!(stats.delayed() >= 2);
    // Two per window: the fifth post cannot pass before two windows.
    assert!(start.elapsed() >= 2 * window, "{:?}", start.elapsed());
}
