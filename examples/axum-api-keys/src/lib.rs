//! An axum API limited per API key, with per-plan quotas, and per client
//! IP: the `tollgate-tower` layer over the memory backend, or Redis when
//! `REDIS_URL` is set.
//!
//! `GET /v1/export` is a long response: at most 2 in flight per API key
//! (a distributed concurrency limit, `api_exports`), each slot held until
//! the response has been sent. The free plan's limit carries a tighter
//! candidate being rolled out, counted but never enforced.
//!
//! The limits come from `limits.toml` (built in) and `TOLLGATE_*`
//! environment variables. `GET /metrics` serves every limiter's metrics
//! in the Prometheus text format (see [`install_metrics`]).

use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderName, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};
use tollgate_limiter::{Backend, Config, ConfigError, KeyHasher, metrics};
use tollgate_tower::RateLimitLayer;
use tollgate_tower::concurrency::ConcurrencyLimitLayer;
use tollgate_tower::extract::{ApiKey, ClientIp};
use tower::ServiceBuilder;

/// The built-in limits.
pub const LIMITS: &str = include_str!("../limits.toml");

/// The limits: the built-in ones, overridden by `TOLLGATE_*` variables.
pub fn limits() -> Result<Config, ConfigError> {
    Config::builder().toml_str(LIMITS).env().load()
}

/// Which limits [`app_with`] applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layers {
    /// None: the bare router (to measure what the layers cost).
    None,
    /// Per API key only.
    PerKey,
    /// Per client IP, then per API key (the example).
    PerIpAndKey,
}

/// The API, limited per client IP, then per API key (`x-api-key` or
/// `Authorization: Bearer`), with the plan's quota: keys starting with
/// `pro_` are on the pro plan. A request without a key is refused (400).
///
/// API keys are hashed with `hasher` (HMAC under the service's secret).
///
/// With `limited = false`, the same API without the layers.
pub fn app<B: Backend + Clone>(
    config: &Config,
    backend: B,
    limited: bool,
    hasher: KeyHasher,
) -> Result<Router, ConfigError> {
    let layers = if limited {
        Layers::PerIpAndKey
    } else {
        Layers::None
    };
    app_with(config, backend, layers, hasher)
}

/// The API with the chosen [`Layers`].
pub fn app_with<B: Backend + Clone>(
    config: &Config,
    backend: B,
    layers: Layers,
    hasher: KeyHasher,
) -> Result<Router, ConfigError> {
    let router = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/v1/items", get(|| async { r#"{"items":[1,2,3]}"# }));
    let export = get(|| async { "a large export\n" });
    if layers == Layers::None {
        return Ok(router.route("/v1/export", export));
    }
    let exports = config.limiter("api_exports")?.build(backend.clone());
    let export_key =
        ApiKey::header(HeaderName::from_static("x-api-key"), hasher.clone()).or_bearer();
    let router = router.route(
        "/v1/export",
        export.route_layer(ConcurrencyLimitLayer::new(exports, export_key)),
    );
    let free = config.limiter("api_free")?.build(backend.clone());
    let pro = config.limiter("api_pro")?.build(backend.clone());

    let api_key = ApiKey::header(HeaderName::from_static("x-api-key"), hasher).or_bearer();
    let plan_of = api_key.clone();
    let per_key = RateLimitLayer::per_request(
        move |req: &Request<Body>| {
            // A real service looks the key's plan up; the example reads it
            // from the key itself.
            if plan_of
                .credential(req)
                .is_some_and(|k| k.starts_with("pro_"))
            {
                pro.clone()
            } else {
                free.clone()
            }
        },
        api_key,
    );
    if layers == Layers::PerKey {
        return Ok(router.layer(per_key));
    }
    let per_ip = config.limiter("api_ip")?.build(backend);
    // One stack (the IP counted before the key) given to one
    // `Router::layer`: axum boxes each route's service, clones the box and
    // boxes the response body at every `layer` call, so two calls did it
    // twice per request (measured: 1,200 of 36,400 instructions a request).
    let limits = ServiceBuilder::new()
        .layer(RateLimitLayer::new(per_ip, ClientIp::new()))
        .layer(per_key);
    Ok(router.layer(limits))
}

/// Installs the process's Prometheus recorder, with buckets for the
/// backend latency histogram, and returns the handle that renders it.
///
/// Call it before building the limiters: each registers its metrics when
/// it is built. Once per process, within a tokio runtime: a task drains
/// the histogram's samples every 5 s (the exporter's own listener would;
/// without it they pile up until a scrape).
pub fn install_metrics() -> Result<PrometheusHandle, BuildError> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(metrics::BACKEND_LATENCY.to_owned()),
            metrics::LATENCY_BUCKETS,
        )?
        .install_recorder()?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(std::time::Duration::from_secs(5));
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// Adds `GET /metrics` (Prometheus text format) to `router`. Added after
/// the rate-limit layers, the route is not limited: a scraper needs no
/// API key.
pub fn with_metrics(router: Router, handle: PrometheusHandle) -> Router {
    router.route(
        "/metrics",
        get(move || {
            let text = handle.render();
            async move { ([(CONTENT_TYPE, "text/plain; version=0.0.4")], text) }
        }),
    )
}

/// Serves `router` on `listener`, with the peer addresses the per-IP
/// limit needs.
pub async fn serve(listener: tokio::net::TcpListener, router: Router) -> std::io::Result<()> {
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
}

/// One answer of [`burst`].
#[derive(Debug, Clone)]
pub struct Reply {
    /// The status.
    pub status: StatusCode,
    /// The `RateLimit` fields, joined.
    pub ratelimit: String,
    /// `Retry-After`, if any.
    pub retry_after: Option<String>,
}

/// Fetches `GET http://{addr}{path}`, with API key `key` if given: the status and
/// the body.
pub async fn fetch(
    addr: SocketAddr,
    path: &str,
    key: Option<&str>,
) -> Result<(StatusCode, String), Box<dyn std::error::Error>> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut req = Request::get(format!("http://{addr}{path}"));
    if let Some(key) = key {
        req = req.header("x-api-key", key);
    }
    let res = client.request(req.body(Full::default())?).await?;
    let status = res.status();
    let body = res.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8(body.to_vec())?))
}

/// Sends `n` requests with API key `key` to `addr`, one after the other,
/// with a real HTTP client.
pub async fn burst(
    addr: SocketAddr,
    key: &str,
    n: usize,
) -> Result<Vec<Reply>, Box<dyn std::error::Error>> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut replies = Vec::with_capacity(n);
    for _ in 0..n {
        let req = Request::get(format!("http://{addr}/v1/items"))
            .header("x-api-key", key)
            .body(Full::default())?;
        let res = client.request(req).await?;
        let header = |name: &str| {
            let values: Vec<_> = res
                .headers()
                .get_all(name)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .collect();
            (!values.is_empty()).then(|| values.join(", "))
        };
        let reply = Reply {
            status: res.status(),
            ratelimit: header("ratelimit").unwrap_or_default(),
            retry_after: header("retry-after"),
        };
        // Read the body so the connection is reused.
        res.into_body().collect().await?;
        replies.push(reply);
    }
    Ok(replies)
}
