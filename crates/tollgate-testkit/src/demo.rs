//! Running an example's binary as a user runs it.

use std::process::Command;

/// Runs the example binary `bin` (from `env!("CARGO_BIN_EXE_<name>")`)
/// with no arguments, counting in Redis at `redis_url` when given and in
/// memory otherwise, and returns its standard output.
///
/// Panics unless the demo exits successfully and reports (on standard
/// error, with "counting in Redis") the backend it was asked for.
pub fn run(bin: &str, redis_url: Option<&str>) -> String {
    let mut cmd = Command::new(bin);
    match redis_url {
        Some(url) => cmd.env("REDIS_URL", url),
        None => cmd.env_remove("REDIS_URL"),
    };
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {bin}: {e}"));
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.contains("counting in Redis"),
        redis_url.is_some(),
        "{stderr}"
    );
    String::from_utf8(out.stdout).expect("the demo prints UTF-8")
}

/// Generates the two demo tests of an example: on the memory backend, and
/// with `REDIS_URL` pointing at a throwaway redis-server (skipped when
/// redis-server is not installed, outside CI; a failure under `CI=true`).
/// `$check` asserts on the demo's standard output.
#[macro_export]
macro_rules! demo_tests {
    ($bin:expr, $check:path) => {
        #[test]
        fn the_demo_runs_to_completion() {
            $check(&$crate::demo::run($bin, None));
        }

        #[test]
        fn the_demo_counts_in_redis_too() {
            let Some(server) = $crate::redis_server::RedisServer::start() else {
                return;
            };
            $check(&$crate::demo::run($bin, Some(&server.url())));
        }
    };
}
