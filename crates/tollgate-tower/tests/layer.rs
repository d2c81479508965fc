//! The layer in front of a plain tower service, with the memory backend
//! on a mock clock (and tokio's paused clock for timeouts).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, Request, Response, StatusCode};
use http_body_util::BodyExt;
use tollgate_limiter::{
    Calendar, Composite, FailMode, Key, Limiter, MockClock, Period, Policy, ProgressiveDelay,
    SlidingWindow, TokenBucket,
};
use tollgate_memory::MemoryBackend;
use tollgate_tower::extract::{ApiKey, ClientIp, KeyHasher, PeerAddr};
use tollgate_tower::respond::{Grpc, Http, Refusal};
use tollgate_tower::{MissingKey, Outcome, RateLimitLayer, ResponseBody};
use tower::{Layer, Service, ServiceExt, service_fn};

type Res = Response<ResponseBody<String>>;

/// A service answering the status in the `x-status` header (200 without
/// one), counting its calls.
#[derive(Clone, Default)]
struct Echo {
    calls: Arc<AtomicUsize>,
}

impl Echo {
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn service(
        &self,
    ) -> impl Service<Request<String>, Response = Response<String>, Error = Infallible, Future: Send>
    + Clone
    + Send
    + use<> {
        let calls = Arc::clone(&self.calls);
        service_fn(move |req: Request<String>| {
            calls.fetch_add(1, Ordering::SeqCst);
            let status = req
                .headers()
                .get("x-status")
                .and_then(|v| v.to_str().ok()?.parse::<u16>().ok())
                .unwrap_or(200);
            let mut res = Response::new(format!("echo {}", req.into_body()));
            *res.status_mut() = StatusCode::from_u16(status).unwrap();
            async move { Ok::<_, Infallible>(res) }
        })
    }
}

fn req(key: Option<&str>) -> Request<String> {
    let mut b = Request::builder();
    if let Some(k) = key {
        b = b.header("authorization", format!("Bearer {k}"));
    }
    b.body(String::new()).unwrap()
}

async fn call<S>(svc: &S, req: Request<String>) -> Res
where
    S: Service<Request<String>, Response = Res, Error = Infallible> + Clone,
{
    svc.clone().oneshot(req).await.unwrap()
}

async fn body(res: Res) -> String {
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn header<'a>(res: &'a Res, name: &str) -> Vec<&'a str> {
    res.headers()
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect()
}

fn bucket(capacity: u64, per: Duration) -> TokenBucket {
    TokenBucket::new(capacity, capacity, per).unwrap()
}

#[tokio::test]
async fn refuses_with_429_retry_after_and_ietf_fields() {
    let clock = MockClock::new();
    let backend = MemoryBackend::with_clock(clock.clone());
    // 2 tokens, one back every 30 s.
    let limiter = Limiter::new(
        "api",
        TokenBucket::new(2, 1, Duration::from_secs(30)).unwrap(),
        backend,
    );
    let echo = Echo::default();
    let svc =
        RateLimitLayer::new(limiter, ApiKey::bearer(KeyHasher::unkeyed())).layer(echo.service());

    let first = call(&svc, req(Some("k"))).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(header(&first, "ratelimit-policy"), ["\"api\";q=2;w=60"]);
    assert_eq!(header(&first, "ratelimit"), ["\"api\";r=1;t=30"]);
    assert!(header(&first, "retry-after").is_empty());
    assert_eq!(body(first).await, "echo ");

    assert_eq!(call(&svc, req(Some("k"))).await.status(), StatusCode::OK);

    clock.advance(Duration::from_millis(500));
    let refused = call(&svc, req(Some("k"))).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    // 29.5 s to wait: rounded up, and equal to the announced t.
    assert_eq!(header(&refused, "retry-after"), ["30"]);
    assert_eq!(header(&refused, "ratelimit"), ["\"api\";r=0;t=30"]);
    assert_eq!(
        header(&refused, "content-type"),
        ["application/problem+json"]
    );
    let problem: serde_json::Value = serde_json::from_str(&body(refused).await).unwrap();
    assert_eq!(
        problem["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(problem["status"], 429);
    assert_eq!(problem["violated-policies"][0], "api");
    assert_eq!(
        echo.calls(),
        2,
        "a refused request never reaches the service"
    );

    // Other keys are not affected; the key recovers once a token is back.
    assert_eq!(
        call(&svc, req(Some("other"))).await.status(),
        StatusCode::OK
    );
    clock.advance(Duration::from_millis(29_500));
    assert_eq!(call(&svc, req(Some("k"))).await.status(), StatusCode::OK);
}

/// A composite limiter: every part in `RateLimit-Policy`, the binding one in
/// `RateLimit`, `Retry-After` the latest refusal, and a refusal by the
/// window leaves the bucket's tokens alone (stacked layers would not).
#[tokio::test]
async fn a_composite_answers_with_every_part_and_charges_nothing_on_refusal() {
    let clock = MockClock::new();
    let backend = MemoryBackend::with_clock(clock.clone());
    let policy = Composite::new([
        Policy::from(TokenBucket::new(3, 1, Duration::from_secs(10)).unwrap()),
        Policy::from(SlidingWindow::new(2, Duration::from_secs(3600)).unwrap()),
    ])
    .unwrap();
    let limiter = Limiter::new("plan", policy, backend);
    let echo = Echo::default();
    let svc = RateLimitLayer::new(limiter.clone(), ApiKey::bearer(KeyHasher::unkeyed()))
        .layer(echo.service());

    let first = call(&svc, req(Some("k"))).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(
        header(&first, "ratelimit-policy"),
        ["\"plan.0\";q=3;w=30, \"plan.1\";q=2;w=3600"]
    );
    // The window has 1 left, the bucket 2: the window binds.
    assert_eq!(header(&first, "ratelimit"), ["\"plan.1\";r=1;t=3600"]);
    assert_eq!(call(&svc, req(Some("k"))).await.status(), StatusCode::OK);
    for _ in 0..3 {
        let refused = call(&svc, req(Some("k"))).await;
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(header(&refused, "retry-after"), ["3600"]);
        assert_eq!(header(&refused, "ratelimit"), ["\"plan.1\";r=0;t=3600"]);
        assert!(
            body(refused)
                .await
                .contains("\"violated-policies\":[\"plan.1\"]")
        );
    }
    assert_eq!(echo.calls(), 2);
    // The bucket lost only the two admitted tokens.
    let bucket_only = Composite::new([Policy::from(
        TokenBucket::new(3, 1, Duration::from_secs(10)).unwrap(),
    )])
    .unwrap();
    limiter
        .set_override(None, Some(bucket_only.into()))
        .await
        .unwrap();
    let res = call(&svc, req(Some("k"))).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "ratelimit"), ["\"plan.0\";r=0;t=30"]);
}

/// A monthly quota in Berlin: `w` is the current month's length (28 days
/// in February, 31 days less the daylight-saving hour in March), and `t`
/// and `Retry-After` point at the next boundary, Berlin midnight.
#[tokio::test]
async fn a_calendar_quota_resets_at_the_boundary() {
    // Saturday 28 February 2026, 23:00 in Berlin (22:00 UTC).
    let clock = MockClock::starting_at(1_772_316_000_000_000);
    let backend = MemoryBackend::with_clock(clock.clone());
    let month = Calendar::new(2, Period::Month, "Europe/Berlin").unwrap();
    let limiter = Limiter::new("plan", month, backend.clone());
    let svc = RateLimitLayer::new(limiter, ApiKey::bearer(KeyHasher::unkeyed()))
        .layer(Echo::default().service());

    let first = call(&svc, req(Some("k"))).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(
        header(&first, "ratelimit-policy"),
        ["\"plan\";q=2;w=2419200"]
    );
    assert_eq!(header(&first, "ratelimit"), ["\"plan\";r=1;t=3600"]);
    assert_eq!(call(&svc, req(Some("k"))).await.status(), StatusCode::OK);
    clock.advance(Duration::from_secs(1800));
    let refused = call(&svc, req(Some("k"))).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&refused, "retry-after"), ["1800"]);
    assert_eq!(header(&refused, "ratelimit"), ["\"plan\";r=0;t=1800"]);
    clock.advance(Duration::from_secs(1800));
    let march = call(&svc, req(Some("k"))).await;
    assert_eq!(march.status(), StatusCode::OK);
    let w = 31 * 86_400 - 3600;
    assert_eq!(
        header(&march, "ratelimit-policy"),
        [format!("\"plan\";q=2;w={w}")]
    );
    assert_eq!(header(&march, "ratelimit"), [format!("\"plan\";r=1;t={w}")]);

    // 10 a second AND 2 a month: the month binds and names its part.
    let both = Composite::new([
        Policy::from(bucket(10, Duration::from_secs(1))),
        month.into(),
    ])
    .unwrap();
    let svc = RateLimitLayer::new(
        Limiter::new("api", both, backend),
        ApiKey::bearer(KeyHasher::unkeyed()),
    )
    .layer(Echo::default().service());
    let res = call(&svc, req(Some("k"))).await;
    assert_eq!(
        header(&res, "ratelimit-policy"),
        [format!("\"api.0\";q=10;w=1, \"api.1\";q=2;w={w}")]
    );
    assert_eq!(header(&res, "ratelimit"), [format!("\"api.1\";r=1;t={w}")]);
    assert_eq!(call(&svc, req(Some("k"))).await.status(), StatusCode::OK);
    let refused = call(&svc, req(Some("k"))).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&refused, "retry-after"), [w.to_string()]);
}

#[tokio::test]
async fn retry_after_is_never_zero() {
    let clock = MockClock::new();
    let backend = MemoryBackend::with_clock(clock.clone());
    let limiter = Limiter::new("fast", TokenBucket::per_second(1, 1000).unwrap(), backend);
    let svc = RateLimitLayer::new(limiter, ApiKey::bearer(KeyHasher::unkeyed()))
        .layer(Echo::default().service());
    assert_eq!(call(&svc, req(Some("k"))).await.status(), StatusCode::OK);
    let refused = call(&svc, req(Some("k"))).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&refused, "retry-after"), ["1"]);
}

#[tokio::test]
async fn headers_on_allowed_can_be_turned_off() {
    let limiter = Limiter::new(
        "api",
        bucket(5, Duration::from_secs(1)),
        MemoryBackend::new(),
    );
    let svc = RateLimitLayer::new(limiter, ApiKey::bearer(KeyHasher::unkeyed()))
        .responder(Http::new().headers_on_allowed(false))
        .layer(Echo::default().service());
    let res = call(&svc, req(Some("k"))).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.headers().get("ratelimit").is_none());
    assert!(res.headers().get("ratelimit-policy").is_none());
}

#[tokio::test]
async fn fail_closed_answers_503_apart_from_429_and_fail_open_passes() {
    let backend = MemoryBackend::new();
    let closed = Limiter::new("closed", bucket(5, Duration::from_secs(1)), backend.clone());
    let open = Limiter::builder("open", bucket(5, Duration::from_secs(1)), backend.clone())
        .fail_mode(FailMode::Open)
        .build();
    let echo = Echo::default();
    let closed_svc =
        RateLimitLayer::new(closed, ApiKey::bearer(KeyHasher::unkeyed())).layer(echo.service());
    let open_svc =
        RateLimitLayer::new(open, ApiKey::bearer(KeyHasher::unkeyed())).layer(echo.service());

    backend.set_failing(true);
    let res = call(&closed_svc, req(Some("k"))).await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(&res, "retry-after"), ["1"]);
    assert!(res.headers().get("ratelimit").is_none());
    let problem: serde_json::Value = serde_json::from_str(&body(res).await).unwrap();
    assert_eq!(problem["status"], 503);
    assert_ne!(
        problem["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(echo.calls(), 0);

    let res = call(&open_svc, req(Some("k"))).await;
    assert_eq!(res.status(), StatusCode::OK);
    // No decision was made: no figures to announce.
    assert!(res.headers().get("ratelimit").is_none());
    assert_eq!(echo.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_slow_backend_times_out_into_the_fail_mode() {
    let backend = MemoryBackend::new();
    let limiter = Limiter::builder("slow", bucket(5, Duration::from_secs(1)), backend.clone())
        .timeout(Duration::from_millis(20))
        .build();
    let svc = RateLimitLayer::new(limiter, ApiKey::bearer(KeyHasher::unkeyed()))
        .layer(Echo::default().service());
    backend.set_delay(Duration::from_secs(1));
    let res = call(&svc, req(Some("k"))).await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    backend.clear_faults();
    let res = call(&svc, req(Some("k"))).await;
    assert_eq!(res.status(), StatusCode::OK);
}

#[tokio::test]
async fn missing_key_policies() {
    let backend = MemoryBackend::new();
    let closed = Limiter::new(
        "closed",
        bucket(2, Duration::from_secs(60)),
        backend.clone(),
    );
    let open = Limiter::builder("open", bucket(2, Duration::from_secs(60)), backend.clone())
        .fail_mode(FailMode::Open)
        .build();
    let echo = Echo::default();

    // Default: reject with 400.
    let svc = RateLimitLayer::new(open.clone(), ApiKey::bearer(KeyHasher::unkeyed()))
        .layer(echo.service());
    let res = call(&svc, req(None)).await;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_eq!(header(&res, "content-type"), ["application/problem+json"]);

    // Allow on a fail-open limiter: through, uncounted.
    let svc = RateLimitLayer::new(open, ApiKey::bearer(KeyHasher::unkeyed()))
        .on_missing_key(MissingKey::Allow)
        .layer(echo.service());
    for _ in 0..5 {
        assert_eq!(call(&svc, req(None)).await.status(), StatusCode::OK);
    }

    // Allow on a fail-closed limiter: still rejected.
    let svc = RateLimitLayer::new(closed.clone(), ApiKey::bearer(KeyHasher::unkeyed()))
        .on_missing_key(MissingKey::Allow)
        .layer(echo.service());
    assert_eq!(
        call(&svc, req(None)).await.status(),
        StatusCode::BAD_REQUEST
    );

    // Fallback: every keyless request shares one budget, even when the
    // backend fails (the limiter's fail mode still applies).
    let svc = RateLimitLayer::new(closed, ApiKey::bearer(KeyHasher::unkeyed()))
        .on_missing_key(MissingKey::Fallback(Key::new("anonymous")))
        .layer(echo.service());
    assert_eq!(call(&svc, req(None)).await.status(), StatusCode::OK);
    assert_eq!(call(&svc, req(None)).await.status(), StatusCode::OK);
    assert_eq!(
        call(&svc, req(None)).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(call(&svc, req(Some("k"))).await.status(), StatusCode::OK);
    backend.set_failing(true);
    assert_eq!(
        call(&svc, req(None)).await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(echo.calls(), 5 + 3);
}

/// Without a cost of its own, the layer charges the limiter's: `cost` in
/// configuration (it charged 1 a request, whatever was configured).
#[tokio::test]
async fn the_configured_cost_is_charged() {
    let config = tollgate_limiter::Config::builder()
        .toml_str(
            "[limiters.export]\nstrategy = \"token_bucket\"\ncapacity = 10\nrefill = \"10/m\"\ncost = 4",
        )
        .load()
        .unwrap();
    let limiter = config
        .limiter("export")
        .unwrap()
        .build(MemoryBackend::new());
    assert_eq!(limiter.cost(), 4);
    let svc = RateLimitLayer::new(limiter, ApiKey::bearer(KeyHasher::unkeyed()))
        .layer(Echo::default().service());
    let res = call(&svc, req(Some("k"))).await;
    assert_eq!(header(&res, "ratelimit"), ["\"export\";r=6;t=24"]);
    assert_eq!(call(&svc, req(Some("k"))).await.status(), StatusCode::OK);
    // 2 left: a request of 4 waits.
    assert_eq!(
        call(&svc, req(Some("k"))).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn cost_from_a_closure() {
    let limiter = Limiter::new(
        "llm",
        bucket(10, Duration::from_secs(60)),
        MemoryBackend::new(),
    );
    let svc = RateLimitLayer::new(limiter, ApiKey::bearer(KeyHasher::unkeyed()))
        .cost(|req: &Request<String>| {
            req.headers()
                .get("x-tokens")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        })
        .layer(Echo::default().service());
    let weighted = |n: u64| {
        let mut r = req(Some("k"));
        r.headers_mut().insert("x-tokens", n.into());
        r
    };
    let res = call(&svc, weighted(7)).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "ratelimit"), ["\"llm\";r=3;t=42"]);
    assert_eq!(
        call(&svc, weighted(4)).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(call(&svc, weighted(3)).await.status(), StatusCode::OK);
    // A cost no policy can grant is refused, never let through, and told
    // apart from a limit (no Retry-After: waiting will not help) and from a
    // backend failure.
    let res = call(&svc, weighted(11)).await;
    assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert!(res.headers().get("retry-after").is_none());
}

#[tokio::test]
async fn per_role_quotas_from_a_resolver() {
    let backend = MemoryBackend::new();
    let free = Limiter::new(
        "api_free",
        bucket(1, Duration::from_secs(60)),
        backend.clone(),
    );
    let pro = Limiter::new("api_pro", bucket(3, Duration::from_secs(60)), backend);
    let svc = RateLimitLayer::per_request(
        move |req: &Request<String>| {
            if req.headers().get("x-plan").is_some_and(|v| v == "pro") {
                pro.clone()
            } else {
                free.clone()
            }
        },
        ApiKey::bearer(KeyHasher::unkeyed()),
    )
    .layer(Echo::default().service());
    let pro_req = || {
        let mut r = req(Some("p"));
        r.headers_mut().insert("x-plan", "pro".parse().unwrap());
        r
    };
    assert_eq!(call(&svc, req(Some("f"))).await.status(), StatusCode::OK);
    assert_eq!(
        call(&svc, req(Some("f"))).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    for _ in 0..3 {
        let res = call(&svc, pro_req()).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert!(header(&res, "ratelimit-policy")[0].starts_with("\"api_pro\";q=3"));
    }
    assert_eq!(
        call(&svc, pro_req()).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn stacked_layers_count_per_ip_and_per_key() {
    let backend = MemoryBackend::new();
    let per_ip = Limiter::new("ip", bucket(3, Duration::from_secs(60)), backend.clone());
    let per_key = Limiter::new("key", bucket(2, Duration::from_secs(60)), backend);
    let svc = tower::ServiceBuilder::new()
        .layer(RateLimitLayer::new(per_ip, ClientIp::new()))
        .layer(RateLimitLayer::new(
            per_key,
            ApiKey::bearer(KeyHasher::unkeyed()),
        ))
        .service(Echo::default().service());
    let from = |ip: &str, key: &str| {
        let mut r = req(Some(key));
        r.extensions_mut()
            .insert(PeerAddr(format!("{ip}:1000").parse().unwrap()));
        r
    };
    let call2 = |r| {
        let svc = svc.clone();
        async move { svc.oneshot(r).await.unwrap() }
    };
    let res = call2(from("192.0.2.1", "a")).await;
    assert_eq!(res.status(), StatusCode::OK);
    // Both policies are announced, the inner layer's first, as one list
    // on one line per field.
    let fields: Vec<_> = res.headers().get_all("ratelimit").iter().collect();
    assert_eq!(fields, ["\"key\";r=1;t=30, \"ip\";r=2;t=20"]);
    let policies: Vec<_> = res.headers().get_all("ratelimit-policy").iter().collect();
    assert_eq!(policies, ["\"key\";q=2;w=60, \"ip\";q=3;w=60"]);
    assert_eq!(call2(from("192.0.2.1", "a")).await.status(), StatusCode::OK);
    // The key is spent...
    assert_eq!(
        call2(from("192.0.2.1", "a")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // ...and so is the IP, whatever the key.
    let res = call2(from("192.0.2.1", "b")).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(
        res.headers()
            .get("ratelimit")
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("\"ip\"")
    );
    assert_eq!(call2(from("192.0.2.2", "b")).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn server_errors_can_be_left_uncounted() {
    let limiter = Limiter::new(
        "api",
        bucket(2, Duration::from_secs(60)),
        MemoryBackend::new(),
    );
    let svc = RateLimitLayer::new(limiter, ApiKey::bearer(KeyHasher::unkeyed()))
        .classify(|res: &Response<String>| {
            if res.status().is_server_error() {
                Outcome::Ignore
            } else {
                Outcome::Count
            }
        })
        .layer(Echo::default().service());
    let failing = || {
        let mut r = req(Some("k"));
        r.headers_mut().insert("x-status", 500.into());
        r
    };
    for _ in 0..5 {
        assert_eq!(
            call(&svc, failing()).await.status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }
    let res = call(&svc, req(Some("k"))).await;
    assert_eq!(res.status(), StatusCode::OK);
    // The figures are the charge's, taken before the response was returned.
    assert_eq!(header(&res, "ratelimit"), ["\"api\";r=1;t=30"]);
    assert_eq!(call(&svc, req(Some("k"))).await.status(), StatusCode::OK);
    assert_eq!(
        call(&svc, req(Some("k"))).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn only_failures_count_and_success_resets() {
    // Login protection: failures delay the account, a success clears it.
    let clock = MockClock::new();
    let backend = MemoryBackend::with_clock(clock.clone());
    let policy = ProgressiveDelay::new(
        2,
        Duration::from_secs(10),
        2,
        Duration::from_secs(300),
        Duration::from_secs(900),
    )
    .unwrap();
    let limiter = Limiter::new("login", policy, backend);
    let echo = Echo::default();
    let svc = RateLimitLayer::new(limiter, ApiKey::bearer(KeyHasher::unkeyed()))
        .classify(|res: &Response<String>| match res.status() {
            StatusCode::UNAUTHORIZED => Outcome::Count,
            s if s.is_success() => Outcome::Reset,
            _ => Outcome::Ignore,
        })
        .layer(echo.service());
    let attempt = |ok: bool| {
        let mut r = req(Some("alice"));
        if !ok {
            r.headers_mut().insert("x-status", 401.into());
        }
        r
    };
    // Two free failures, then the third blocks the account for 10 s.
    for _ in 0..3 {
        assert_eq!(
            call(&svc, attempt(false)).await.status(),
            StatusCode::UNAUTHORIZED
        );
    }
    let blocked = call(&svc, attempt(true)).await;
    assert_eq!(blocked.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&blocked, "retry-after"), ["10"]);
    assert_eq!(echo.calls(), 3);
    clock.advance(Duration::from_secs(10));
    assert_eq!(call(&svc, attempt(true)).await.status(), StatusCode::OK);
    // The success forgot the failures: two free ones again.
    for _ in 0..3 {
        assert_eq!(
            call(&svc, attempt(false)).await.status(),
            StatusCode::UNAUTHORIZED
        );
    }
    assert_eq!(
        call(&svc, attempt(false)).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn custom_refusal_hook_keeps_the_standard_headers() {
    let limiter = Limiter::new(
        "api",
        SlidingWindow::new(1, Duration::from_secs(60)).unwrap(),
        MemoryBackend::new(),
    );
    let svc = RateLimitLayer::new(limiter, ApiKey::bearer(KeyHasher::unkeyed()))
        .responder(Http::new().on_refusal(|refusal: &Refusal<'_>| {
            let mut res = Response::new(Bytes::from(format!("slow down ({})", refusal.limiter())));
            *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            res
        }))
        .layer(Echo::default().service());
    assert_eq!(call(&svc, req(Some("k"))).await.status(), StatusCode::OK);
    let res = call(&svc, req(Some("k"))).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "retry-after"), ["60"]);
    assert_eq!(header(&res, "ratelimit"), ["\"api\";r=0;t=60"]);
    assert_eq!(body(res).await, "slow down (api)");
}

#[tokio::test]
async fn grpc_refusals_are_statuses_with_retry_metadata() {
    let backend = MemoryBackend::new();
    let limiter = Limiter::new(
        "rpc",
        SlidingWindow::new(1, Duration::from_secs(5)).unwrap(),
        backend.clone(),
    );
    let svc = RateLimitLayer::new(limiter, ApiKey::bearer(KeyHasher::unkeyed()))
        .responder(Grpc::new())
        .layer(Echo::default().service());
    assert_eq!(call(&svc, req(Some("k"))).await.status(), StatusCode::OK);
    let res = call(&svc, req(Some("k"))).await;
    // gRPC carries its status in headers of an HTTP 200.
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "content-type"), ["application/grpc"]);
    assert_eq!(header(&res, "grpc-status"), ["8"]);
    assert_eq!(header(&res, "retry-after"), ["5"]);
    assert_eq!(header(&res, "grpc-retry-pushback-ms"), ["5000"]);
    assert!(
        res.headers()
            .contains_key(HeaderName::from_static("grpc-status-details-bin"))
    );

    backend.set_failing(true);
    let res = call(&svc, req(Some("k"))).await;
    assert_eq!(header(&res, "grpc-status"), ["14"]);
    let res = call(&svc, req(None)).await;
    assert_eq!(header(&res, "grpc-status"), ["3"]);
}

#[tokio::test]
async fn clones_of_the_layer_share_limits() {
    let limiter = Limiter::new(
        "api",
        bucket(2, Duration::from_secs(60)),
        MemoryBackend::new(),
    );
    let layer = RateLimitLayer::new(limiter, ApiKey::bearer(KeyHasher::unkeyed()));
    let a = layer.clone().layer(Echo::default().service());
    let b = layer.layer(Echo::default().service());
    assert_eq!(call(&a, req(Some("k"))).await.status(), StatusCode::OK);
    assert_eq!(call(&b, req(Some("k"))).await.status(), StatusCode::OK);
    assert_eq!(
        call(&a, req(Some("k"))).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test(start_paused = true)]
async fn a_charge_in_flight_survives_the_client_going_away() {
    let backend = MemoryBackend::new();
    let limiter = Limiter::new(
        "login",
        SlidingWindow::new(1, Duration::from_secs(60)).unwrap(),
        backend.clone(),
    );
    let svc = RateLimitLayer::new(limiter, ApiKey::bearer(KeyHasher::unkeyed()))
        .classify(|_: &Response<String>| Outcome::Count)
        .layer(Echo::default().service());
    // Each backend call takes 10 ms: the check ends at 10 ms, the charge
    // would end at 20 ms, and the client is gone at 15 ms.
    backend.set_delay(Duration::from_millis(10));
    let gone = tokio::time::timeout(
        Duration::from_millis(15),
        svc.clone().oneshot(req(Some("k"))),
    )
    .await;
    assert!(gone.is_err(), "the request was still being charged");
    tokio::time::sleep(Duration::from_millis(20)).await;
    backend.clear_faults();
    assert_eq!(
        call(&svc, req(Some("k"))).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// Counting by outcome charges after the response; a client that drops
/// each request once it has passed the check (its work started) and
/// before the answer must still be charged, or it is never counted.
#[tokio::test(start_paused = true)]
async fn a_request_dropped_before_its_response_is_charged() {
    let limiter = Limiter::new(
        "api",
        SlidingWindow::new(1, Duration::from_secs(60)).unwrap(),
        MemoryBackend::new(),
    );
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    // Answers after a second of work.
    let slow = service_fn(move |_req: Request<String>| {
        counted.fetch_add(1, Ordering::SeqCst);
        async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok::<_, Infallible>(Response::new(String::new()))
        }
    });
    let svc = RateLimitLayer::new(limiter, ApiKey::bearer(KeyHasher::unkeyed()))
        .classify(|_: &Response<String>| Outcome::Count)
        .layer(slow);
    let gone = tokio::time::timeout(
        Duration::from_millis(100),
        svc.clone().oneshot(req(Some("k"))),
    )
    .await;
    assert!(gone.is_err(), "the request was answered before the drop");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // The charge runs in a task of its own.
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        call(&svc, req(Some("k"))).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// The tokens a call really used, put in the response by the service.
#[derive(Clone, Copy)]
struct Used(u64);

#[tokio::test]
async fn reserve_then_settle_from_the_response() {
    let backend = MemoryBackend::new();
    let limiter = Limiter::builder(
        "llm",
        TokenBucket::new(100, 1, Duration::from_secs(60)).unwrap(),
        backend.clone(),
    )
    .fail_mode(FailMode::Open)
    .build();
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    // Reports the usage the request asks for (`x-used`), if any.
    let model = service_fn(move |req: Request<String>| {
        counted.fetch_add(1, Ordering::SeqCst);
        let used = req
            .headers()
            .get("x-used")
            .and_then(|v| v.to_str().ok()?.parse().ok());
        let mut res = Response::new(String::from("completion"));
        if let Some(n) = used {
            res.extensions_mut().insert(Used(n));
        }
        async move { Ok::<_, Infallible>(res) }
    });
    let svc = RateLimitLayer::new(limiter.clone(), ApiKey::bearer(KeyHasher::unkeyed()))
        .cost(|req: &Request<String>| {
            req.headers()
                .get("x-estimate")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        })
        .settle(|res: &Response<String>| res.extensions().get::<Used>().map(|u| u.0))
        .layer(model);
    let ask = |estimate: u64, used: Option<u64>| {
        let mut r = req(Some("k"));
        r.headers_mut().insert("x-estimate", estimate.into());
        if let Some(n) = used {
            r.headers_mut().insert("x-used", n.into());
        }
        r
    };
    let key = ApiKey::bearer(KeyHasher::unkeyed());
    let key = tollgate_tower::extract::KeyExtractor::extract(&key, &req(Some("k"))).unwrap();
    let left = || async { limiter.try_peek(&key, 1).await.unwrap().remaining() };

    // 80 reserved, 30 used: 50 come back, and the fields say so.
    let res = call(&svc, ask(80, Some(30))).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(left().await, 70);
    assert!(header(&res, "ratelimit")[0].starts_with("\"llm\";r=70;"));
    // An estimate that does not fit is refused before the model is called.
    assert_eq!(
        call(&svc, ask(80, Some(1))).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // No usage reported: the whole estimate stays charged.
    assert_eq!(call(&svc, ask(60, None)).await.status(), StatusCode::OK);
    assert_eq!(left().await, 10);
    // More than estimated: the excess is charged too.
    assert_eq!(call(&svc, ask(5, Some(9))).await.status(), StatusCode::OK);
    assert_eq!(left().await, 1);
    // Fail-open without the backend: the call passes, and its settle has
    // nothing to give back.
    backend.fail_next(1);
    assert_eq!(call(&svc, ask(1, Some(0))).await.status(), StatusCode::OK);
    assert_eq!(left().await, 1);
}

/// A window that penalises refusals records every refused request, and a
/// layer that charges by outcome looks before (a look records nothing):
/// its refusals must be recorded all the same, or a client hammering a
/// login endpoint is let in again as soon as its first requests leave the
/// window, where `penalise_refused` keeps it out while it hammers.
#[tokio::test]
async fn a_penalised_window_records_refusals_when_charging_by_outcome() {
    let clock = MockClock::new();
    let backend = MemoryBackend::with_clock(clock.clone());
    let window = SlidingWindow::new(2, Duration::from_secs(10))
        .unwrap()
        .penalise_refused(true);
    let upfront = RateLimitLayer::new(
        Limiter::new("upfront", window, backend.clone()),
        ApiKey::bearer(KeyHasher::unkeyed()),
    )
    .layer(Echo::default().service());
    let by_outcome = RateLimitLayer::new(
        Limiter::new("by_outcome", window, backend),
        ApiKey::bearer(KeyHasher::unkeyed()),
    )
    .classify(|_: &Response<String>| Outcome::Count)
    .layer(Echo::default().service());
    // Two pass at 0 s, then one request a second is refused until 9 s.
    for t in 0..10 {
        let want = if t == 0 {
            StatusCode::OK
        } else {
            StatusCode::TOO_MANY_REQUESTS
        };
        for _ in 0..if t == 0 { 2 } else { 1 } {
            assert_eq!(call(&upfront, req(Some("k"))).await.status(), want);
            assert_eq!(
                call(&by_outcome, req(Some("k"))).await.status(),
                want,
                "{t} s"
            );
        }
        clock.advance(Duration::from_secs(1));
    }
    // 10 s: the two admitted requests have left the window, the refused
    // ones have not: still refused, with either layer.
    assert_eq!(
        call(&upfront, req(Some("k"))).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        call(&by_outcome, req(Some("k"))).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// Counting by outcome looks, then records a refusal of a penalised
/// window in a second call. A client gone between the two (its request
/// future dropped once the look has answered) is still recorded, as an
/// upfront layer records it in its one call. Before, the recording call
/// went with the dropped future: a flood that hung up on each request
/// escaped the penalty meant for it.
#[tokio::test(start_paused = true)]
async fn a_penalised_refusal_is_recorded_when_the_client_goes_after_the_look() {
    let clock = MockClock::new();
    let backend = MemoryBackend::with_clock(clock.clone());
    let window = SlidingWindow::new(1, Duration::from_secs(60))
        .unwrap()
        .penalise_refused(true);
    let svc = RateLimitLayer::new(
        Limiter::new("by_outcome", window, backend.clone()),
        ApiKey::bearer(KeyHasher::unkeyed()),
    )
    .classify(|_: &Response<String>| Outcome::Count)
    .layer(Echo::default().service());
    assert_eq!(call(&svc, req(Some("k"))).await.status(), StatusCode::OK);
    clock.advance(Duration::from_secs(30));
    // Every backend call takes 10 ms: the look answers at 10 ms, the
    // recording call at 20; the client is gone at 15.
    backend.set_delay(Duration::from_millis(10));
    let gone = tokio::time::timeout(
        Duration::from_millis(15),
        svc.clone().oneshot(req(Some("k"))),
    )
    .await;
    assert!(gone.is_err(), "answered before the client went");
    tokio::time::sleep(Duration::from_millis(100)).await;
    backend.clear_faults();
    // 61 s: the admitted request has left the window, the refusal
    // recorded at 30 s has not.
    clock.advance(Duration::from_secs(31));
    assert_eq!(
        call(&svc, req(Some("k"))).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// Shadow mode never refuses, and a whole deployment is put in it for a
/// first rollout in front of a service: a request without a key (an
/// extractor that does not fit every client yet) passes, as a refusal by
/// the limit does, with what enforcement would have answered in its
/// extensions, instead of a 400 from a limiter that was to refuse nothing.
#[tokio::test]
async fn shadow_mode_lets_a_request_without_a_key_pass() {
    let shadow = Limiter::builder(
        "shadow",
        bucket(2, Duration::from_secs(60)),
        MemoryBackend::new(),
    )
    .mode(tollgate_limiter::Mode::Shadow)
    .build();
    let echo = Echo::default();
    let svc =
        RateLimitLayer::new(shadow, ApiKey::bearer(KeyHasher::unkeyed())).layer(echo.service());
    let res = call(&svc, req(None)).await;
    assert_eq!(res.status(), StatusCode::OK);
    let shadowed = res
        .extensions()
        .get::<tollgate_tower::respond::ShadowRefusal>()
        .expect("what enforcement would have answered");
    assert_eq!(shadowed.limiter, "shadow");
    assert_eq!(shadowed.decision, None);
    assert!(header(&res, "ratelimit").is_empty());
    assert_eq!(echo.calls(), 1);
}

/// A layer that charges by outcome charges an `Err` of the inner service
/// (a timeout layer inside it) as `Classify::on_error` says, by default as
/// a counted response: otherwise every request a client makes slow enough
/// to time out is free.
#[tokio::test]
async fn an_inner_error_is_charged_when_charging_by_outcome() {
    let limiter = Limiter::new(
        "errs",
        bucket(2, Duration::from_secs(60)),
        MemoryBackend::new(),
    );
    let timed_out =
        service_fn(|_: Request<String>| async { Err::<Response<String>, _>("timed out") });
    let svc = RateLimitLayer::new(limiter.clone(), ApiKey::bearer(KeyHasher::unkeyed()))
        .classify(|_: &Response<String>| Outcome::Ignore)
        .layer(timed_out);
    for _ in 0..2 {
        assert!(svc.clone().oneshot(req(Some("k"))).await.is_err());
    }
    // Charged in tasks of their own: let them run.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let key = KeyHasher::unkeyed().secret("k");
    let left = limiter.peek(&key).await;
    assert!(!left.is_allowed(), "{left:?}");
    // A third request is refused before it reaches the service.
    let res = svc.clone().oneshot(req(Some("k"))).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// An IPv6 client holding a whole /48 (what many hosting providers give
/// away) has 65,536 /64s, each a fresh key of a per-/64 limit: the recipe
/// of docs/consumers.md ("A client with many addresses") stacks a looser
/// per-/48 limit behind it, which counts them together. Twenty /64s of one
/// /48 get the /48's 10, not 20 × 3. The per-/64 limit comes first, so one
/// /64 flooding on its own spends no more of its /48 than its own limit:
/// its neighbours in the /48 still get in.
#[tokio::test]
async fn a_client_rotating_its_64s_is_counted_by_its_48() {
    let backend = MemoryBackend::new();
    let hour = Duration::from_secs(3600);
    let per_64 = Limiter::new("ip", bucket(3, hour), backend.clone());
    let per_48 = Limiter::new("ip_net", bucket(10, hour), backend);
    let svc = tower::ServiceBuilder::new()
        .layer(RateLimitLayer::new(per_64, ClientIp::new()))
        .layer(RateLimitLayer::new(per_48, ClientIp::new().ipv6_prefix(48)))
        .service(Echo::default().service());
    let from = |ip: String| {
        let mut r = req(None);
        r.extensions_mut()
            .insert(PeerAddr(format!("[{ip}]:1000").parse().unwrap()));
        let svc = svc.clone();
        async move { svc.oneshot(r).await.unwrap().status() }
    };
    let mut admitted = 0;
    for net in 0..20 {
        for _ in 0..3 {
            admitted += usize::from(from(format!("2001:db8:7:{net:x}::1")).await == StatusCode::OK);
        }
    }
    assert_eq!(admitted, 10, "one /48, twenty /64s");

    // Another /48: one /64 floods, and is refused by its own limit.
    let mut flood = Vec::new();
    for _ in 0..50 {
        flood.push(from("2001:db8:8:1::1".into()).await);
    }
    assert!(flood[..3].iter().all(|s| *s == StatusCode::OK), "{flood:?}");
    assert!(
        flood[3..]
            .iter()
            .all(|s| *s == StatusCode::TOO_MANY_REQUESTS)
    );
    // Its /48 was charged its 3 admitted, not the 50: a neighbour gets in.
    assert_eq!(from("2001:db8:8:2::1".into()).await, StatusCode::OK);
}
