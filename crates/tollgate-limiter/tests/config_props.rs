//! The configuration loader under arbitrary values (issue 11): whatever a
//! configuration file or the environment holds, loading never panics, a
//! refusal names the section and the field, and what loads is a working
//! limiter.

use proptest::prelude::*;
use tollgate_limiter::{Config, Key, MockClock, Policy};
use tollgate_memory::MemoryBackend;

/// Every field a limiter section knows, plus one it does not.
const LIMITER_FIELDS: &[&str] = &[
    "capacity",
    "refill",
    "limit",
    "window",
    "penalise_refused",
    "free_attempts",
    "base_delay",
    "factor",
    "max_delay",
    "forget_after",
    "period",
    "time_zone",
    "cost",
    "min_cost",
    "fail_mode",
    "timeout",
    "bogus",
];

const DEFAULT_FIELDS: &[&str] = &[
    "prefix",
    "fail_mode",
    "timeout",
    "breaker_threshold",
    "breaker_backoff",
    "breaker_max_backoff",
];

/// A TOML basic string holding `s`.
fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A value as written in TOML: the plausible, the edge and the absurd.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        prop_oneof![Just(0i64), Just(1), Just(-1), Just(i64::MAX), 0i64..2000]
            .prop_map(|n| n.to_string()),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| format!("{f:?}")),
        any::<bool>().prop_map(|b| b.to_string()),
        prop_oneof![
            Just("1s"),
            Just("0s"),
            Just("15m"),
            Just("10/s"),
            Just("0/s"),
            Just("60/min"),
            Just("18446744073709551615/s"),
            Just("99999999999999h"),
            Just("open"),
            Just("month"),
            Just("Europe/Berlin"),
            Just("Mars/Olympus"),
            Just("closed"),
            Just(""),
            Just("/"),
        ]
        .prop_map(toml_string),
        "\\PC{0,16}".prop_map(|s| toml_string(&s)),
        Just("[1, 2]".to_owned()),
        Just("{ a = 1 }".to_owned()),
    ]
}

fn strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("token_bucket"),
        Just("sliding_window"),
        Just("progressive_delay"),
        Just("calendar"),
        Just("leaky_bucket"),
    ]
    .prop_map(toml_string)
}

fn fields(names: &'static [&'static str]) -> impl Strategy<Value = Vec<(&'static str, String)>> {
    proptest::sample::subsequence(names, 0..=names.len())
        .prop_flat_map(|names| {
            let n = names.len();
            (Just(names), proptest::collection::vec(value(), n))
        })
        .prop_map(|(names, values)| names.into_iter().zip(values).collect())
}

/// Loads `toml` and checks the outcome.
fn check(toml: &str) -> Result<(), TestCaseError> {
    match Config::builder().toml_str(toml).load() {
        Ok(config) => {
            // What loads is a limiter that decides.
            for lc in config.limiters() {
                // A progressive delay may grant no free attempt (the first
                // failure is delayed); every other limit grants something.
                let none_free = matches!(lc.policy, Policy::ProgressiveDelay(_));
                prop_assert!(lc.policy.limit() > 0 || none_free, "{toml}");
                let limiter = lc.build(MemoryBackend::with_clock(MockClock::new()));
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                    .unwrap();
                let verdict = rt.block_on(limiter.check(&Key::new("k")));
                prop_assert!(verdict.decision().is_some(), "{toml}: {verdict:?}");
            }
        }
        Err(e) => {
            let msg = e.to_string();
            let named = msg.contains("limiters.x") || msg.contains("defaults");
            prop_assert!(named, "the error names no section: {msg}\n{toml}");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any limiter section and defaults: never a panic; an error names
    /// where it is; a loaded limiter decides.
    #[test]
    fn any_section_loads_or_names_its_error(
        strategy in proptest::option::of(strategy()),
        limiter in fields(LIMITER_FIELDS),
        defaults in fields(DEFAULT_FIELDS),
    ) {
        let mut toml = String::from("[defaults]\n");
        for (k, v) in &defaults {
            toml.push_str(&format!("{k} = {v}\n"));
        }
        toml.push_str("[limiters.x]\n");
        if let Some(s) = &strategy {
            toml.push_str(&format!("strategy = {s}\n"));
        }
        for (k, v) in &limiter {
            toml.push_str(&format!("{k} = {v}\n"));
        }
        check(&toml)?;
    }

    /// A well-formed section with one field replaced by an arbitrary value.
    #[test]
    fn one_bad_value_in_a_good_section(
        which in 0usize..3,
        field in proptest::sample::select(LIMITER_FIELDS),
        v in value(),
    ) {
        let base = [
            "strategy = \"token_bucket\"\ncapacity = 10\nrefill = \"1/s\"\n",
            "strategy = \"sliding_window\"\nlimit = 10\nwindow = \"1m\"\n",
            "strategy = \"progressive_delay\"\nfree_attempts = 3\nbase_delay = \"1s\"\nmax_delay = \"1m\"\nforget_after = \"1h\"\n",
        ][which];
        let kept: String = base
            .lines()
            .filter(|l| !l.starts_with(&format!("{field} ")))
            .map(|l| format!("{l}\n"))
            .collect();
        check(&format!("[limiters.x]\n{kept}{field} = {v}\n"))?;
    }
}

/// A limiter built from `toml` (section `x`) on a memory backend that
/// answers `delay` late and fails its first `failures` decisions; checks
/// `n` times and answers whether every decision came back (no panic).
fn decides_with(toml: &str, delay: std::time::Duration, failures: u64, n: usize) {
    let config = Config::builder().toml_str(toml).load();
    let Ok(config) = config else {
        // Refused at start-up: fine, as long as the error names the field.
        let msg = config.unwrap_err().to_string();
        assert!(
            msg.contains("limiters.x") || msg.contains("defaults"),
            "{msg}"
        );
        return;
    };
    let backend = MemoryBackend::with_clock(MockClock::new());
    backend.set_delay(delay);
    backend.fail_next(failures);
    let limiter = config.limiter("x").unwrap().build(backend);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        for _ in 0..n {
            let _ = limiter.check(&Key::new("k")).await;
            tokio::time::advance(std::time::Duration::from_secs(3600)).await;
        }
    });
}

/// A duration humantime reads but an `Instant` cannot reach (about 300
/// billion years) is either refused at start-up, naming the field, or
/// means "no limit": it never panics a decision. It did: the per-decision
/// deadline is `Instant::now() + timeout`, and a breaker's back-off
/// `Instant::now() + backoff` (and doubled with `Duration * 2`).
#[test]
fn a_huge_duration_never_panics_a_decision() {
    let tb = "[limiters.x]\nstrategy='token_bucket'\ncapacity=10\nrefill='1/s'\n";
    let huge = "'300000000000y'";
    // The per-decision timeout, set on the limiter or as the default.
    decides_with(
        &format!("{tb}timeout={huge}"),
        std::time::Duration::from_millis(1),
        0,
        1,
    );
    decides_with(
        &format!("[defaults]\ntimeout={huge}\n{tb}"),
        std::time::Duration::from_millis(1),
        0,
        1,
    );
    // The breaker's back-offs: opened by failures, then probing.
    decides_with(
        &format!(
            "[defaults]\nbreaker_threshold=1\nbreaker_backoff={huge}\nbreaker_max_backoff={huge}\n{tb}"
        ),
        std::time::Duration::ZERO,
        3,
        3,
    );
    decides_with(
        &format!(
            "[defaults]\nbreaker_threshold=1\nbreaker_backoff='1s'\nbreaker_max_backoff={huge}\n{tb}"
        ),
        std::time::Duration::ZERO,
        3,
        3,
    );
}

/// One limiter's settings, written both ways: as configuration and as
/// builder calls.
#[derive(Debug, Clone)]
struct Settings {
    name: &'static str,
    /// `None`: a concurrency limit of one slot; `Some(n)`: a token bucket
    /// of capacity `n`.
    capacity: Option<u64>,
    candidate: Option<Option<u64>>,
    min_cost: Option<u64>,
    timeout_ms: Option<u64>,
    /// First and longest back-off, in ms.
    breaker: Option<(u64, u64)>,
}

fn policy_of(capacity: Option<u64>) -> Policy {
    let second = std::time::Duration::from_secs(1);
    match capacity {
        Some(n) => tollgate_limiter::TokenBucket::new(n, 1, second)
            .unwrap()
            .into(),
        None => tollgate_limiter::Concurrency::new(1, second)
            .unwrap()
            .into(),
    }
}

fn toml_policy(capacity: Option<u64>) -> String {
    match capacity {
        Some(n) => format!("strategy = 'token_bucket'\ncapacity = {n}\nrefill = '1/s'\n"),
        None => "strategy = 'concurrency'\nmax_in_flight = 1\nlease = '1s'\n".into(),
    }
}

impl Settings {
    fn toml(&self) -> String {
        let mut toml = String::from("[defaults]\n");
        if let Some((backoff, max)) = self.breaker {
            toml.push_str(&format!(
                "breaker_backoff = '{backoff}ms'\nbreaker_max_backoff = '{max}ms'\n"
            ));
        }
        toml.push_str(&format!("[limiters.{}]\n", toml_string(self.name)));
        toml.push_str(&toml_policy(self.capacity));
        if let Some(n) = self.min_cost {
            toml.push_str(&format!("min_cost = {n}\n"));
        }
        if let Some(ms) = self.timeout_ms {
            toml.push_str(&format!("timeout = '{ms}ms'\n"));
        }
        if let Some(c) = self.candidate {
            toml.push_str(&format!(
                "[limiters.{}.candidate]\n{}",
                toml_string(self.name),
                toml_policy(c)
            ));
        }
        toml
    }

    fn try_build(&self) -> Result<(), tollgate_limiter::ConfigError> {
        let ms = std::time::Duration::from_millis;
        let backend = MemoryBackend::with_clock(MockClock::new());
        let mut b =
            tollgate_limiter::Limiter::builder(self.name, policy_of(self.capacity), backend);
        if let Some(n) = self.min_cost {
            b = b.min_cost(n);
        }
        if let Some(t) = self.timeout_ms {
            b = b.timeout(ms(t));
        }
        if let Some((backoff, max)) = self.breaker {
            b = b.breaker(tollgate_limiter::BreakerConfig {
                backoff: ms(backoff),
                max_backoff: ms(max),
                ..tollgate_limiter::BreakerConfig::default()
            });
        }
        if let Some(c) = self.candidate {
            b = b.candidate(policy_of(c));
        }
        b.try_build().map(drop)
    }
}

fn settings() -> impl Strategy<Value = Settings> {
    (
        proptest::sample::select(&["api", "", "a:b", "{api}", "a}b"][..]),
        proptest::option::of(1u64..6),
        proptest::option::of(proptest::option::of(1u64..6)),
        proptest::option::of(0u64..7),
        proptest::option::of(0u64..3),
        proptest::option::of((0u64..3, 0u64..3)),
    )
        .prop_map(
            |(name, capacity, candidate, min_cost, timeout_ms, breaker)| Settings {
                name,
                capacity,
                candidate,
                min_cost,
                timeout_ms,
                breaker,
            },
        )
}

/// The field an error names, or `None` for a setting that builds.
fn refused_field(r: Result<(), tollgate_limiter::ConfigError>) -> Option<&'static str> {
    match r {
        Ok(()) => None,
        Err(tollgate_limiter::ConfigError::Invalid { field, .. }) => Some(field),
        Err(e) => panic!("not a refused field: {e}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Configuration and the builder check one set of rules: for any
    /// settings both can express, configuration loads them iff
    /// `LimiterBuilder::try_build` builds them, and a setting with one
    /// fault is refused by both under the same field.
    #[test]
    fn configuration_loads_what_the_builder_builds(s in settings()) {
        let toml = s.toml();
        let loaded = Config::builder().toml_str(&toml).load().map(drop);
        let config = refused_field(loaded);
        let builder = refused_field(s.try_build());
        prop_assert_eq!(config.is_none(), builder.is_none(), "configuration {:?}, builder {:?}\n{}", config, builder, toml);
        let faults = [
            !["api"].contains(&s.name),
            s.timeout_ms == Some(0),
            s.breaker.is_some_and(|(b, m)| b == 0 || m < b),
            s.capacity.is_none() && s.candidate.is_some(),
            s.candidate == Some(None),
            s.min_cost.is_some_and(|n| n == 0 || s.capacity.is_some_and(|c| n > c)),
            s.min_cost.is_some_and(|n| matches!(s.candidate, Some(Some(c)) if n > c)),
        ];
        if faults.iter().filter(|f| **f).count() == 1 {
            prop_assert_eq!(config, builder, "{}", toml);
        }
    }
}
