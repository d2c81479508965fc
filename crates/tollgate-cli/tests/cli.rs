//! The `tollgate` binary, run as an operator runs it, against throwaway
//! servers on loopback ports: every test that reaches a server runs on
//! Redis (`<test>::redis`) and on Valkey (`<test>::valkey`). What the CLI shows and changes is
//! checked against what a service's own `Limiter` (same configuration, same
//! Redis) decides.
//!
//! Without redis-server the Redis tests are skipped loudly; under `CI=true`
//! they fail instead (see `tollgate_testkit::redis_server`).

use std::io::Write;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tollgate_limiter::{
    Backend, Config, Decision, Key, KeyHasher, Limiter, Policy, Scope, TokenBucket,
};
use tollgate_redis::{Durability, RedisBackend};
use tollgate_testkit::ha::RedisSentinel;
use tollgate_testkit::redis_server::{RedisServer, Server, unused_port};

const BIN: &str = env!("CARGO_BIN_EXE_tollgate");

/// The key secret of the services in these tests; every run of the CLI
/// has it in `TOLLGATE_KEY_SECRET`, as an operator's shell would.
const SECRET: &str = "the services' key secret";

/// The hasher the services build from [`SECRET`].
fn hasher() -> KeyHasher {
    KeyHasher::new(SECRET).unwrap()
}

/// A config file in a temporary directory, removed on drop.
struct ConfigFile {
    path: PathBuf,
    toml: String,
}

impl ConfigFile {
    fn new(toml: &str) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "tollgate-cli-test-{}-{}.toml",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&path, toml).expect("write the config file");
        Self {
            path,
            toml: toml.to_owned(),
        }
    }

    fn arg(&self) -> &str {
        self.path.to_str().expect("utf-8 temp path")
    }

    /// The service's side: a limiter of this configuration on `url`.
    fn limiter(&self, url: &str, name: &str) -> Limiter<RedisBackend> {
        let config = Config::builder().toml_str(&self.toml).load().unwrap();
        let backend = block_on(
            RedisBackend::builder(url)
                .prefix(config.prefix())
                .durability(Durability::Skip)
                .build(),
        )
        .expect("connect the service's backend");
        let mut lc = config.limiter(name).unwrap().clone();
        lc.timeout = Duration::from_secs(2);
        lc.build(backend)
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// One runtime for the services' side: a backend's connections live on the
/// runtime that made them.
fn block_on<F: Future>(f: F) -> F::Output {
    static RT: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("tokio runtime")
    });
    RT.block_on(f)
}

fn decide(l: &Limiter<RedisBackend>, key: &Key, cost: u64) -> Decision {
    block_on(l.try_acquire(key, cost)).expect("the service's decision")
}

/// What the service would answer to one unit for `key`, consuming nothing.
fn peek(l: &Limiter<RedisBackend>, key: &Key) -> Decision {
    block_on(l.try_peek(key, 1)).expect("the service's peek")
}

/// Runs the binary with a clean environment plus `env`, feeding `stdin`.
fn run_with(args: &[&str], env: &[(&str, &str)], stdin: &str) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_clear()
        .env("TOLLGATE_KEY_SECRET", SECRET)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("run tollgate");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().expect("wait for tollgate")
}

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    run_with(args, env, "")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts the exit code and returns stdout + stderr for messages.
#[track_caller]
fn expect(o: &Output, code: i32) -> String {
    let text = format!("{}{}", stdout(o), stderr(o));
    assert_eq!(o.status.code(), Some(code), "output:\n{text}");
    text
}

/// A line of `inspect`'s output, e.g. `field("remaining")`.
fn field(out: &str, name: &str) -> String {
    out.lines()
        .find_map(|l| {
            l.strip_prefix(name)
                .filter(|v| v.starts_with(' '))
                .map(|v| v.trim().to_owned())
        })
        .unwrap_or_else(|| panic!("no {name:?} line in:\n{out}"))
}

/// Stdout as JSON (`--json`).
#[track_caller]
fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}{}", stdout(o), stderr(o)))
}

fn shared_url(server: Server) -> Option<String> {
    RedisServer::shared_url_on(server)
}

const API: &str = r#"
[limiters.api]
strategy = "token_bucket"
capacity = 10
refill = "1/h"

[limiters.costly]
strategy = "token_bucket"
capacity = 10
refill = "1/h"
cost = 4

[limiters.login_ip]
strategy = "sliding_window"
limit = 3
window = "15m"

[limiters.login_account]
strategy = "progressive_delay"
free_attempts = 2
base_delay = "10m"
max_delay = "1h"
forget_after = "2h"
"#;

fn config(prefix: &str) -> ConfigFile {
    ConfigFile::new(&format!("[defaults]\nprefix = \"{prefix}\"\n{API}"))
}

// ---------------------------------------------------------------- help

#[test]
fn every_command_has_help() {
    for path in [
        &[][..],
        &["inspect"],
        &["reset"],
        &["override"],
        &["override", "set"],
        &["override", "clear"],
        &["override", "show"],
        &["durability"],
        &["config"],
        &["config", "validate"],
    ] {
        let mut args: Vec<&str> = path.to_vec();
        args.push("--help");
        let o = run(&args, &[]);
        let out = expect(&o, 0);
        let usage = format!("Usage: tollgate {}", path.join(" "));
        assert!(out.contains(usage.trim_end()), "{path:?}:\n{out}");
    }
    let top = stdout(&run(&["--help"], &[]));
    assert!(
        top.contains("Exit codes:") && top.contains("3  durability"),
        "{top}"
    );
    let keys = stdout(&run(&["inspect", "--help"], &[]));
    for flag in ["--ip", "--email", "--api-key", "--key", "--ipv6-prefix"] {
        assert!(keys.contains(flag), "{flag}:\n{keys}");
    }
    // REDIS_URL may hold a password: --help must not print it.
    let o = run(
        &["--help"],
        &[("REDIS_URL", "redis://u:hunter2@127.0.0.1:1")],
    );
    assert!(!stdout(&o).contains("hunter2"));
}

// ---------------------------------------------------------------- config validate

#[test]
fn config_validate_accepts_a_good_file_and_lists_its_limiters() {
    let c = config("t-validate");
    let o = run(&["config", "validate", c.arg()], &[]);
    let out = expect(&o, 0);
    assert!(out.contains("4 limiter(s)"), "{out}");
    assert!(out.contains("prefix \"t-validate\""), "{out}");
    assert!(
        out.contains("token_bucket: capacity = 10, refill = \"1/h\"; cost 4"),
        "{out}"
    );
    let o = run(&["--json", "config", "validate", c.arg()], &[]);
    expect(&o, 0);
    let v = json(&o);
    assert_eq!(v["valid"], true);
    assert_eq!(v["prefix"], "t-validate");
    assert_eq!(v["limiters"].as_array().map(Vec::len), Some(4));
    assert_eq!(v["limiters"][1]["cost"], 4);
    assert_eq!(v["limiters"][1]["name"], "costly");
    // --config and positional files are layered in order.
    let extra = ConfigFile::new("[limiters.api]\ncapacity = 99");
    let o = run(&["-c", c.arg(), "config", "validate", extra.arg()], &[]);
    assert!(expect(&o, 0).contains("capacity = 99"));
}

/// A reader that stops reading (`| head -1`, a pager quit early) closes
/// the pipe: the CLI stops printing and exits with its own verdict, as
/// without the reader. It panicked (exit 101, "failed printing to stdout:
/// Broken pipe"). The pipe's reading end is closed before the CLI starts,
/// so every write meets it.
#[test]
fn a_closed_stdout_is_no_panic() {
    let c = config("t-pipe");
    for (args, code) in [
        (vec!["config", "validate", c.arg()], 0),
        (vec!["--json", "config", "validate", c.arg()], 0),
        (vec!["config", "validate", c.arg(), "/nonexistent.toml"], 2),
    ] {
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader);
        let o = Command::new(BIN)
            .args(&args)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .expect("run tollgate");
        let err = stderr(&o);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
    }
}

#[test]
fn config_validate_errors_name_the_limiter_and_the_field() {
    let cases = [
        (
            "[limiters.api]\nstrategy='token_bucket'\ncapacity=0\nrefill='1/s'",
            "limiters.api.capacity",
        ),
        (
            "[limiters.api]\nstrategy='leaky'\ncapacity=1\nrefill='1/s'",
            "limiters.api.strategy",
        ),
        (
            "[limiters.api]\nstrategy='token_bucket'\ncapacity=1\nrefill='1/s'\nwindow='1m'",
            "limiters.api.window",
        ),
        (
            "[limiters.api]\nstrategy='token_bucket'\ncapacity=2\nrefill='1/s'\ncost=3",
            "limiters.api.cost",
        ),
        (
            "[limiters.login]\nstrategy='sliding_window'\nlimit=5\nwindow='0s'",
            "limiters.login.window",
        ),
        (
            "[limiters.api]\nstrategy='token_bucket'\ncapacty=1\nrefill='1/s'",
            "capacty",
        ),
    ];
    for (toml, want) in cases {
        let c = ConfigFile::new(toml);
        let o = run(&["config", "validate", c.arg()], &[]);
        let err = expect(&o, 2);
        assert!(
            stderr(&o).contains(want),
            "{toml}: want {want}, got:\n{err}"
        );
        assert!(stderr(&o).starts_with("error: invalid tollgate configuration"));
    }
}

#[test]
fn config_validate_layers_the_environment_like_start_up() {
    let c = config("t-env");
    // A bad value from the environment is named like one from a file.
    let o = run(
        &["config", "validate", c.arg()],
        &[("TOLLGATE_LIMITERS__API__CAPACITY", "0")],
    );
    expect(&o, 2);
    assert!(
        stderr(&o).contains("limiters.api.capacity"),
        "{}",
        stderr(&o)
    );
    // A good one changes the result.
    let o = run(
        &["config", "validate", c.arg()],
        &[("TOLLGATE_LIMITERS__API__CAPACITY", "77")],
    );
    assert!(expect(&o, 0).contains("capacity = 77"));
    // The environment alone is a configuration.
    let o = run(
        &["config", "validate"],
        &[
            ("TOLLGATE_LIMITERS__WEB__STRATEGY", "sliding_window"),
            ("TOLLGATE_LIMITERS__WEB__LIMIT", "5"),
            ("TOLLGATE_LIMITERS__WEB__WINDOW", "1m"),
        ],
    );
    assert!(expect(&o, 0).contains("1 limiter(s)"));
    // A missing file is an error that names it.
    let o = run(&["config", "validate", "/nonexistent/tollgate.toml"], &[]);
    expect(&o, 2);
    assert!(stderr(&o).contains("/nonexistent/tollgate.toml"));
}

// ---------------------------------------------------------------- usage errors

#[test]
fn usage_errors_exit_2() {
    let c = config("t-usage");
    let url = "redis://127.0.0.1:1";
    for (args, want) in [
        (vec!["inspect", "api"], "required"),
        (
            vec!["inspect", "api", "--ip", "1.2.3.4", "--key", "x"],
            "cannot be used",
        ),
        (
            vec!["reset", "api", "--ip", "not-an-ip"],
            "--ip \"not-an-ip\"",
        ),
        (vec!["inspect", "api", "--ip", "10.0.0.0/8"], "IPv6 only"),
        (
            vec!["inspect", "nope", "--ip", "1.2.3.4"],
            "no limiter named \"nope\"",
        ),
        (vec!["override", "set", "api"], "no policy given"),
        (
            vec!["override", "set", "api", "--capacity", "x"],
            "invalid value",
        ),
        (vec!["durability", "--timeout", "soon"], "--timeout"),
        (
            vec!["--prefix", "a{b", "inspect", "api", "--key", "k"],
            "--prefix \"a{b\"",
        ),
        (vec!["frobnicate"], "unrecognized subcommand"),
    ] {
        let mut full = vec!["-c", c.arg(), "--redis-url", url];
        full.extend(args.iter().copied());
        let o = run(&full, &[]);
        let out = expect(&o, 2);
        assert!(out.contains(want), "{args:?}: want {want:?} in:\n{out}");
    }
    for tls_url in ["rediss://127.0.0.1:1", "rediss+sentinel://127.0.0.1:1/m"] {
        let o = run(&["--redis-url", tls_url, "durability"], &[]);
        if cfg!(feature = "tls") {
            expect(&o, 1);
        } else {
            assert!(expect(&o, 2).contains("`tls` feature"), "{tls_url}");
        }
    }
    let o = run(
        &[
            "--redis-url",
            "redis://127.0.0.1:1,redis://127.0.0.1:2",
            "durability",
        ],
        &[],
    );
    let out = expect(&o, 2);
    if cfg!(feature = "cluster") {
        assert!(out.contains("--cluster"), "{out}");
    } else {
        assert!(out.contains("add --cluster"), "{out}");
        let o = run(&["--cluster", "durability"], &[]);
        assert!(expect(&o, 2).contains("`cluster` feature"));
    }
}

// ---------------------------------------------------------------- unreachable Redis

#[test]
fn unreachable_redis_exits_1_without_showing_the_password() {
    let c = config("t-down");
    // A port nobody listens on.
    let port = unused_port();
    let url = format!("redis://ops:hunter2@127.0.0.1:{port}");
    for args in [
        vec!["inspect", "api", "--ip", "1.2.3.4"],
        vec!["reset", "api", "--ip", "1.2.3.4"],
        vec!["override", "show", "api"],
        vec!["override", "set", "api", "--capacity", "5"],
        vec!["override", "clear", "api"],
        vec!["durability"],
    ] {
        let mut full = vec!["-c", c.arg()];
        full.extend(args.iter().copied());
        let o = run(&full, &[("REDIS_URL", &url)]);
        let out = expect(&o, 1);
        assert!(
            out.contains(&format!(
                "cannot connect to redis at redis://ops:***@127.0.0.1:{port}"
            )),
            "{args:?}:\n{out}"
        );
        assert!(!out.contains("hunter2"), "{out}");
    }
}

/// A URL that cannot be a Redis address is a usage error (exit 2), as the
/// exit codes say, not "Redis unreachable" (exit 1), and its message
/// shows no password.
#[test]
fn a_malformed_redis_url_exits_2_without_the_password() {
    let c = config("t-bad-url");
    for url in [
        "redis://ops:hunter2@127.0.0.1:notaport",
        "redis://ops:hunter2@127.0.0.1:6379/notadb",
        "http://ops:hunter2@127.0.0.1:6379",
        "redis+sentinel://ops:hunter2@127.0.0.1:26379",
    ] {
        let o = run(
            &[
                "-c",
                c.arg(),
                "--redis-url",
                url,
                "inspect",
                "api",
                "--key",
                "a",
            ],
            &[],
        );
        let out = expect(&o, 2);
        assert!(out.contains("invalid redis URL"), "{url}: {out}");
        assert!(!out.contains("hunter2"), "{url}: {out}");
    }
}

#[test]
fn a_silent_server_times_out_with_exit_1() {
    // Accepts connections (the kernel's backlog) but never answers.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://127.0.0.1:{}", silent.local_addr().unwrap().port());
    let t = std::time::Instant::now();
    let o = run(
        &["--redis-url", &url, "--timeout", "300ms", "durability"],
        &[],
    );
    let out = expect(&o, 1);
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert!(
        out.contains("did not answer within") || out.contains("cannot connect"),
        "{out}"
    );
}

// ---------------------------------------------------------------- [redis] from configuration

tollgate_testkit::on_every_server! {
    /// Without `--redis-url` or `REDIS_URL` the CLI connects where the
    /// configuration's `[redis]` section says (a file, overridden by
    /// `TOLLGATE_REDIS__URL`); `REDIS_URL` and then `--redis-url` win over it.
    #[test]
    fn the_url_comes_from_configuration_unless_given(server: Server) {
        let Some(url) = shared_url(server) else { return };
        let dead = format!("redis://127.0.0.1:{}", unused_port());
        let with_redis = |at: &str| {
            ConfigFile::new(&format!(
                "[defaults]\nprefix = \"t-cfgurl\"\n[redis]\nurl = \"{at}\"\n{API}"
            ))
        };
        let service = config("t-cfgurl").limiter(&url, "api");
        let k = Key::new("cfg-url");
        assert!(decide(&service, &k, 3).is_allowed());
        let inspect = ["inspect", "api", "--key", "cfg-url"];
        let remaining = |o: &Output| field(&expect(o, 0), "remaining");

        let good = with_redis(&url);
        let args = [&["-c", good.arg()][..], &inspect].concat();
        assert_eq!(remaining(&run(&args, &[])), "7", "from the file");

        let bad = with_redis(&dead);
        let args = [&["-c", bad.arg()][..], &inspect].concat();
        let o = run(&args, &[]);
        assert!(expect(&o, 1).contains(&dead), "the file's URL is used");
        let o = run(&args, &[("TOLLGATE_REDIS__URL", &url)]);
        assert_eq!(remaining(&o), "7", "TOLLGATE_REDIS__URL over the file");
        let o = run(&args, &[("REDIS_URL", &url)]);
        assert_eq!(remaining(&o), "7", "REDIS_URL over the configuration");
        let args = [&["-c", good.arg(), "--redis-url", &dead][..], &inspect].concat();
        let o = run(&args, &[]);
        assert!(expect(&o, 1).contains(&dead), "--redis-url over the configuration");
    }
}

#[test]
fn config_validate_checks_the_redis_section() {
    let c = ConfigFile::new(&format!(
        "[redis]\nurl = \"redis://ops:hunter2@10.0.0.5:6379\"\nresponse_timeout = \"250ms\"\n{API}"
    ));
    let o = run(&["config", "validate", c.arg()], &[]);
    let out = expect(&o, 0);
    assert!(
        out.contains("redis: redis://ops:***@10.0.0.5:6379"),
        "{out}"
    );
    assert!(!out.contains("hunter2"), "{out}");
    let o = run(&["--json", "config", "validate", c.arg()], &[]);
    expect(&o, 0);
    assert_eq!(json(&o)["redis"]["cluster"], false);
    for (env, field) in [
        ("TOLLGATE_REDIS__RESPONSE_TIMEOUT", "redis.response_timeout"),
        ("TOLLGATE_REDIS__URL", "redis.url"),
    ] {
        let o = run(&["config", "validate", c.arg()], &[(env, "soon")]);
        assert!(expect(&o, 2).contains(field), "{env}");
    }
}

// ---------------------------------------------------------------- inspect

tollgate_testkit::on_every_server! {
    /// A limiter's configured cost is what `inspect` asks about: with 2
    /// of 10 left, a request of `cost = 4` would be refused (it answered
    /// "a request of cost 1 would pass now").
    #[test]
    fn inspect_asks_about_the_configured_cost(server: Server) {
        let Some(url) = shared_url(server) else { return };
        let c = config("t-inspect-cost");
        let service = c.limiter(&url, "costly");
        let key = Key::new("acct-7");
        for _ in 0..2 {
            assert!(block_on(service.check(&key)).is_allowed());
        }
        let o = run(
            &["-c", c.arg(), "inspect", "costly", "--key", "acct-7"],
            &[("REDIS_URL", &url)],
        );
        let out = expect(&o, 0);
        assert_eq!(field(&out, "remaining"), "2", "{out}");
        assert!(
            field(&out, "verdict").starts_with("REFUSED: a request of cost 4 would be refused"),
            "{out}"
        );
    }
}

tollgate_testkit::on_every_server! {
    #[test]
    fn inspect_shows_the_slots_held_and_the_mode(server: Server) {
        let Some(url) = shared_url(server) else { return };
        let c = ConfigFile::new(
            r#"
            [defaults]
            prefix = "t-slots"
            [limiters.exports]
            strategy = "concurrency"
            max_in_flight = 3
            lease = "2m"
            mode = "shadow"
            "#,
        );
        let service = c.limiter(&url, "exports");
        let k = Key::new("tenant-7");
        // Two requests in flight, one of them on a worker that died.
        let (_, held) = block_on(service.hold(&k));
        let (_, lost) = block_on(service.hold(&k));
        std::mem::forget(lost.expect("a slot"));
        let inspect = |json: bool| {
            let mut args = vec!["-c", c.arg()];
            if json {
                args.push("--json");
            }
            args.extend(["inspect", "exports", "--key", "tenant-7"]);
            run(&args, &[("REDIS_URL", &url)])
        };
        let out = expect(&inspect(false), 0);
        assert!(field(&out, "in flight").starts_with("2 of 3 slots held"), "{out}");
        assert!(field(&out, "mode").starts_with("shadow"), "{out}");
        assert_eq!(field(&out, "remaining"), "1");
        let v = json(&inspect(true));
        assert_eq!(v["mode"], "shadow");
        assert_eq!(v["slots"]["held"], 2);
        assert_eq!(v["slots"]["max_in_flight"], 3);
        assert!(v["slots"]["redis_key"].as_str().unwrap().ends_with("{tenant-7}:slots"));
        // The request that ended gives its slot back; a reset frees the
        // dead worker's without waiting for its lease.
        block_on(held.expect("a slot").release()).expect("released");
        assert_eq!(json(&inspect(true))["slots"]["held"], 1);
        expect(&run(&["-c", c.arg(), "reset", "exports", "--key", "tenant-7"], &[("REDIS_URL", &url)]), 0);
        assert_eq!(json(&inspect(true))["slots"]["held"], 0);
        assert_eq!(peek(&service, &k).remaining(), 3);
    }
}

tollgate_testkit::on_every_server! {
    #[test]
    fn inspect_shows_the_candidate_beside_the_enforced_policy(server: Server) {
        let Some(url) = shared_url(server) else { return };
        let c = ConfigFile::new(
            r#"
            [defaults]
            prefix = "t-cand"
            [limiters.api]
            strategy = "token_bucket"
            capacity = 5
            refill = "1/h"
            [limiters.api.candidate]
            strategy = "sliding_window"
            limit = 2
            window = "1h"
            "#,
        );
        let service = c.limiter(&url, "api");
        let k = Key::new("acct-1");
        for _ in 0..3 {
            assert!(block_on(service.check(&k)).is_allowed());
        }
        let run_cli = |json: bool| {
            let mut args = vec!["-c", c.arg()];
            if json {
                args.push("--json");
            }
            args.extend(["inspect", "api", "--key", "acct-1"]);
            run(&args, &[("REDIS_URL", &url)])
        };
        let out = expect(&run_cli(false), 0);
        assert_eq!(field(&out, "remaining"), "2");
        let cand = field(&out, "candidate");
        assert!(cand.contains("api:candidate") && cand.contains("would REFUSE"), "{out}");
        let v = json(&run_cli(true));
        assert_eq!(v["candidate"]["limiter"], "api:candidate");
        assert_eq!(v["candidate"]["decision"]["remaining"], 0);
        assert_eq!(v["candidate"]["policy"]["strategy"], "sliding_window");
    }
}

tollgate_testkit::on_every_server! {
    /// `tollgate reset` resets the candidate's state of the key too, as
    /// `Limiter::reset` does (the CHANGELOG's "the CLI's `reset`
    /// follows"): the CLI built its limiter without the candidate, so a
    /// user unblocked by hand stayed blocked under the candidate, whose
    /// line and metrics then counted a disagreement where there is none.
    #[test]
    fn reset_resets_the_candidate_too(server: Server) {
        let Some(url) = shared_url(server) else { return };
        let c = ConfigFile::new(
            r#"
            [defaults]
            prefix = "t-cand-reset"
            [limiters.api]
            strategy = "token_bucket"
            capacity = 5
            refill = "1/h"
            [limiters.api.candidate]
            strategy = "sliding_window"
            limit = 2
            window = "1h"
            "#,
        );
        let service = c.limiter(&url, "api");
        let k = Key::new("acct-1");
        for _ in 0..3 {
            assert!(block_on(service.check(&k)).is_allowed());
        }
        let inspect = || {
            json(&run(
                &["-c", c.arg(), "--json", "inspect", "api", "--key", "acct-1"],
                &[("REDIS_URL", &url)],
            ))
        };
        assert_eq!(inspect()["candidate"]["decision"]["remaining"], 0);
        let o = run(
            &["-c", c.arg(), "reset", "api", "--key", "acct-1"],
            &[("REDIS_URL", &url)],
        );
        expect(&o, 0);
        let v = inspect();
        assert_eq!(v["decision"]["remaining"], 5, "{v}");
        assert_eq!(v["candidate"]["decision"]["remaining"], 2, "{v}");
    }
}

tollgate_testkit::on_every_server! {
    /// The candidate's line answers for the request the limiter would
    /// charge (its cost, 4 here), as the enforced line does: asked about
    /// one unit, it said "would allow" with 1 of 5 left, where the
    /// service's next request (cost 4) would be refused by it.
    #[test]
    fn inspect_asks_the_candidate_about_the_configured_cost(server: Server) {
        let Some(url) = shared_url(server) else { return };
        let c = ConfigFile::new(
            r#"
            [defaults]
            prefix = "t-cand-cost"
            [limiters.api]
            strategy = "token_bucket"
            capacity = 10
            refill = "1/h"
            cost = 4
            [limiters.api.candidate]
            strategy = "sliding_window"
            limit = 5
            window = "1h"
            "#,
        );
        let service = c.limiter(&url, "api");
        let k = Key::new("acct-1");
        assert!(block_on(service.check(&k)).is_allowed());
        let o = run(
            &["-c", c.arg(), "inspect", "api", "--key", "acct-1"],
            &[("REDIS_URL", &url)],
        );
        let out = expect(&o, 0);
        assert_eq!(field(&out, "remaining"), "6", "{out}");
        let cand = field(&out, "candidate");
        assert!(cand.contains("would REFUSE"), "{out}");
    }
}

tollgate_testkit::on_every_server! {
    #[test]
    fn inspect_shows_what_the_service_counted(server: Server) {
        let Some(url) = shared_url(server) else { return };
        let c = config("t-inspect");
        let service = c.limiter(&url, "api");
        // The service saw "Alice@Example.com " four times (the login layer
        // normalises and hashes it).
        let alice = hasher().email("alice@example.com");
        for _ in 0..4 {
            assert!(decide(&service, &alice, 1).is_allowed());
        }
        let o = run(
            &[
                "-c",
                c.arg(),
                "inspect",
                "api",
                "--email",
                " Alice@EXAMPLE.com",
            ],
            &[("REDIS_URL", &url)],
        );
        let out = expect(&o, 0);
        assert_eq!(field(&out, "limit"), "10");
        assert_eq!(field(&out, "remaining"), "6");
        assert_eq!(field(&out, "retry-after"), "0s");
        assert!(field(&out, "verdict").starts_with("allowed"), "{out}");
        // 4 tokens at one an hour: fresh again in just under 4 h.
        let reset: f64 = field(&out, "reset-after")
            .split("s ")
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!((14_000.0..=14_400.0).contains(&reset), "{out}");
        assert!(
            field(&out, "redis key").starts_with("t-inspect:api:{#e:"),
            "{out}"
        );
        assert!(!out.contains("alice"), "the email must not be shown: {out}");
        assert!(field(&out, "in force").ends_with("(from configuration)"));

        // The same, for scripts.
        let o = run(
            &[
                "-c",
                c.arg(),
                "--json",
                "inspect",
                "api",
                "--email",
                "alice@example.com",
            ],
            &[("REDIS_URL", &url)],
        );
        expect(&o, 0);
        let v = json(&o);
        assert_eq!(v["decision"]["remaining"], 6);
        assert_eq!(v["decision"]["allowed"], true);
        assert_eq!(v["key"]["kind"], "email");
        assert_eq!(v["key"]["key"], alice.as_str());
        assert_eq!(v["policy"]["source"], "configuration");
        assert_eq!(v["policy"]["in_force"]["capacity"], 10);

        // Inspecting is a peek: it consumed nothing.
        assert_eq!(decide(&service, &alice, 1).remaining(), 5);

        // Hashed keys need the services' secret: without it, a clear error
        // (never a key the services do not use); from a file, the same key;
        // another secret or none, another key.
        let inspect_email = |extra: &[&str], env: &[(&str, &str)]| {
            let mut args = vec!["-c", c.arg(), "--json"];
            args.extend(extra);
            args.extend(["inspect", "api", "--email", "alice@example.com"]);
            let mut env = env.to_vec();
            env.push(("REDIS_URL", &url));
            run(&args, &env)
        };
        let o = inspect_email(&[], &[("TOLLGATE_KEY_SECRET", "")]);
        assert_eq!(o.status.code(), Some(2));
        assert!(stderr(&o).contains("TOLLGATE_KEY_SECRET"), "{}", stderr(&o));
        let dir = std::env::temp_dir().join(format!("tollgate-cli-secret-{}-{server}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("secret");
        std::fs::write(&file, format!("{SECRET}\n")).unwrap();
        let o = inspect_email(
            &["--key-secret-file", file.to_str().unwrap()],
            &[("TOLLGATE_KEY_SECRET", "")],
        );
        expect(&o, 0);
        assert_eq!(json(&o)["key"]["key"], alice.as_str());
        std::fs::write(&file, "another secret, long enough").unwrap();
        let o = inspect_email(&["--key-secret-file", file.to_str().unwrap()], &[]);
        expect(&o, 0);
        assert_ne!(json(&o)["key"]["key"], alice.as_str());
        std::fs::remove_dir_all(&dir).unwrap();
        let o = inspect_email(&["--unkeyed-hashes"], &[]);
        expect(&o, 0);
        assert_eq!(
            json(&o)["key"]["key"],
            KeyHasher::unkeyed().email("alice@example.com").as_str()
        );

        // An exhausted API key, given on standard input.
        let secret = "sk_live_0123456789";
        let bob = hasher().secret(secret);
        assert!(decide(&service, &bob, 10).is_allowed());
        let o = run_with(
            &["-c", c.arg(), "inspect", "api", "--api-key", "-"],
            &[("REDIS_URL", &url)],
            &format!("{secret}\n"),
        );
        let out = expect(&o, 0);
        assert!(field(&out, "verdict").starts_with("REFUSED"), "{out}");
        assert_eq!(field(&out, "remaining"), "0");
        assert!(
            field(&out, "verdict").contains("Retry-After: 3600"),
            "{out}"
        );
        let retry: f64 = field(&out, "retry-after")
            .split('s')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!((3590.0..=3600.0).contains(&retry), "{out}");
        assert!(!out.contains(secret));
    }
}

tollgate_testkit::on_every_server! {
    #[test]
    fn prefix_flag_overrides_the_configured_prefix(server: Server) {
        let Some(url) = shared_url(server) else { return };
        let c = config("t-prefix-config");
        let other = config("t-prefix-flag");
        let service = other.limiter(&url, "api");
        let key = Key::new("account-1");
        decide(&service, &key, 3);
        let o = run(
            &[
                "-c",
                c.arg(),
                "--prefix",
                "t-prefix-flag",
                "inspect",
                "api",
                "--key",
                "account-1",
            ],
            &[("REDIS_URL", &url)],
        );
        let out = expect(&o, 0);
        assert_eq!(field(&out, "remaining"), "7");
        assert!(field(&out, "redis key").starts_with("t-prefix-flag:api:{account-1}"));
    }
}

// ---------------------------------------------------------------- reset

tollgate_testkit::on_every_server! {
    #[test]
    fn reset_unblocks_a_key(server: Server) {
        let Some(url) = shared_url(server) else { return };
        let c = config("t-reset");
        let run_cli = |args: &[&str]| {
            let mut full = vec!["-c", c.arg(), "--redis-url", url.as_str()];
            full.extend(args);
            run(&full, &[])
        };

        // A client IP locked out by the login window.
        let ip_limiter = c.limiter(&url, "login_ip");
        let ip = Key::new("203.0.113.7");
        for _ in 0..3 {
            assert!(decide(&ip_limiter, &ip, 1).is_allowed());
        }
        assert!(decide(&ip_limiter, &ip, 1).is_denied());
        let out = expect(&run_cli(&["reset", "login_ip", "--ip", "203.0.113.7"]), 0);
        assert!(out.contains("the key is fresh (3 of 3 available)"), "{out}");
        // Where it acted, for an operator whose shell holds another
        // REDIS_URL: the URL (no password here to hide) and the prefix.
        assert!(
            field(&out, "on redis") == format!("{url} (prefix t-reset)"),
            "{out}"
        );
        let d = decide(&ip_limiter, &ip, 1);
        assert!(d.is_allowed() && d.remaining() == 2, "{d:?}");

        // An IPv6 client keyed by its /64, as ClientIp::ipv6_prefix(64) does.
        let net = Key::new("2001:db8:1:2::/64");
        assert!(decide(&ip_limiter, &net, 3).is_allowed());
        assert!(decide(&ip_limiter, &net, 1).is_denied());
        let o = run_cli(&[
            "reset",
            "login_ip",
            "--ip",
            "2001:db8:1:2::99",
            "--ipv6-prefix",
            "64",
        ]);
        expect(&o, 0);
        assert!(decide(&ip_limiter, &net, 1).is_allowed());
        // The /64 is the default, as in ClientIp::new().
        assert!(decide(&ip_limiter, &net, 2).is_allowed());
        assert!(decide(&ip_limiter, &net, 1).is_denied());
        let o = run_cli(&["reset", "login_ip", "--ip", "2001:db8:1:2::99"]);
        expect(&o, 0);
        assert!(decide(&ip_limiter, &net, 1).is_allowed());
        // An IPv4-mapped address is its IPv4 address, as in ClientIp.
        assert!(decide(&ip_limiter, &ip, 2).is_allowed());
        assert!(decide(&ip_limiter, &ip, 1).is_denied());
        let o = run_cli(&["reset", "login_ip", "--ip", "::ffff:203.0.113.7"]);
        expect(&o, 0);
        assert!(decide(&ip_limiter, &ip, 1).is_allowed());

        // An account delayed by the progressive delay.
        let account = c.limiter(&url, "login_account");
        let email = hasher().email("carol@example.com");
        for _ in 0..3 {
            decide(&account, &email, 1);
        }
        let blocked = peek(&account, &email);
        assert!(blocked.is_denied(), "{blocked:?}");
        let out = expect(
            &run_cli(&["inspect", "login_account", "--email", "Carol@example.com"]),
            0,
        );
        assert!(field(&out, "verdict").starts_with("REFUSED"), "{out}");
        expect(
            &run_cli(&["reset", "login_account", "--email", "Carol@example.com"]),
            0,
        );
        assert!(peek(&account, &email).is_allowed());

        // Another key is untouched.
        let other = Key::new("198.51.100.1");
        decide(&ip_limiter, &other, 2);
        expect(&run_cli(&["reset", "login_ip", "--ip", "203.0.113.7"]), 0);
        assert_eq!(decide(&ip_limiter, &other, 1).remaining(), 0);
    }
}

tollgate_testkit::on_every_server! {
    /// An `--email` the services never key (no `@`: a typo, or a user
    /// name) is refused, rather than reset a key no service counts and
    /// report that it worked.
    #[test]
    fn an_email_the_services_never_key_exits_2(server: Server) {
        let Some(url) = shared_url(server) else { return };
        let c = config("t-email-typo");
        for email in ["carol.example.com", "carol@example.com\u{7}", " "] {
            for cmd in ["reset", "inspect"] {
                let o = run(
                    &["-c", c.arg(), "--redis-url", &url, cmd, "login_account", "--email", email],
                    &[],
                );
                let out = expect(&o, 2);
                assert!(out.contains("--email"), "{out}");
            }
        }
    }
}

tollgate_testkit::on_every_server! {
    /// `ApiKey` trims the header value (and the bearer token) of ASCII
    /// whitespace before hashing: an API key given with a pasted space, on
    /// the command line or standard input, is the same client.
    #[test]
    fn an_api_key_is_trimmed_as_the_extractor_trims_it(server: Server) {
        let Some(url) = shared_url(server) else { return };
        let c = config("t-api-key-trim");
        let api = c.limiter(&url, "api");
        let key = hasher().secret("sk_live_1");
        block_on(api.reset(&key)).unwrap();
        for (arg, stdin) in [("-", "sk_live_1 \n"), (" sk_live_1\t", "")] {
            assert!(decide(&api, &key, 10).is_allowed());
            assert!(decide(&api, &key, 1).is_denied());
            let o = run_with(
                &["-c", c.arg(), "--redis-url", &url, "reset", "api", "--api-key", arg],
                &[],
                stdin,
            );
            let out = expect(&o, 0);
            let d = peek(&api, &key);
            assert!(d.is_allowed(), "reset with {arg:?}/{stdin:?} said:\n{out}\nthe service: {d:?}");
        }
        let o = run_with(
            &["-c", c.arg(), "--redis-url", &url, "reset", "api", "--api-key", "-"],
            &[],
            " \n",
        );
        expect(&o, 2);
    }
}

// ---------------------------------------------------------------- overrides

tollgate_testkit::on_every_server! {
    /// `override mark`: a per-key override whose limiter has no marker (as
    /// a version before the marker stored it) is ignored by a token
    /// bucket, and applies once the command has run; it names the
    /// limiters it marked, in text and JSON, and a second run changes
    /// nothing.
    #[test]
    fn override_mark_finds_per_key_overrides_without_their_marker(server: Server) {
        let Some(url) = shared_url(server) else { return };
        let c = config("t-mark");
        let run_cli = |args: &[&str]| {
            let mut full = vec!["-c", c.arg()];
            full.extend(args);
            run(&full, &[("REDIS_URL", &url)])
        };
        let args = ["override", "set", "api", "--key", "acct", "--capacity", "40"];
        expect(&run_cli(&args), 0);
        let del = Command::new("redis-cli")
            .args(["-u", &url, "DEL", "t-mark:api:keyed{t-mark:api:override}"])
            .output()
            .expect("run redis-cli");
        assert_eq!(stdout(&del).trim(), "1", "{}", stderr(&del));
        let acct = Key::new("acct");
        assert_eq!(peek(&c.limiter(&url, "api"), &acct).limit(), 10);

        let out = expect(&run_cli(&["override", "mark"]), 0);
        assert!(
            out.contains("marked 1 limiter(s) with per-key overrides: api"),
            "{out}"
        );
        assert_eq!(peek(&c.limiter(&url, "api"), &acct).limit(), 40);
        let again = json(&run_cli(&["--json", "override", "mark"]));
        assert_eq!(again["marked"], serde_json::json!(["api"]));
        expect(&run_cli(&["override", "clear", "api", "--key", "acct"]), 0);
    }
}

tollgate_testkit::on_every_server! {
    #[test]
    fn overrides_change_what_the_services_decide(server: Server) {
        let Some(url) = shared_url(server) else { return };
        let c = config("t-override");
        let run_cli = |args: &[&str]| {
            let mut full = vec!["-c", c.arg()];
            full.extend(args);
            run(&full, &[("REDIS_URL", &url)])
        };
        let service = c.limiter(&url, "api");
        let vip = hasher().secret("sk_vip");
        let other = Key::new("10.0.0.1");

        // Limiter-wide, as flags: fields not given keep their configured value.
        let out = expect(&run_cli(&["override", "set", "api", "--capacity", "2"]), 0);
        assert!(
            out.contains(
                "override set for limiter api (every key): token_bucket: capacity = 2, refill = \"1/h\""
            ),
            "{out}"
        );
        assert_eq!(decide(&service, &other, 1).limit(), 2);

        // Per key, as a TOML snippet; the key given on standard input.
        let o = run_with(
            &[
                "-c",
                c.arg(),
                "override",
                "set",
                "api",
                "--api-key",
                "-",
                "--toml",
                "capacity = 50\nrefill = \"50/min\"",
            ],
            &[("REDIS_URL", &url)],
            "sk_vip\n",
        );
        expect(&o, 0);
        // The limiter's first per-key override: at once for a worker that
        // has not cached its overrides, within override_cache_ttl (1 s) for
        // one that has (the service above); later per-key changes, clears
        // included, at once.
        let service = c.limiter(&url, "api");
        let d = decide(&service, &vip, 1);
        assert_eq!((d.limit(), d.remaining()), (50, 49));
        assert_eq!(decide(&service, &other, 1).limit(), 2);

        // show and inspect report what is in force, and from where.
        let out = expect(
            &run_cli(&["override", "show", "api", "--api-key", "sk_vip"]),
            0,
        );
        assert!(
            field(&out, "limiter-wide").contains("capacity = 2"),
            "{out}"
        );
        assert!(field(&out, "this key").contains("capacity = 50"), "{out}");
        assert!(
            field(&out, "in force").ends_with("(from the key's override)"),
            "{out}"
        );
        let o = run_cli(&["--json", "override", "show", "api", "--api-key", "sk_vip"]);
        expect(&o, 0);
        let v = json(&o);
        assert_eq!(v["policy"]["source"], "key_override");
        assert_eq!(v["policy"]["key_override"]["capacity"], 50);
        assert_eq!(v["policy"]["key_override"]["refill"], "50/min");
        assert_eq!(v["policy"]["limiter_override"]["capacity"], 2);
        assert_eq!(v["policy"]["configured"]["capacity"], 10);
        let out = expect(&run_cli(&["inspect", "api", "--key", "10.0.0.1"]), 0);
        assert!(
            field(&out, "in force").ends_with("(from the limiter-wide override)"),
            "{out}"
        );
        assert_eq!(field(&out, "limit"), "2");
        assert_eq!(field(&out, "remaining"), "0");

        // Clearing the key's override falls back to the limiter-wide one.
        let out = expect(
            &run_cli(&["override", "clear", "api", "--api-key", "sk_vip"]),
            0,
        );
        assert!(
            out.contains("override cleared") && out.contains("was token_bucket: capacity = 50"),
            "{out}"
        );
        assert_eq!(peek(&service, &vip).limit(), 2);
        // ... and clearing that one to the configuration: at once for a
        // worker that has not cached it, within its override_cache_ttl (1 s)
        // for one that has (the service, which read it above).
        expect(&run_cli(&["override", "clear", "api"]), 0);
        assert_eq!(peek(&c.limiter(&url, "api"), &vip).limit(), 10);
        let out = expect(&run_cli(&["override", "clear", "api"]), 0);
        assert!(out.contains("no override was set"), "{out}");
        let out = expect(&run_cli(&["override", "show", "api"]), 0);
        assert_eq!(field(&out, "limiter-wide"), "none");

        // A sliding window and a progressive delay take their own fields.
        expect(
            &run_cli(&[
                "override", "set", "login_ip", "--limit", "100", "--window", "1m",
            ]),
            0,
        );
        let login = c.limiter(&url, "login_ip");
        assert_eq!(decide(&login, &other, 1).limit(), 100);
        expect(
            &run_cli(&["override", "set", "login_account", "--free-attempts", "9"]),
            0,
        );
        let account = c.limiter(&url, "login_account");
        assert_eq!(peek(&account, &other).limit(), 9);
        expect(&run_cli(&["override", "clear", "login_ip"]), 0);
        expect(&run_cli(&["override", "clear", "login_account"]), 0);
    }
}

tollgate_testkit::on_every_server! {
    /// `override set --for`: the override is reported with the time it has
    /// left, then forgotten by Redis, and the services decide under what
    /// was in force before; a time under a millisecond exits 2 naming the
    /// flag, before anything is written.
    #[test]
    fn an_override_set_for_a_time_is_forgotten(server: Server) {
        let Some(url) = shared_url(server) else { return };
        let c = config("t-overridefor");
        let run_cli = |args: &[&str]| {
            let mut full = vec!["-c", c.arg()];
            full.extend(args);
            run(&full, &[("REDIS_URL", &url)])
        };
        let other = Key::new("10.0.0.1");

        let o = run_cli(&["override", "set", "api", "--capacity", "3", "--for", "0s"]);
        let out = expect(&o, 2);
        assert!(out.contains("--for") && out.contains("at least 1ms"), "{out}");
        let o = run_cli(&["--json", "override", "show", "api"]);
        assert_eq!(json(&o)["policy"]["limiter_override"], serde_json::Value::Null);

        // A long one: reported with what it has left, in text and JSON.
        let out = expect(
            &run_cli(&["override", "set", "api", "--key", "acct", "--capacity", "5", "--for", "1h"]),
            0,
        );
        assert!(out.contains("capacity = 5") && out.contains(", for 3600s (1h), then forgotten"), "{out}");
        assert!(field(&out, "this key").contains("; expires in "), "{out}");
        let v = json(&run_cli(&["--json", "override", "show", "api", "--key", "acct"]));
        let left = v["policy"]["key_override_expires_in_ms"].as_u64().unwrap_or_else(|| panic!("{v}"));
        assert!((3_000_000..=3_600_000).contains(&left), "{v}");
        assert_eq!(v["policy"]["limiter_override_expires_in_ms"], serde_json::Value::Null);

        // A short one, limiter-wide: in force, then gone.
        let v = json(&run_cli(&["--json", "override", "set", "api", "--capacity", "3", "--for", "500ms"]));
        assert_eq!(v["set_for_ms"], 500, "{v}");
        assert_eq!(decide(&c.limiter(&url, "api"), &other, 1).limit(), 3);
        let forgotten = (0..100).any(|_| {
            std::thread::sleep(Duration::from_millis(100));
            let v = json(&run_cli(&["--json", "override", "show", "api"]));
            v["policy"]["limiter_override"].is_null()
        });
        assert!(forgotten, "the override was not forgotten within 10 s");
        assert_eq!(peek(&c.limiter(&url, "api"), &other).limit(), 10);
        // Set again without a time: until cleared.
        let out = expect(&run_cli(&["override", "set", "api", "--key", "acct", "--capacity", "6"]), 0);
        assert!(out.contains("(until cleared)"), "{out}");
        assert_eq!(field(&out, "this key"), "token_bucket: capacity = 6, refill = \"1/h\"");
        expect(&run_cli(&["override", "clear", "api", "--key", "acct"]), 0);
    }
}

tollgate_testkit::on_every_server! {
    /// `override list` finds every override of the prefix, limiter-wide and
    /// per key, with the time left of one set for a time and the reason of
    /// one that is no policy; the counters' own keys are not listed.
    #[test]
    fn override_list_shows_every_override(server: Server) {
        let Some(url) = shared_url(server) else { return };
        let c = config("t-list");
        let run_cli = |args: &[&str]| {
            let mut full = vec!["-c", c.arg()];
            full.extend(args);
            run(&full, &[("REDIS_URL", &url)])
        };
        let out = expect(&run_cli(&["override", "list"]), 0);
        assert!(out.contains("no override stored"), "{out}");

        expect(&run_cli(&["override", "set", "api", "--capacity", "3"]), 0);
        let acct = ["override", "set", "api", "--key", "acct", "--capacity", "5", "--for", "1h"];
        expect(&run_cli(&acct), 0);
        let ip = ["override", "set", "login_ip", "--ip", "10.0.0.9", "--limit", "100"];
        expect(&run_cli(&ip), 0);
        let server_lock = RedisServer::shared_on(server).unwrap().lock().unwrap();
        assert_eq!(server_lock.cli(&["SET", "t-list:api:{bad}:override", "9:zz"]).trim(), "OK");
        assert_eq!(server_lock.cli(&["HSET", "t-list:api:{hash}:override", "f", "v"]).trim(), "1");
        drop(server_lock);
        // State keys and markers of the prefix are no overrides.
        decide(&c.limiter(&url, "api"), &Key::new("10.0.0.1"), 1);
        decide(&c.limiter(&url, "login_ip"), &Key::new("10.0.0.1"), 1);

        let out = expect(&run_cli(&["override", "list"]), 0);
        let lines: Vec<&str> = out.lines().filter(|l| !l.starts_with("on redis")).collect();
        assert_eq!(lines.len(), 5, "{out}");
        assert!(lines[0].starts_with("api (every key)") && lines[0].contains("capacity = 3"), "{out}");
        assert!(lines[1].starts_with("api key acct") && lines[1].contains("; expires in "), "{out}");
        assert!(lines[2].starts_with("api key bad") && lines[2].contains("INVALID"), "{out}");
        assert!(lines[3].starts_with("api key hash") && lines[3].contains("WRONGTYPE"), "{out}");
        assert!(lines[4].starts_with("login_ip key 10.0.0.9") && lines[4].contains("limit = 100"), "{out}");

        let v = json(&run_cli(&["--json", "override", "list", "api"]));
        let listed = v["overrides"].as_array().unwrap_or_else(|| panic!("{v}"));
        assert_eq!(listed.len(), 4, "{v}");
        assert_eq!(listed[0]["key"], serde_json::Value::Null);
        assert_eq!(listed[0]["policy"]["capacity"], 3);
        assert_eq!(listed[0]["expires_in_ms"], serde_json::Value::Null);
        assert_eq!(listed[1]["key"], "acct");
        let left = listed[1]["expires_in_ms"].as_u64().unwrap_or_else(|| panic!("{v}"));
        assert!((3_000_000..=3_600_000).contains(&left), "{v}");
        assert!(listed[2]["policy"]["invalid"].as_str().is_some_and(|w| w.contains("9:zz")), "{v}");

        let out = expect(&run_cli(&["override", "list", "nope"]), 2);
        assert!(out.contains("nope"), "{out}");
        for args in [&["override", "clear", "api"][..], &["override", "clear", "api", "--key", "acct"], &["override", "clear", "api", "--key", "bad"], &["override", "clear", "api", "--key", "hash"], &["override", "clear", "login_ip", "--ip", "10.0.0.9"]] {
            expect(&run_cli(args), 0);
        }
        let out = expect(&run_cli(&["override", "list"]), 0);
        assert!(out.contains("no override stored"), "{out}");
    }
}

tollgate_testkit::on_every_server! {
    /// An adaptive limiter's rates are per-key overrides of its name
    /// (`[adaptive.<name>]`): `override list` shows them, and
    /// `override list <name>` lists them alone. It refused the name, as
    /// one the configuration does not have (exit 2, "no limiter named
    /// \"harvester\""), where the unfiltered list showed them under it.
    #[test]
    fn override_list_takes_an_adaptive_limiter(server: Server) {
        let Some(url) = shared_url(server) else { return };
        let c = ConfigFile::new(&format!(
            "[defaults]\nprefix = \"t-list-aimd\"\n[adaptive.harvester]\n{API}"
        ));
        let rate = Policy::from(TokenBucket::new(1, 2000, Duration::from_secs(1000)).unwrap());
        let backend = block_on(
            RedisBackend::builder(url.as_str())
                .prefix("t-list-aimd")
                .durability(Durability::Skip)
                .build(),
        )
        .expect("connect");
        let site = Key::new("example.org");
        block_on(backend.set_expiring_override(
            Scope::Key("harvester", &site),
            &rate,
            Duration::from_secs(3600),
        ))
        .expect("a rate stored");
        let run_cli = |args: &[&str]| {
            let mut full = vec!["-c", c.arg()];
            full.extend(args);
            run(&full, &[("REDIS_URL", &url)])
        };
        let all = expect(&run_cli(&["override", "list"]), 0);
        assert!(all.contains("harvester key example.org"), "{all}");
        let out = expect(&run_cli(&["override", "list", "harvester"]), 0);
        let lines: Vec<&str> = out.lines().filter(|l| !l.starts_with("on redis")).collect();
        assert_eq!(lines.len(), 1, "{out}");
        assert!(lines[0].starts_with("harvester key example.org"), "{out}");
        block_on(backend.set_override(Scope::Key("harvester", &site), None)).expect("cleared");
    }
}

tollgate_testkit::on_every_server! {
    /// An override stored by hand (or by another tool) that is no policy is
    /// what an operator most needs to remove: `override clear` removes it,
    /// and says it was no policy, limiter-wide and per key. It exited 1
    /// ("reading the override") and left it in place: every decision it
    /// governs kept failing until someone ran `redis-cli DEL`.
    #[test]
    fn override_clear_removes_an_override_that_is_no_policy(server: Server) {
        let Some(url) = shared_url(server) else { return };
        let c = config("t-clearbad");
        let redis_cli = |args: &[&str]| {
            let mut full = vec!["-u", &url];
            full.extend(args);
            let o = Command::new("redis-cli").args(&full).output().expect("run redis-cli");
            stdout(&o).trim().to_owned()
        };
        let wide = "t-clearbad:api:override";
        let key = "t-clearbad:api:{acct}:override";
        for (at, scope) in [(wide, &["api"][..]), (key, &["api", "--key", "acct"][..])] {
            assert_eq!(redis_cli(&["SET", at, "9:zz"]), "OK");
            let mut args = vec!["-c", c.arg(), "--redis-url", &url, "override", "clear"];
            args.extend(scope);
            let out = expect(&run(&args, &[]), 0);
            assert!(out.contains("override cleared") && out.contains("9:zz"), "{out}");
            assert_eq!(redis_cli(&["EXISTS", at]), "0", "{out}");
        }
    }
}

tollgate_testkit::on_every_server! {
    #[test]
    fn invalid_overrides_exit_2_and_never_reach_redis(server: Server) {
        let Some(url) = shared_url(server) else { return };
        let c = config("t-badoverride");
        for (args, want) in [
            (
                vec!["api", "--capacity", "0"],
                "limiters.api.capacity: must be at least 1",
            ),
            (
                vec!["api", "--limit", "5"],
                "limiters.api.limit: belongs to sliding_window",
            ),
            (vec!["api", "--refill", "fast"], "limiters.api.refill"),
            (vec!["costly", "--capacity", "3"], "limiters.costly.cost"),
            (
                vec!["api", "--toml", "timeout = \"1s\""],
                "limiters.api.timeout: not part of a runtime override",
            ),
            (
                vec!["api", "--toml", "strategy = \"sliding_window\"\nlimit = 3"],
                "limiters.api.strategy",
            ),
            (vec!["api", "--toml", "capacty = 3"], "capacty"),
            (
                vec!["login_ip", "--window", "0s"],
                "limiters.login_ip.window",
            ),
            (
                vec!["login_account", "--max-delay", "1s"],
                "limiters.login_account.max_delay",
            ),
            // Beyond the exact integers of the scripts: it passed the
            // checks, then failed to encode (exit 1, "Redis failing").
            (
                vec!["login_ip", "--limit", "9007199254740993"],
                "limiters.login_ip.limit",
            ),
        ] {
            let mut full = vec!["-c", c.arg(), "--redis-url", &url, "override", "set"];
            full.extend(args.iter().copied());
            let o = run(&full, &[]);
            expect(&o, 2);
            assert!(
                stderr(&o).contains(want),
                "{args:?}: want {want:?} in:\n{}",
                stderr(&o)
            );
        }
        let server = RedisServer::shared_on(server).unwrap().lock().unwrap();
        let keys = server.cli(&["--scan", "--pattern", "t-badoverride:*"]);
        assert_eq!(keys.trim(), "", "nothing may have been written");
    }
}

// ---------------------------------------------------------------- durability

tollgate_testkit::on_every_server! {
    #[test]
    fn durability_passes_on_a_durable_server(server: Server) {
        let Some(server) = RedisServer::builder()
            .server(server)
            .appendonly(true)
            .start()
        else {
            return;
        };
        let o = run(&["durability"], &[("REDIS_URL", &server.url())]);
        let out = expect(&o, 0);
        assert!(out.contains("appendonly        yes"), "{out}");
        assert!(out.contains("maxmemory-policy  noeviction"), "{out}");
        assert!(out.contains("durable: yes"), "{out}");
        assert!(out.contains(&format!("server            127.0.0.1:{}", server.port())));
        let o = run(
            &["--redis-url", &server.url(), "durability", "--strict"],
            &[],
        );
        expect(&o, 0);
    }
}

tollgate_testkit::on_every_server! {
    #[test]
    fn durability_fails_on_a_server_without_aof(server: Server) {
        let Some(server) = RedisServer::builder()
            .server(server)
            .appendonly(false)
            .start()
        else {
            return;
        };
        let o = run(&["--redis-url", &server.url(), "durability"], &[]);
        let out = expect(&o, 3);
        assert!(out.contains("appendonly is not yes"), "{out}");
        assert!(out.contains("durable: NO"), "{out}");
        let o = run(&["--redis-url", &server.url(), "durability", "--json"], &[]);
        expect(&o, 3);
        let v = json(&o);
        assert_eq!(v["durable"], false);
        assert_eq!(v["ok"], false);
        assert_eq!(v["servers"][0]["appendonly"], "no");
        assert_eq!(v["servers"][0]["maxmemory_policy"], "noeviction");
    }
}

tollgate_testkit::on_every_server! {
    #[test]
    fn durability_fails_on_an_evicting_server(server: Server) {
        let Some(server) = RedisServer::builder()
            .server(server)
            .appendonly(true)
            .maxmemory_policy("volatile-lru")
            .start()
        else {
            return;
        };
        let o = run(&["--redis-url", &server.url(), "durability"], &[]);
        let out = expect(&o, 3);
        assert!(
            out.contains("maxmemory-policy is volatile-lru, not noeviction"),
            "{out}"
        );
        assert!(!out.contains("appendonly is not yes"), "{out}");
    }
}

tollgate_testkit::on_every_server! {
    #[test]
    fn unreadable_settings_fail_only_under_strict(server: Server) {
        let Some(server) = RedisServer::builder()
            .server(server)
            .appendonly(true)
            .raw_args(["--rename-command", "CONFIG", ""])
            .start()
        else {
            return;
        };
        let o = run(&["--redis-url", &server.url(), "durability"], &[]);
        let out = expect(&o, 0);
        assert!(out.contains("durable: unknown"), "{out}");
        let o = run(&["--redis-url", &server.url(), "--json", "durability"], &[]);
        expect(&o, 0);
        let v = json(&o);
        assert!(v["durable"].is_null() && v["ok"] == true, "{v}");
        assert!(v["servers"][0]["appendonly"].is_null(), "{v}");
        let o = run(
            &["--redis-url", &server.url(), "durability", "--strict"],
            &[],
        );
        let out = expect(&o, 3);
        assert!(out.contains("refused under --strict"), "{out}");
    }
}

// ---------------------------------------------------------------- cluster

// The shared body of `on_every_server!` does not take the test's
// attributes: the whole module is gated.
#[cfg(feature = "cluster")]
mod cluster {
    use super::*;

    tollgate_testkit::on_every_server! {
        #[test]
        fn commands_work_on_a_cluster(server: Server) {
            use tollgate_testkit::redis_server::RedisCluster;
            let Some(cluster) = RedisCluster::shared_on(server) else {
                return;
            };
            let urls = cluster.urls();
            let joined = urls.join(",");
            let c = config("t-cluster");
            let service = || {
                let config = Config::builder().toml_str(&c.toml).load().unwrap();
                let backend = block_on(
                    RedisBackend::cluster_builder(urls.clone())
                        .prefix(config.prefix())
                        .durability(Durability::Skip)
                        .build(),
                )
                .expect("connect the service's cluster backend");
                let mut lc = config.limiter("api").unwrap().clone();
                lc.timeout = Duration::from_secs(2);
                lc.build(backend)
            };
            let run_cli = |args: &[&str]| {
                let mut full = vec!["-c", c.arg(), "--cluster"];
                full.extend(args);
                run(&full, &[("REDIS_URL", &joined)])
            };
            // Keys in several slots.
            let keys: Vec<String> = (0..8).map(|i| format!("account-{i}")).collect();
            let api = service();
            for k in &keys {
                decide(&api, &Key::new(k), 3);
            }
            for k in &keys {
                let out = expect(&run_cli(&["inspect", "api", "--key", k]), 0);
                assert_eq!(field(&out, "remaining"), "7", "{k}: {out}");
            }
            expect(&run_cli(&["reset", "api", "--key", "account-3"]), 0);
            assert_eq!(peek(&api, &Key::new("account-3")).remaining(), 10);
            assert_eq!(peek(&api, &Key::new("account-4")).remaining(), 7);

            // Overrides, the limiter's first per-key one and a limiter-wide one:
            // at once for a worker that has not cached the limiter's overrides
            // (others within override_cache_ttl).
            expect(
                &run_cli(&[
                    "override",
                    "set",
                    "api",
                    "--key",
                    "account-5",
                    "--capacity",
                    "40",
                ]),
                0,
            );
            assert_eq!(peek(&service(), &Key::new("account-5")).limit(), 40);
            expect(&run_cli(&["override", "set", "api", "--capacity", "20"]), 0);
            assert_eq!(peek(&service(), &Key::new("account-6")).limit(), 20);
            let out = expect(
                &run_cli(&["override", "show", "api", "--key", "account-5"]),
                0,
            );
            assert!(
                field(&out, "in force").ends_with("(from the key's override)"),
                "{out}"
            );
            expect(
                &run_cli(&["override", "clear", "api", "--key", "account-5"]),
                0,
            );
            expect(&run_cli(&["override", "clear", "api"]), 0);
            assert_eq!(peek(&service(), &Key::new("account-5")).limit(), 10);

            // Every master is checked; the testkit's nodes run without AOF.
            let out = expect(&run_cli(&["durability"]), 3);
            for n in cluster.nodes() {
                assert!(
                    out.contains(&format!("server            127.0.0.1:{}", n.port())),
                    "{out}"
                );
            }
            assert_eq!(out.matches("appendonly is not yes").count(), 3, "{out}");
        }
    }
}

/// A `redis+sentinel://` URL (split on its commas by `--redis-url`, and
/// put back together): the report covers the master and its replica,
/// with their roles.
#[test]
fn durability_covers_a_sentinel_master_and_its_replica() {
    let Some(ha) = RedisSentinel::builder()
        .server(RedisServer::builder().appendonly(true))
        .start()
    else {
        return;
    };
    let o = run(&["--redis-url", &ha.url(), "durability", "--json"], &[]);
    expect(&o, 0);
    let v = json(&o);
    assert_eq!(v["durable"], true, "{v}");
    let servers = v["servers"].as_array().unwrap();
    let roles: Vec<&str> = servers
        .iter()
        .map(|s| s["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["master", "replica"], "{v}");
    let master = format!("127.0.0.1:{}", ha.master_port().unwrap());
    assert_eq!(servers[0]["server"], master.as_str());
    let o = run(&["durability"], &[("REDIS_URL", &ha.url())]);
    let out = expect(&o, 0);
    assert!(out.contains("role              replica"), "{out}");
}

// ---------------------------------------------------------------- calendar

tollgate_testkit::on_every_server! {
    /// A calendar quota: `inspect` shows the current window in its zone,
    /// what was used in it and when the count starts again; an override
    /// of another period moves the window.
    #[test]
    fn inspect_shows_the_calendar_window(server: Server) {
        use tollgate_limiter::{Calendar, Clock, Period, SystemClock};
        let Some(url) = shared_url(server) else { return };
        let c = ConfigFile::new(
            "[defaults]\nprefix = \"t-cal\"\n\n[limiters.plan]\nstrategy = \"calendar\"\n\
             limit = 10\nperiod = \"month\"\ntime_zone = \"Europe/Berlin\"\n",
        );
        let service = c.limiter(&url, "plan");
        let key = Key::new("tenant-7");
        let before = SystemClock.now();
        assert!(decide(&service, &key, 3).is_allowed());
        let month = Calendar::new(10, Period::Month, "Europe/Berlin").unwrap();
        let inspect = |json: bool| {
            let mut args = vec!["-c", c.arg()];
            if json {
                args.push("--json");
            }
            args.extend(["inspect", "plan", "--key", "tenant-7"]);
            run(&args, &[("REDIS_URL", &url)])
        };
        let o = inspect(true);
        expect(&o, 0);
        let after = SystemClock.now();
        let v = json(&o);
        let w = &v["calendar_window"];
        assert_eq!(w["used"], 3);
        assert_eq!(w["limit"], 10);
        assert_eq!(w["period"], "month");
        assert_eq!(w["time_zone"], "Europe/Berlin");
        let end = w["end_us"].as_u64().unwrap();
        assert!(
            end == month.window_at(before).1 || end == month.window_at(after).1,
            "{v}"
        );
        assert!(w["end"].as_str().unwrap().ends_with("[Europe/Berlin]"), "{v}");
        assert!(w["end"].as_str().unwrap().contains("-01T00:00:00+0"), "{v}");
        assert_eq!(v["decision"]["remaining"], 7);

        let out = expect(&inspect(false), 0);
        assert!(field(&out, "used").starts_with("3 of 10 in this window"), "{out}");
        assert!(field(&out, "window").starts_with("10 per month in Europe/Berlin: "), "{out}");

        // Per day instead: a new window, nothing used in it yet.
        let o = run(
            &[
                "-c", c.arg(), "override", "set", "plan", "--key", "tenant-7",
                "--period", "day", "--time-zone", "UTC",
            ],
            &[("REDIS_URL", &url)],
        );
        let out = expect(&o, 0);
        assert!(out.contains("calendar: limit = 10, period = \"day\", time_zone = \"UTC\""), "{out}");
        let v = json(&inspect(true));
        assert_eq!(v["calendar_window"]["used"], 0);
        assert_eq!(v["calendar_window"]["period"], "day");
        assert!(v["calendar_window"]["end"].as_str().unwrap().ends_with("T00:00:00+00:00[UTC]"), "{v}");
        // A zone that does not exist is refused, naming the field.
        let o = run(
            &["-c", c.arg(), "override", "set", "plan", "--time-zone", "Europe/Nowhere"],
            &[("REDIS_URL", &url)],
        );
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains("limiters.plan.time_zone"), "{}", stderr(&o));
    }
}
