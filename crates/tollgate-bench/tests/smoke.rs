//! The load tool runs end to end (briefly) and refuses non-loopback targets.

use std::process::Command;

fn bench(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tollgate-bench"))
        .args(args)
        .output()
        .expect("run tollgate-bench")
}

/// A short run against a throwaway server, 4 tasks, 10 keys; its output,
/// once it succeeded.
fn spawned(duration: &str, rounds: &str, extra: &[&str]) -> String {
    let mut args = vec![
        "--spawn-server",
        "--duration",
        duration,
        "--rounds",
        rounds,
        "--concurrency",
        "4",
        "--keys",
        "10",
        // Errors are asserted: on a loaded CI machine the library's
        // default 50 ms timeout is not what these tests are about.
        "--timeout",
        "1s",
    ];
    args.extend_from_slice(extra);
    let out = bench(&args);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[test]
fn compares_library_and_bare_client() {
    if !tollgate_testkit::redis_server::available() {
        return;
    }
    let text = spawned("400ms", "2", &[]);
    for line in ["library", "bare", "ratio library/bare:"] {
        assert!(
            text.lines().any(|l| l.starts_with(line)),
            "no {line:?} line in:\n{text}"
        );
    }
    assert!(text.contains("errors 0"), "{text}");
}

/// The short form of scripts/bench-peers.sh's Rust side: every peer, both
/// orders, a ratio line and a result line per path, and server CPU read.
#[test]
fn compares_library_with_every_peer_in_both_orders() {
    if !tollgate_testkit::redis_server::available() {
        return;
    }
    for order in [
        &["--peers", "bare,gcra"][..],
        &["--peers", "gcra,bare", "--peers-first"],
    ] {
        let text = spawned("200ms", "1", order);
        for peer in ["bare", "gcra"] {
            let ratio = text
                .lines()
                .find_map(|l| l.strip_prefix(&format!("ratio library/{peer}: ")))
                .unwrap_or_else(|| panic!("no ratio for {peer} in:\n{text}"));
            let wall: f64 = ratio.split_whitespace().next().unwrap().parse().unwrap();
            let per = |what: &str| -> f64 {
                let (_, rest) = ratio.split_once(what).unwrap_or_else(|| panic!("{ratio}"));
                rest.split_whitespace().next().unwrap().parse().unwrap()
            };
            let (server, client) = (per("server-CPU second: "), per("client-CPU second: "));
            assert!(wall > 0.0 && server > 0.0 && client > 0.0, "{ratio}");
            assert!(server.is_finite() && client.is_finite(), "{ratio}");
        }
        for path in ["library", "bare", "gcra"] {
            let result = text
                .lines()
                .find(|l| l.starts_with(&format!("result path={path} ")))
                .unwrap_or_else(|| panic!("no result line for {path} in:\n{text}"));
            assert!(result.ends_with(" errors=0"), "{result}");
            assert!(!result.contains("server_cpu=0.000000"), "{result}");
            assert!(!result.contains("client_cpu=0.000000"), "{result}");
        }
    }
    // The minimal script is a token bucket only.
    let out = bench(&[
        "--spawn-server",
        "--duration",
        "200ms",
        "--peers",
        "gcra",
        "--strategy",
        "sliding-window",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--peers gcra"));
}

#[test]
fn memory_backend() {
    let out = bench(&[
        "--backend",
        "memory",
        "--duration",
        "200ms",
        "--rounds",
        "1",
        "--keys",
        "1",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.lines().any(|l| l.starts_with("library")),
        "{text}"
    );
}

#[test]
fn refuses_targets_off_loopback() {
    // 192.0.2.0/24 is TEST-NET-1: never contacted, refused before any I/O.
    let out = bench(&["--url", "redis://192.0.2.1:6379", "--duration", "1s"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("loopback"));
    let out = bench(&["--backend", "memory", "--duration", "2m"]);
    assert!(!out.status.success(), "runs are bounded");
}

/// A flag the limiter refuses is a usage error naming the flag (exit 2),
/// checked before a server is started: never a panic.
#[test]
fn a_zero_timeout_is_refused_naming_the_flag() {
    for backend in ["memory", "redis"] {
        let out = bench(&["--backend", backend, "--spawn-server", "--timeout", "0ms"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{backend}: {stderr}");
        assert!(
            stderr.contains("error: --timeout: must be above zero") && !stderr.contains("panicked"),
            "{backend}: {stderr}"
        );
    }
}

/// A server that is not there is an error naming the URL, not a panic.
#[test]
fn an_unreachable_server_is_an_error_naming_it() {
    // A loopback port nothing listens on.
    let port = tollgate_testkit::redis_server::unused_port();
    let url = format!("redis://127.0.0.1:{port}");
    let out = bench(&["--backend", "redis", "--url", &url, "--duration", "1s"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("error: connect the library's backend to {url}"))
            && !stderr.contains("panicked"),
        "{stderr}"
    );
}
