//! The outbound adaptive layer: calls to remote sources at the rate they
//! allow.
//!
//! [`AdaptiveLayer`] wraps an HTTP client service (hyper's, or any
//! `Service<http::Request<_>, Response = http::Response<_>>`). Before each
//! call it waits for a token of the call's scope (by default the remote
//! [`Host`]) from an [`AimdLimiter`]; after it, it reports the response:
//! a `429` or `503` cuts the scope's rate and holds the scope until its
//! `Retry-After`, a success lets the rate grow (see [`classify`]). The rate
//! lives in the limiter's backend, so every worker of a crawler fleet
//! follows the same one; if the backend fails, each worker carries on at
//! the last rate it knew (see [`tollgate_limiter::aimd`]).
//!
//! # Examples
//!
//! ```
//! use std::convert::Infallible;
//! use tollgate_limiter::aimd::{AimdConfig, AimdLimiter};
//! use tollgate_memory::MemoryBackend;
//! use tollgate_tower::outbound::AdaptiveLayer;
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = AimdLimiter::new("harvester", AimdConfig::default(), MemoryBackend::new())?;
//! // Stands for an HTTP client, e.g. hyper-util's legacy `Client`.
//! let http_client = service_fn(|_req: http::Request<String>| async {
//!     Ok::<_, Infallible>(http::Response::new(String::from("hello")))
//! });
//! let client = ServiceBuilder::new()
//!     .layer(AdaptiveLayer::new(limiter.clone()))
//!     .service(http_client);
//!
//! let req = http::Request::get("http://example.org/").body(String::new())?;
//! let response = client.oneshot(req).await?;
//! assert_eq!(response.status(), 200);
//! // The success was fed back: the site's rate has taken one step up.
//! assert_eq!(limiter.rate(&"example.org".into()), 2.0);
//! # Ok(())
//! # }
//! ```
//!
//! [`AimdLimiter`]: tollgate_limiter::aimd::AimdLimiter

mod classify;
pub mod future;
mod layer;
mod service;

pub use classify::{Host, classify, retry_after};
pub use layer::AdaptiveLayer;
pub use service::Adaptive;

#[cfg(test)]
mod tests;
