//! Running an example's binary as a user runs it.

use std::process::Command;

/// Points the demo at `redis_url` (`REDIS_URL`), or at memory. With Redis,
/// every limiter's per-decision timeout is 5 s (`TOLLGATE_DEFAULTS__TIMEOUT`,
/// for the demos that read their limits with environment overrides): the
/// demos' 50 ms answers a timeout, by the fail mode, now and then on a
/// loaded test machine, and the test would see a fail-open pass or a
/// fail-closed refusal where it checks the demo's counts.
fn redis_env(cmd: &mut Command, redis_url: Option<&str>) {
    match redis_url {
        Some(url) => cmd
            .env("REDIS_URL", url)
            .env("TOLLGATE_DEFAULTS__TIMEOUT", "5s"),
        None => cmd.env_remove("REDIS_URL"),
    };
}

/// Runs the example binary `bin` (from `env!("CARGO_BIN_EXE_<name>")`)
/// with no arguments, counting in Redis at `redis_url` when given and in
/// memory otherwise, and returns its standard output.
///
/// Panics unless the demo exits successfully and reports (on standard
/// error, with "counting in Redis") the backend it was asked for.
pub fn run(bin: &str, redis_url: Option<&str>) -> String {
    let mut cmd = Command::new(bin);
    redis_env(&mut cmd, redis_url);
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

/// Runs the example binary `bin` with the environment variables `env` set
/// (and no `REDIS_URL` unless `env` sets one), for a start-up that fails,
/// and returns its standard error.
///
/// Panics unless it exits non-zero and reports the error as a user should
/// read it: a last line `error: ` with the error's `Display` (and its
/// causes), not the `Debug` that a `main` returning `Result` prints
/// (`Error: Invalid { path: .. }`).
pub fn run_failing(bin: &str, env: &[(&str, &str)]) -> String {
    let out = Command::new(bin)
        .env_remove("REDIS_URL")
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {bin}: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{bin} {env:?} succeeded: {stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.starts_with("error: "), "{stderr}");
    assert!(
        !stderr.contains("Error: ") && !stderr.contains(" { "),
        "a Debug form: {stderr}"
    );
    stderr
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

/// An example binary serving on a loopback port, started by [`serve`];
/// killed when dropped.
#[derive(Debug)]
pub struct Served {
    child: std::process::Child,
    addr: std::net::SocketAddr,
}

impl Served {
    /// The address it listens on.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        // Only the child this test started, by its handle.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the example binary `bin` with `args` (which make it serve on a
/// loopback port it prints to standard error as `listening on
/// http://ADDR`), counting in Redis at `redis_url` when given and in
/// memory otherwise, and waits until it listens.
///
/// Panics unless it reports the backend it was asked for before
/// listening.
pub fn serve(bin: &str, args: &[&str], redis_url: Option<&str>) -> Served {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let mut cmd = Command::new(bin);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    redis_env(&mut cmd, redis_url);
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {bin}: {e}"));
    let mut lines = BufReader::new(child.stderr.take().expect("piped")).lines();
    let mut seen = Vec::new();
    let addr = loop {
        let Some(Ok(line)) = lines.next() else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{bin} exited before listening: {seen:?}");
        };
        if let Some(addr) = line.strip_prefix("listening on http://") {
            break addr.parse().expect("a socket address");
        }
        seen.push(line);
    };
    assert_eq!(
        seen.iter().any(|l| l.contains("counting in Redis")),
        redis_url.is_some(),
        "{seen:?}"
    );
    // Keep reading, so that the child never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    Served { child, addr }
}
