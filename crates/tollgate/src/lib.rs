//! tollgate: one rate-limiting primitive for a whole platform.
//!
//! Modules do not count limits themselves: they ask a shared counter — a
//! Redis (or Redis Cluster) in production, an in-process map in unit tests
//! and single-process tools — through one [`Limiter`] type and, for
//! services, tower layers.
//!
//! This facade re-exports the workspace behind features:
//!
//! | feature | brings |
//! |---|---|
//! | `memory` (default) | `memory::MemoryBackend`, the in-process backend |
//! | `redis` | `redis::RedisBackend`: atomic Lua scripts, self-healing connections, durability check |
//! | `redis-cluster` | Redis Cluster through the redis crate's cluster client |
//! | `redis-tls` | `rediss://` URLs (a private CA, client certificates) |
//! | `tower` | `tower::RateLimitLayer`, extractors, responders, the outbound adaptive layer |
//! | `axum` | client IP from axum's `ConnectInfo` |
//! | `tonic` | client IP from tonic's `TcpConnectInfo` (the gRPC responder, `RESOURCE_EXHAUSTED`, comes with `tower`) |
//! | `metrics` | every limiter's decisions, backend latency and breaker through the `metrics` crate ([`metrics`]) |
//!
//! The re-exported items keep their own docs, whose examples (like the
//! guides in the repository's `docs/` and its `examples/`) name the member
//! crates: there, `tollgate_limiter::X` is `tollgate::X`,
//! `tollgate_memory::X` is `tollgate::memory::X`, `tollgate_redis::X` is
//! `tollgate::redis::X` and `tollgate_tower::X` is `tollgate::tower::X`.
//!
//! For an axum or tonic service, start from the README's Usage (the
//! crate's page on crates.io: a router generic over the backend, a layer
//! per client IP and per API key, limits from [`Config`]) and the `tower`
//! module.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{Key, Limiter, SlidingWindow, memory::MemoryBackend};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // At most 3 webhook events per channel per minute, refusing when the
//! // backend is down (the default, fail-closed).
//! let limiter = Limiter::new(
//!     "webhooks",
//!     SlidingWindow::new(3, Duration::from_secs(60))?,
//!     MemoryBackend::new(),
//! );
//! let channel = Key::new("C024BE91L");
//! for _ in 0..3 {
//!     assert!(limiter.check(&channel).await.is_allowed());
//! }
//! let refused = limiter.check(&channel).await.into_result().unwrap_err();
//! assert!(refused.retry_after <= Duration::from_secs(60));
//! # Ok(())
//! # }
//! ```

// On docs.rs (`--cfg docsrs`, nightly): items behind a feature say which.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub use tollgate_limiter::*;

/// The in-process backend (`memory` feature).
#[cfg(feature = "memory")]
#[cfg_attr(docsrs, doc(cfg(feature = "memory")))]
pub mod memory {
    pub use tollgate_memory::*;
}

/// The Redis backend (`redis` feature).
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis {
    pub use tollgate_redis::*;
}

/// Tower layers (`tower` feature).
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod tower {
    pub use tollgate_tower::*;
}

// The README's Rust blocks, compiled (and run) as doctests: they are the
// first code a user copies, and markdown outside a crate is never compiled.
// `README.md` is a link to the repository's, inside the crate so that it
// ships in the package (a path outside the crate would not be there).
#[cfg(all(doctest, feature = "axum", feature = "redis"))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
