//! `cargo run -p axum-api-keys`: starts the API on a loopback port, sends
//! it a burst of requests with one API key and prints each status with its
//! rate-limit fields: the 200s turn into 429s.
//!
//! It ends by scraping its own `GET /metrics` and printing the decision
//! counters.
//!
//! `cargo run -p axum-api-keys -- --serve [ADDR]` keeps serving (default
//! `127.0.0.1:3000`), metrics at `/metrics`; add `--no-limit` to serve without the layers, or
//! `--key-only` to limit per API key only, `--no-metrics` to record no
//! metrics (all three are for benchmarks).
//! `REDIS_URL=redis://127.0.0.1:6379` counts in Redis instead of memory.

use std::error::Error;
use std::process::ExitCode;

use axum::Router;
use axum_api_keys::Layers;
use tollgate_limiter::KeyHasher;
use tollgate_memory::MemoryBackend;
use tollgate_redis::RedisBackend;

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
    let layers = if args.iter().any(|a| a == "--no-limit") {
        Layers::None
    } else if args.iter().any(|a| a == "--key-only") {
        Layers::PerKey
    } else {
        Layers::PerIpAndKey
    };
    let bind = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .map_or("127.0.0.1:3000", String::as_str);

    // Before the limiters: they register their metrics when built.
    let metrics = if args.iter().any(|a| a == "--no-metrics") {
        None
    } else {
        Some(axum_api_keys::install_metrics()?)
    };
    let config = axum_api_keys::limits()?;
    // A service hashes emails and API keys under its secret
    // (TOLLGATE_KEY_SECRET, the same on every worker) and fails at start-up
    // without one; this self-contained demo falls back to a throwaway one.
    let hasher = KeyHasher::from_env().or_else(|_| KeyHasher::new("a throwaway demo secret"))?;
    let router: Router = match std::env::var("REDIS_URL") {
        Ok(url) => {
            let backend = RedisBackend::builder(url)
                .prefix(config.prefix())
                .build()
                .await?;
            eprintln!("counting in Redis");
            axum_api_keys::app_with(&config, backend, layers, hasher)?
        }
        Err(_) => axum_api_keys::app_with(&config, MemoryBackend::new(), layers, hasher)?,
    };
    let router = match metrics {
        Some(handle) => axum_api_keys::with_metrics(router, handle),
        None => router,
    };

    if serve {
        let listener = tokio::net::TcpListener::bind(bind).await?;
        eprintln!("listening on http://{}", listener.local_addr()?);
        axum_api_keys::serve(listener, router).await?;
        return Ok(());
    }

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(axum_api_keys::serve(listener, router));
    println!("GET http://{addr}/v1/items  x-api-key: demo_key  (free plan: 5 per minute)");
    for (i, r) in axum_api_keys::burst(addr, "demo_key", 8)
        .await?
        .iter()
        .enumerate()
    {
        let retry = r
            .retry_after
            .as_deref()
            .map(|s| format!("  Retry-After: {s}"))
            .unwrap_or_default();
        println!(
            "{:>2}  {}  RateLimit: {}{retry}",
            i + 1,
            r.status,
            r.ratelimit
        );
    }
    println!("\nGET http://{addr}/metrics");
    let (_, text) = axum_api_keys::fetch(addr, "/metrics", None).await?;
    if text.is_empty() {
        println!("(--no-metrics)");
    }
    for line in text.lines() {
        if line.starts_with("tollgate_decisions_total") && !line.ends_with(" 0") {
            println!("{line}");
        }
    }
    Ok(())
}
