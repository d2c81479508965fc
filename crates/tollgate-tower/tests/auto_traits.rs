//! The layers, services and their configuration are `Send + Sync` (a
//! server shares them between its connections' tasks) and the services'
//! futures `Send`: checked at compile time, so a field that loses one fails
//! this build rather than a user's.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tollgate_limiter::{Key, KeyHasher, Limiter, SlidingWindow};
use tollgate_memory::MemoryBackend;
use tollgate_tower::RateLimitLayer;
use tollgate_tower::extract::{ApiKey, ClientIp};
use tollgate_tower::respond::{Grpc, Http};
use tower::{Layer, Service, service_fn};

fn send_sync<T: Send + Sync>(_: &T) {}

fn send<T: Send>(_: &T) {}

#[test]
fn layers_services_and_futures_are_send_and_sync() {
    let limiter = Limiter::new(
        "auto-traits",
        SlidingWindow::new(1, Duration::from_secs(1)).unwrap(),
        MemoryBackend::new(),
    );
    send_sync(&ClientIp::new());
    send_sync(&ApiKey::bearer(KeyHasher::unkeyed()));
    send_sync(&Http::new());
    send_sync(&Grpc::new());

    let by_header = |req: &Request<Full<Bytes>>| {
        req.headers()
            .get("x-key")
            .map(|v| Key::new(v.to_str().unwrap_or("?")))
    };
    let layer = RateLimitLayer::new(limiter, by_header);
    send_sync(&layer);
    let inner = service_fn(|_req: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
    });
    let mut svc = layer.layer(inner);
    send_sync(&svc);
    // Built, never polled.
    let fut = svc.call(Request::new(Full::new(Bytes::new())));
    send(&fut);
}
