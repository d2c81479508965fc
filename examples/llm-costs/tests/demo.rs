//! `cargo run -p llm-costs`, as a user runs it: it exits by itself; the
//! third large completion is refused while cheap calls still pass.

use std::process::Command;

#[test]
fn the_demo_runs_to_completion() {
    let out = Command::new(env!("CARGO_BIN_EXE_llm-costs"))
        .env_remove("REDIS_URL")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
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
