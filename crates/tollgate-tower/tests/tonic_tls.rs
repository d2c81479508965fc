//! A real tonic server over TLS: tonic records the peer as
//! `TlsConnectInfo<TcpConnectInfo>`, and `ClientIp` must read it, or every
//! request would be keyless (and refused by the missing-key policy).
//!
//! The certificate is made with the `openssl` CLI
//! (`scripts/install-test-deps.sh` installs it).

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

async fn serve_tls(cert: &str, key: &str) -> SocketAddr {
    let limiter = Limiter::new(
        "grpc_ip",
        SlidingWindow::new(2, Duration::from_secs(30)).unwrap(),
        MemoryBackend::new(),
    );
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let tls = ServerTlsConfig::new().identity(Identity::from_pem(cert, key));
    tokio::spawn(async move {
        Server::builder()
            .tls_config(tls)
            .unwrap()
            // The default missing-key policy: a keyless request is refused.
            .layer(RateLimitLayer::new(limiter, ClientIp::new()).grpc())
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    addr
}

#[tokio::test]
async fn a_tls_server_keys_requests_by_the_peer_address() {
    let (cert, key) = self_signed();
    let addr = serve_tls(&cert, &key).await;
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
    let check = |client: &mut HealthClient<Channel>| {
        let mut client = client.clone();
        async move {
            client
                .check(HealthCheckRequest {
                    service: String::new(),
                })
                .await
        }
    };
    // Keyed by 127.0.0.1: two pass with the limit's fields, the third is
    // refused by the limit (not as keyless).
    for remaining in [1, 0] {
        let ok = check(&mut client).await.unwrap();
        let field = ok.metadata().get("ratelimit").unwrap().to_str().unwrap();
        assert!(
            field.starts_with(&format!("\"grpc_ip\";r={remaining};")),
            "{field}"
        );
    }
    let status = check(&mut client).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
}
