//! A tonic gRPC server (the standard health service) limited per client
//! IP: refusals are `RESOURCE_EXHAUSTED` statuses with the retry delay in
//! metadata, backend failures `UNAVAILABLE` (the limiter is fail-closed).
//! The memory backend by default; Redis when `REDIS_URL` is set.

use std::net::SocketAddr;

use tollgate_limiter::{Backend, Config, ConfigError};
use tollgate_tower::RateLimitLayer;
use tollgate_tower::extract::ClientIp;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

/// The built-in limits; `TOLLGATE_*` variables override them.
pub const LIMITS: &str = r#"
[limiters.grpc_ip]
strategy = "sliding_window"
limit = 3
window = "10s"
fail_mode = "closed"
"#;

/// The limits: the built-in ones, overridden by `TOLLGATE_*` variables.
pub fn limits() -> Result<Config, ConfigError> {
    Config::builder().toml_str(LIMITS).env().load()
}

/// Serves the health service on `listener`, limited per client IP.
pub async fn serve<B: Backend>(
    config: &Config,
    backend: B,
    listener: tokio::net::TcpListener,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let limiter = config.limiter("grpc_ip")?.build(backend);
    let (_reporter, health) = tonic_health::server::health_reporter();
    Server::builder()
        .layer(RateLimitLayer::new(limiter, ClientIp::new()).grpc())
        .add_service(health)
        .serve_with_incoming(TcpIncoming::from(listener))
        .await?;
    Ok(())
}

/// One answer of [`burst`]: the gRPC code and the `retry-after` metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// `Ok` or the refusal's code.
    pub code: tonic::Code,
    /// The `ratelimit` metadata.
    pub ratelimit: Option<String>,
    /// The `retry-after` metadata (seconds).
    pub retry_after: Option<String>,
}

/// Sends `n` health checks to `addr` with a real tonic client.
pub async fn burst(addr: SocketAddr, n: usize) -> Result<Vec<Reply>, Box<dyn std::error::Error>> {
    let channel = Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let mut client = HealthClient::new(channel);
    let mut replies = Vec::with_capacity(n);
    for _ in 0..n {
        let request = HealthCheckRequest {
            service: String::new(),
        };
        let text = |m: &tonic::metadata::MetadataMap, k: &str| {
            m.get(k).and_then(|v| v.to_str().ok()).map(str::to_owned)
        };
        replies.push(match client.check(request).await {
            Ok(res) => Reply {
                code: tonic::Code::Ok,
                ratelimit: text(res.metadata(), "ratelimit"),
                retry_after: None,
            },
            Err(status) => Reply {
                code: status.code(),
                ratelimit: text(status.metadata(), "ratelimit"),
                retry_after: text(status.metadata(), "retry-after"),
            },
        });
    }
    Ok(replies)
}
