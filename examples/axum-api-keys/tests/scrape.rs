//! The example binary's `GET /metrics`, scraped as Prometheus scrapes it:
//! the decision counters move exactly as the requests sent imply.

use std::collections::BTreeMap;

use http::StatusCode;
use tollgate_testkit::demo::{Served, serve};

const BIN: &str = env!("CARGO_BIN_EXE_axum-api-keys");

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The samples of a Prometheus text page, by `name{label=value,...}`
/// (labels sorted, quotes dropped).
fn parse(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect("a sample");
            let (name, labels) = match series.split_once('{') {
                Some((name, labels)) => {
                    let mut labels: Vec<_> = labels
                        .trim_end_matches('}')
                        .split(',')
                        .map(|l| l.replace('"', ""))
                        .collect();
                    labels.sort();
                    (name, labels.join(","))
                }
                None => (series, String::new()),
            };
            (
                format!("{name}{{{labels}}}"),
                value.parse().expect("a number"),
            )
        })
        .collect()
}

async fn scrape(served: &Served) -> BTreeMap<String, f64> {
    let (status, text) = axum_api_keys::fetch(served.addr(), "/metrics", None)
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    parse(&text)
}

fn value(metrics: &BTreeMap<String, f64>, series: &str) -> f64 {
    *metrics
        .get(series)
        .unwrap_or_else(|| panic!("no {series} in {metrics:#?}"))
}

fn decisions(metrics: &BTreeMap<String, f64>, limiter: &str, outcome: &str) -> f64 {
    value(
        metrics,
        &format!("tollgate_decisions_total{{limiter={limiter},op=check,outcome={outcome}}}"),
    )
}

async fn statuses(served: &Served, key: &str, n: usize) -> Vec<StatusCode> {
    let replies = axum_api_keys::burst(served.addr(), key, n).await.unwrap();
    replies.iter().map(|r| r.status).collect()
}

#[test]
fn the_scraped_counters_follow_the_requests() {
    let served = serve(BIN, &["--serve", "127.0.0.1:0"], None);
    runtime().block_on(async {
        let free = statuses(&served, "demo_key", 8).await;
        assert_eq!(free[..5], [StatusCode::OK; 5]);
        assert_eq!(free[5..], [StatusCode::TOO_MANY_REQUESTS; 3]);
        let (status, _) = axum_api_keys::fetch(served.addr(), "/v1/items", None)
            .await
            .unwrap();
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(statuses(&served, "pro_key", 2).await, [StatusCode::OK; 2]);

        let m = scrape(&served).await;
        assert_eq!(decisions(&m, "api_free", "allowed"), 5.0);
        assert_eq!(decisions(&m, "api_free", "refused"), 3.0);
        // The candidate (3 a minute) beside the free plan (5): it would
        // have refused the 4th and 5th, and agrees on the last 3.
        let candidate = |verdict: &str| {
            value(
                &m,
                &format!(
                    "tollgate_candidate_decisions_total{{limiter=api_free,verdict={verdict}}}"
                ),
            )
        };
        assert_eq!(candidate("both_allowed"), 3.0);
        assert_eq!(candidate("candidate_refuses"), 2.0);
        assert_eq!(candidate("both_refused"), 3.0);
        assert_eq!(candidate("candidate_allows"), 0.0);
        assert_eq!(decisions(&m, "api_pro", "allowed"), 2.0);
        // Every request, the keyless one too, passed the per-IP limit.
        assert_eq!(decisions(&m, "api_ip", "allowed"), 11.0);
        for limiter in ["api_ip", "api_free", "api_pro"] {
            for outcome in ["failed_open", "failed_closed"] {
                assert_eq!(decisions(&m, limiter, outcome), 0.0, "{limiter} {outcome}");
            }
            assert_eq!(
                value(&m, &format!("tollgate_breaker_state{{limiter={limiter}}}")),
                0.0
            );
        }
        // The keyless request never reached the per-key limiter.
        assert_eq!(
            value(
                &m,
                "tollgate_missing_key_total{limiter=api_free,outcome=rejected}"
            ),
            1.0
        );
        // The memory backend answers at once, without a round trip: its
        // answers are not timed (the Redis test below times them).
        assert_eq!(
            value(
                &m,
                "tollgate_backend_latency_seconds_count{limiter=api_free}"
            ),
            0.0
        );
    });
}

/// Counting in a throwaway Redis, then with the Redis gone: the
/// fail-open limits let every request through, counted as such, and
/// their breakers open (skipped when redis-server is not installed,
/// outside CI).
#[test]
fn a_dead_redis_shows_as_failed_open_and_open_breakers() {
    let Some(mut server) = tollgate_testkit::redis_server::RedisServer::start() else {
        return;
    };
    let served = serve(BIN, &["--serve", "127.0.0.1:0"], Some(&server.url()));
    runtime().block_on(async {
        let free = statuses(&served, "demo_key", 6).await;
        assert_eq!(free[..5], [StatusCode::OK; 5]);
        assert_eq!(free[5], StatusCode::TOO_MANY_REQUESTS);
        server.kill();
        assert_eq!(statuses(&served, "other_key", 7).await, [StatusCode::OK; 7]);

        let m = scrape(&served).await;
        assert_eq!(decisions(&m, "api_free", "allowed"), 5.0);
        assert_eq!(decisions(&m, "api_free", "refused"), 1.0);
        for limiter in ["api_ip", "api_free"] {
            assert_eq!(decisions(&m, limiter, "failed_open"), 7.0, "{limiter}");
            assert_eq!(decisions(&m, limiter, "failed_closed"), 0.0, "{limiter}");
            // Five failures in a row open a breaker (the default).
            assert!(
                value(
                    &m,
                    &format!("tollgate_breaker_transitions_total{{limiter={limiter},to=open}}")
                ) >= 1.0
            );
            assert_eq!(
                value(&m, &format!("tollgate_breaker_state{{limiter={limiter}}}")),
                2.0,
                "{limiter}"
            );
        }
        assert_eq!(decisions(&m, "api_ip", "allowed"), 6.0);
        // Every round trip is timed, in the histogram's buckets: the six
        // answered, then the failed calls until the breaker opened.
        let latency = |series: &str| {
            value(
                &m,
                &format!("tollgate_backend_latency_seconds_{series}limiter=api_free}}"),
            )
        };
        assert!(latency("count{") >= 6.0 + 5.0, "{}", latency("count{"));
        assert_eq!(latency("bucket{le=+Inf,"), latency("count{"));
    });
}
