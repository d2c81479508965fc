//! The load tool runs end to end (briefly) and refuses non-loopback targets.

use std::process::Command;

fn bench(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tollgate-bench"))
        .args(args)
        .output()
        .expect("run tollgate-bench")
}

#[test]
fn compares_library_and_bare_client() {
    if !tollgate_testkit::redis_server::available() {
        return;
    }
    let out = bench(&[
        "--spawn-server",
        "--duration",
        "400ms",
        "--rounds",
        "2",
        "--concurrency",
        "4",
        "--keys",
        "10",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in ["library", "bare", "ratio library/bare:"] {
        assert!(
            text.lines().any(|l| l.starts_with(line)),
            "no {line:?} line in:\n{text}"
        );
    }
    assert!(text.contains("errors 0"), "{text}");
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
