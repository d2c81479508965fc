//! What each command does.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use tollgate_limiter::{
    Backend, Clock, Config, Decision, Error, FailMode, Key, Limiter, Mode, Op, Policy, RedisConfig,
    Request, SystemClock,
};
use tollgate_redis::{Durability, RedisBackend, RedisError, Setting};

use crate::args::{Cli, Command, ConfigCommand, Global, KeyedArgs, OverrideCommand, ScopeArgs};
use crate::failure::Failure;
use crate::keys::KeySpec;
use crate::render::{describe, human_duration, override_policy, policy_json};

/// Prints one JSON document on standard output.
fn print_json(v: &Value) {
    out!(
        "{}",
        serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
    );
}

fn key_json(key: Option<&KeySpec>) -> Value {
    match key {
        Some(k) => json!({ "key": k.key.as_str(), "kind": k.kind }),
        None => Value::Null,
    }
}

fn decision_json(d: &Decision) -> Value {
    json!({
        "allowed": d.is_allowed(),
        "limit": d.limit(),
        "remaining": d.remaining(),
        "retry_after_us": u64::try_from(d.retry_after().as_micros()).unwrap_or(u64::MAX),
        "retry_after_secs": d.retry_after_secs(),
        "reset_after_us": u64::try_from(d.reset_after().as_micros()).unwrap_or(u64::MAX),
        "part": d.part(),
    })
}

/// Runs the command line.
pub(crate) fn run(cli: &Cli) -> Result<(), Failure> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::Backend(format!("cannot start the runtime: {e}")))?;
    let g = &cli.global;
    if let Command::Config(ConfigCommand::Validate(v)) = &cli.command {
        let mut files = g.config.clone();
        files.extend(v.files.iter().cloned());
        return validate(&files, g.json);
    }
    let g = &with_config(g)?;
    match &cli.command {
        Command::Config(_) => unreachable!("handled above"),
        Command::Durability(d) => rt.block_on(durability(g, d.strict)),
        Command::Inspect(a) => rt.block_on(inspect(g, a)),
        Command::Reset(a) => rt.block_on(reset(g, a)),
        Command::Override(OverrideCommand::Set(s)) => {
            let snippet = match &s.toml {
                Some(t) => t.clone(),
                None => s.policy.to_toml(),
            };
            rt.block_on(override_set(g, &s.scope, &snippet, s.ttl))
        }
        Command::Override(OverrideCommand::Clear(s)) => rt.block_on(override_clear(g, s)),
        Command::Override(OverrideCommand::Show(s)) => rt.block_on(override_show(g, s)),
        Command::Override(OverrideCommand::Mark) => rt.block_on(override_mark(g)),
        Command::Override(OverrideCommand::List { limiter }) => {
            rt.block_on(override_list(g, limiter.as_deref()))
        }
    }
}

/// The configuration, loaded as a service loads it at start-up.
fn load_config(files: &[PathBuf]) -> Result<Config, Failure> {
    let mut b = Config::builder();
    for f in files {
        b = b.file(f);
    }
    b.env().load().map_err(|e| Failure::Input(e.to_string()))
}

/// The default Redis, when neither the command line nor the configuration
/// names one.
const DEFAULT_URL: &str = "redis://127.0.0.1:6379";

/// `g` with the configuration loaded and the Redis URLs resolved:
/// `--redis-url`, else `REDIS_URL`, else the configuration's `[redis]`
/// section (files, then `TOLLGATE_REDIS__*`), else [`DEFAULT_URL`].
fn with_config(g: &Global) -> Result<Global, Failure> {
    let config = load_config(&g.config)?;
    let mut g = g.clone();
    if g.redis_url.is_empty() {
        match config.redis().filter(|r| !r.urls.is_empty()) {
            Some(r) => {
                g.redis_url.clone_from(&r.urls);
                g.cluster |= r.cluster;
                g.url_from_config = true;
            }
            None => g.redis_url.push(DEFAULT_URL.to_owned()),
        }
    }
    g.loaded = Some(config);
    Ok(g)
}

/// The loaded configuration (see [`with_config`]).
fn loaded(g: &Global) -> Result<&Config, Failure> {
    g.loaded
        .as_ref()
        .ok_or_else(|| Failure::Input("the configuration was not loaded".into()))
}

fn validate(files: &[PathBuf], as_json: bool) -> Result<(), Failure> {
    let config = load_config(files)?;
    let redis = config.redis().filter(|r| !r.urls.is_empty());
    if redis.is_some() {
        // What a service's start-up checks before connecting (URLs, TLS CA).
        let _checked = RedisBackend::builder_from_config(&config)
            .map_err(|e| Failure::Input(e.to_string()))?;
    }
    let redis_urls = |r: &RedisConfig| r.urls.iter().map(|u| redact(u)).collect::<Vec<_>>();
    let sources: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    if as_json {
        let limiters: Vec<Value> = config
            .limiters()
            .map(|l| {
                json!({
                    "name": l.name,
                    "policy": policy_json(&l.policy),
                    "cost": l.cost,
                    "fail_mode": l.fail_mode.to_string(),
                    "timeout": crate::render::config_duration(l.timeout),
                })
            })
            .collect();
        print_json(&json!({
            "valid": true,
            "files": sources,
            "prefix": config.prefix(),
            "limiters": limiters,
            "redis": redis.map(|r| json!({ "urls": redis_urls(r), "cluster": r.cluster })),
        }));
        return Ok(());
    }
    let sources = if sources.is_empty() {
        "TOLLGATE_* environment".to_owned()
    } else {
        format!("{} + TOLLGATE_* environment", sources.join(" + "))
    };
    let n = config.limiters().count();
    out!(
        "configuration is valid ({sources}): {n} limiter(s), prefix {:?}",
        config.prefix()
    );
    for l in config.limiters() {
        out!(
            "  {:<20} {}; cost {}, fail {}, timeout {}",
            l.name,
            describe(&l.policy),
            l.cost,
            l.fail_mode,
            crate::render::config_duration(l.timeout)
        );
    }
    if let Some(r) = redis {
        let mode = if r.cluster { " (cluster)" } else { "" };
        out!("  redis: {}{mode}", redis_urls(r).join(","));
    }
    if n == 0 {
        eprintln!("warning: no limiters configured ([limiters.<name>])");
    }
    Ok(())
}

/// A URL with its passwords hidden (a Sentinel URL's query may hold the
/// sentinels' own).
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let shown = match rest.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            if userinfo.contains(':') {
                format!("{scheme}://{user}:***@{host}")
            } else {
                format!("{scheme}://{userinfo}@{host}")
            }
        }
        None => format!("{scheme}://{rest}"),
    };
    match query {
        None => shown,
        Some(q) => {
            let q: Vec<String> = q
                .split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, _)) if k.contains("password") => format!("{k}=***"),
                    _ => kv.to_owned(),
                })
                .collect();
            format!("{shown}?{}", q.join("&"))
        }
    }
}

fn urls(g: &Global) -> String {
    g.redis_url
        .iter()
        .map(|u| redact(u))
        .collect::<Vec<_>>()
        .join(",")
}

/// Where a command that changes state acted: the Redis URLs (passwords
/// hidden) and the prefix. An operator whose shell still holds another
/// `REDIS_URL` sees it before trusting the answer.
fn acted_on(g: &Global, prefix: &str) -> String {
    format!("{} (prefix {prefix})", urls(g))
}

/// Runs `fut` under the command's timeout.
async fn timed<T>(
    g: &Global,
    what: &str,
    fut: impl Future<Output = Result<T, Failure>>,
) -> Result<T, Failure> {
    tokio::time::timeout(g.timeout, fut)
        .await
        .unwrap_or_else(|_| {
            Err(Failure::Backend(format!(
                "{what}: redis at {} did not answer within {}",
                urls(g),
                human_duration(g.timeout)
            )))
        })
}

/// A backend on the command's Redis, without the start-up durability check.
async fn connect(g: &Global, prefix: &str) -> Result<RedisBackend, Failure> {
    // The configuration's rule for `defaults.prefix`.
    if let Err(rule) = tollgate_limiter::config::check_prefix(prefix) {
        return Err(Failure::Input(format!("--prefix {prefix:?}: {rule}")));
    }
    if !cfg!(feature = "tls")
        && g.redis_url.iter().any(|u| {
            let u = u.trim().to_ascii_lowercase();
            u.starts_with("rediss://") || u.starts_with("rediss+sentinel://")
        })
    {
        return Err(Failure::Input(
            "rediss:// and rediss+sentinel:// need a tollgate built with the `tls` feature".into(),
        ));
    }
    let builder = if g.url_from_config {
        // The section's other settings (TLS CA, pool) apply too; the
        // command's own timeout and prefix are set below.
        RedisBackend::builder_from_config(loaded(g)?).map_err(|e| Failure::Input(e.to_string()))?
    } else if g.cluster {
        cluster_builder(g)?
    } else {
        match g.redis_url.as_slice() {
            [url] => RedisBackend::builder(url.trim()),
            _ => {
                return Err(Failure::Input(
                    "several Redis URLs are for a cluster: add --cluster".into(),
                ));
            }
        }
    };
    let build = async {
        builder
            .prefix(prefix)
            .pool_size(1)
            .connect_timeout(g.timeout)
            .response_timeout(g.timeout)
            .durability(Durability::Skip)
            .build()
            .await
            .map_err(|e| {
                let what = format!("cannot connect to redis at {}", urls(g));
                match bad_url(&e) {
                    Some(why) => Failure::Input(format!("{what}: {why}")),
                    None => Failure::backend(&what, &e),
                }
            })
    };
    timed(g, "connecting", build).await
}

/// Why the URLs cannot be used at all, when that is the failure: invalid
/// usage (exit 2), not an unreachable Redis. The reasons never hold a
/// password.
fn bad_url(e: &RedisError) -> Option<String> {
    match e {
        RedisError::InvalidUrl(_)
        | RedisError::InvalidClientCert(_)
        | RedisError::Unsupported(_) => Some(e.to_string()),
        RedisError::Redis(r) if r.kind() == redis::ErrorKind::InvalidClientConfig => Some(format!(
            "invalid redis URL: {} (expected redis://[[user]:password@]host[:port][/db], \
             rediss://..., or redis+sentinel://host[:port][,...]/<master-name>)",
            r.to_string().replace(" - InvalidClientConfig", "")
        )),
        _ => None,
    }
}

#[cfg(feature = "cluster")]
fn cluster_builder(g: &Global) -> Result<tollgate_redis::RedisBackendBuilder, Failure> {
    Ok(RedisBackend::cluster_builder(
        g.redis_url.iter().map(|u| u.trim().to_owned()),
    ))
}

#[cfg(not(feature = "cluster"))]
fn cluster_builder(_: &Global) -> Result<tollgate_redis::RedisBackendBuilder, Failure> {
    Err(Failure::Input(
        "--cluster needs a tollgate built with the `cluster` feature".into(),
    ))
}

/// The named limiter of the configuration, over the command's Redis.
struct Target {
    limiter: Limiter<RedisBackend>,
    /// The configured mode (the CLI's own limiter always enforces: it
    /// only looks).
    mode: Mode,
    /// The configured candidate policy, and the limiter name its state is
    /// kept under (`<name>:candidate`: read from the backend itself, as no
    /// limiter may be named so).
    candidate: Option<(String, Policy)>,
}

async fn target(g: &Global, name: &str) -> Result<Target, Failure> {
    let config = loaded(g)?;
    let lc = config
        .limiter(name)
        .map_err(|e| Failure::Input(e.to_string()))?
        .clone();
    let prefix = g
        .prefix
        .clone()
        .unwrap_or_else(|| config.prefix().to_owned());
    let backend = connect(g, &prefix).await?;
    let candidate = lc.candidate.map(|p| (format!("{}:candidate", lc.name), p));
    // Checked when the configuration loaded, and `--timeout` when parsed
    // (above zero): a refusal here is a setting changed in between. With
    // the candidate, as the services' limiter: its `reset` resets the
    // candidate's state too.
    let mut limiter = Limiter::builder(lc.name, lc.policy, backend)
        .fail_mode(FailMode::Closed)
        .timeout(g.timeout)
        .cost(lc.cost)
        .min_cost(lc.min_cost);
    if let Some((_, p)) = &candidate {
        limiter = limiter.candidate(*p);
    }
    let limiter = limiter
        .try_build()
        .map_err(|e| Failure::Input(e.to_string()))?;
    Ok(Target {
        limiter,
        mode: lc.mode,
        candidate,
    })
}

/// Whether `e` says a stored override is no policy (Redis answered, but
/// what it holds does not decode).
fn is_no_policy(e: &Error) -> bool {
    let Error::Backend(b) = e else { return false };
    match b.downcast_ref::<RedisError>() {
        Some(RedisError::Encoding(_)) => true,
        // Not even a string (a hash, a list written there by hand).
        Some(RedisError::Redis(r)) => r.code() == Some("WRONGTYPE"),
        _ => false,
    }
}

/// Maps a limiter error: a policy problem is the user's, anything else is
/// the backend's.
fn limiter_error(what: &str, e: &Error) -> Failure {
    match e {
        Error::Policy(p) => Failure::Input(format!("{what}: {p}")),
        e => Failure::backend(what, e),
    }
}

/// The overrides stored for a limiter and (optionally) a key.
struct Overrides {
    configured: Policy,
    limiter: Option<Policy>,
    key: Option<Policy>,
    /// The time each override has left, when it was set for a time
    /// (`override set --for`).
    limiter_ttl: Option<Duration>,
    key_ttl: Option<Duration>,
}

impl Overrides {
    async fn read(t: &Target, key: Option<&Key>) -> Result<Self, Failure> {
        let get = |k: Option<&Key>| {
            let l = &t.limiter;
            let k = k.cloned();
            async move {
                l.get_override_and_ttl(k.as_ref())
                    .await
                    .map_err(|e| limiter_error("reading the overrides", &e))
            }
        };
        let split = |o: Option<(Policy, Option<Duration>)>| match o {
            Some((p, ttl)) => (Some(p), ttl),
            None => (None, None),
        };
        let (limiter, limiter_ttl) = split(get(None).await?);
        let (key, key_ttl) = match key {
            Some(k) => split(get(Some(k)).await?),
            None => (None, None),
        };
        Ok(Self {
            configured: *t.limiter.policy(),
            limiter,
            key,
            limiter_ttl,
            key_ttl,
        })
    }

    /// The policy in force, where it comes from (for people) and its
    /// source's id (for JSON).
    fn in_force(&self) -> (&Policy, &'static str, &'static str) {
        match (&self.key, &self.limiter) {
            (Some(p), _) => (p, "the key's override", "key_override"),
            (None, Some(p)) => (p, "the limiter-wide override", "limiter_override"),
            (None, None) => (&self.configured, "configuration", "configuration"),
        }
    }

    fn json(&self) -> Value {
        let opt = |p: &Option<Policy>| p.as_ref().map_or(Value::Null, policy_json);
        let (p, _, source) = self.in_force();
        json!({
            "configured": policy_json(&self.configured),
            "limiter_override": opt(&self.limiter),
            "limiter_override_expires_in_ms": millis_json(self.limiter_ttl),
            "key_override": opt(&self.key),
            "key_override_expires_in_ms": millis_json(self.key_ttl),
            "in_force": policy_json(p),
            "source": source,
        })
    }

    fn print(&self, key: Option<&KeySpec>) {
        let opt = |p: &Option<Policy>, ttl: Option<Duration>| match (p, ttl) {
            (None, _) => "none".into(),
            (Some(p), None) => describe(p),
            (Some(p), Some(t)) => format!("{}; expires in {}", describe(p), human_duration(t)),
        };
        out!("configured   {}", describe(&self.configured));
        out!("limiter-wide {}", opt(&self.limiter, self.limiter_ttl));
        if key.is_some() {
            out!("this key     {}", opt(&self.key, self.key_ttl));
        }
        let (p, from, _) = self.in_force();
        out!("in force     {} (from {from})", describe(p));
    }
}

/// A duration in whole milliseconds, or `null`.
fn millis_json(d: Option<Duration>) -> Value {
    d.map_or(Value::Null, |d| {
        json!(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    })
}

fn print_decision(d: &Decision, cost: u64) {
    if d.is_allowed() {
        out!("verdict      allowed: a request of cost {cost} would pass now");
    } else {
        out!(
            "verdict      REFUSED: a request of cost {cost} would be refused for {}; Retry-After: {}",
            human_duration(d.retry_after()),
            d.retry_after_secs()
        );
    }
    out!("limit        {}", d.limit());
    out!("remaining    {}", d.remaining());
    out!("retry-after  {}", human_duration(d.retry_after()));
    out!(
        "reset-after  {} (until the key is fresh again)",
        human_duration(d.reset_after())
    );
}

fn print_header(t: &Target, key: &KeySpec) {
    let l = &t.limiter;
    out!("limiter      {} ({})", l.name(), l.policy().strategy());
    out!("key          {}", key.describe());
    out!("redis key    {}", l.backend().state_key(l.name(), &key.key));
}

async fn inspect(g: &Global, a: &KeyedArgs) -> Result<(), Failure> {
    let key = a.key.resolve(a.ipv6_prefix, g)?;
    let t = target(g, &a.limiter).await?;
    let work = async {
        let d = t
            .limiter
            // Whether a request of the limiter's cost would pass now.
            .try_peek(&key.key, t.limiter.cost())
            .await
            .map_err(|e| limiter_error("inspect", &e))?;
        let o = Overrides::read(&t, Some(&key.key)).await?;
        let c = match &t.candidate {
            Some((name, policy)) => {
                // The same request as the enforced line's: the limiter's
                // cost (at least its minimum), not one unit.
                let cost = t.limiter.cost().max(t.limiter.min_cost());
                let req = Request {
                    limiter: name,
                    key: &key.key,
                    policy,
                    op: Op::Peek(cost),
                };
                Some(
                    t.limiter
                        .backend()
                        .decide(req)
                        .await
                        .map_err(|e| Failure::backend("inspect", &e))?,
                )
            }
            None => None,
        };
        Ok((d, o, c))
    };
    let (d, o, c) = timed(g, "inspect", work).await?;
    let in_force = o.key.or(o.limiter).unwrap_or(o.configured);
    // A composite's numbers are its binding part's.
    let binding = match in_force {
        Policy::Composite(c) => c.policy(d.part()),
        other => Some(other),
    };
    let window = match binding {
        Some(Policy::Calendar(c)) => Some(CalendarWindow::of(&c, &d, SystemClock.now())),
        _ => None,
    };
    // A concurrency limit's state is its slots: held = limit - free.
    let slots = matches!(in_force, Policy::Concurrency(_))
        .then(|| (d.limit().saturating_sub(d.remaining()), d.limit()));
    if g.json {
        let l = &t.limiter;
        let mut doc = json!({
            "limiter": l.name(),
            "mode": t.mode.to_string(),
            "key": key_json(Some(&key)),
            "redis_key": l.backend().state_key(l.name(), &key.key),
            "policy": o.json(),
            "decision": decision_json(&d),
            "calendar_window": window.as_ref().map_or(Value::Null, CalendarWindow::json),
        });
        if let (Some((name, policy)), Some(cd)) = (&t.candidate, &c) {
            doc["candidate"] = json!({
                "limiter": name,
                "policy": policy_json(policy),
                "decision": decision_json(cd),
            });
        }
        if let Some((held, max)) = slots {
            doc["slots"] = json!({
                "held": held,
                "max_in_flight": max,
                "last_lease_expires_in_us":
                    u64::try_from(d.reset_after().as_micros()).unwrap_or(u64::MAX),
                "redis_key": format!("{}:slots", l.backend().state_key(l.name(), &key.key)),
            });
        }
        print_json(&doc);
        return Ok(());
    }
    print_header(&t, &key);
    if t.mode == Mode::Shadow {
        out!("mode         shadow: refusals are recorded, never enforced");
    }
    o.print(Some(&key));
    if let Some((held, max)) = slots {
        out!(
            "in flight    {held} of {max} slots held (the last lease expires in {})",
            human_duration(d.reset_after())
        );
    }
    print_decision(&d, t.limiter.cost().max(t.limiter.min_cost()));
    if let (Some((name, policy)), Some(cd)) = (&t.candidate, &c) {
        out!(
            "candidate    {} (state under {}): {}, {} of {} remaining",
            describe(policy),
            name,
            if cd.is_allowed() {
                "would allow"
            } else {
                "would REFUSE"
            },
            cd.remaining(),
            cd.limit()
        );
    }
    // A composite's numbers are its binding part's: say which.
    if let (Policy::Composite(_), Some(part)) = (in_force, binding) {
        out!("binding      part {}: {}", d.part(), describe(&part));
    }
    if let Some(w) = window {
        w.print();
    }
    Ok(())
}

/// The current window of a calendar quota, as `inspect` shows it.
struct CalendarWindow {
    calendar: tollgate_limiter::Calendar,
    start: u64,
    end: u64,
    used: u64,
}

impl CalendarWindow {
    /// The window of `d`, a peek made about `now`: the one the backend
    /// counted in (it ends `reset_after` after the backend's now; its
    /// middle is found on this machine's clock, whatever a small skew),
    /// or for a window nothing was charged in, the one holding `now`.
    fn of(c: &tollgate_limiter::Calendar, d: &Decision, now: u64) -> Self {
        let micros = |x: std::time::Duration| u64::try_from(x.as_micros()).unwrap_or(u64::MAX);
        let (start, end) = match micros(d.reset_after()) {
            0 => c.window_at(now),
            reset => c.window_at(
                now.saturating_add(reset)
                    .saturating_sub(micros(d.window()) / 2),
            ),
        };
        Self {
            calendar: *c,
            start,
            end,
            used: d.limit().saturating_sub(d.remaining()),
        }
    }

    fn json(&self) -> Value {
        let zone = self.calendar.zone();
        json!({
            "period": self.calendar.period().as_str(),
            "time_zone": zone.name(),
            "start": zone.civil(self.start),
            "end": zone.civil(self.end),
            "start_us": self.start,
            "end_us": self.end,
            "used": self.used,
            "limit": self.calendar.limit(),
        })
    }

    fn print(&self) {
        let zone = self.calendar.zone();
        out!(
            "window       {} per {} in {}: {} .. {}",
            self.calendar.limit(),
            self.calendar.period(),
            zone.name(),
            zone.civil(self.start),
            zone.civil(self.end),
        );
        out!(
            "used         {} of {} in this window; the count starts from zero at {}",
            self.used,
            self.calendar.limit(),
            zone.civil(self.end),
        );
    }
}

async fn reset(g: &Global, a: &KeyedArgs) -> Result<(), Failure> {
    let key = a.key.resolve(a.ipv6_prefix, g)?;
    let t = target(g, &a.limiter).await?;
    let work = async {
        let d = t
            .limiter
            .reset(&key.key)
            .await
            .map_err(|e| limiter_error("reset", &e))?;
        let o = Overrides::read(&t, Some(&key.key)).await?;
        Ok((d, o))
    };
    let (d, o) = timed(g, "reset", work).await?;
    if g.json {
        print_json(&json!({
            "limiter": t.limiter.name(),
            "key": key_json(Some(&key)),
            "reset": true,
            "redis": acted_on(g, t.limiter.backend().prefix()),
            "decision": decision_json(&d),
            "key_override_kept": o.key.as_ref().map_or(Value::Null, policy_json),
        }));
        return Ok(());
    }
    out!(
        "reset {} for limiter {}: the key is fresh ({} of {} available)",
        key.describe(),
        t.limiter.name(),
        d.remaining(),
        d.limit()
    );
    out!("on redis     {}", acted_on(g, t.limiter.backend().prefix()));
    if o.key.is_some() {
        out!(
            "note: the key's override is kept; `tollgate override clear {} --{} ...` removes it",
            t.limiter.name(),
            key.kind
        );
    }
    Ok(())
}

fn scope_name(t: &Target, key: Option<&KeySpec>) -> String {
    match key {
        Some(k) => format!("limiter {}, key {}", t.limiter.name(), k.describe()),
        None => format!("limiter {} (every key)", t.limiter.name()),
    }
}

async fn override_set(
    g: &Global,
    s: &ScopeArgs,
    snippet: &str,
    ttl: Option<Duration>,
) -> Result<(), Failure> {
    let key = s.key.resolve(s.ipv6_prefix, g)?;
    // Validate before connecting: a bad override never reaches Redis.
    let config = loaded(g)?;
    let lc = config
        .limiter(&s.limiter)
        .map_err(|e| Failure::Input(e.to_string()))?;
    let policy = override_policy(lc, snippet)?;
    let t = target(g, &s.limiter).await?;
    let k = key.as_ref().map(|k| &k.key);
    let work = async {
        match ttl {
            Some(ttl) => t.limiter.set_override_for(k, policy, ttl).await,
            None => t.limiter.set_override(k, Some(policy)).await,
        }
        .map_err(|e| limiter_error("setting the override", &e))?;
        Overrides::read(&t, k).await
    };
    let o = timed(g, "override set", work).await?;
    if g.json {
        print_json(&json!({
            "limiter": t.limiter.name(),
            "key": key_json(key.as_ref()),
            "set": policy_json(&policy),
            "set_for_ms": millis_json(ttl),
            "redis": acted_on(g, t.limiter.backend().prefix()),
            "policy": o.json(),
        }));
        return Ok(());
    }
    let lasting = match ttl {
        Some(t) => format!(", for {}, then forgotten", human_duration(t)),
        None => " (until cleared)".into(),
    };
    out!(
        "override set for {}: {}{lasting}",
        scope_name(&t, key.as_ref()),
        describe(&policy)
    );
    out!("on redis     {}", acted_on(g, t.limiter.backend().prefix()));
    o.print(key.as_ref());
    Ok(())
}

async fn override_clear(g: &Global, s: &ScopeArgs) -> Result<(), Failure> {
    let key = s.key.resolve(s.ipv6_prefix, g)?;
    let t = target(g, &s.limiter).await?;
    let k = key.as_ref().map(|k| &k.key);
    let work = async {
        // A stored value that is no policy is what most needs clearing:
        // cleared all the same, and said.
        let before = match t.limiter.get_override(k).await {
            Ok(p) => Ok(p),
            Err(e) if is_no_policy(&e) => Err(crate::failure::chain(&e)),
            Err(e) => return Err(limiter_error("reading the override", &e)),
        };
        t.limiter
            .set_override(k, None)
            .await
            .map_err(|e| limiter_error("clearing the override", &e))?;
        Ok((before, Overrides::read(&t, k).await?))
    };
    let (before, o) = timed(g, "override clear", work).await?;
    if g.json {
        let cleared = match &before {
            Ok(p) => p.as_ref().map_or(Value::Null, policy_json),
            Err(why) => json!({ "invalid": why }),
        };
        print_json(&json!({
            "limiter": t.limiter.name(),
            "key": key_json(key.as_ref()),
            "cleared": cleared,
            "redis": acted_on(g, t.limiter.backend().prefix()),
            "policy": o.json(),
        }));
        return Ok(());
    }
    match before {
        Ok(Some(p)) => out!(
            "override cleared for {} (was {})",
            scope_name(&t, key.as_ref()),
            describe(&p)
        ),
        Err(why) => out!(
            "override cleared for {} (was no policy: {why})",
            scope_name(&t, key.as_ref())
        ),
        Ok(None) => out!("no override was set for {}", scope_name(&t, key.as_ref())),
    }
    out!("on redis     {}", acted_on(g, t.limiter.backend().prefix()));
    o.print(key.as_ref());
    Ok(())
}

async fn override_show(g: &Global, s: &ScopeArgs) -> Result<(), Failure> {
    let key = s.key.resolve(s.ipv6_prefix, g)?;
    let t = target(g, &s.limiter).await?;
    let k = key.as_ref().map(|k| &k.key);
    let o = timed(g, "override show", Overrides::read(&t, k)).await?;
    if g.json {
        print_json(&json!({
            "limiter": t.limiter.name(),
            "key": key_json(key.as_ref()),
            "policy": o.json(),
        }));
        return Ok(());
    }
    out!("{}", scope_name(&t, key.as_ref()));
    o.print(key.as_ref());
    Ok(())
}

/// The key prefix: `--prefix`, else the configuration's.
fn prefix(g: &Global) -> Result<String, Failure> {
    Ok(match &g.prefix {
        Some(p) => p.clone(),
        None => loaded(g)?.prefix().to_owned(),
    })
}

async fn override_list(g: &Global, limiter: Option<&str>) -> Result<(), Failure> {
    // A limiter the configuration does not name is a typo, not "none";
    // an adaptive limiter's rates are overrides of its name.
    if let Some(l) = limiter {
        let config = loaded(g)?;
        if config.adaptive(l).is_err() {
            config
                .limiter(l)
                .map_err(|e| Failure::Input(e.to_string()))?;
        }
    }
    let prefix = prefix(g)?;
    let backend = connect(g, &prefix).await?;
    let work = async {
        backend
            .list_overrides(limiter)
            .await
            .map_err(|e| Failure::backend("override list", &e))
    };
    let listed = timed(g, "override list", work).await?;
    let on = acted_on(g, &prefix);
    if g.json {
        let overrides: Vec<Value> = listed
            .iter()
            .map(|o| {
                json!({
                    "limiter": o.limiter,
                    "key": o.key,
                    "policy": match &o.policy {
                        Ok(p) => policy_json(p),
                        Err(why) => json!({ "invalid": why }),
                    },
                    "expires_in_ms": millis_json(o.ttl),
                })
            })
            .collect();
        print_json(&json!({ "redis": on, "overrides": overrides }));
        return Ok(());
    }
    out!("on redis     {on}");
    if listed.is_empty() {
        out!("no override stored");
        return Ok(());
    }
    let scope = |o: &tollgate_redis::StoredOverride| match &o.key {
        Some(k) => format!("{} key {k}", o.limiter),
        None => format!("{} (every key)", o.limiter),
    };
    let width = listed.iter().map(|o| scope(o).len()).max().unwrap_or(0);
    for o in &listed {
        let policy = match &o.policy {
            Ok(p) => describe(p),
            Err(why) => format!("INVALID, no policy: {why}"),
        };
        let lasting = match o.ttl {
            Some(t) => format!("; expires in {}", human_duration(t)),
            None => String::new(),
        };
        out!("{:width$}  {policy}{lasting}", scope(o));
    }
    Ok(())
}

async fn override_mark(g: &Global) -> Result<(), Failure> {
    let backend = connect(g, &prefix(g)?).await?;
    let work = async {
        backend
            .mark_keyed_overrides()
            .await
            .map_err(|e| Failure::backend("override mark", &e))
    };
    let marked = timed(g, "override mark", work).await?;
    if g.json {
        print_json(&json!({ "marked": marked }));
    } else if marked.is_empty() {
        out!("no per-key override stored: nothing to mark");
    } else {
        out!(
            "marked {} limiter(s) with per-key overrides: {}",
            marked.len(),
            marked.join(", ")
        );
    }
    Ok(())
}

async fn durability(g: &Global, strict: bool) -> Result<(), Failure> {
    let backend = connect(g, &prefix(g)?).await?;
    let work = async {
        backend
            .check_durability()
            .await
            .map_err(|e| Failure::backend("durability check", &e))
    };
    let report = timed(g, "durability", work).await?;
    // One server: named by its URL. Several (a cluster, a Sentinel master
    // and its replicas): by address, with their roles.
    let single = !g.cluster && report.nodes.len() == 1 && !g.redis_url[0].contains("+sentinel://");
    let verdict = if report.is_durable() {
        Ok(())
    } else if report.is_known_bad() || strict {
        Err(Failure::NotDurable)
    } else {
        Ok(())
    };
    if g.json {
        let setting = |s: &Setting| match s {
            Setting::Known(v) => Value::from(v.as_str()),
            _ => Value::Null,
        };
        let servers: Vec<Value> = report
            .nodes
            .iter()
            .map(|n| {
                // Each problem starts with its server (and role): said
                // once, by the fields.
                let problems: Vec<String> = n
                    .problems()
                    .into_iter()
                    .map(|p| p.split_once(": ").map_or(p.clone(), |(_, p)| p.to_owned()))
                    .collect();
                json!({
                    "server": if single { host(&g.redis_url[0]) } else { n.node.clone() },
                    "role": n.role.to_string(),
                    "appendonly": setting(&n.appendonly),
                    "appendfsync": setting(&n.appendfsync),
                    "maxmemory_policy": setting(&n.maxmemory_policy),
                    "problems": problems,
                })
            })
            .collect();
        let durable = if report.is_durable() {
            Value::from(true)
        } else if report.is_known_bad() {
            Value::from(false)
        } else {
            Value::Null
        };
        print_json(&json!({
            "durable": durable,
            "strict": strict,
            "ok": verdict.is_ok(),
            "servers": servers,
        }));
        return verdict;
    }
    for n in &report.nodes {
        let node = if single {
            host(&g.redis_url[0])
        } else {
            n.node.clone()
        };
        out!("server            {node}");
        out!("role              {}", n.role);
        out!("appendonly        {} (want yes)", n.appendonly);
        out!("appendfsync       {}", n.appendfsync);
        out!("maxmemory-policy  {} (want noeviction)", n.maxmemory_policy);
        let own = format!("{}: ", n.node);
        for p in n.problems() {
            let p = if single {
                p.strip_prefix(&own).unwrap_or(&p)
            } else {
                &p
            };
            out!("problem           {p}");
        }
    }
    if report.is_durable() {
        out!("durable: yes");
        return Ok(());
    }
    if report.is_known_bad() {
        out!("durable: NO (see docs/redis.md, \"Configuration: redis-durable\")");
        return Err(Failure::NotDurable);
    }
    if strict {
        out!("durable: UNKNOWN, refused under --strict (grant the user +config|get to prove it)");
        return Err(Failure::NotDurable);
    }
    out!("durable: unknown (some settings could not be read; --strict fails on this)");
    Ok(())
}

/// `host:port` of a URL, without credentials.
fn host(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    rest.split(['/', '?']).next().unwrap_or(rest).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_shown_without_passwords() {
        assert_eq!(
            redact("redis://limiter:s3cret@10.0.0.5:6379/0"),
            "redis://limiter:***@10.0.0.5:6379/0"
        );
        assert_eq!(redact("redis://:s3cret@h:1"), "redis://:***@h:1");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
        assert_eq!(
            redact("redis+sentinel://u:pw@a:1,b:2/m?sentinel_password=s3&sentinel_username=x"),
            "redis+sentinel://u:***@a:1,b:2/m?sentinel_password=***&sentinel_username=x"
        );
        assert_eq!(host("rediss://u:p@h.example:6380/2"), "h.example:6380");
    }
}
