//! `cargo run -p axum-login`: starts the login app on a loopback port; an
//! attacker runs a password list against one account and is cut off (the
//! account is delayed, then the attacker's IP refused), and the real user,
//! after waiting the `Retry-After` they are told, logs in.
//!
//! `cargo run -p axum-login -- --serve [ADDR]` keeps serving (default
//! `127.0.0.1:3000`). `REDIS_URL=redis://127.0.0.1:6379` counts in Redis
//! instead of memory, and so does a `[redis]` section of the configuration
//! (`TOLLGATE_REDIS__URL=rediss://…`, `TOLLGATE_REDIS__CONNECT_TIMEOUT=1s`):
//! moving between environments takes no code.

use std::error::Error;
use std::process::ExitCode;

use axum::Router;
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

async fn try_main() -> Result<(), Box<dyn Error + Send + Sync>> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let serve = args.iter().any(|a| a == "--serve");
    let bind = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .map_or("127.0.0.1:3000", String::as_str);

    let config = axum_login::limits()?;
    // Emails are hashed under the service's secret (TOLLGATE_KEY_SECRET, the
    // same on every worker). Serving without it fails at start-up; only the
    // self-contained demo falls back to a throwaway one.
    let hasher = match KeyHasher::from_env() {
        Ok(hasher) => hasher,
        Err(e) if serve => return Err(e.into()),
        Err(_) => KeyHasher::new("a throwaway demo secret")?,
    };
    // The demo stands in for a proxy on loopback (nginx, see docs/nginx.md).
    let proxies = vec!["127.0.0.1/32".parse()?, "::1/128".parse()?];
    let router: Router = if config.redis().is_some() {
        let backend = RedisBackend::from_config(&config).await?;
        eprintln!("counting in Redis");
        axum_login::app(&config, backend, proxies, hasher)?
    } else {
        axum_login::app(&config, MemoryBackend::new(), proxies, hasher)?
    };

    if serve {
        let listener = tokio::net::TcpListener::bind(bind).await?;
        eprintln!("listening on http://{}", listener.local_addr()?);
        axum_login::serve(listener, router).await?;
        return Ok(());
    }

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(axum_login::serve(listener, router));
    println!(
        "POST http://{addr}/login  account {}  (5 free failures, then 1s, 2s, 4s ...; 20 attempts per IP per 15 min)",
        axum_login::EMAIL
    );
    let run = axum_login::demo(addr, 24).await?;
    for (i, r) in run.attacker.iter().enumerate() {
        println!("attacker  #{:<2} {}", i + 1, describe(r));
    }
    for r in &run.user {
        println!("real user     {}", describe(r));
    }
    Ok(())
}

fn describe(r: &axum_login::Reply) -> String {
    let mut s = r.status.to_string();
    if let Some(by) = &r.refused_by {
        s.push_str(&format!("  refused by {by}"));
    }
    if let Some(secs) = r.retry_after {
        s.push_str(&format!("  Retry-After: {secs}"));
    }
    s
}
