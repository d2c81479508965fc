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
//! * `metrics`: the limiters' metrics (tollgate-limiter's `metrics`
//!   feature) and one of the layers' own (see [Telemetry](#telemetry)).
//!
//! # Telemetry
//!
//! Every decision runs in a `rate_limit` tracing span (debug level) with
//! the limiter and key; refusals and backend failures are debug events
//! (the limiter itself warns about backend failures, throttled).
//!
//! With the `metrics` feature, every limiter counts its own decisions by
//! outcome, times its backend calls and reports its breaker (see
//! [`tollgate_limiter::metrics`]): a decision a layer asks for is counted
//! there, once, like a decision of any other consumer. The layers add only
//! what never reaches a limiter:
//!
//! * `tollgate_missing_key_total{limiter, outcome}`: requests (or stream
//!   items) without a key, `outcome` `allowed` or `rejected` per
//!   [`MissingKey`].
//!
//! What a refusal became follows from the decision: `refused` is a 429
//! (413 for a cost the policy can never grant), `failed_closed` a 503,
//! `failed_open` a request let through.
//!
//! # Dependencies in the public API
//!
//! The layers are written against the crates of the tower ecosystem, whose
//! types appear in this crate's signatures and trait impls: `http` 1
//! (requests, responses, header maps), `http-body` 1 and `bytes` 1
//! ([`ResponseBody`]), `tower-service` / `tower-layer` 0.3 (every
//! [`Service`](tower_service::Service) and [`Layer`](tower_layer::Layer)),
//! `futures-core` 0.3 (the [`Stream`](futures_core::Stream) adapter) and
//! `ipnet` 2 (re-exported as [`extract::IpNet`]). A new major version of
//! one of them is a new major version of this crate; they are not
//! re-exported, as in tower-http: an application names the versions its
//! server (hyper, axum, tonic) already uses.
//!
//! The `axum` (0.8) and `tonic` (0.14) features add no type to the API:
//! [`ClientIp`](extract::ClientIp) reads their connection info from the
//! request's extensions, by type. Those of another major version of axum
//! or tonic are other types, which it does not see: an application on one
//! inserts a [`PeerAddr`](extract::PeerAddr) itself, or its requests have
//! no client IP.

// On docs.rs (`--cfg docsrs`, nightly): items behind a feature say which.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod buffer_body;
pub mod concurrency;
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
