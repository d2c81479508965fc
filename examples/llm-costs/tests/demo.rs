//! `cargo run -p llm-costs`, as a user runs it: it exits by itself; the
//! third large completion is refused while cheap calls still pass.

tollgate_testkit::demo_tests!(env!("CARGO_BIN_EXE_llm-costs"), check);

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
