//! Tower layers for [tollgate](https://docs.rs/tollgate): one rate-limiting
//! primitive, consumed by HTTP and gRPC servers.
//!
//! * [`RateLimitLayer`] puts a keyed limit in front of any tower `Service`
//!   (axum routers, tonic servers, hyper services). The key comes from an
//!   [extractor](extract): a closure, or a built-in ([client IP](extract::ClientIp)
//!   with trusted proxies, [API key](extract::ApiKey), a key
//!   [from the body](extract::FromBody)). Refusals are answered by a
//!   [responder](respond): HTTP 429 with `Retry-After` and the IETF
//!   `RateLimit` fields, or a gRPC `RESOURCE_EXHAUSTED` status.
//! * [`BufferBodyLayer`] reads a bounded body so a key (a login's email)
//!   can be taken from it, handing the body on intact.
//! * [`login`] protects a login route: a sliding window per client IP and a
//!   progressive delay per account that counts only failed logins.
//! * [`stream`] limits a `Stream` of events (a listener with no webhook)
//!   per key, dropping or delaying the excess; with the
//!   [`Typed`](stream::Typed) responder the same layer serves non-HTTP
//!   `Service`s.
//! * [`outbound`] holds the adaptive layer for calls to remote services.
//!
//! Limits are decided by a [`Limiter`](tollgate_limiter::Limiter) over any
//! backend (memory or Redis); the limiter's fail mode says what a backend
//! failure does: fail-open lets requests through, fail-closed answers 503.
//!
//! # Examples
//!
//! An axum router limited per API key:
//!
//! ```
//! use std::time::Duration;
//! use axum::{Router, routing::get};
//! use tollgate_limiter::{FailMode, Limiter, TokenBucket};
//! use tollgate_memory::MemoryBackend;
//! use tollgate_tower::{RateLimitLayer, extract::{ApiKey, KeyHasher}};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = Limiter::builder("api", TokenBucket::new(100, 100, Duration::from_secs(60))?, MemoryBackend::new())
//!     .fail_mode(FailMode::Open)
//!     .build();
//! let app: Router = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     // In a service: `KeyHasher::from_env()?` (TOLLGATE_KEY_SECRET).
//!     .layer(RateLimitLayer::new(limiter, ApiKey::bearer(KeyHasher::new("the fleet's secret, 16+ bytes")?)));
//! # Ok(())
//! # }
//! ```
//!
//! # Features
//!
//! * `axum`: [`ClientIp`](extract::ClientIp) reads axum's
//!   `ConnectInfo<SocketAddr>`.
//! * `tonic`: [`ClientIp`](extract::ClientIp) reads tonic's
//!   `TcpConnectInfo`, plain or inside `TlsConnectInfo` (a TLS server).
//! * `metrics`: counters and a latency histogram through the `metrics`
//!   crate (see [Telemetry](#telemetry)).
//!
//! # Telemetry
//!
//! Every decision runs in a `rate_limit` tracing span (debug level) with
//! the limiter and key; refusals and backend failures are debug events
//! (the limiter itself warns about backend failures, throttled).
//!
//! With the `metrics` feature:
//!
//! * `tollgate_requests_total{limiter, outcome}`, `outcome` one of
//!   `allowed`, `denied`, `too_costly` (a cost the policy can never grant,
//!   answered 413), `unavailable` (fail-closed backend failure,
//!   answered 503), `failed_open`, `missing_key_allowed`,
//!   `missing_key_rejected`;
//! * `tollgate_backend_failures_total{limiter, fail_mode}`;
//! * `tollgate_backend_duration_seconds{limiter}`, a histogram.

pub mod buffer_body;
pub mod extract;
pub mod inbound;
pub mod login;
pub mod outbound;
pub mod respond;
pub mod stream;
mod telemetry;

pub use buffer_body::BufferBodyLayer;
pub use inbound::{MissingKey, Outcome, RateLimit, RateLimitLayer};
pub use respond::ResponseBody;
