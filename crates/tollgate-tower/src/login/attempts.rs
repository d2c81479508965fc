use std::time::Duration;

use tollgate_limiter::policy::PolicyError;
use tollgate_limiter::{
    Backend, Decision, Error, Key, KeyHasher, Limiter, Mode, Reservation, Verdict,
};

use crate::buffer_body::account_key;

/// Login outcomes reported by hand: by a handler without a
/// [`LoginLayer`](super::LoginLayer), or for an outcome known only in a
/// later request (a second factor checked later, a success found by
/// another route).
///
/// Behind a `LoginLayer` the request's attempt is already taken up front:
/// say its outcome with a [`LoginOutcome`](super::LoginOutcome) in the
/// response. [`failed`](Self::failed) there would record a second failure
/// for the same attempt ([`succeeded`](Self::succeeded) is harmless: a
/// cleared account stays cleared).
///
/// It wraps the per-account [`ProgressiveDelay`](tollgate_limiter::ProgressiveDelay)
/// limiter; emails are normalised and hashed with [`KeyHasher::email`],
/// exactly as [`LoginLayer`](super::LoginLayer)'s body extractor does, so
/// both count the same account (give both the same hasher). An address
/// that extractor refuses (not in its one canonical form: an invisible
/// character, a compatibility letter, a dotless `ı`; see
/// [`Email`](crate::buffer_body::Email)) is no account to
/// [`check`](Self::check) and [`attempt`](Self::attempt) either: they
/// refuse it ([`Verdict::FailedClosed`] with [`Error::Policy`], field
/// `email`; a limiter in shadow mode counts it under its own key) rather
/// than count it apart, which would give a guesser a fresh counter with
/// each spelling a user store folds into one account. Cheap to clone;
/// clones share the limiter.
///
/// [`failed`](Self::failed) reports a failure *after* the fact: attempts
/// in flight together while the account is free all pass
/// [`check`](Self::check) before any is recorded. Where the handler can,
/// take the attempt *up front* with [`attempt`](Self::attempt) before
/// verifying the password: concurrent attempts then see each other, as
/// with [`LoginLayer`](super::LoginLayer) counting by status.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tollgate_limiter::{KeyHasher, Limiter, ProgressiveDelay};
/// use tollgate_memory::MemoryBackend;
/// use tollgate_tower::login::LoginAttempts;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let policy = ProgressiveDelay::new(1, Duration::from_secs(1), 2, Duration::from_secs(60), Duration::from_secs(600))?;
/// let hasher = KeyHasher::new("the fleet's secret, 16+ bytes")?; // or KeyHasher::from_env()?
/// let attempts = LoginAttempts::new(Limiter::new("login_account", policy, MemoryBackend::new()), hasher);
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
    hasher: KeyHasher,
}

impl<B> Clone for LoginAttempts<B> {
    fn clone(&self) -> Self {
        Self {
            limiter: self.limiter.clone(),
            hasher: self.hasher.clone(),
        }
    }
}

impl<B: Backend> LoginAttempts<B> {
    /// Reports to `limiter` (a progressive delay), keying accounts with
    /// `hasher` (the one given to the [`LoginLayer`](super::LoginLayer)).
    pub fn new(limiter: Limiter<B>, hasher: KeyHasher) -> Self {
        Self { limiter, hasher }
    }

    /// The limiter.
    pub fn limiter(&self) -> &Limiter<B> {
        &self.limiter
    }

    /// Whether `email` may try now, recording nothing. An address not in
    /// its canonical form is refused (see the type's docs).
    pub async fn check(&self, email: &str) -> Verdict {
        match self.account(email) {
            Ok(key) => self.limiter.peek(&key).await,
            Err(refused) => refused,
        }
    }

    /// Records a failed login for `email`; the verdict says whether the
    /// account is now delayed.
    pub async fn failed(&self, email: &str) -> Verdict {
        self.limiter.check(&self.hasher.email(email)).await
    }

    /// Takes an attempt on `email` up front: records it as a failure now,
    /// atomically, unless the account is delayed (then it is refused and
    /// nothing is recorded: answer `429` with the verdict's retry-after).
    /// Call it before verifying the password, then settle it by the
    /// outcome: a failed login keeps the failure (drop the reservation, or
    /// [`settle(1)`](Reservation::settle)); a success calls
    /// [`succeeded`](Self::succeeded); an attempt that was no failed login
    /// (the user store is down) gives it back with
    /// [`refund`](Reservation::refund). While the account is free, attempts
    /// in flight together pass the free attempts and one more; the rest
    /// are refused.
    /// An address not in its canonical form is refused, holding nothing
    /// (see the type's docs).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_limiter::{KeyHasher, Limiter, ProgressiveDelay};
    /// use tollgate_memory::MemoryBackend;
    /// use tollgate_tower::login::LoginAttempts;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let policy = ProgressiveDelay::new(1, Duration::from_secs(1), 2, Duration::from_secs(60), Duration::from_secs(600))?;
    /// let hasher = KeyHasher::new("the fleet's secret, 16+ bytes")?;
    /// let attempts = LoginAttempts::new(Limiter::new("login_account", policy, MemoryBackend::new()), hasher);
    ///
    /// // Three attempts in flight together: the free one and the one that
    /// // starts the delay pass, the third is refused.
    /// let (a, _first) = attempts.attempt("bob@example.com").await;
    /// let (b, second) = attempts.attempt("bob@example.com").await;
    /// let (c, _) = attempts.attempt("bob@example.com").await;
    /// assert_eq!([a.is_allowed(), b.is_allowed(), c.is_allowed()], [true, true, false]);
    /// // The second found the user store down: no failed login.
    /// second.refund().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn attempt(&self, email: &str) -> (Verdict, Reservation<B>) {
        match self.account(email) {
            Ok(key) => self.limiter.reserve(&key, 1).await,
            Err(refused) => (refused, Reservation::default()),
        }
    }

    /// The account's key, as `LoginLayer`'s body extractor finds it, or
    /// the refusal of an address that extractor refuses (in shadow mode,
    /// which refuses nothing, its own key).
    fn account(&self, email: &str) -> Result<Key, Verdict> {
        match account_key(&self.hasher, email) {
            Some(key) => Ok(key),
            None if self.limiter.mode() == Mode::Shadow => Ok(self.hasher.email(email)),
            None => Err(Verdict::FailedClosed(
                Error::from(PolicyError::new(
                    "email",
                    "not an address in its canonical form: no account",
                )),
                Duration::from_secs(1),
            )),
        }
    }

    /// Records a successful login: the account's failures are forgotten.
    pub async fn succeeded(&self, email: &str) -> Result<Decision, Error> {
        self.limiter.reset(&self.hasher.email(email)).await
    }
}

#[cfg(test)]
mod tests {
    use tollgate_limiter::ProgressiveDelay;
    use tollgate_memory::MemoryBackend;

    use super::*;

    fn attempts() -> LoginAttempts<MemoryBackend> {
        let policy = ProgressiveDelay::new(
            1,
            Duration::from_secs(10),
            2,
            Duration::from_secs(60),
            Duration::from_secs(600),
        )
        .unwrap();
        let hasher = KeyHasher::new("a test secret, 16 bytes or more").unwrap();
        LoginAttempts::new(
            Limiter::new("login_account", policy, MemoryBackend::new()),
            hasher,
        )
    }

    /// Spellings of one address that a user store may fold into it (a
    /// dotless `ı`, an invisible character, a fullwidth or compatibility
    /// letter), which `LoginLayer`'s body extractor refuses: taken up
    /// front or checked, each was counted under a fresh key of its own,
    /// so a guesser had the free attempts again with every spelling (and
    /// there are as many as letters to vary). They are no account here
    /// either; the canonical spelling counts as before.
    #[tokio::test]
    async fn a_spelling_the_login_layer_refuses_has_no_counter_of_its_own() {
        let attempts = attempts();
        let twins = [
            "k\u{131}ss@example.com",
            "ki\u{200B}ss@example.com",
            "\u{FF4B}iss@example.com",
            "kis\u{AD}s@example.com",
            "\u{212A}iss@example.com",
        ];
        let (first, _kept) = attempts.attempt("kiss@example.com").await;
        assert!(first.is_allowed());
        let mut passed = Vec::new();
        for twin in twins {
            let (taken, _kept) = attempts.attempt(twin).await;
            let checked = attempts.check(twin).await;
            if taken.is_allowed() || checked.is_allowed() {
                passed.push(twin);
            }
        }
        assert!(passed.is_empty(), "fresh counters for {passed:?}");
        // Cased and padded, it is the same account: its second failure
        // starts the delay.
        let (second, _kept) = attempts.attempt(" KISS@Example.com").await;
        assert!(second.is_allowed());
        assert!(!attempts.check("kiss@example.com").await.is_allowed());
    }
}
