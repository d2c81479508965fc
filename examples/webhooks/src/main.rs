//! `cargo run -p webhooks`: starts the webhook endpoints on a loopback
//! port and sends them a storm: one Slack channel flooded, a quieter
//! channel of the same workspace, a Telegram chat; prints what passed and
//! which limit refused the rest. Then a listener stream (a fake Mattermost
//! source) is limited per channel, the excess dropped and counted.
//!
//! `cargo run -p webhooks -- --serve [ADDR]` keeps serving (default
//! `127.0.0.1:3000`). `REDIS_URL=redis://127.0.0.1:6379` counts in Redis
//! instead of memory.

use std::collections::BTreeMap;
use std::error::Error;
use std::process::ExitCode;

use tollgate_limiter::Backend;
use tollgate_memory::MemoryBackend;
use tollgate_redis::RedisBackend;
use tollgate_tower::stream::Excess;
use webhooks::{Sender, listener, slack_message, telegram_message};

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
    let config = webhooks::limits()?;
    match std::env::var("REDIS_URL") {
        Ok(url) => {
            let backend = RedisBackend::builder(url)
                .prefix(config.prefix())
                .build()
                .await?;
            eprintln!("counting in Redis");
            run(&config, backend).await
        }
        Err(_) => run(&config, MemoryBackend::new()).await,
    }
}

async fn run<B: Backend + Clone>(
    config: &tollgate_limiter::Config,
    backend: B,
) -> Result<(), Box<dyn Error + Send + Sync>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // The demo stands in for a proxy on loopback (nginx, see docs/nginx.md).
    let proxies = vec!["127.0.0.1/32".parse()?, "::1/128".parse()?];
    let router = webhooks::app(config, backend.clone(), proxies)?;

    if args.iter().any(|a| a == "--serve") {
        let bind = args
            .iter()
            .find(|a| !a.starts_with("--"))
            .map_or("127.0.0.1:3000", String::as_str);
        let listener = tokio::net::TcpListener::bind(bind).await?;
        eprintln!("listening on http://{}", listener.local_addr()?);
        webhooks::serve(listener, router).await?;
        return Ok(());
    }

    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = tcp.local_addr()?;
    tokio::spawn(webhooks::serve(tcp, router));
    let sender = Sender::new(addr);
    println!("webhooks on http://{addr}  (per channel 30/min, per source 120/min, per IP 600/min)");

    let slack_ip = Some("192.0.2.10");
    let telegram_ip = Some("192.0.2.20");
    let mut tally: BTreeMap<&str, BTreeMap<String, u64>> = BTreeMap::new();
    let mut count = |what: &'static str, reply: webhooks::Reply| {
        let outcome = match reply.refused_by {
            Some(by) => format!("{} {by}", reply.status.as_u16()),
            None => reply.status.as_u16().to_string(),
        };
        *tally.entry(what).or_default().entry(outcome).or_default() += 1;
    };
    for i in 0..40 {
        let flood = slack_message("T0ACME", "C0FLOOD", &format!("spam {i}"));
        count(
            "slack T0ACME #C0FLOOD (40 sent)",
            sender.post("/slack/events", slack_ip, &flood).await?,
        );
        if i % 4 == 0 {
            let quiet = slack_message("T0ACME", "C0QUIET", "hello");
            count(
                "slack T0ACME #C0QUIET (10 sent)",
                sender.post("/slack/events", slack_ip, &quiet).await?,
            );
        }
        let update = telegram_message(i, -1_001_234, &format!("msg {i}"));
        count(
            "telegram demo_bot chat -1001234 (40 sent)",
            sender
                .post("/telegram/demo_bot", telegram_ip, &update)
                .await?,
        );
    }
    for (what, outcomes) in &tally {
        let outcomes: Vec<String> = outcomes.iter().map(|(o, n)| format!("{n} x {o}")).collect();
        println!("{what:<42} {}", outcomes.join(", "));
    }

    println!("\nlistener (fake Mattermost source): per channel 30/min, excess dropped");
    let limiter = config.limiter("listener_channel")?.build(backend);
    let (handled, stats) = listener::run(
        listener::fake_source(listener::storm()),
        limiter,
        Excess::Drop,
    )
    .await;
    for (channel, n) in &handled.per_channel {
        println!("  #{channel:<12} {n} handled");
    }
    println!(
        "  dropped: {} (over the limit: {})",
        stats.dropped(),
        stats.limited()
    );
    Ok(())
}
