//! Policies as TOML fields (to show them, and to validate overrides with the
//! configuration's own rules), and durations for people.

use std::collections::BTreeMap;
use std::time::Duration;

use figment::Figment;
use figment::providers::{Format, Toml};
use tollgate_limiter::{Config, LimiterConfig, Policy};

use crate::failure::Failure;

/// A TOML basic string.
pub(crate) fn toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A duration as configuration writes it (`15m`, `1s 500ms`): exact, and
/// parsed back by the configuration loader.
pub(crate) fn config_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// A duration for people: whole seconds when it is one, else seconds with
/// milliseconds (`0s`, `15s`, `1.235s`).
/// From a minute on, the rounded span follows (`3596.209s (59m 56s)`).
pub(crate) fn human_duration(d: Duration) -> String {
    let secs = if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{:.3}s", d.as_secs_f64())
    };
    if d.as_secs() < 60 {
        return secs;
    }
    let whole = Duration::from_secs(d.as_secs() + u64::from(d.subsec_millis() >= 500));
    format!("{secs} ({})", humantime::format_duration(whole))
}

/// A refill rate as configuration writes it: `60/min`, `10/s`, `5/15m`.
fn rate(count: u64, period: Duration) -> String {
    let per = match period.as_secs() {
        1 if period.subsec_nanos() == 0 => "s".to_owned(),
        60 if period.subsec_nanos() == 0 => "min".to_owned(),
        3600 if period.subsec_nanos() == 0 => "h".to_owned(),
        86_400 if period.subsec_nanos() == 0 => "day".to_owned(),
        _ => config_duration(period),
    };
    format!("{count}/{per}")
}

/// The policy's fields, as configuration spells them, with TOML values.
pub(crate) fn policy_fields(p: &Policy) -> Vec<(&'static str, String)> {
    let dur = |d: Duration| toml_string(&config_duration(d));
    match p {
        Policy::TokenBucket(tb) => vec![
            ("capacity", tb.capacity().to_string()),
            ("refill", toml_string(&rate(tb.refill(), tb.period()))),
        ],
        Policy::SlidingWindow(sw) => {
            let mut f = vec![
                ("limit", sw.limit().to_string()),
                ("window", dur(sw.window())),
            ];
            if sw.penalises_refused() {
                f.push(("penalise_refused", "true".into()));
            }
            f
        }
        Policy::ProgressiveDelay(pd) => vec![
            ("free_attempts", pd.free_attempts().to_string()),
            ("base_delay", dur(pd.base_delay())),
            ("factor", pd.factor().to_string()),
            ("max_delay", dur(pd.max_delay())),
            ("forget_after", dur(pd.forget_after())),
        ],
        Policy::Concurrency(c) => vec![
            ("max_in_flight", c.max_in_flight().to_string()),
            ("lease", dur(c.lease())),
        ],
        Policy::Composite(c) => {
            let parts: Vec<String> = c
                .policies()
                .map(|part| {
                    let mut f = vec![format!(
                        "strategy = {}",
                        toml_string(part.strategy().as_str())
                    )];
                    f.extend(
                        policy_fields(&part)
                            .into_iter()
                            .map(|(k, v)| format!("{k} = {v}")),
                    );
                    format!("{{ {} }}", f.join(", "))
                })
                .collect();
            vec![("policies", format!("[{}]", parts.join(", ")))]
        }
        Policy::Calendar(c) => vec![
            ("limit", c.limit().to_string()),
            ("period", toml_string(c.period().as_str())),
            ("time_zone", toml_string(c.zone().name())),
        ],
        // `Policy` is non-exhaustive: a strategy this CLI does not know.
        _ => Vec::new(),
    }
}

/// The policy as JSON: `{"strategy": "token_bucket", "capacity": 100,
/// "refill": "60/min"}`, values spelled as in configuration.
pub(crate) fn policy_json(p: &Policy) -> serde_json::Value {
    let mut map = serde_json::Map::new();
    map.insert("strategy".into(), p.strategy().as_str().into());
    if let Policy::Composite(c) = p {
        let parts: Vec<_> = c.policies().map(|part| policy_json(&part)).collect();
        map.insert("policies".into(), parts.into());
        return serde_json::Value::Object(map);
    }
    for (k, v) in policy_fields(p) {
        // A TOML integer, boolean or basic string (as `toml_string` writes
        // it) is also a JSON value.
        let v = serde_json::from_str(&v).unwrap_or(serde_json::Value::String(v));
        map.insert(k.into(), v);
    }
    serde_json::Value::Object(map)
}

/// One line: `token_bucket: capacity = 100, refill = "60/min"`.
pub(crate) fn describe(p: &Policy) -> String {
    let fields: Vec<String> = policy_fields(p)
        .into_iter()
        .map(|(k, v)| format!("{k} = {v}"))
        .collect();
    format!("{}: {}", p.strategy(), fields.join(", "))
}

/// Fields that configure a limiter but are not part of a runtime override.
const NOT_OVERRIDABLE: [&str; 6] = [
    "cost",
    "min_cost",
    "fail_mode",
    "timeout",
    "mode",
    "candidate",
];

/// Builds an override of `limiter`'s policy from `snippet` (TOML fields of
/// one limiter, without a table header): the fields given replace the
/// configured ones, and the result is validated by the configuration loader
/// itself, so an override obeys exactly the start-up rules and its errors
/// name the limiter and the field.
pub(crate) fn override_policy(limiter: &LimiterConfig, snippet: &str) -> Result<Policy, Failure> {
    let name = &limiter.name;
    if snippet.trim().is_empty() {
        return Err(Failure::Input(
            "no policy given: use flags (e.g. --capacity 500) or --toml 'capacity = 500'".into(),
        ));
    }
    if snippet.lines().any(|l| l.trim_start().starts_with('[')) {
        return Err(Failure::Input(format!(
            "the TOML snippet holds the fields of limiter {name:?} only \
             (e.g. 'capacity = 500'), not a table header"
        )));
    }
    let header = format!("[limiters.{}]\n", toml_string(name));
    let given = format!("{header}{snippet}\n");

    // Fields that are not policy, and a change of strategy, get their own
    // message; everything else is left to the loader.
    let fields: BTreeMap<String, BTreeMap<String, figment::value::Value>> =
        Figment::from(Toml::string(&given))
            .extract_inner("limiters")
            .map_err(|e| Failure::Input(format!("invalid override: {e}")))?;
    let fields = fields.get(name.as_str()).cloned().unwrap_or_default();
    if let Some(field) = NOT_OVERRIDABLE.iter().find(|f| fields.contains_key(**f)) {
        return Err(Failure::Input(format!(
            "invalid override: limiters.{name}.{field}: not part of a runtime override \
             (only the policy is; change it in configuration)"
        )));
    }
    let configured = limiter.policy.strategy();
    if let Some(s) = fields.get("strategy").and_then(|v| v.as_str())
        && s != configured.as_str()
    {
        return Err(Failure::Input(format!(
            "invalid override: limiters.{name}.strategy: an override of limiter {name:?} \
             must be a {configured}, not {s:?}"
        )));
    }

    let mut base = format!(
        "{header}strategy = {}\ncost = {}\nmin_cost = {}\n",
        toml_string(configured.as_str()),
        limiter.cost,
        limiter.min_cost
    );
    for (k, v) in policy_fields(&limiter.policy) {
        // The snippet's own value wins; leaving the configured one in the
        // base layer is what lets a partial override keep the rest.
        base.push_str(&format!("{k} = {v}\n"));
    }
    let config = Config::builder()
        .toml_str(&base)
        .toml_str(&given)
        .load()
        .map_err(|e| Failure::Input(format!("invalid override: {e}")))?;
    let policy = config
        .limiter(name)
        .map_err(|e| Failure::Input(e.to_string()))?
        .policy;
    Ok(policy)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(toml: &str) -> LimiterConfig {
        Config::builder()
            .toml_str(toml)
            .load()
            .unwrap()
            .limiter("api")
            .unwrap()
            .clone()
    }

    const BUCKET: &str =
        "[limiters.api]\nstrategy='token_bucket'\ncapacity=100\nrefill='60/min'\ncost=5";

    fn err(l: &LimiterConfig, snippet: &str) -> String {
        match override_policy(l, snippet) {
            Err(Failure::Input(m)) => m,
            other => panic!("expected an input error, got {other:?}"),
        }
    }

    #[test]
    fn policies_round_trip_through_their_fields() {
        for toml in [
            BUCKET,
            "[limiters.api]\nstrategy='token_bucket'\ncapacity=3\nrefill='7/1500ms'",
            "[limiters.api]\nstrategy='sliding_window'\nlimit=20\nwindow='15m'\npenalise_refused=true",
            "[limiters.api]\nstrategy='progressive_delay'\nfree_attempts=5\nbase_delay='1s'\nfactor=3\nmax_delay='15m'\nforget_after='1h'",
            COMPOSITE,
        ] {
            let l = limiter(toml);
            // An override that changes nothing gives the configured policy.
            let fields = policy_fields(&l.policy);
            let snippet: Vec<String> = fields.iter().map(|(k, v)| format!("{k} = {v}")).collect();
            assert_eq!(override_policy(&l, &snippet.join("\n")).unwrap(), l.policy);
        }
    }

    #[test]
    fn a_partial_override_keeps_the_other_fields() {
        let l = limiter(BUCKET);
        let p = override_policy(&l, "capacity = 500").unwrap();
        assert_eq!(
            describe(&p),
            "token_bucket: capacity = 500, refill = \"60/min\""
        );
    }

    #[test]
    fn overrides_obey_the_configuration_rules() {
        let l = limiter(BUCKET);
        assert!(err(&l, "capacity = 0").contains("limiters.api.capacity"));
        assert!(err(&l, "capacity = 3").contains("limiters.api.cost"));
        let e = err(&l, "limit = 3");
        assert!(
            e.contains("limiters.api.limit") && e.contains("belongs to sliding_window"),
            "{e}"
        );
        assert!(err(&l, "refill = \"fast\"").contains("limiters.api.refill"));
        assert!(err(&l, "capacty = 3").contains("capacty"));
        assert!(err(&l, "timeout = \"1s\"").contains("limiters.api.timeout"));
        // A candidate is configuration, not part of an override: it was
        // ignored, and the configured policy stored as "the override".
        let e = err(
            &l,
            "candidate = { strategy = 'token_bucket', capacity = 50, refill = '1/s' }",
        );
        assert!(
            e.contains("limiters.api.candidate: not part of a runtime override"),
            "{e}"
        );
        assert!(err(&l, "strategy = \"sliding_window\"").contains("limiters.api.strategy"));
        assert!(err(&l, "[limiters.api]\ncapacity = 3").contains("table header"));
        assert!(err(&l, "capacity = ").contains("invalid override"));
        assert!(err(&l, " ").contains("no policy"));
    }

    const COMPOSITE: &str = "[limiters.api]\nstrategy='composite'\npolicies=[\
        {strategy='token_bucket', capacity=10, refill='10/s'},\
        {strategy='sliding_window', limit=1000, window='1day'}]";

    #[test]
    fn composites_show_and_override_their_list() {
        let l = limiter(COMPOSITE);
        assert_eq!(
            describe(&l.policy),
            "composite: policies = [{ strategy = \"token_bucket\", capacity = 10, refill = \"10/s\" }, \
             { strategy = \"sliding_window\", limit = 1000, window = \"1day\" }]"
        );
        assert_eq!(
            policy_json(&l.policy)["policies"][1],
            serde_json::json!({"strategy": "sliding_window", "limit": 1000, "window": "1day"})
        );
        // An override replaces the whole list, under the configuration's rules.
        let p = override_policy(
            &l,
            "policies = [{ strategy = 'token_bucket', capacity = 5, refill = '1/s' }]",
        )
        .unwrap();
        assert_eq!(p.max_cost(), Some(5));
        let e = err(
            &l,
            "policies = [{ strategy = 'token_bucket', capacity = 0, refill = '1/s' }]",
        );
        assert!(
            e.contains("limiters.api.policies: policies[0].capacity"),
            "{e}"
        );
    }

    #[test]
    fn policies_as_json() {
        let l = limiter(BUCKET);
        assert_eq!(
            policy_json(&l.policy),
            serde_json::json!({"strategy": "token_bucket", "capacity": 100, "refill": "60/min"})
        );
        let l = limiter(
            "[limiters.api]\nstrategy='sliding_window'\nlimit=2\nwindow='1m'\npenalise_refused=true",
        );
        assert_eq!(policy_json(&l.policy)["penalise_refused"], true);
        assert_eq!(policy_json(&l.policy)["window"], "1m");
    }

    #[test]
    fn durations_for_people() {
        assert_eq!(human_duration(Duration::ZERO), "0s");
        assert_eq!(human_duration(Duration::from_secs(15)), "15s");
        assert_eq!(human_duration(Duration::from_micros(1_234_567)), "1.235s");
        assert_eq!(
            human_duration(Duration::from_micros(3_596_209_000)),
            "3596.209s (59m 56s)"
        );
        assert_eq!(rate(60, Duration::from_secs(60)), "60/min");
        assert_eq!(rate(7, Duration::from_millis(1500)), "7/1s 500ms");
        for (n, p) in [(1, 1), (2, 60), (3, 3600), (4, 86_400), (5, 900)] {
            let p = Duration::from_secs(p);
            assert_eq!(tollgate_limiter::parse_rate(&rate(n, p)), Ok((n, p)));
        }
        assert_eq!(toml_string("a\"b\\"), "\"a\\\"b\\\\\"");
    }
}
