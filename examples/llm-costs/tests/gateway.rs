//! The API-key and LLM-cost rows on both backends (time from a mock
//! clock): per-role ceilings through the policy resolver; a token budget
//! separate from the API limit, each call reserving its prompt plus
//! `max_tokens` and settling with the usage the model reports; each limit
//! with its own fail mode.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use http::Request;
use http_body_util::BodyExt;
use tollgate_limiter::{Backend, Config, KeyHasher, MockClock};
use tollgate_memory::MemoryBackend;
use tollgate_redis::RedisBackend;
use tollgate_testkit::redis_server::RedisServer;
use tower::ServiceExt;

/// The shipped limits with smaller API ceilings: standard 5, admin 20.
fn app<B: Backend + Clone>(backend: B) -> Router {
    let config = Config::builder()
        .toml_str(llm_costs::LIMITS)
        .toml_str(
            "[limiters.api_standard]\ncapacity = 5\nrefill = '5/min'\n\
             [limiters.api_admin]\ncapacity = 20\nrefill = '20/min'\n",
        )
        .load()
        .unwrap();
    llm_costs::app(
        &config,
        backend,
        KeyHasher::new("the example tests' secret").unwrap(),
    )
    .unwrap()
}

/// (status, violated policy, Retry-After).
async fn send(app: &Router, req: Request<Body>) -> (u16, Option<String>, Option<u64>) {
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status().as_u16();
    let retry = res
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().parse().unwrap());
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let policy = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["violated-policies"][0].as_str().map(str::to_owned));
    (status, policy, retry)
}

fn models(key: &str) -> Request<Body> {
    Request::get("/v1/models")
        .header("x-api-key", key)
        .body(Body::empty())
        .unwrap()
}

fn complete(key: &str, max_tokens: u64) -> Request<Body> {
    let body = serde_json::json!({ "prompt": "x".repeat(400), "max_tokens": max_tokens });
    Request::post("/v1/complete")
        .header("x-api-key", key)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

async fn roles_and_token_budget<B: Backend + Clone>(backend: B, clock: MockClock) {
    let app = app(backend);

    // Per-role ceilings: a standard key gets 5, an admin key 20.
    let mut standard = Vec::new();
    for _ in 0..6 {
        standard.push(send(&app, models("std_1")).await);
    }
    assert!(standard[..5].iter().all(|r| r.0 == 200), "{standard:?}");
    assert_eq!(standard[5].0, 429);
    assert_eq!(standard[5].1.as_deref(), Some("api_standard"));
    for i in 0..20 {
        assert_eq!(send(&app, models("admin_1")).await.0, 200, "admin call {i}");
    }
    assert_eq!(
        send(&app, models("admin_1")).await.1.as_deref(),
        Some("api_admin")
    );

    // The token budget is separate, and charged by tokens. A call reserves
    // its prompt (100) + max_tokens: 10_000 here; the fake model uses 100 +
    // 250, and the rest comes back when the call settles.
    let key = "admin_2";
    assert_eq!(llm_costs::cost(&"x".repeat(400), 9_900), 10_000);
    let (status, usage) = completion(&app, key, 9_900).await;
    assert_eq!(status, 200);
    assert_eq!(usage["reserved_tokens"], 10_000);
    assert_eq!(usage["charged_tokens"], 350);
    assert_eq!(usage["tokens_left"], 19_650);
    // So a second and a third such call pass too (without settling, the
    // third would be refused: 3 x 10_000 > 20_000).
    assert_eq!(completion(&app, key, 9_900).await.1["tokens_left"], 19_300);
    assert_eq!(completion(&app, key, 9_900).await.1["tokens_left"], 18_950);
    // A call that reserves more than is left is refused before the model
    // is called: 1_050 tokens short at 20_000 an hour is 189 s.
    let (status, policy, retry) = send(&app, complete(key, 19_900)).await;
    assert_eq!((status, policy.as_deref()), (429, Some("llm_tokens")));
    assert_eq!(retry, Some(189));
    // The API limit is not the token budget: cheap calls still work, and
    // another key has its own budget.
    assert_eq!(send(&app, models(key)).await.0, 200);
    assert_eq!(
        completion(&app, "admin_3", 19_900).await.1["tokens_left"],
        19_650
    );
    // A call larger than the whole budget can never pass: 400, not 429.
    assert_eq!(send(&app, complete("admin_3", 30_000)).await.0, 400);

    // 189 s later, enough has dripped back for the large call.
    clock.advance(Duration::from_secs(189));
    assert_eq!(send(&app, complete(key, 19_900)).await.0, 200);
}

/// (status, the `usage` the gateway reports).
async fn completion(app: &Router, key: &str, max_tokens: u64) -> (u16, serde_json::Value) {
    let res = app
        .clone()
        .oneshot(complete(key, max_tokens))
        .await
        .unwrap();
    let status = res.status().as_u16();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    (status, v["usage"].clone())
}

/// The token budget is counted under the key the API limit counts: one
/// credential, trimmed. A key sent with blanks around it (kept as sent
/// over HTTP/2) was a second budget, for a gateway that authenticates the
/// trimmed key.
#[tokio::test]
async fn a_key_spelled_with_blanks_shares_its_budget() {
    let app = app(MemoryBackend::with_clock(MockClock::new()));
    assert_eq!(
        completion(&app, "admin_4", 9_900).await.1["tokens_left"],
        19_650
    );
    let (status, usage) = completion(&app, " admin_4\t", 9_900).await;
    assert_eq!(status, 200);
    assert_eq!(usage["tokens_left"], 19_300, "a budget of its own");
}

#[tokio::test]
async fn memory_backend() {
    let clock = MockClock::new();
    roles_and_token_budget(MemoryBackend::with_clock(clock.clone()), clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_backend() {
    let Some(url) = RedisServer::shared_url() else {
        return;
    };
    let clock = MockClock::new();
    let backend = RedisBackend::builder(url)
        .prefix("llm-costs-test")
        .caller_time(clock.clone())
        .min_ttl(Duration::from_secs(7200))
        .build()
        .await
        .unwrap();
    roles_and_token_budget(backend, clock).await;
}

#[tokio::test]
async fn the_api_fails_open_and_inference_fails_closed() {
    let backend = MemoryBackend::new();
    let app = app(backend.clone());
    backend.set_failing(true);
    // The counter is down: the API limit lets calls through ...
    assert_eq!(send(&app, models("std_1")).await.0, 200);
    // ... the token budget does not.
    let (status, _, retry) = send(&app, complete("std_1", 10)).await;
    assert_eq!(status, 503);
    assert!(retry.is_some());
}
