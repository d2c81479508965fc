//! Distributed concurrency limits: [`ConcurrencyLimitLayer`], at most N
//! requests of one key in flight across the fleet.
//!
//! For each request the layer extracts the key, takes a slot of the
//! limiter's [`Concurrency`](tollgate_limiter::Concurrency) policy in the
//! request's one round trip ([`Limiter::hold`](tollgate_limiter::Limiter::hold)),
//! and gives it back when the response **ends**: the response body is
//! wrapped in a [`PermitBody`] that holds the slot until the body has been
//! sent (its last frame, an error, or the body dropped: a client gone
//! mid-stream). An inner service that fails, or panics (the unwinding drops
//! the response future), gives the slot back too.
//!
//! A response that upgrades the connection (a WebSocket's `101 Switching
//! Protocols`) ends at once: its slot is given back as the socket opens,
//! and the open socket holds none. To limit open sockets per key, hold a
//! [`Permit`](tollgate_limiter::Permit) from
//! [`Limiter::hold`](tollgate_limiter::Limiter::hold) in the socket's
//! task, kept alive ([`Permit::keep_alive`](tollgate_limiter::Permit::keep_alive)).
//!
//! While the request runs and its body is sent, the slot's lease is
//! renewed every third of a lease: a client that sends its request or
//! reads its response slowly decides how long that takes, and a lease
//! running out under it would let one request more in.
//!
//! Giving back is a release spawned on the tokio runtime, best effort: on a
//! runtime that is shutting down, or a backend that fails, it is lost, and
//! the slot's lease frees it (see [`Permit`](tollgate_limiter::Permit)).
//! So the lease is how long a slot outlives a worker that died (its
//! renewals die with it): a minute is a fair choice, however long the
//! responses. A body leaked in a live process (never dropped) keeps its
//! slot, renewed, until the process ends.
//!
//! A refused request is answered like a rate-limit refusal: **429** with
//! `Retry-After` (at most 1 s: a slot usually frees when a request ends,
//! see [`concurrency`](tollgate_limiter::concurrency)) and the `RateLimit`
//! fields (`q` the slots, `w` the lease); gRPC `RESOURCE_EXHAUSTED`. 429,
//! not 503: the client sent too many requests at once on its key, the
//! service itself is not overloaded. A backend failure follows the
//! limiter's fail mode (fail-open passes holding nothing; fail-closed is a
//! 503), and a limiter in shadow mode lets every request through (see
//! [`ShadowRefusal`](crate::respond::ShadowRefusal)).
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use http::{Request, Response, StatusCode};
//! use tollgate_limiter::{Concurrency, Key, Limiter};
//! use tollgate_memory::MemoryBackend;
//! use tollgate_tower::concurrency::ConcurrencyLimitLayer;
//! use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let exports = Limiter::new("exports", Concurrency::new(1, Duration::from_secs(120))?, MemoryBackend::new());
//! let mut svc = ServiceBuilder::new()
//!     .layer(ConcurrencyLimitLayer::new(exports, |_: &Request<()>| Some(Key::new("tenant-1"))))
//!     .service(service_fn(|_req: Request<()>| async {
//!         Ok::<_, std::convert::Infallible>(Response::new(String::from("a big export")))
//!     }));
//!
//! let first = svc.ready().await?.call(Request::new(())).await?;
//! // The first response's body is not sent yet: its slot is held.
//! let second = svc.ready().await?.call(Request::new(())).await?;
//! assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
//! drop(first); // sent (or the client left): the slot is given back
//! # tokio::task::yield_now().await;
//! let third = svc.ready().await?.call(Request::new(())).await?;
//! assert_eq!(third.status(), StatusCode::OK);
//! # Ok(())
//! # }
//! ```

mod body;
mod future;
mod layer;
mod service;

pub use body::PermitBody;
pub use future::ResponseFuture;
pub use layer::ConcurrencyLimitLayer;
pub use service::ConcurrencyLimit;
