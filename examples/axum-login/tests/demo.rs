//! `cargo run -p axum-login`, as a user runs it, on memory and with
//! `REDIS_URL`: it exits by itself; the attacker is cut off, the real user
//! gets in after the delay.

/// Runs the demo, counting in Redis at `redis_url` when given.
fn demo(redis_url: Option<&str>) -> String {
    tollgate_testkit::demo::run(env!("CARGO_BIN_EXE_axum-login"), redis_url)
}

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

#[test]
fn the_demo_runs_to_completion() {
    check(&demo(None));
}

/// The `REDIS_URL` path, against a throwaway redis-server (skipped when
/// it is not installed, outside CI).
#[test]
fn the_demo_counts_in_redis_too() {
    let Some(server) = tollgate_testkit::redis_server::RedisServer::start() else {
        return;
    };
    check(&demo(Some(&server.url())));
}
