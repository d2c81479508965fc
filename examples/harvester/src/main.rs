//! `cargo run -p harvester`: starts a fake source on a loopback port that
//! serves 20 pages/s and raises its limit to 35/s after 15 s, crawls it for
//! 30 s with 8 concurrent tasks through the adaptive layer, and prints the
//! adapted rate as it converges.
//!
//! Options: `--duration 30s`, `--source-rate 20`, `--rise-to 35`,
//! `--rise-at 15s` (`--rise-to 0` keeps the limit), `--tasks 8`,
//! `--csv FILE` (every 100 ms sample: `t,rate,limit,served,refused`).
//! `REDIS_URL=redis://127.0.0.1:6379` keeps the adaptive state in Redis
//! instead of memory.

use std::error::Error;
use std::process::ExitCode;
use std::time::Duration;

use harvester::{Options, Sample, Schedule, Source};
use tollgate_limiter::Backend;
use tollgate_limiter::aimd::AimdLimiter;
use tollgate_memory::MemoryBackend;
use tollgate_redis::RedisBackend;

struct Args {
    options: Options,
    schedule: Schedule,
    csv: Option<String>,
}

const USAGE: &str = "usage: harvester [--duration 30s] [--source-rate 20] [--rise-to 35] \
                     [--rise-at 15s] [--tasks 8] [--csv FILE]";

fn parse_args() -> Result<Args, String> {
    let mut options = Options::default();
    let mut rate = 20.0;
    let mut rise_to = 35.0;
    let mut rise_at = Duration::from_secs(15);
    let mut csv = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--help" || flag == "-h" {
            return Err(USAGE.into());
        }
        let value = args
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let number = |v: &str| v.parse::<f64>().map_err(|e| format!("{flag} {v}: {e}"));
        let duration =
            |v: &str| humantime::parse_duration(v).map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--duration" => options.duration = duration(&value)?,
            "--source-rate" => rate = number(&value)?,
            "--rise-to" => rise_to = number(&value)?,
            "--rise-at" => rise_at = duration(&value)?,
            "--tasks" => {
                options.tasks = value.parse().map_err(|e| format!("{flag} {value}: {e}"))?
            }
            "--csv" => csv = Some(value),
            other => return Err(format!("unknown option {other}\n{USAGE}")),
        }
    }
    if !(rate > 0.0 && rise_to >= 0.0) {
        return Err("rates must be positive".into());
    }
    let change = (rise_to > 0.0).then_some((rise_at, rise_to));
    Ok(Args {
        options,
        schedule: Schedule { rate, change },
        csv,
    })
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
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };
    let config = harvester::config()?;
    match std::env::var("REDIS_URL") {
        Ok(url) => {
            let backend = RedisBackend::builder(url)
                .prefix("harvester")
                .build()
                .await?;
            eprintln!("adaptive state in Redis");
            run(&args, AimdLimiter::new("harvester", config, backend)?).await
        }
        Err(_) => {
            run(
                &args,
                AimdLimiter::new("harvester", config, MemoryBackend::new())?,
            )
            .await
        }
    }
}

async fn run<B: Backend>(args: &Args, limiter: AimdLimiter<B>) -> Result<(), Box<dyn Error>> {
    let source = Source::start(args.schedule).await?;
    let scope = harvester::scope(&source);
    println!(
        "source http://{} serves {}/s{}; crawling for {:?} with {} tasks",
        source.addr(),
        args.schedule.rate,
        args.schedule
            .change
            .map(|(at, r)| format!(", {r}/s after {at:?}"))
            .unwrap_or_default(),
        args.options.duration,
        args.options.tasks,
    );
    println!(
        "{:>6}  {:>11}  {:>12}  {:>9}  {:>9}",
        "t", "rate", "source limit", "served/s", "refused/s"
    );
    let mut last: Option<Sample> = None;
    let samples = harvester::crawl(&source, &limiter, &args.options, |s| {
        // One line a second, with the throughput of that second.
        let due = last.is_none_or(|l| s.t - l.t >= 1.0);
        if due {
            let (served, refused) =
                last.map_or((0, 0), |l| (s.served - l.served, s.refused - l.refused));
            println!(
                "{:>5.1}s  {:>7.2} r/s  {:>8.1} r/s  {:>9}  {:>9}",
                s.t, s.rate, s.limit, served, refused
            );
            last = Some(*s);
        }
    })
    .await;

    let end = samples.last().map_or(0.0, |s| s.t);
    let mean = harvester::mean_rate(&samples, end - 5.0, end + 1.0).unwrap_or(f64::NAN);
    let limit = source.limit();
    println!(
        "last 5 s: mean rate {mean:.1}/s for a hidden limit of {limit}/s ({:.0}%); served {}, refused {}",
        100.0 * mean / limit,
        source.served(),
        source.refused(),
    );
    if let Some(path) = &args.csv {
        std::fs::write(path, harvester::to_csv(&samples))?;
        println!("samples written to {path}");
    }
    // The adapted rate of this run's throwaway source is of no further use.
    let _ = limiter.forget(&scope).await;
    Ok(())
}
