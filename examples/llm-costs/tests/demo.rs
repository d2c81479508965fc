//! `cargo run -p llm-costs`, as a user runs it: it exits by itself; three
//! large completions pass and are charged what they used, the fourth does
//! not fit what is left, while cheap calls still pass.

tollgate_testkit::demo_tests!(env!("CARGO_BIN_EXE_llm-costs"), check);

fn check(stdout: &str) {
    assert!(
        stdout.contains("completion #3 (reserved 8310 tokens): 200 OK, used 560, 18320 left"),
        "{stdout}"
    );
    // 19_310 - 18_320 = 990 tokens to drip back, at 20_000 an hour.
    assert!(
        stdout.contains(
            "completion #4 (reserved 19310 tokens): 429 Too Many Requests  Retry-After: 179"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("GET /v1/models: 200 OK"), "{stdout}");
}

/// An invalid configuration stops the start-up (exit code 1) with the
/// error's message, which names the field; `main` returned the error and
/// printed its `Debug`: `Error: Invalid { path: .. }`.
#[test]
fn an_invalid_configuration_is_reported_by_its_message() {
    let stderr = tollgate_testkit::demo::run_failing(
        env!("CARGO_BIN_EXE_llm-costs"),
        &[("TOLLGATE_LIMITERS__LLM_TOKENS__REFILL", "lots")],
    );
    assert!(
        stderr.contains("error: invalid tollgate configuration: limiters.llm_tokens.refill: "),
        "{stderr}"
    );
}
