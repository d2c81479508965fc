use http::StatusCode;

use crate::inbound::{Classify, Outcome};

/// The per-account classifier of [`LoginLayer`](super::LoginLayer): which
/// login responses count.
///
/// It [reserves](Classify::reserves): each attempt is recorded as a
/// failure *before* the handler runs, atomically in the shared counter (so
/// attempts in flight together see each other, and a delayed account is
/// refused without recording anything), and the response settles it.
///
/// By status ([`by_status`](Self::by_status), the default):
///
/// | response | outcome | the attempt's failure |
/// |---|---|---|
/// | `401 Unauthorized`, `403 Forbidden` | a failure: [`Outcome::Count`] | kept |
/// | `2xx` | a success: [`Outcome::Reset`] | the account is cleared |
/// | anything else (`400`, `5xx`, redirects), or the handler's `Err` | [`Outcome::Ignore`] | refunded (the delay it may have started runs on) |
/// | none: the request dropped (a client gone mid-attempt) | | kept |
///
/// [`explicit`](Self::explicit), for handlers whose status does not tell
/// (a form login that redirects either way): the handler says what the
/// attempt was by putting a [`LoginOutcome`] in the response's extensions,
/// and a response without one **keeps** the failure, so a path that
/// forgets to say cannot hand out free guesses:
///
/// | the response's [`LoginOutcome`] | the attempt's failure |
/// |---|---|
/// | [`Failed`](LoginOutcome::Failed), or none | kept |
/// | [`Succeeded`](LoginOutcome::Succeeded) | the account is cleared |
/// | [`NoAttempt`](LoginOutcome::NoAttempt), or the handler's `Err` | refunded |
///
/// # Examples
///
/// ```
/// use tollgate_tower::inbound::{Classify, Outcome};
/// use tollgate_tower::login::{FailedLogins, LoginOutcome};
///
/// let res = |status: u16| http::Response::builder().status(status).body(()).unwrap();
/// assert_eq!(FailedLogins::by_status().classify(&res(401)), Outcome::Count);
/// assert_eq!(FailedLogins::by_status().classify(&res(200)), Outcome::Reset);
/// assert_eq!(FailedLogins::by_status().classify(&res(500)), Outcome::Ignore);
///
/// // A form login: 303 either way, the handler says which.
/// let said = |outcome: LoginOutcome| {
///     let mut res = res(303);
///     res.extensions_mut().insert(outcome);
///     res
/// };
/// let explicit = FailedLogins::explicit();
/// assert_eq!(explicit.classify(&said(LoginOutcome::Succeeded)), Outcome::Reset);
/// assert_eq!(explicit.classify(&said(LoginOutcome::Failed)), Outcome::Count);
/// assert_eq!(explicit.classify(&said(LoginOutcome::NoAttempt)), Outcome::Ignore);
/// assert_eq!(explicit.classify(&res(303)), Outcome::Count); // not said: kept
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailedLogins {
    by_status: bool,
}

/// What a login attempt was, said by the handler behind a
/// [`LoginLayer`](super::LoginLayer) built with
/// [`count_by_status(false)`](super::LoginLayer::count_by_status), in the
/// response's extensions (see [`FailedLogins::explicit`]). With axum,
/// return it beside the response: `(Extension(LoginOutcome::Failed),
/// Redirect::to("/login"))`.
///
/// The attempt was taken up front, as a failure; this settles it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LoginOutcome {
    /// A wrong password, an unknown account: the failure is kept (as it
    /// is when the response says nothing).
    Failed,
    /// The password was right: the account's failures are forgotten.
    Succeeded,
    /// No password was checked (a CSRF token that did not match, the user
    /// store down): the failure is given back.
    NoAttempt,
}

impl FailedLogins {
    /// Counts by response status (see the table).
    pub fn by_status() -> Self {
        Self { by_status: true }
    }

    /// Counts by the [`LoginOutcome`] the handler puts in the response
    /// (see the table); status codes say nothing.
    pub fn explicit() -> Self {
        Self { by_status: false }
    }

    /// The outcome of a login answered with `status` and no
    /// [`LoginOutcome`] in its extensions.
    pub fn outcome(&self, status: StatusCode) -> Outcome {
        if !self.by_status {
            // Not said: the failure taken up front stays.
            return Outcome::Count;
        }
        match status {
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Outcome::Count,
            s if s.is_success() => Outcome::Reset,
            _ => Outcome::Ignore,
        }
    }
}

impl Default for FailedLogins {
    fn default() -> Self {
        Self::by_status()
    }
}

impl<B> Classify<http::Response<B>> for FailedLogins {
    fn reserves(&self) -> bool {
        true
    }

    /// The handler failed: no failed login, the attempt is refunded.
    fn on_error(&self) -> Outcome {
        Outcome::Ignore
    }

    fn classify(&self, response: &http::Response<B>) -> Outcome {
        if self.by_status {
            return self.outcome(response.status());
        }
        match response.extensions().get::<LoginOutcome>() {
            Some(LoginOutcome::Failed) => Outcome::Count,
            Some(LoginOutcome::Succeeded) => Outcome::Reset,
            Some(LoginOutcome::NoAttempt) => Outcome::Ignore,
            None => self.outcome(response.status()),
        }
    }
}
