//! End to end: a real tonic server (the standard health service) on a
//! loopback port and a real tonic client.

use std::net::SocketAddr;
use std::time::Duration;

use tollgate_limiter::{Limiter, SlidingWindow};
use tollgate_memory::MemoryBackend;
use tollgate_tower::RateLimitLayer;
use tollgate_tower::extract::ClientIp;
use tonic::Code;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

async fn serve(backend: MemoryBackend) -> SocketAddr {
    let limiter = Limiter::new(
        "grpc_ip",
        SlidingWindow::new(2, Duration::from_secs(30)).unwrap(),
        backend,
    );
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        Server::builder()
            .layer(RateLimitLayer::new(limiter, ClientIp::new()).grpc())
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    addr
}

async fn connect(addr: SocketAddr) -> HealthClient<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
}

async fn check(
    client: &mut HealthClient<Channel>,
) -> Result<tonic::Response<tonic_health::pb::HealthCheckResponse>, tonic::Status> {
    client
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
}

#[tokio::test]
async fn resource_exhausted_with_the_retry_delay_in_metadata() {
    let addr = serve(MemoryBackend::new()).await;
    let mut client = connect(addr).await;
    for remaining in [1, 0] {
        let ok = check(&mut client).await.unwrap();
        let field = ok.metadata().get("ratelimit").unwrap().to_str().unwrap();
        assert!(
            field.starts_with(&format!("\"grpc_ip\";r={remaining};")),
            "{field}"
        );
    }
    let status = check(&mut client).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(status.metadata().get("retry-after").unwrap(), "30");
    assert_eq!(
        status.metadata().get("grpc-retry-pushback-ms").unwrap(),
        "30000"
    );
    // The rich error model: google.rpc.Status with a RetryInfo detail.
    let details = status.details();
    assert!(
        details.windows(20).any(|w| w == b"google.rpc.RetryInfo"),
        "{details:?}"
    );
}

#[tokio::test]
async fn unavailable_when_a_fail_closed_backend_fails() {
    let backend = MemoryBackend::new();
    let addr = serve(backend.clone()).await;
    let mut client = connect(addr).await;
    backend.set_failing(true);
    let status = check(&mut client).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.metadata().get("retry-after").unwrap(), "1");
    backend.clear_faults();
    assert!(check(&mut client).await.is_ok());
}
