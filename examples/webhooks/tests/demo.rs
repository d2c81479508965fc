//! `cargo run -p webhooks`, as a user runs it: it exits by itself and shows
//! the flooded channels cut at 30 and the listener's excess dropped.

/// Runs the demo, counting in Redis at `redis_url` when given.
fn demo(redis_url: Option<&str>) -> String {
    tollgate_testkit::demo::run(env!("CARGO_BIN_EXE_webhooks"), redis_url)
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

fn check(stdout: &str) {
    assert!(
        stdout.contains("#C0FLOOD (40 sent)            30 x 200, 10 x 429 hooks_channel"),
        "{stdout}"
    );
    assert!(
        stdout.contains("#C0QUIET (10 sent)            10 x 200\n"),
        "{stdout}"
    );
    assert!(stdout.contains("town-square  30 handled"), "{stdout}");
    assert!(
        stdout.contains("dropped: 20 (over the limit: 20)"),
        "{stdout}"
    );
}
