//! Why a command failed, and the exit code that says so.

use std::error::Error;

/// Exit code: Redis unreachable, timed out or failing.
pub(crate) const EXIT_BACKEND: u8 = 1;
/// Exit code: invalid usage, configuration or override (clap's usage
/// errors use 2 as well).
pub(crate) const EXIT_INPUT: u8 = 2;
/// Exit code: the Redis server is not durable.
pub(crate) const EXIT_NOT_DURABLE: u8 = 3;

/// A failed command.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Bad input: usage, configuration, an invalid override.
    Input(String),
    /// Redis could not be reached or failed.
    Backend(String),
    /// The durability check found problems (already printed).
    NotDurable,
}

impl Failure {
    /// A backend failure, with the whole chain of causes.
    pub(crate) fn backend(context: &str, e: &(dyn Error + 'static)) -> Self {
        Self::Backend(format!("{context}: {}", chain(e)))
    }

    /// The process exit code.
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            Self::Input(_) => EXIT_INPUT,
            Self::Backend(_) => EXIT_BACKEND,
            Self::NotDurable => EXIT_NOT_DURABLE,
        }
    }

    /// Prints the failure on standard error.
    pub(crate) fn report(&self) {
        match self {
            Self::Input(m) | Self::Backend(m) => eprintln!("error: {m}"),
            Self::NotDurable => eprintln!("error: redis is not durable (see above)"),
        }
    }
}

pub(crate) use tollgate_limiter::error::chain;

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Outer(std::io::Error);

    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("backend failed")
        }
    }

    impl Error for Outer {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn chain_joins_sources() {
        let e = Outer(std::io::Error::other("connection refused"));
        assert_eq!(chain(&e), "backend failed: connection refused");
        assert_eq!(Failure::backend("inspect", &e).exit_code(), EXIT_BACKEND);
    }
}
