//! `cargo run -p webhooks`, as a user runs it: it exits by itself and shows
//! the flooded channels cut at 30 and the listener's excess dropped.

tollgate_testkit::demo_tests!(env!("CARGO_BIN_EXE_webhooks"), check);

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

/// An invalid configuration stops the start-up (exit code 1) with the
/// error's message, which names the field; `main` returned the error and
/// printed its `Debug`: `Error: Invalid { path: .. }`.
#[test]
fn an_invalid_configuration_is_reported_by_its_message() {
    let stderr = tollgate_testkit::demo::run_failing(
        env!("CARGO_BIN_EXE_webhooks"),
        &[("TOLLGATE_LIMITERS__HOOKS_CHANNEL__LIMIT", "0")],
    );
    assert!(
        stderr.contains(
            "error: invalid tollgate configuration: limiters.hooks_channel.limit: must be at least 1"
        ),
        "{stderr}"
    );
}
