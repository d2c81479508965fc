use tollgate_limiter::{Backend, Decision, Error, Key, Limiter, Verdict};

/// Explicit reports of login outcomes, for handlers that know better than
/// the response status (a form login that redirects on failure and on
/// success, a second factor checked later).
///
/// It wraps the per-account [`ProgressiveDelay`](tollgate_limiter::ProgressiveDelay)
/// limiter; emails are normalised and hashed with [`Key::email`], exactly
/// as [`LoginLayer`](super::LoginLayer)'s body extractor does, so both
/// count the same account. Cheap to clone; clones share the limiter.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tollgate_limiter::{Limiter, ProgressiveDelay};
/// use tollgate_memory::MemoryBackend;
/// use tollgate_tower::login::LoginAttempts;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let policy = ProgressiveDelay::new(1, Duration::from_secs(1), 2, Duration::from_secs(60), Duration::from_secs(600))?;
/// let attempts = LoginAttempts::new(Limiter::new("login_account", policy, MemoryBackend::new()));
///
/// assert!(attempts.check("bob@example.com").await.is_allowed());
/// attempts.failed("bob@example.com").await; // free
/// attempts.failed("Bob@Example.com ").await; // same account: delayed
/// assert!(!attempts.check("bob@example.com").await.is_allowed());
/// attempts.succeeded("bob@example.com").await?;
/// assert!(attempts.check("bob@example.com").await.is_allowed());
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct LoginAttempts<B> {
    limiter: Limiter<B>,
}

impl<B> Clone for LoginAttempts<B> {
    fn clone(&self) -> Self {
        Self {
            limiter: self.limiter.clone(),
        }
    }
}

impl<B: Backend> LoginAttempts<B> {
    /// Reports to `limiter` (a progressive delay).
    pub fn new(limiter: Limiter<B>) -> Self {
        Self { limiter }
    }

    /// The limiter.
    pub fn limiter(&self) -> &Limiter<B> {
        &self.limiter
    }

    /// Whether `email` may try now, recording nothing.
    pub async fn check(&self, email: &str) -> Verdict {
        self.limiter.peek(&Key::email(email)).await
    }

    /// Records a failed login for `email`; the verdict says whether the
    /// account is now delayed.
    pub async fn failed(&self, email: &str) -> Verdict {
        self.limiter.check(&Key::email(email)).await
    }

    /// Records a successful login: the account's failures are forgotten.
    pub async fn succeeded(&self, email: &str) -> Result<Decision, Error> {
        self.limiter.reset(&Key::email(email)).await
    }
}
