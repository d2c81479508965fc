//! The login kit on both backends, with time driven by a mock clock: a
//! brute-force loop is cut off (account delayed, then the IP refused); the
//! answers are the same whether the account exists or not; the real user
//! gets in after the delay and that clears the account; a dead counter
//! refuses logins (fail-closed).

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tollgate_limiter::{Backend, KeyHasher, MockClock};
use tollgate_memory::MemoryBackend;
use tollgate_redis::RedisBackend;
use tollgate_testkit::redis_server::RedisServer;
use tower::ServiceExt;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    status: StatusCode,
    retry_after: Option<String>,
    refused_by: Option<String>,
    body: String,
}

async fn attempt(app: &Router, ip: &str, email: &str, password: &str) -> Answer {
    let body = serde_json::json!({ "email": email, "password": password }).to_string();
    let mut req = Request::post("/login")
        .header("content-type", "application/json")
        .header("x-forwarded-for", ip)
        .body(Body::from(body))
        .unwrap();
    // As served: the peer is the proxy on loopback.
    req.extensions_mut().insert(ConnectInfo(
        "127.0.0.1:50000".parse::<SocketAddr>().unwrap(),
    ));
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status();
    let retry_after = res
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let body =
        String::from_utf8(res.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    Answer {
        status,
        retry_after,
        refused_by: axum_login::refused_by(&body),
        body,
    }
}

fn hasher() -> KeyHasher {
    KeyHasher::new("the example tests' secret").unwrap()
}

fn app<B: Backend + Clone>(backend: B) -> Router {
    let config = axum_login::limits().unwrap();
    axum_login::app(
        &config,
        backend,
        vec!["127.0.0.1/32".parse().unwrap()],
        hasher(),
    )
    .unwrap()
}

async fn brute_force_is_cut_off_and_the_user_gets_in<B: Backend + Clone>(
    backend: B,
    clock: MockClock,
) {
    let app = app(backend);
    let alice = axum_login::EMAIL;
    let attacker = "203.0.113.66";

    // Five free failures, the sixth starts a 1 s delay; from then on the
    // account is refused before the handler.
    let mut seen = Vec::new();
    for i in 0..8 {
        seen.push(attempt(&app, attacker, alice, &format!("guess{i}")).await);
    }
    let statuses: Vec<_> = seen.iter().map(|a| a.status.as_u16()).collect();
    assert_eq!(statuses, [401, 401, 401, 401, 401, 401, 429, 429]);
    assert_eq!(seen[6].retry_after.as_deref(), Some("1"));
    assert_eq!(seen[6].refused_by.as_deref(), Some("login_account"));

    // Same answers for an account that does not exist, from another IP.
    let mut unknown = Vec::new();
    for i in 0..8 {
        unknown.push(
            attempt(
                &app,
                "203.0.113.67",
                "nobody@example.com",
                &format!("guess{i}"),
            )
            .await,
        );
    }
    assert_eq!(
        seen, unknown,
        "an unknown account must look like a real one"
    );

    // The real user, from their own IP, is delayed too: the right
    // password does not get through a delayed account.
    let user = "198.51.100.7";
    let delayed = attempt(&app, user, alice, axum_login::PASSWORD).await;
    assert_eq!(delayed.status, StatusCode::TOO_MANY_REQUESTS);
    let wait: u64 = delayed.retry_after.as_deref().unwrap().parse().unwrap();

    // After the delay, they get in; that clears the account.
    clock.advance(Duration::from_secs(wait));
    let ok = attempt(&app, user, alice, axum_login::PASSWORD).await;
    assert_eq!(ok.status, StatusCode::OK, "{ok:?}");
    // A delay, not a lock-out: the account has its free attempts again.
    let again = attempt(&app, attacker, alice, "guess8").await;
    assert_eq!(again.status, StatusCode::UNAUTHORIZED);

    // The attacker's IP has used 9 + refused attempts of its 20 per
    // 15 minutes; the rest of the window is soon gone, whatever the
    // account.
    let mut refused_by_ip = None;
    for i in 0..20 {
        let a = attempt(&app, attacker, &format!("victim{i}@example.com"), "x").await;
        if a.refused_by.as_deref() == Some("login_ip") {
            refused_by_ip = Some(i);
            assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS);
            break;
        }
        assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(refused_by_ip, Some(11), "9 earlier attempts + 11 = 20");
    // Even with the right password, from that IP.
    let blocked = attempt(&app, attacker, alice, axum_login::PASSWORD).await;
    assert_eq!(blocked.refused_by.as_deref(), Some("login_ip"));
    // The user, elsewhere, is not affected.
    let ok = attempt(&app, user, alice, axum_login::PASSWORD).await;
    assert_eq!(ok.status, StatusCode::OK);
}

#[tokio::test]
async fn memory_backend() {
    let clock = MockClock::new();
    brute_force_is_cut_off_and_the_user_gets_in(MemoryBackend::with_clock(clock.clone()), clock)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_backend() {
    let Some(url) = RedisServer::shared_url() else {
        return;
    };
    let clock = MockClock::new();
    let backend = RedisBackend::builder(url)
        .prefix("axum-login-test")
        .caller_time(clock.clone())
        // Redis expires keys on its own clock; keep them for the test.
        .min_ttl(Duration::from_secs(3600))
        .build()
        .await
        .unwrap();
    brute_force_is_cut_off_and_the_user_gets_in(backend, clock).await;
}

#[tokio::test]
async fn a_dead_counter_refuses_logins() {
    let backend = MemoryBackend::new();
    backend.set_failing(true);
    let app = app(backend);
    let a = attempt(
        &app,
        "198.51.100.7",
        axum_login::EMAIL,
        axum_login::PASSWORD,
    )
    .await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn a_login_without_an_email_is_a_bad_request() {
    let app = app(MemoryBackend::new());
    let a = attempt(&app, "198.51.100.7", "not an email", "x").await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
}

/// Explicit reports (`LoginAttempts`) count on Redis as on memory: the
/// same account however the email is written, cleared by a success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_reports_on_redis() {
    use tollgate_tower::login::LoginAttempts;

    let Some(url) = RedisServer::shared_url() else {
        return;
    };
    let clock = MockClock::new();
    let backend = RedisBackend::builder(url)
        .prefix("axum-login-explicit")
        .caller_time(clock.clone())
        .min_ttl(Duration::from_secs(3600))
        .build()
        .await
        .unwrap();
    let config = axum_login::limits().unwrap();
    let attempts = LoginAttempts::new(
        config
            .limiter("login_account")
            .unwrap()
            .build(backend.clone()),
        hasher(),
    );
    for _ in 0..5 {
        assert!(attempts.failed("bob@example.com").await.is_allowed());
    }
    let sixth = attempts.failed(" Bob@Example.com").await;
    assert!(!sixth.is_allowed());
    assert_eq!(
        sixth.decision().unwrap().retry_after(),
        Duration::from_secs(1)
    );
    assert!(!attempts.check("bob@example.com").await.is_allowed());
    // Redis never holds the address.
    let key = backend.state_key("login_account", &hasher().email("bob@example.com"));
    assert!(!key.contains("bob"), "{key}");
    clock.advance(Duration::from_secs(1));
    assert!(attempts.check("bob@example.com").await.is_allowed());
    attempts.succeeded("bob@example.com").await.unwrap();
    assert_eq!(
        attempts
            .check("bob@example.com")
            .await
            .decision()
            .unwrap()
            .remaining(),
        5
    );
}
