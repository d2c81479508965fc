//! The webhook endpoints on both backends: a flooded channel is cut at its
//! limit while the other channels flow, a source is cut across its
//! channels, an IP across sources; refusals name the limit; a dead counter
//! refuses (fail-closed). Time is a mock clock, so the window's end is
//! shown without waiting.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use http::Request;
use http_body_util::BodyExt;
use serde_json::Value;
use tollgate_limiter::{Backend, Config, MockClock};
use tollgate_memory::MemoryBackend;
use tollgate_redis::RedisBackend;
use tollgate_testkit::redis_server::RedisServer;
use tower::ServiceExt;
use webhooks::{slack_message, telegram_message};

/// The shipped limits, smaller: per IP 50, per source 20, per channel 5.
fn config() -> Config {
    Config::builder()
        .toml_str(webhooks::LIMITS)
        .toml_str(
            "[limiters.hooks_ip]\nlimit = 50\n\
             [limiters.hooks_source]\nlimit = 20\n\
             [limiters.hooks_channel]\nlimit = 5\n",
        )
        .load()
        .unwrap()
}

fn app<B: Backend + Clone>(backend: B) -> Router {
    webhooks::app(&config(), backend, vec!["127.0.0.1/32".parse().unwrap()]).unwrap()
}

/// (status, the limiter that refused, the body).
async fn post(
    app: &Router,
    ip: &str,
    path: &str,
    payload: &Value,
) -> (u16, Option<String>, Vec<u8>) {
    let mut req = Request::post(path)
        .header("content-type", "application/json")
        .header("x-forwarded-for", ip)
        .body(Body::from(payload.to_string()))
        .unwrap();
    req.extensions_mut().insert(ConnectInfo(
        "127.0.0.1:50000".parse::<SocketAddr>().unwrap(),
    ));
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status().as_u16();
    let body = res.into_body().collect().await.unwrap().to_bytes().to_vec();
    (status, webhooks::refused_by(&body), body)
}

async fn limits_per_ip_source_and_channel<B: Backend + Clone>(backend: B, clock: MockClock) {
    let app = app(backend);
    let slack = "192.0.2.10";
    let flood = slack_message("T1", "C1", "spam");

    // One channel: 5 pass, then 429 by the channel limit.
    let mut seen = Vec::new();
    for _ in 0..7 {
        let (status, by, _) = post(&app, slack, "/slack/events", &flood).await;
        seen.push((status, by));
    }
    assert!(seen[..5].iter().all(|s| *s == (200, None)), "{seen:?}");
    assert_eq!(seen[5], (429, Some("hooks_channel".into())));

    // Another channel of the same workspace still flows.
    let (status, _, _) = post(
        &app,
        slack,
        "/slack/events",
        &slack_message("T1", "C2", "hi"),
    )
    .await;
    assert_eq!(status, 200);

    // The workspace as a whole: 8 calls so far; 12 more on fresh channels
    // reach its 20, the next is refused by the source limit.
    for i in 0..12 {
        let msg = slack_message("T1", &format!("D{i}"), "hi");
        assert_eq!(post(&app, slack, "/slack/events", &msg).await.0, 200);
    }
    let (status, by, _) = post(
        &app,
        slack,
        "/slack/events",
        &slack_message("T1", "D99", "hi"),
    )
    .await;
    assert_eq!((status, by.as_deref()), (429, Some("hooks_source")));
    // Another workspace is not affected.
    let (status, _, _) = post(
        &app,
        slack,
        "/slack/events",
        &slack_message("T2", "C1", "hi"),
    )
    .await;
    assert_eq!(status, 200);

    // Telegram: the bot is the source, the chat the channel; the same chat
    // id under another bot is another channel.
    let tg = "192.0.2.20";
    let statuses: Vec<u16> = {
        let mut v = Vec::new();
        for i in 0..6 {
            v.push(
                post(&app, tg, "/telegram/bot_a", &telegram_message(i, -42, "m"))
                    .await
                    .0,
            );
        }
        v
    };
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
    assert_eq!(
        post(&app, tg, "/telegram/bot_b", &telegram_message(9, -42, "m"))
            .await
            .0,
        200
    );

    // One IP across sources: 50 calls, then refused by the IP limit.
    let noisy = "203.0.113.9";
    for i in 0..50 {
        let msg = slack_message(&format!("W{i}"), "C1", "hi");
        assert_eq!(
            post(&app, noisy, "/slack/events", &msg).await.0,
            200,
            "call {i}"
        );
    }
    let (status, by, _) = post(
        &app,
        noisy,
        "/slack/events",
        &slack_message("W99", "C1", "hi"),
    )
    .await;
    assert_eq!((status, by.as_deref()), (429, Some("hooks_ip")));

    // A sliding minute later, the flooded channel flows again.
    clock.advance(Duration::from_secs(61));
    assert_eq!(post(&app, slack, "/slack/events", &flood).await.0, 200);
}

#[tokio::test]
async fn memory_backend() {
    let clock = MockClock::new();
    limits_per_ip_source_and_channel(MemoryBackend::with_clock(clock.clone()), clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_backend() {
    let Some(url) = RedisServer::shared_url() else {
        return;
    };
    let clock = MockClock::new();
    let backend = RedisBackend::builder(url)
        .prefix("webhooks-test")
        .caller_time(clock.clone())
        .min_ttl(Duration::from_secs(3600))
        .build()
        .await
        .unwrap();
    limits_per_ip_source_and_channel(backend, clock).await;
}

#[tokio::test]
async fn fail_closed_and_malformed_calls() {
    let backend = MemoryBackend::new();
    let app = app(backend.clone());
    let ip = "192.0.2.10";

    // Slack's endpoint check is answered.
    let challenge =
        serde_json::json!({ "type": "url_verification", "team_id": "T1", "challenge": "abc" });
    let (status, _, body) = post(&app, ip, "/slack/events", &challenge).await;
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap()["challenge"],
        "abc"
    );

    // No workspace: no source to count it under.
    let anonymous = serde_json::json!({ "type": "event_callback", "event": { "channel": "C1" } });
    assert_eq!(post(&app, ip, "/slack/events", &anonymous).await.0, 400);

    // The counter is down: refuse, never let a public endpoint run open.
    backend.set_failing(true);
    let (status, _, _) = post(&app, ip, "/slack/events", &slack_message("T1", "C1", "x")).await;
    assert_eq!(status, 503);
}
