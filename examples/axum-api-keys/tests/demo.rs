//! The demo's burst: 200s, then 429s once the free plan's 5 are spent.

use http::StatusCode;
use tollgate_limiter::KeyHasher;
use tollgate_memory::MemoryBackend;

fn hasher() -> KeyHasher {
    KeyHasher::new("the example tests' secret").unwrap()
}

async fn start(limited: bool) -> std::net::SocketAddr {
    let config = axum_api_keys::limits().unwrap();
    let router = axum_api_keys::app(&config, MemoryBackend::new(), limited, hasher()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(axum_api_keys::serve(listener, router));
    addr
}

#[tokio::test]
async fn the_burst_turns_200s_into_429s() {
    let addr = start(true).await;
    let replies = axum_api_keys::burst(addr, "demo_key", 8).await.unwrap();
    let statuses: Vec<_> = replies.iter().map(|r| r.status).collect();
    assert_eq!(statuses[..5], [StatusCode::OK; 5]);
    assert_eq!(statuses[5..], [StatusCode::TOO_MANY_REQUESTS; 3]);
    assert!(
        replies[0].ratelimit.contains("\"api_free\";r=4;"),
        "{:?}",
        replies[0]
    );
    assert!(
        replies[0].ratelimit.contains("\"api_ip\";r=99;"),
        "{:?}",
        replies[0]
    );
    assert!(replies[0].retry_after.is_none());
    let retry: u64 = replies[5].retry_after.as_deref().unwrap().parse().unwrap();
    assert!((1..=12).contains(&retry), "{retry}");
}

#[tokio::test]
async fn the_pro_plan_has_its_own_quota() {
    let addr = start(true).await;
    let replies = axum_api_keys::burst(addr, "pro_key", 8).await.unwrap();
    assert!(replies.iter().all(|r| r.status == StatusCode::OK));
    // A composite: the binding part (the fewest remaining) is the burst.
    assert!(
        replies[0].ratelimit.contains("\"api_pro.0\";r=49;"),
        "{:?}",
        replies[0]
    );
}

#[tokio::test]
async fn without_the_layers_nothing_is_limited() {
    let addr = start(false).await;
    let replies = axum_api_keys::burst(addr, "demo_key", 8).await.unwrap();
    assert!(
        replies
            .iter()
            .all(|r| r.status == StatusCode::OK && r.ratelimit.is_empty())
    );
}

/// The `REDIS_URL` path: the same burst, counted in a throwaway Redis
/// (skipped when redis-server is not installed, outside CI).
#[tokio::test]
async fn the_burst_counts_in_redis_too() {
    let Some(server) = tollgate_testkit::redis_server::RedisServer::start() else {
        return;
    };
    // Decisions wait up to 5 s, not the example's 50 ms: a loaded test
    // machine's slow reply would pass a request fail-open.
    let config = tollgate_limiter::Config::builder()
        .toml_str(axum_api_keys::LIMITS)
        .toml_str("[defaults]\ntimeout = '5s'")
        .load()
        .unwrap();
    let backend = tollgate_redis::RedisBackend::builder(server.url())
        .prefix(config.prefix())
        .build()
        .await
        .unwrap();
    let router = axum_api_keys::app(&config, backend, true, hasher()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(axum_api_keys::serve(listener, router));
    let replies = axum_api_keys::burst(addr, "demo_key", 7).await.unwrap();
    let statuses: Vec<_> = replies.iter().map(|r| r.status).collect();
    assert_eq!(statuses[..5], [StatusCode::OK; 5]);
    assert_eq!(statuses[5..], [StatusCode::TOO_MANY_REQUESTS; 2]);
}

#[tokio::test]
async fn key_only_counts_no_ip() {
    let config = axum_api_keys::limits().unwrap();
    let router = axum_api_keys::app_with(
        &config,
        MemoryBackend::new(),
        axum_api_keys::Layers::PerKey,
        hasher(),
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(axum_api_keys::serve(listener, router));
    let replies = axum_api_keys::burst(addr, "demo_key", 6).await.unwrap();
    assert!(
        replies[0].ratelimit.starts_with("\"api_free\";r=4;"),
        "{:?}",
        replies[0]
    );
    assert!(!replies[0].ratelimit.contains("api_ip"));
    assert_eq!(replies[5].status, StatusCode::TOO_MANY_REQUESTS);
}

/// At most 2 exports in flight per key: a slot is held until the response
/// body has been sent, and given back when it is (or the client leaves).
#[tokio::test]
async fn exports_are_limited_in_flight_until_their_body_is_sent() {
    use axum::body::Body;
    use http::Request;
    use http_body_util::BodyExt;
    use tower::{Service, ServiceExt};

    let config = axum_api_keys::limits().unwrap();
    let backend = MemoryBackend::new();
    let mut app =
        axum_api_keys::app_with(&config, backend, axum_api_keys::Layers::PerKey, hasher()).unwrap();
    let export = |key: &str| {
        Request::get("/v1/export")
            .header("x-api-key", key)
            .body(Body::empty())
            .unwrap()
    };
    let mut call = async |key: &str| {
        let svc = ServiceExt::<Request<Body>>::ready(&mut app).await.unwrap();
        svc.call(export(key)).await.unwrap()
    };
    // Two responses whose bodies are not sent yet hold both slots.
    let first = call("pro_exporter").await;
    let second = call("pro_exporter").await;
    assert_eq!(
        (first.status(), second.status()),
        (StatusCode::OK, StatusCode::OK)
    );
    let third = call("pro_exporter").await;
    assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(third.headers()["retry-after"], "1");
    // Another key has its own slots.
    assert_eq!(call("pro_other").await.status(), StatusCode::OK);
    // The first export is sent: its slot is free again.
    let body = first.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"a large export\n");
    let mut status = StatusCode::TOO_MANY_REQUESTS;
    for _ in 0..1000 {
        let res = call("pro_exporter").await;
        status = res.status();
        if status == StatusCode::OK {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(status, StatusCode::OK);
    drop(second);
}

/// An invalid configuration stops the start-up (exit code 1) with the
/// error's message, which names the field; `main` returned the error and
/// printed its `Debug`: `Error: Invalid { path: .. }`.
#[test]
fn an_invalid_configuration_is_reported_by_its_message() {
    let stderr = tollgate_testkit::demo::run_failing(
        env!("CARGO_BIN_EXE_axum-api-keys"),
        &[("TOLLGATE_LIMITERS__API_FREE__CAPACITY", "0")],
    );
    assert!(
        stderr.contains(
            "error: invalid tollgate configuration: limiters.api_free.capacity: must be at least 1"
        ),
        "{stderr}"
    );
}
