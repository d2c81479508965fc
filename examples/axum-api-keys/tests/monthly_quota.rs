//! The pro plan's monthly quota: a calendar part of the `api_pro`
//! composite, counted per key and reset at midnight on the 1st, Berlin
//! time; `Retry-After` points at that boundary.

use axum::Router;
use axum::body::Body;
use http::{Request, StatusCode};
use tollgate_limiter::{Config, KeyHasher, MockClock, Period, Policy};
use tollgate_memory::MemoryBackend;
use tower::ServiceExt;

/// Saturday 31 January 2026, 23:59 in Berlin (22:59 UTC).
const JAN_31_2359_BERLIN: u64 = 1_769_900_340_000_000;

#[test]
fn the_pro_plan_ships_a_monthly_quota_in_berlin() {
    let config = axum_api_keys::limits().unwrap();
    let Policy::Composite(pro) = config.limiter("api_pro").unwrap().policy else {
        panic!("api_pro is a composite")
    };
    let Some(Policy::Calendar(month)) = pro.policy(2) else {
        panic!("{pro:?}")
    };
    assert_eq!(month.limit(), 10_000);
    assert_eq!(month.period(), Period::Month);
    assert_eq!(month.zone().name(), "Europe/Berlin");
}

async fn get(app: &Router, key: &str) -> (StatusCode, Vec<String>) {
    let req = Request::get("/v1/items")
        .header("x-api-key", key)
        .body(Body::empty())
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let headers = ["ratelimit", "ratelimit-policy", "retry-after"]
        .iter()
        .map(|h| {
            res.headers()
                .get(*h)
                .map_or(String::new(), |v| v.to_str().unwrap().to_owned())
        })
        .collect();
    (res.status(), headers)
}

#[tokio::test]
async fn a_spent_month_waits_for_the_first_of_the_next() {
    // The shipped plan, with a monthly quota of 3 so the test spends it.
    let config = Config::builder()
        .toml_str(axum_api_keys::LIMITS)
        .toml_str(
            r#"[limiters.api_pro]
            policies = [
                { strategy = "token_bucket", capacity = 50, refill = "50/min" },
                { strategy = "sliding_window", limit = 2000, window = "24h" },
                { strategy = "calendar", limit = 3, period = "month", time_zone = "Europe/Berlin" },
            ]"#,
        )
        .load()
        .unwrap();
    let clock = MockClock::starting_at(JAN_31_2359_BERLIN);
    let app = axum_api_keys::app_with(
        &config,
        MemoryBackend::with_clock(clock.clone()),
        axum_api_keys::Layers::PerKey,
        KeyHasher::new("the example tests' secret").unwrap(),
    )
    .unwrap();

    for left in [2, 1, 0] {
        let (status, h) = get(&app, "pro_acme").await;
        assert_eq!(status, StatusCode::OK);
        // The month binds: the fewest remaining, 60 s to its end.
        assert_eq!(h[0], format!("\"api_pro.2\";r={left};t=60"));
    }
    let (status, h) = get(&app, "pro_acme").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(h[2], "60", "Retry-After: Berlin midnight");
    // January: 31 days.
    assert!(h[1].ends_with("\"api_pro.2\";q=3;w=2678400"), "{h:?}");
    // Another key of the plan has its own quota.
    assert_eq!(get(&app, "pro_other").await.0, StatusCode::OK);

    clock.advance(std::time::Duration::from_secs(60));
    let (status, h) = get(&app, "pro_acme").await;
    assert_eq!(status, StatusCode::OK);
    // February: a fresh quota for 28 days.
    assert_eq!(h[0], "\"api_pro.2\";r=2;t=2419200");
}
