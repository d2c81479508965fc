//! `tollgate`: the operations CLI of the tollgate rate limiter.
//!
//! This crate is the `tollgate` binary; its library holds the whole CLI
//! (the binary calls [`main`]) so that its documentation does not collide
//! with the `tollgate` facade crate's.
//!
//! It works on the same Redis counters the services use, through the same
//! [`Limiter`](tollgate_limiter::Limiter), the same scripts and the same
//! configuration, so what it shows and changes is exactly what the services
//! see on their next decision:
//!
//! | command | what it does |
//! |---|---|
//! | `tollgate inspect <LIMITER> <KEY>` | a key's state: limit, remaining, retry-after, reset-after, overrides in force (a peek: consumes nothing) |
//! | `tollgate reset <LIMITER> <KEY>` | forgets a key (unblocks a user after a false positive) |
//! | `tollgate override set <LIMITER> [KEY] <POLICY> [--for DURATION]` | a runtime override, limiter-wide or for one key, validated like configuration, kept until cleared or for a time |
//! | `tollgate override clear <LIMITER> [KEY]` | removes it |
//! | `tollgate override show <LIMITER> [KEY]` | configured, limiter-wide, per-key and in-force policies |
//! | `tollgate override list [LIMITER]` | every override stored, with the time each has left |
//! | `tollgate override mark` | marks every limiter with per-key overrides, once, when upgrading from a version before the marker |
//! | `tollgate durability [--strict]` | checks the Redis server's `appendonly` and `maxmemory-policy` |
//! | `tollgate config validate [FILE]...` | loads configuration as a service does at start-up |
//!
//! A key is given as the raw identity and its kind, and is turned into a
//! storage key exactly as the tower layers do: `--ip` (through
//! [`Key::ip`](tollgate_limiter::Key::ip), as `ClientIp`: IPv4 and
//! IPv4-mapped IPv6 per address, IPv6 by /64 unless `--ipv6-prefix` says
//! otherwise), `--email` (normalised and
//! hashed, [`KeyHasher::email`](tollgate_limiter::KeyHasher::email)), `--api-key`
//! (hashed, [`KeyHasher::secret`](tollgate_limiter::KeyHasher::secret)) or `--key` (any other id,
//! [`Key::new`](tollgate_limiter::Key::new)). A value of `-` is read from
//! standard input, so secrets stay out of the shell history.
//!
//! Configuration is read like at start-up: the `--config` files in order,
//! then the `TOLLGATE_*` environment variables. The Redis URL comes from
//! `--redis-url`, else `REDIS_URL`, else the configuration's `[redis]`
//! section, else `redis://127.0.0.1:6379`. With `--json` every command prints one JSON
//! document instead of text, for scripts and monitoring.
//!
//! # Exit codes
//!
//! | code | meaning |
//! |---|---|
//! | 0 | success |
//! | 1 | Redis unreachable, timed out or failing |
//! | 2 | invalid usage, configuration or override (the message names the limiter and the field) |
//! | 3 | `durability`: the server is not durable |
//!
//! # Examples
//!
//! ```console
//! $ cargo install tollgate-cli
//! $ tollgate config validate tollgate.toml
//! $ tollgate --config tollgate.toml --key-secret-file /run/secrets/tollgate \
//!       inspect login --email alice@example.com
//! $ tollgate --config tollgate.toml --key-secret-file /run/secrets/tollgate \
//!       reset login --email alice@example.com
//! $ tollgate durability --strict --redis-url redis://127.0.0.1:6379
//! ```
//!
//! See `docs/operations.md` for runbooks.

// On docs.rs (`--cfg docsrs`, nightly): items behind a feature say which.
#![cfg_attr(docsrs, feature(doc_cfg))]

/// `println!` that stops printing, instead of panicking, once standard
/// output is closed (`| head -1`, a pager quit early): the command still
/// ends with its own exit code (a `durability` gate's 3 is not lost).
/// Another write error ends the process with a message.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let written = writeln!(std::io::stdout().lock(), $($arg)*);
        $crate::stdout_written(written);
    }};
}

/// What [`out!`] does with a write's result.
fn stdout_written(written: std::io::Result<()>) {
    match written {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            eprintln!("error: writing to standard output: {e}");
            std::process::exit(1);
        }
        _ => {}
    }
}

mod args;
mod commands;
mod failure;
mod keys;
mod render;

use std::process::ExitCode;

use clap::Parser;

/// Runs the CLI on the process's arguments and environment: what the
/// `tollgate` binary does. Errors are printed on standard error; the exit
/// code says what failed (see [Exit codes](crate#exit-codes)).
pub fn main() -> ExitCode {
    let mut cli = args::Cli::parse();
    cli.global.rejoin_sentinel_url();
    match commands::run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            failure.report();
            ExitCode::from(failure.exit_code())
        }
    }
}
