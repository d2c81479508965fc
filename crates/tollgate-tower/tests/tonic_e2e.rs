//! End to end: a real tonic server (the standard health service) on a
//! loopback port and a real tonic client, over plain HTTP/2 and over TLS.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use tollgate_limiter::{Limiter, SlidingWindow};
use tollgate_memory::MemoryBackend;
use tollgate_tower::RateLimitLayer;
use tollgate_tower::extract::ClientIp;
use tonic::Code;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity, Server, ServerTlsConfig};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

async fn serve(backend: MemoryBackend) -> SocketAddr {
    serve_with(backend, None).await
}

/// The server, over TLS with `tls`.
async fn serve_with(backend: MemoryBackend, tls: Option<ServerTlsConfig>) -> SocketAddr {
    let limiter = Limiter::new(
        "grpc_ip",
        SlidingWindow::new(2, Duration::from_secs(30)).unwrap(),
        backend,
    );
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut server = Server::builder();
        if let Some(tls) = tls {
            server = server.tls_config(tls).unwrap();
        }
        server
            // The default missing-key policy: a keyless request is refused.
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

// ---------------------------------------------------------------- TLS
//
// Over TLS, tonic records the peer as `TlsConnectInfo<TcpConnectInfo>`, and
// `ClientIp` must read it, or every request would be keyless (and refused
// by the missing-key policy). The certificate is made with the `openssl`
// CLI (`scripts/install-test-deps.sh` installs it).

/// A self-signed certificate for `localhost` and its key, in PEM.
fn self_signed() -> (String, String) {
    let dir: PathBuf = std::env::temp_dir().join(format!(
        "tollgate-tonic-tls-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let out = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args(["-nodes", "-days", "1", "-subj", "/CN=localhost"])
        .args(["-addext", "subjectAltName=DNS:localhost"])
        // An end-entity certificate (webpki refuses a CA as the server).
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("the openssl CLI (scripts/install-test-deps.sh installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pem = (
        std::fs::read_to_string(&cert).unwrap(),
        std::fs::read_to_string(&key).unwrap(),
    );
    std::fs::remove_dir_all(&dir).unwrap();
    pem
}

#[tokio::test]
async fn a_tls_server_keys_requests_by_the_peer_address() {
    let (cert, key) = self_signed();
    let tls = ServerTlsConfig::new().identity(Identity::from_pem(&cert, &key));
    let addr = serve_with(MemoryBackend::new(), Some(tls)).await;
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&cert))
        .domain_name("localhost");
    let channel = Channel::from_shared(format!("https://localhost:{}", addr.port()))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    // Keyed by 127.0.0.1: two pass, the third is refused by the limit.
    // Without a key, the first would be refused as keyless
    // (`INVALID_ARGUMENT`).
    let mut codes = Vec::new();
    for _ in 0..3 {
        codes.push(match check(&mut client).await {
            Ok(_) => Code::Ok,
            Err(status) => status.code(),
        });
    }
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::ResourceExhausted]);
}

// ------------------------------------------------------- concurrency
//
// `ConcurrencyLimitLayer::grpc()` over a real tonic server: a server
// stream (the health service's `Watch`) holds its slot until the stream
// ends, so a second call of the same peer is refused with
// RESOURCE_EXHAUSTED while it is open, and passes once the client drops it.

#[tokio::test]
async fn a_grpc_stream_holds_its_concurrency_slot_until_dropped() {
    use tollgate_limiter::Concurrency;
    use tollgate_tower::concurrency::ConcurrencyLimitLayer;

    let limiter = Limiter::new(
        "grpc_streams",
        Concurrency::new(1, Duration::from_secs(60)).unwrap(),
        MemoryBackend::new(),
    );
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let layer = ConcurrencyLimitLayer::new(limiter.clone(), ClientIp::new()).grpc();
    tokio::spawn(async move {
        Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    let mut client = connect(addr).await;

    let watch = client
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap();
    let mut stream = watch.into_inner();
    // The stream is live: its first message arrived.
    assert!(stream.message().await.unwrap().is_some());

    let status = check(&mut client).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let retry: u64 = status
        .metadata()
        .get("retry-after")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    // A slot frees whenever a call ends: retry in the shortest delay, 1 s.
    assert_eq!(retry, 1);

    // Dropping the stream ends the response body: the slot comes back.
    drop(stream);
    let mut passed = false;
    for _ in 0..200 {
        if check(&mut client).await.is_ok() {
            passed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        passed,
        "the slot was never released after the stream was dropped"
    );
}
