//! Inbound rate limiting: [`RateLimitLayer`] in front of any tower
//! `Service`.
//!
//! For each request, the layer
//!
//! 1. picks the [`Limiter`](tollgate_limiter::Limiter) (one, or one per
//!    request with a [`PerRequest`] policy resolver);
//! 2. extracts the key with a [`KeyExtractor`](crate::extract::KeyExtractor)
//!    (a closure or a built-in); without one, [`MissingKey`] decides;
//! 3. asks the limiter for the request's [`Cost`];
//! 4. calls the inner service if allowed, or answers the
//!    [`Refusal`](crate::respond::Refusal) through its
//!    [`Respond`](crate::respond::Respond) implementation (HTTP 429/503/400, or gRPC
//!    statuses) without calling it;
//! 5. decorates the response with the rate-limit fields.
//!
//! A backend failure goes by the limiter's fail mode: fail-open lets the
//! request through, fail-closed answers `503` (gRPC `UNAVAILABLE`) with a
//! short `Retry-After`, logged and counted apart from limit refusals.
//!
//! Layers stack: put a per-IP layer outside a per-key layer and each counts
//! its own key; both add their policy to the `RateLimit` fields.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use http::{Request, Response, StatusCode};
//! use tollgate_limiter::{FailMode, Limiter, TokenBucket};
//! use tollgate_memory::MemoryBackend;
//! use tollgate_tower::{RateLimitLayer, extract::{ApiKey, ClientIp, KeyHasher, PeerAddr}};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let backend = MemoryBackend::new();
//! let per_ip = Limiter::new("ip", TokenBucket::per_second(100, 10)?, backend.clone());
//! let per_key = Limiter::builder("api", TokenBucket::new(2, 1, Duration::from_secs(60))?, backend)
//!     .fail_mode(FailMode::Open)
//!     .build();
//!
//! let svc = ServiceBuilder::new()
//!     .layer(RateLimitLayer::new(per_ip, ClientIp::new()))
//!     .layer(RateLimitLayer::new(per_key, ApiKey::bearer(KeyHasher::new("the fleet's secret, 16+ bytes")?)))
//!     .service(service_fn(|_req: Request<String>| async {
//!         Ok::<_, std::convert::Infallible>(Response::new(String::from("hello")))
//!     }));
//!
//! let request = || {
//!     let mut req = Request::builder()
//!         .header("authorization", "Bearer k-123")
//!         .body(String::new())
//!         .unwrap();
//!     req.extensions_mut().insert(PeerAddr("192.0.2.1:5555".parse().unwrap()));
//!     req
//! };
//! let statuses = [
//!     svc.clone().oneshot(request()).await?,
//!     svc.clone().oneshot(request()).await?,
//!     svc.clone().oneshot(request()).await?,
//! ].map(|res| res.status());
//! assert_eq!(statuses, [StatusCode::OK, StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]);
//! # Ok(())
//! # }
//! ```
//!
//! Counting by outcome (here: a 5xx is not the client's fault) is one more
//! line, see [`Classify`]:
//!
//! ```
//! # use tollgate_limiter::{Limiter, TokenBucket};
//! # use tollgate_memory::MemoryBackend;
//! use tollgate_tower::{Outcome, RateLimitLayer, extract::{ApiKey, KeyHasher}};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let limiter = Limiter::new("api", TokenBucket::per_second(10, 1)?, MemoryBackend::new());
//! let layer = RateLimitLayer::new(limiter, ApiKey::bearer(KeyHasher::new("the fleet's secret, 16+ bytes")?)).classify(
//!     |res: &http::Response<String>| {
//!         if res.status().is_server_error() { Outcome::Ignore } else { Outcome::Count }
//!     },
//! );
//! # Ok(())
//! # }
//! ```
//!
//! A cost known only from the response (LLM tokens) is reserved as an
//! estimate and settled with the usage the response reports: one more
//! line, [`RateLimitLayer::settle`] (see [`SettleWith`]).

pub mod future;
mod hooks;
mod layer;
mod service;

pub use hooks::{
    Classify, Cost, LimiterCost, MissingKey, Outcome, PerRequest, SelectLimiter, SettleWith,
    Upfront,
};
pub use layer::RateLimitLayer;
pub use service::RateLimit;
