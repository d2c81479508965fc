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
