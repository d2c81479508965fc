//! `cargo run -p llm-costs`, as a user runs it: it exits by itself; the
//! third large completion is refused while cheap calls still pass.

/// Runs the demo, counting in Redis at `redis_url` when given.
fn demo(redis_url: Option<&str>) -> String {
    tollgate_testkit::demo::run(env!("CARGO_BIN_EXE_llm-costs"), redis_url)
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
        stdout.contains("completion #2 (8310 tokens): 200 OK"),
        "{stdout}"
    );
    assert!(
        stdout.contains("completion #3 (8310 tokens): 429 Too Many Requests  Retry-After: 888"),
        "{stdout}"
    );
    assert!(stdout.contains("GET /v1/models: 200 OK"), "{stdout}");
}
