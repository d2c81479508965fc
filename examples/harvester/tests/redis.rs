//! Two workers sharing one adaptive state through a real Redis (a
//! throwaway `redis-server` on a loopback port; skipped, loudly, when
//! Redis is not installed).

use std::time::Duration;

use tollgate_limiter::Key;
use tollgate_limiter::aimd::{AimdConfig, AimdLimiter, Outcome};
use tollgate_redis::RedisBackend;
use tollgate_testkit::redis_server::RedisServer;

async fn worker(url: &str, prefix: &str) -> AimdLimiter<RedisBackend> {
    let backend = RedisBackend::builder(url)
        .prefix(prefix)
        .build()
        .await
        .unwrap();
    let config = AimdConfig {
        initial_rate: 8.0,
        // Long enough that the test's own pace never opens a new window.
        reaction_window: Duration::from_secs(30),
        // Not the default 50 ms: the test checks what two workers share
        // through Redis, which a loaded machine can answer later than that.
        timeout: tollgate_testkit::conformance::PATIENT_TIMEOUT,
        ..AimdConfig::default()
    };
    AimdLimiter::new("harvester", config, backend).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_share_rate_gates_and_holds_through_redis() {
    let Some(url) = RedisServer::shared_url() else {
        return;
    };
    // Two workers: separate connections, separate local state.
    let a = worker(&url, "aimd-shared").await;
    let b = worker(&url, "aimd-shared").await;
    let site = Key::new("source.test");
    assert!(!a.acquire(&site).await.unwrap().is_local());
    assert!(!b.acquire(&site).await.unwrap().is_local());

    // A burst of refusals seen by both workers is one cut.
    let mut burst = Vec::new();
    for i in 0..8 {
        let worker = if i % 2 == 0 { a.clone() } else { b.clone() };
        let site = site.clone();
        burst.push(tokio::spawn(async move {
            worker
                .feedback(&site, Outcome::Refused { retry_after: None })
                .await;
        }));
    }
    for task in burst {
        task.await.unwrap();
    }
    assert_eq!(a.shared_rate(&site).await.unwrap(), 6.0);
    assert_eq!(b.shared_rate(&site).await.unwrap(), 6.0);

    // A Retry-After seen by one worker holds the other.
    a.feedback(
        &site,
        Outcome::Refused {
            retry_after: Some(Duration::from_secs(20)),
        },
    )
    .await;
    let wait = b.try_acquire(&site).await.unwrap_err();
    assert!(
        wait > Duration::from_secs(15) && wait <= Duration::from_secs(20),
        "{wait:?}"
    );

    // A fresh worker (a restarted process) starts from the shared rate.
    let c = worker(&url, "aimd-shared").await;
    assert!(c.try_acquire(&site).await.is_err());
    assert_eq!(c.rate(&site), 6.0);
    c.forget(&site).await.unwrap();
    assert_eq!(a.shared_rate(&site).await.unwrap(), 8.0);
}
