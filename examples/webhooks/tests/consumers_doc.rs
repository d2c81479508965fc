//! `docs/consumers.md` is checked: every TOML block in it loads (merged,
//! as one deployment would), each row has the strategy and fail mode the
//! consumers table gives it, and the examples ship the same numbers.

use std::path::Path;
use std::time::Duration;

use tollgate_limiter::{Config, FailMode, Policy, Strategy};

fn doc() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/consumers.md");
    std::fs::read_to_string(path).expect("docs/consumers.md")
}

fn toml_blocks(doc: &str) -> Vec<&str> {
    doc.split("```toml\n")
        .skip(1)
        .map(|rest| &rest[..rest.find("```").expect("a closed block")])
        .collect()
}

fn documented() -> Config {
    let doc = doc();
    let blocks = toml_blocks(&doc);
    assert!(blocks.len() >= 7, "{} blocks", blocks.len());
    let mut builder = Config::builder();
    for block in blocks {
        // Each block also loads on its own.
        Config::builder()
            .toml_str(block)
            .load()
            .unwrap_or_else(|e| panic!("{e}\n{block}"));
        builder = builder.toml_str(block);
    }
    builder.load().unwrap()
}

#[test]
fn every_row_has_its_strategy_and_fail_mode() {
    let c = documented();
    let rows: &[(&str, Strategy, FailMode)] = &[
        ("login_ip", Strategy::SlidingWindow, FailMode::Closed),
        (
            "login_account",
            Strategy::ProgressiveDelay,
            FailMode::Closed,
        ),
        ("api_ip", Strategy::TokenBucket, FailMode::Open),
        ("api_standard", Strategy::TokenBucket, FailMode::Open),
        ("api_admin", Strategy::TokenBucket, FailMode::Open),
        ("hooks_ip", Strategy::SlidingWindow, FailMode::Closed),
        ("hooks_source", Strategy::SlidingWindow, FailMode::Closed),
        ("hooks_channel", Strategy::SlidingWindow, FailMode::Closed),
        (
            "listener_channel",
            Strategy::SlidingWindow,
            FailMode::Closed,
        ),
        ("llm_tokens", Strategy::TokenBucket, FailMode::Closed),
        ("plan_monthly", Strategy::Calendar, FailMode::Open),
        ("plan_api", Strategy::Composite, FailMode::Open),
    ];
    for (name, strategy, fail_mode) in rows {
        let l = c.limiter(name).unwrap();
        assert_eq!(l.policy.strategy(), *strategy, "{name}");
        assert_eq!(l.fail_mode, *fail_mode, "{name}");
    }
    assert_eq!(
        c.limiter("login_ip").unwrap().policy.window(),
        Duration::from_secs(900)
    );
    for name in [
        "hooks_ip",
        "hooks_source",
        "hooks_channel",
        "listener_channel",
    ] {
        assert_eq!(
            c.limiter(name).unwrap().policy.window(),
            Duration::from_secs(60),
            "{name}"
        );
    }
    match c.limiter("api_standard").unwrap().policy {
        Policy::TokenBucket(tb) => assert_eq!(tb.period(), Duration::from_secs(60)),
        other => panic!("{other:?}"),
    }
    let h = c.adaptive("harvester").unwrap();
    assert!(h.decrease > 0.0 && h.decrease < 1.0);
    assert!(h.min_rate <= h.initial_rate && h.initial_rate <= h.max_rate);
}

#[test]
fn the_examples_ship_the_documented_numbers() {
    let c = documented();
    let shipped = [
        (
            include_str!("../../axum-login/limits.toml"),
            &["login_ip", "login_account"][..],
        ),
        (
            include_str!("../limits.toml"),
            &[
                "hooks_ip",
                "hooks_source",
                "hooks_channel",
                "listener_channel",
            ][..],
        ),
        (
            include_str!("../../llm-costs/limits.toml"),
            &["api_standard", "api_admin", "llm_tokens"][..],
        ),
    ];
    for (toml, names) in shipped {
        let example = Config::builder().toml_str(toml).load().unwrap();
        for name in names {
            let (doc, ex) = (c.limiter(name).unwrap(), example.limiter(name).unwrap());
            assert_eq!(doc.policy, ex.policy, "{name}");
            assert_eq!(doc.fail_mode, ex.fail_mode, "{name}");
        }
    }
}

/// The calendar section's worked example: `plan_monthly` with a limit of
/// 3, from 31 January 2026 at 23:59 in Berlin.
#[test]
fn the_calendar_worked_example_holds() {
    use tollgate_limiter::model::{Op, State};
    use tollgate_limiter::{Calendar, Period};
    let c = documented();
    let Policy::Calendar(documented) = c.limiter("plan_monthly").unwrap().policy else {
        panic!("plan_monthly is a calendar quota")
    };
    assert_eq!(documented.period(), Period::Month);
    assert_eq!(documented.zone().name(), "Europe/Berlin");
    let policy =
        Policy::from(Calendar::in_zone(3, documented.period(), documented.zone()).unwrap());
    let mut key = State::fresh(&policy);
    // 2026-01-31T22:59:00Z
    let now = 1_769_900_340_000_000;
    for left in [2, 1, 0] {
        let d = key.apply(now, &policy, Op::Acquire(1));
        assert!(d.is_allowed());
        assert_eq!((d.remaining(), d.reset_after_secs()), (left, 60));
        assert_eq!(d.window(), Duration::from_secs(2_678_400));
    }
    let d = key.apply(now, &policy, Op::Acquire(1));
    assert_eq!((d.is_denied(), d.retry_after_secs()), (true, 60));
    let d = key.apply(now + 60_000_000, &policy, Op::Acquire(1));
    assert!(d.is_allowed());
    assert_eq!((d.remaining(), d.reset_after_secs()), (2, 2_419_200));
}
