//! `cargo run -p axum-login`, as a user runs it, on memory and with
//! `REDIS_URL`: it exits by itself; the attacker is cut off, the real user
//! gets in after the delay.

tollgate_testkit::demo_tests!(env!("CARGO_BIN_EXE_axum-login"), check);

fn check(stdout: &str) {
    assert!(
        stdout.contains("attacker  #1  401 Unauthorized"),
        "{stdout}"
    );
    assert!(stdout.contains("refused by login_account"), "{stdout}");
    assert!(
        stdout.contains("attacker  #24 429 Too Many Requests  refused by login_ip"),
        "{stdout}"
    );
    let user: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("real user"))
        .collect();
    assert!(user.last().unwrap().ends_with("200 OK"), "{stdout}");
}

/// The demo connects where configuration alone says: `TOLLGATE_REDIS__URL`
/// (the `[redis]` section), no `REDIS_URL`; a bad `[redis]` value stops
/// the start-up with an error naming the field.
#[test]
fn the_demo_takes_redis_from_configuration() {
    use std::process::Command;
    let Some(server) = tollgate_testkit::redis_server::RedisServer::start() else {
        return;
    };
    let bin = env!("CARGO_BIN_EXE_axum-login");
    let out = Command::new(bin)
        .env_remove("REDIS_URL")
        .env("TOLLGATE_REDIS__URL", server.url())
        .env("TOLLGATE_REDIS__RESPONSE_TIMEOUT", "2s")
        // The demo's 50 ms would refuse (503) on a slow reply of a loaded
        // test machine.
        .env("TOLLGATE_DEFAULTS__TIMEOUT", "5s")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("counting in Redis"), "{stderr}");
    check(&String::from_utf8_lossy(&out.stdout));
    let out = Command::new(bin)
        .env_remove("REDIS_URL")
        .env("TOLLGATE_REDIS__URL", server.url())
        .env("TOLLGATE_REDIS__CONNECT_TIMEOUT", "0s")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("redis") && stderr.contains("connect_timeout"),
        "{stderr}"
    );
}

/// A misspelt variable stops the start-up (exit code 1) with the
/// error's message, which names the key and the variable, once (the
/// error repeats its source's message: the cause is not printed again);
/// `main` returned the error and printed its `Debug`: `Error:
/// Parse(Error { tag: .. })`.
#[test]
fn an_invalid_configuration_is_reported_by_its_message() {
    let stderr = tollgate_testkit::demo::run_failing(
        env!("CARGO_BIN_EXE_axum-login"),
        &[("TOLLGATE_LIMITERS__LOGIN_IP__LIMT", "5")],
    );
    assert!(
        stderr.contains("error: invalid tollgate configuration: unknown field: found `limt`")
            && stderr.contains("\"limiters.login_ip.limt (TOLLGATE_LIMITERS__LOGIN_IP__LIMT)\""),
        "{stderr}"
    );
    assert_eq!(stderr.matches("unknown field").count(), 1, "{stderr}");
}
