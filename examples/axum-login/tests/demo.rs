//! `cargo run -p axum-login`, as a user runs it, on memory and with
//! `REDIS_URL`: it exits by itself; the attacker is cut off, the real user
//! gets in after the delay.

tollgate_testkit::demo_tests!(env!("CARGO_BIN_EXE_axum-login"), check);

fn check(stdout: &str) {
    assert!(
        stdout.contains("attacker  #1  401 Unauthorized"),
        "{stdout}"
    );
    assert!(stdout.contains("refused by login_account"), "{stdout}");
    assert!(
        stdout.contains("attacker  #24 429 Too Many Requests  refused by login_ip"),
        "{stdout}"
    );
    let user: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("real user"))
        .collect();
    assert!(user.last().unwrap().ends_with("200 OK"), "{stdout}");
}
