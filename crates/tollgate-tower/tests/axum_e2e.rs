//! End to end: a real axum server on a loopback port, real HTTP clients
//! (hyper's, and raw bytes for what a well-behaved client cannot send).

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate_limiter::{FailMode, Limiter, SlidingWindow, TokenBucket};
use tollgate_memory::MemoryBackend;
use tollgate_tower::extract::{ApiKey, ClientIp, FromBody, KeyHasher};
use tollgate_tower::{BufferBodyLayer, RateLimitLayer};

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

struct Answer {
    status: StatusCode,
    headers: http::HeaderMap,
    body: String,
}

async fn get_with(addr: SocketAddr, headers: &[(&str, &str)]) -> Answer {
    let mut b = Request::get(format!("http://{addr}/"));
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    send(b.body(Full::default()).unwrap()).await
}

async fn send(req: Request<Full<Bytes>>) -> Answer {
    let res = client().request(req).await.unwrap();
    let status = res.status();
    let headers = res.headers().clone();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// Sends raw bytes and returns the status line's code (0 if none came).
async fn raw(addr: SocketAddr, request: &[u8]) -> u16 {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "the server answers and closes");
    let text = String::from_utf8_lossy(&buf);
    text.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

fn api_app(limiter: Limiter<MemoryBackend>) -> Router {
    Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(RateLimitLayer::new(
            limiter,
            ApiKey::bearer(KeyHasher::unkeyed()),
        ))
}

#[tokio::test]
async fn two_hundreds_turn_into_429s_over_the_wire() {
    let limiter = Limiter::builder(
        "api",
        TokenBucket::new(3, 1, Duration::from_secs(60)).unwrap(),
        MemoryBackend::new(),
    )
    .fail_mode(FailMode::Open)
    .build();
    let addr = serve(api_app(limiter)).await;
    let auth = [("authorization", "Bearer k-1")];
    for remaining in (0..3).rev() {
        let a = get_with(addr, &auth).await;
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.body, "hello");
        let field = a.headers["ratelimit"].to_str().unwrap();
        assert!(
            field.starts_with(&format!("\"api\";r={remaining};")),
            "{field}"
        );
    }
    let a = get_with(addr, &auth).await;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = a.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry));
    assert_eq!(a.headers["ratelimit-policy"], "\"api\";q=3;w=180");
    assert_eq!(a.headers["content-type"], "application/problem+json");
    assert!(a.body.contains("quota-exceeded"));
    // Another key still passes.
    let a = get_with(addr, &[("authorization", "Bearer k-2")]).await;
    assert_eq!(a.status, StatusCode::OK);
}

#[tokio::test]
async fn fail_closed_503_is_distinguishable_from_429() {
    let backend = MemoryBackend::new();
    let limiter = Limiter::new(
        "api",
        SlidingWindow::new(1, Duration::from_secs(60)).unwrap(),
        backend.clone(),
    );
    let addr = serve(api_app(limiter)).await;
    let auth = [("authorization", "Bearer k")];
    backend.set_failing(true);
    let down = get_with(addr, &auth).await;
    backend.clear_faults();
    assert_eq!(down.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(down.headers["retry-after"], "1");
    assert!(!down.body.contains("quota-exceeded"));
    assert_eq!(get_with(addr, &auth).await.status, StatusCode::OK);
    let limited = get_with(addr, &auth).await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limited.headers["retry-after"], "60");
}

fn ip_app(client_ip: ClientIp) -> Router {
    let limiter = Limiter::new(
        "ip",
        SlidingWindow::new(2, Duration::from_secs(60)).unwrap(),
        MemoryBackend::new(),
    );
    Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(RateLimitLayer::new(limiter, client_ip))
}

#[tokio::test]
async fn spoofed_forwarding_headers_from_an_untrusted_peer_are_ignored() {
    // Only 10.0.0.0/8 is trusted; the test client is 127.0.0.1.
    let client_ip = ClientIp::new().trust_proxies(["10.0.0.0/8".parse().unwrap()]);
    let addr = serve(ip_app(client_ip)).await;
    let statuses = [
        get_with(addr, &[("x-forwarded-for", "198.51.100.1")])
            .await
            .status,
        get_with(addr, &[("x-forwarded-for", "198.51.100.2")])
            .await
            .status,
        get_with(
            addr,
            &[
                ("x-forwarded-for", "198.51.100.3"),
                ("forwarded", "for=198.51.100.3"),
            ],
        )
        .await
        .status,
    ];
    // All three count against 127.0.0.1.
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
}

#[tokio::test]
async fn forwarding_headers_from_a_trusted_proxy_name_the_client() {
    let client_ip = ClientIp::new().trust_proxies(["127.0.0.1/32".parse().unwrap()]);
    let addr = serve(ip_app(client_ip)).await;
    for _ in 0..2 {
        let a = get_with(addr, &[("x-forwarded-for", "198.51.100.1")]).await;
        assert_eq!(a.status, StatusCode::OK);
    }
    let a = get_with(addr, &[("x-forwarded-for", "198.51.100.1")]).await;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS);
    // A client prepending a fake address is still itself.
    let a = get_with(addr, &[("x-forwarded-for", "203.0.113.9, 198.51.100.1")]).await;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS);
    let a = get_with(addr, &[("x-forwarded-for", "198.51.100.2")]).await;
    assert_eq!(a.status, StatusCode::OK);
}

#[tokio::test]
async fn malformed_headers_never_take_the_server_down() {
    let client_ip = ClientIp::new().trust_proxies(["127.0.0.1/32".parse().unwrap()]);
    let limiter = Limiter::new(
        "key",
        SlidingWindow::new(100, Duration::from_secs(60)).unwrap(),
        MemoryBackend::new(),
    );
    let ip = Limiter::new(
        "ip",
        SlidingWindow::new(100, Duration::from_secs(60)).unwrap(),
        MemoryBackend::new(),
    );
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(RateLimitLayer::new(
            limiter,
            ApiKey::bearer(KeyHasher::unkeyed()),
        ))
        .layer(RateLimitLayer::new(ip, client_ip));
    let addr = serve(app).await;
    let long_chain = format!("x-forwarded-for: {}\r\n", vec!["127.0.0.1"; 500].join(","));
    let cases: Vec<Vec<u8>> = vec![
        b"x-forwarded-for: \xff\xfe\x80\r\nauthorization: Bearer k\r\n".to_vec(),
        b"x-forwarded-for: ,,,,\r\nauthorization: Bearer k\r\n".to_vec(),
        b"x-forwarded-for: [::1\r\nauthorization: Bearer k\r\n".to_vec(),
        b"forwarded: for=\"\r\nauthorization: Bearer\r\n".to_vec(),
        b"authorization: Bearer \xc3\x28\r\n".to_vec(),
        b"authorization: \r\n".to_vec(),
        format!("{long_chain}authorization: Bearer k\r\n").into_bytes(),
    ];
    for headers in cases {
        let mut request = b"GET / HTTP/1.1\r\nhost: t\r\nconnection: close\r\n".to_vec();
        request.extend_from_slice(&headers);
        request.extend_from_slice(b"\r\n");
        let status = raw(addr, &request).await;
        // A key is found or the request is refused as keyless: an answer
        // either way.
        assert!(status == 200 || status == 400, "{status} for {headers:?}");
    }
    let a = get_with(addr, &[("authorization", "Bearer k")]).await;
    assert_eq!(a.status, StatusCode::OK);
}

fn login_app(limit: usize) -> Router {
    let per_account = Limiter::new(
        "login_account",
        SlidingWindow::new(2, Duration::from_secs(900)).unwrap(),
        MemoryBackend::new(),
    );
    Router::new()
        .route("/login", post(|body: String| async move { body }))
        .layer(RateLimitLayer::new(per_account, FromBody))
        .layer(BufferBodyLayer::email("email", limit, KeyHasher::unkeyed()))
}

async fn login(addr: SocketAddr, content_type: &str, body: String) -> Answer {
    let req = Request::post(format!("http://{addr}/login"))
        .header("content-type", content_type)
        .body(Full::from(body))
        .unwrap();
    send(req).await
}

#[tokio::test]
async fn email_from_the_body_is_the_key_and_the_body_reaches_the_handler_intact() {
    let addr = serve(login_app(1024)).await;
    let json = r#"{"email":"Alice@Example.com","password":"hunter2"}"#.to_owned();
    let a = login(addr, "application/json", json.clone()).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.body, json);
    let form = "email=alice%40example.com&password=x".to_owned();
    let a = login(addr, "application/x-www-form-urlencoded", form.clone()).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.body, form);
    // Third attempt on the same account, spelled differently.
    let a = login(
        addr,
        "application/json",
        r#"{"email":" ALICE@example.com "}"#.into(),
    )
    .await;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS);
    let a = login(
        addr,
        "application/json",
        r#"{"email":"bob@example.com"}"#.into(),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    // No email: the missing-key policy (reject) applies.
    let a = login(addr, "application/json", r#"{"user":"bob"}"#.into()).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn oversized_bodies_are_refused_not_passed() {
    let addr = serve(login_app(256)).await;
    let big = format!(
        r#"{{"email":"a@example.com","pad":"{}"}}"#,
        "x".repeat(10_000)
    );
    // With a Content-Length.
    let a = login(addr, "application/json", big.clone()).await;
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE);
    // Chunked, so the size is only known while reading.
    let mut request = b"POST /login HTTP/1.1\r\nhost: t\r\nconnection: close\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    for chunk in big.as_bytes().chunks(100) {
        request.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        request.extend_from_slice(chunk);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"0\r\n\r\n");
    assert_eq!(raw(addr, &request).await, 413);
    // A lying Content-Length never panics either.
    let lie = b"POST /login HTTP/1.1\r\nhost: t\r\nconnection: close\r\ncontent-length: 99999999999999999999\r\n\r\n{}";
    let status = raw(addr, lie).await;
    assert!(status == 400 || status == 413, "{status}");
    // The account was never charged by the refused requests.
    for _ in 0..2 {
        let a = login(
            addr,
            "application/json",
            r#"{"email":"a@example.com"}"#.into(),
        )
        .await;
        assert_eq!(a.status, StatusCode::OK);
    }
}

/// The login kit over the wire, against what a client can send that no
/// well-behaved one does: each is answered a 4xx by the layer, none
/// reaches the handler, and a timely, well-formed login still does.
#[tokio::test]
async fn malformed_login_bodies_get_a_4xx_and_never_reach_the_handler() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tollgate_limiter::ProgressiveDelay;
    use tollgate_tower::login::LoginLayer;

    let backend = MemoryBackend::new();
    let per_ip = Limiter::new(
        "login_ip",
        SlidingWindow::new(100, Duration::from_secs(900)).unwrap(),
        backend.clone(),
    );
    let per_account = Limiter::new(
        "login_account",
        ProgressiveDelay::new(
            5,
            Duration::from_secs(1),
            2,
            Duration::from_secs(60),
            Duration::from_secs(600),
        )
        .unwrap(),
        backend,
    );
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&calls);
    let layer = LoginLayer::new(per_ip, per_account, ClientIp::new(), KeyHasher::unkeyed())
        .body_timeout(Some(Duration::from_millis(300)));
    let app = Router::new().route(
        "/login",
        post(move || {
            seen.fetch_add(1, Ordering::SeqCst);
            async { StatusCode::UNAUTHORIZED }
        })
        .layer(layer),
    );
    let addr = serve(app).await;
    let head = |ct: &[u8], framing: &str| {
        let mut r =
            b"POST /login HTTP/1.1\r\nhost: t\r\nconnection: close\r\ncontent-type: ".to_vec();
        r.extend_from_slice(ct);
        r.extend_from_slice(format!("\r\n{framing}\r\n\r\n").as_bytes());
        r
    };
    let json = b"application/json".as_slice();
    let form = b"application/x-www-form-urlencoded".as_slice();
    let with = |mut r: Vec<u8>, body: &[u8]| {
        r.extend_from_slice(body);
        r
    };
    let sized =
        |ct: &[u8], body: &[u8]| with(head(ct, &format!("content-length: {}", body.len())), body);
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        ("invalid UTF-8", sized(json, b"{\"email\":\"\xff@x\"}"), 400),
        ("bad JSON", sized(json, b"{\"email\":"), 400),
        (
            "a form field given twice",
            sized(form, b"email=a%40x.io&email=b%40x.io&password=x"),
            400,
        ),
        (
            "Content-Length shorter than the body",
            with(
                head(json, "content-length: 5"),
                br#"{"email":"a@x.io","password":"x"}"#,
            ),
            400,
        ),
        (
            "Content-Length longer than what is sent",
            with(head(json, "content-length: 500"), br#"{"email":"a@x.io""#),
            408,
        ),
        (
            "a chunked body that never ends",
            with(head(json, "transfer-encoding: chunked"), b"5\r\n{\"ema\r\n"),
            408,
        ),
        (
            "over the 16 KiB bound, chunked",
            {
                let mut r = head(json, "transfer-encoding: chunked");
                for _ in 0..20 {
                    r.extend_from_slice(format!("400\r\n{}\r\n", " ".repeat(1024)).as_bytes());
                }
                r.extend_from_slice(b"0\r\n\r\n");
                r
            },
            413,
        ),
    ];
    for (what, request, want) in cases {
        assert_eq!(raw(addr, &request).await, want, "{what}");
        assert_eq!(
            calls.load(Ordering::SeqCst),
            0,
            "{what} reached the handler"
        );
    }
    let a = login(
        addr,
        "application/json",
        r#"{"email":"a@x.io","password":"x"}"#.into(),
    )
    .await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}
