//! `cargo run -p llm-costs`: each completion reserves its prompt plus
//! `max_tokens` from a standard key's token budget and settles with the
//! usage the (fake) model reports, so three large completions all pass and
//! cost what they used; a fourth that asks for most of the budget does not
//! fit what is left (refused, naming `llm_tokens`), while cheap API calls
//! keep working. `REDIS_URL=redis://127.0.0.1:6379` counts in Redis
//! instead of memory.

use std::error::Error;
use std::process::ExitCode;

use axum::Router;
use axum::body::Body;
use http::Request;
use http_body_util::BodyExt;
use tollgate_limiter::KeyHasher;
use tollgate_memory::MemoryBackend;
use tollgate_redis::RedisBackend;
use tower::ServiceExt;

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
    let config = llm_costs::limits()?;
    // A service hashes emails and API keys under its secret
    // (TOLLGATE_KEY_SECRET, the same on every worker) and fails at start-up
    // without one; this self-contained demo falls back to a throwaway one.
    let hasher = KeyHasher::from_env().or_else(|_| KeyHasher::new("a throwaway demo secret"))?;
    let app: Router = match std::env::var("REDIS_URL") {
        Ok(url) => {
            let backend = RedisBackend::builder(url)
                .prefix(config.prefix())
                .build()
                .await?;
            eprintln!("counting in Redis");
            llm_costs::app(&config, backend, hasher)?
        }
        Err(_) => llm_costs::app(&config, MemoryBackend::new(), hasher)?,
    };
    println!("token budget 20000 per key (20000/h); API 60/min (standard), 600/min (admin)");
    let prompt = "Summarise the attached report. ".repeat(40);
    for (i, max_tokens) in [(1, 8000), (2, 8000), (3, 8000), (4, 19_000)] {
        let body = serde_json::json!({ "prompt": prompt, "max_tokens": max_tokens }).to_string();
        let req = Request::post("/v1/complete")
            .header("x-api-key", "demo_key")
            .header("content-type", "application/json")
            .body(Body::from(body))?;
        let res = app.clone().oneshot(req).await?;
        let status = res.status();
        let retry = res
            .headers()
            .get("retry-after")
            .map(|v| format!("  Retry-After: {}", v.to_str().unwrap_or("?")))
            .unwrap_or_default();
        let body = res.into_body().collect().await?.to_bytes();
        let usage = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .filter(|v| v["usage"].is_object())
            .map(|v| {
                let u = &v["usage"];
                format!(", used {}, {} left", u["charged_tokens"], u["tokens_left"])
            })
            .unwrap_or_default();
        println!(
            "completion #{i} (reserved {} tokens): {status}{usage}{retry}",
            llm_costs::cost(&prompt, max_tokens),
        );
    }
    let req = Request::get("/v1/models")
        .header("x-api-key", "demo_key")
        .body(Body::empty())?;
    let res = app.clone().oneshot(req).await?;
    let ratelimit = res
        .headers()
        .get("ratelimit")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    println!("GET /v1/models: {}  RateLimit: {ratelimit}", res.status());
    Ok(())
}
