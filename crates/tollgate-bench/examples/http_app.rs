//! The axum app of the HTTP comparison
//! (`scripts/bench-http.sh`), served on a loopback address in one of three
//! modes, so that `wrk` sees the same router with a different layer:
//!
//! * `bare`: no rate limit;
//! * `tollgate`: one per-IP `RateLimitLayer` (`ClientIp`, memory backend,
//!   `RateLimit` headers on allowed responses: the defaults);
//! * `governor`: `tower_governor`'s `GovernorLayer` (its default peer-IP key,
//!   `use_headers()`, so both answer with rate-limit headers).
//!
//! Limits are high enough that every request is admitted: this measures
//! the cost of deciding, not of answering 429.
//!
//! ```text
//! cargo run --release -p tollgate-bench --example http_app -- --mode tollgate --listen 127.0.0.1:3000
//! ```

use std::net::SocketAddr;

use axum::Router;
use axum::routing::get;
use clap::{Parser, ValueEnum};
use tollgate_limiter::{Limiter, TokenBucket};
use tollgate_memory::MemoryBackend;
use tollgate_tower::RateLimitLayer;
use tollgate_tower::extract::ClientIp;
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    Bare,
    Tollgate,
    Governor,
}

#[derive(Debug, Parser)]
#[command(about = "The axum app of the HTTP benchmark (loopback only)")]
struct Args {
    /// Which layer the router gets.
    #[arg(long, value_enum)]
    mode: Mode,
    /// Address to serve on (loopback only).
    #[arg(long, default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
    /// Tokio worker threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
}

/// The router of every mode: the route of the API-key example.
fn router(mode: Mode) -> Router {
    let router = Router::new().route("/v1/items", get(|| async { r#"{"items":[1,2,3]}"# }));
    match mode {
        Mode::Bare => router,
        Mode::Tollgate => {
            let policy = TokenBucket::per_second(1_000_000_000, 1_000_000).expect("valid policy");
            let limiter = Limiter::new("http_ip", policy, MemoryBackend::new());
            router.layer(RateLimitLayer::new(limiter, ClientIp::new()))
        }
        Mode::Governor => {
            let config = GovernorConfigBuilder::default()
                .per_nanosecond(1)
                .burst_size(1_000_000_000)
                .use_headers()
                .finish()
                .expect("valid governor config");
            router.layer(GovernorLayer::new(config))
        }
    }
}

fn main() {
    let args = Args::parse();
    if !args.listen.ip().is_loopback() {
        eprintln!("refusing {}: loopback addresses only", args.listen);
        std::process::exit(2);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .expect("bind the listen address");
        axum::serve(
            listener,
            router(args.mode).into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .expect("serve");
    });
}

/// The short form of scripts/bench-http.sh: each mode serves the route,
/// and the limited ones answer with their rate-limit headers.
#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::extract::ConnectInfo;
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt;

    use super::*;

    #[tokio::test]
    async fn every_mode_admits_with_its_headers() {
        for (mode, header) in [
            (Mode::Bare, None),
            (Mode::Tollgate, Some("ratelimit")),
            (Mode::Governor, Some("x-ratelimit-remaining")),
        ] {
            let app = router(mode);
            for _ in 0..3 {
                let mut req = Request::get("/v1/items").body(Body::empty()).unwrap();
                req.extensions_mut()
                    .insert(ConnectInfo(SocketAddr::from(([127, 0, 0, 1], 40_000))));
                let res = app.clone().oneshot(req).await.unwrap();
                assert_eq!(res.status(), StatusCode::OK, "{mode:?}");
                match header {
                    Some(h) => assert!(res.headers().contains_key(h), "{mode:?}: {res:?}"),
                    None => assert!(
                        !res.headers()
                            .keys()
                            .any(|k| k.as_str().contains("ratelimit")),
                        "{res:?}"
                    ),
                }
            }
        }
    }
}
