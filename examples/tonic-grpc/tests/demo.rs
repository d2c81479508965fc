//! The demo's burst: three `Ok`, then `ResourceExhausted` with a retry
//! delay; `Unavailable` when the fail-closed backend fails.

use tollgate_memory::MemoryBackend;
use tonic::Code;

async fn start(backend: MemoryBackend) -> std::net::SocketAddr {
    let config = tonic_grpc::limits().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { tonic_grpc::serve(&config, backend, listener).await.unwrap() });
    addr
}

#[tokio::test]
async fn ok_then_resource_exhausted() {
    let addr = start(MemoryBackend::new()).await;
    let replies = tonic_grpc::burst(addr, 5).await.unwrap();
    let codes: Vec<_> = replies.iter().map(|r| r.code).collect();
    assert_eq!(
        codes,
        [
            Code::Ok,
            Code::Ok,
            Code::Ok,
            Code::ResourceExhausted,
            Code::ResourceExhausted
        ]
    );
    assert_eq!(
        replies[0].ratelimit.as_deref(),
        Some("\"grpc_ip\";r=2;t=10")
    );
    assert_eq!(replies[3].retry_after.as_deref(), Some("10"));
}

#[tokio::test]
async fn unavailable_when_the_backend_fails() {
    let backend = MemoryBackend::new();
    backend.set_failing(true);
    let addr = start(backend).await;
    let replies = tonic_grpc::burst(addr, 1).await.unwrap();
    assert_eq!(replies[0].code, Code::Unavailable);
    assert_eq!(replies[0].retry_after.as_deref(), Some("1"));
}

/// The `REDIS_URL` path, counted in a throwaway Redis (skipped when
/// redis-server is not installed, outside CI).
#[tokio::test]
async fn counts_in_redis_too() {
    let Some(server) = tollgate_testkit::redis_server::RedisServer::start() else {
        return;
    };
    // Decisions wait up to 5 s, not the default 50 ms: a loaded test
    // machine's slow reply would answer by the fail mode.
    let config = tollgate_limiter::Config::builder()
        .toml_str(tonic_grpc::LIMITS)
        .toml_str("[defaults]\ntimeout = '5s'")
        .load()
        .unwrap();
    let backend = tollgate_redis::RedisBackend::builder(server.url())
        .prefix(config.prefix())
        .build()
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { tonic_grpc::serve(&config, backend, listener).await.unwrap() });
    let codes: Vec<_> = tonic_grpc::burst(addr, 4)
        .await
        .unwrap()
        .iter()
        .map(|r| r.code)
        .collect();
    assert_eq!(
        codes,
        [Code::Ok, Code::Ok, Code::Ok, Code::ResourceExhausted]
    );
}

/// An invalid configuration stops the start-up (exit code 1) with the
/// error's message, which names the field; `main` returned the error and
/// printed its `Debug`: `Error: Invalid { path: .. }`.
#[test]
fn an_invalid_configuration_is_reported_by_its_message() {
    let stderr = tollgate_testkit::demo::run_failing(
        env!("CARGO_BIN_EXE_tonic-grpc"),
        &[("TOLLGATE_LIMITERS__GRPC_IP__WINDOW", "0s")],
    );
    assert!(
        stderr.contains("error: invalid tollgate configuration: limiters.grpc_ip.window: "),
        "{stderr}"
    );
}
