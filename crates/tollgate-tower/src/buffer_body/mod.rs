//! Keys found in the request body: [`BufferBodyLayer`] reads the body up to
//! a bound, finds the key (an email in a login form, a channel in a
//! webhook payload), records it as a [`BodyKey`] extension and hands the
//! request on with its body intact. A [`RateLimitLayer`](crate::RateLimitLayer)
//! inside it keys on [`FromBody`].
//!
//! A body larger than the bound is refused with `413 Content Too Large`
//! (problem+json) and never reaches the service, so a large body cannot
//! slip past a limiter. A body that has not fully arrived within the read
//! deadline ([`DEFAULT_READ_TIMEOUT`], 10 s, see
//! [`BufferBodyLayer::read_timeout`]) is refused with `408 Request
//! Timeout`, so a client trickling its body cannot hold a connection and
//! a buffer for ever. A body that cannot be read is refused with `400`.
//! A body that holds no key is handed on without one, and the rate-limit
//! layer's [`MissingKey`](crate::MissingKey) policy decides.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::Full;
//! use bytes::Bytes;
//! use tollgate_limiter::{KeyHasher, Limiter, SlidingWindow};
//! use tollgate_memory::MemoryBackend;
//! use tollgate_tower::{BufferBodyLayer, RateLimitLayer, extract::FromBody};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let per_account = Limiter::new(
//!     "login_account",
//!     SlidingWindow::new(1, Duration::from_secs(900))?,
//!     MemoryBackend::new(),
//! );
//! let svc = ServiceBuilder::new()
//!     // In a service: `KeyHasher::from_env()?` (TOLLGATE_KEY_SECRET).
//!     .layer(BufferBodyLayer::email("email", 16 * 1024, KeyHasher::new("the fleet's secret, 16+ bytes")?))
//!     .layer(RateLimitLayer::new(per_account, FromBody))
//!     .service(service_fn(|req: Request<Full<Bytes>>| async move {
//!         Ok::<_, std::convert::Infallible>(Response::new(req.into_body()))
//!     }));
//!
//! let login = |email: &str| {
//!     Request::post("/login")
//!         .header("content-type", "application/json")
//!         .body(Full::from(format!(r#"{{"email":"{email}","password":"x"}}"#)))
//!         .unwrap()
//! };
//! let first = svc.clone().oneshot(login("alice@example.com")).await?;
//! assert_eq!(first.status(), StatusCode::OK);
//! // Same account, however it is spelled.
//! let second = svc.clone().oneshot(login(" Alice@Example.COM")).await?;
//! assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
//! # Ok(())
//! # }
//! ```

mod extractor;
pub mod future;
mod layer;
mod service;
#[cfg(test)]
mod tests;

pub(crate) use extractor::account_key;
pub use extractor::{BodyExtractor, BodyKey, Email, FromBody};
pub use layer::{BufferBodyLayer, DEFAULT_READ_TIMEOUT};
pub use service::BufferBody;
