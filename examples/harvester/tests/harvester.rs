//! The example end to end, in real time over the loopback: a hidden limit
//! is found, and the binary runs by itself.

use std::process::Command;
use std::time::Duration;

use harvester::{Options, Schedule, Source};
use tollgate_limiter::aimd::AimdLimiter;
use tollgate_memory::MemoryBackend;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finds_the_hidden_rate() {
    let source = Source::start(Schedule {
        rate: 20.0,
        change: None,
    })
    .await
    .unwrap();
    let limiter = AimdLimiter::new(
        "harvester",
        harvester::config().unwrap(),
        MemoryBackend::new(),
    )
    .unwrap();
    let options = Options {
        duration: Duration::from_secs(14),
        ..Options::default()
    };
    let samples = harvester::crawl(&source, &limiter, &options, |_| {}).await;

    // From 2/s, +4/s per second reaches 20/s in under 5 s; afterwards the
    // rate saws around the limit. Real time adds jitter: 25% of slack.
    let mean = harvester::mean_rate(&samples, 7.0, 15.0).unwrap();
    assert!((mean - 20.0).abs() <= 0.25 * 20.0, "mean rate {mean}");
    // It did probe the limit, and refusals stayed rare.
    let (served, refused) = (source.served(), source.refused());
    assert!(refused >= 1, "never refused: the limit was not found");
    assert!(refused * 5 < served, "served {served}, refused {refused}");
}

#[test]
fn the_binary_runs_by_itself_and_writes_csv() {
    let csv = std::env::temp_dir().join(format!("harvester-test-{}.csv", std::process::id()));
    let output = Command::new(env!("CARGO_BIN_EXE_harvester"))
        .args([
            "--duration",
            "4s",
            "--source-rate",
            "10",
            "--rise-to",
            "0",
            "--csv",
        ])
        .arg(&csv)
        .env_remove("REDIS_URL")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("last 5 s: mean rate"), "{stdout}");

    let text = std::fs::read_to_string(&csv).unwrap();
    std::fs::remove_file(&csv).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("t,rate,limit,served,refused"));
    let rows: Vec<Vec<f64>> = lines
        .map(|l| l.split(',').map(|v| v.parse().unwrap()).collect())
        .collect();
    assert!(rows.len() >= 30, "{} samples", rows.len());
    assert!(rows.iter().all(|r| r.len() == 5 && r[2] == 10.0));
    // Time moves forward and the counts never go back.
    assert!(
        rows.windows(2)
            .all(|w| w[1][0] > w[0][0] && w[1][3] >= w[0][3])
    );
}

#[test]
fn bad_arguments_are_refused() {
    let output = Command::new(env!("CARGO_BIN_EXE_harvester"))
        .args(["--duration", "soon"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--duration"));
}

/// A start-up failure is reported by the error's message and its cause
/// (exit code 1); `main` returned the error and printed its `Debug`:
/// `Error: Redis(Redis URL did not parse - InvalidClientConfig)`.
#[test]
fn a_start_up_failure_is_reported_by_its_message_and_cause() {
    let stderr = tollgate_testkit::demo::run_failing(
        env!("CARGO_BIN_EXE_harvester"),
        &[("REDIS_URL", "not a url")],
    );
    assert!(
        stderr.contains("error: redis command failed: Redis URL did not parse"),
        "{stderr}"
    );
}
