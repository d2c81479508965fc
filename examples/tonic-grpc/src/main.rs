//! `cargo run -p tonic-grpc`: starts the gRPC server on a loopback port,
//! sends it a burst of health checks and prints each outcome: `Ok`, then
//! `ResourceExhausted` with a `retry-after`.
//!
//! `cargo run -p tonic-grpc -- --serve [ADDR]` keeps serving (default
//! `127.0.0.1:50051`). `REDIS_URL=redis://127.0.0.1:6379` counts in Redis.

use std::error::Error;
use std::process::ExitCode;

use tollgate_limiter::Config;
use tollgate_memory::MemoryBackend;
use tollgate_redis::RedisBackend;

async fn run(
    config: Config,
    listener: tokio::net::TcpListener,
) -> Result<(), Box<dyn Error + Send + Sync>> {
    match std::env::var("REDIS_URL") {
        Ok(url) => {
            let backend = RedisBackend::builder(url)
                .prefix(config.prefix())
                .build()
                .await?;
            tonic_grpc::serve(&config, backend, listener).await
        }
        Err(_) => tonic_grpc::serve(&config, MemoryBackend::new(), listener).await,
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let Err(e) = try_main().await else {
        return ExitCode::SUCCESS;
    };
    // What `main -> Result` would print is the error's `Debug`; its
    // `Display` names what to fix (the field, the file), then its causes.
    eprintln!("error: {}", tollgate_limiter::error::chain(&*e));
    ExitCode::FAILURE
}

async fn try_main() -> Result<(), Box<dyn Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let serve = args.iter().any(|a| a == "--serve");
    let bind = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .map_or("127.0.0.1:50051", String::as_str);
    let config = tonic_grpc::limits()?;

    if serve {
        let listener = tokio::net::TcpListener::bind(bind).await?;
        eprintln!("gRPC health service on {}", listener.local_addr()?);
        return run(config, listener).await.map_err(|e| e as Box<dyn Error>);
    }

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(run(config, listener));
    println!("grpc.health.v1.Health/Check on {addr}  (3 per 10 s per client IP)");
    for (i, r) in tonic_grpc::burst(addr, 5).await?.iter().enumerate() {
        let retry = r
            .retry_after
            .as_deref()
            .map(|s| format!("  retry-after: {s}"))
            .unwrap_or_default();
        let fields = r.ratelimit.as_deref().unwrap_or("-");
        println!("{:>2}  {:?}  ratelimit: {fields}{retry}", i + 1, r.code);
    }
    Ok(())
}
