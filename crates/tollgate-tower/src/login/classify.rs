use http::StatusCode;

use crate::inbound::{Classify, Outcome};

/// The per-account classifier of [`LoginLayer`](super::LoginLayer): which
/// login responses count.
///
/// By status ([`by_status`](Self::by_status), the default), it
/// [reserves](Classify::reserves): each attempt is recorded as a failure
/// *before* the handler runs, atomically in the shared counter (so
/// attempts in flight together see each other, and a delayed account is
/// refused without recording anything), and the response settles it:
///
/// | response | outcome | the attempt's failure |
/// |---|---|---|
/// | `401 Unauthorized`, `403 Forbidden` | a failure: [`Outcome::Count`] | kept |
/// | `2xx` | a success: [`Outcome::Reset`] | the account is cleared |
/// | anything else (`400`, `5xx`, redirects), or the handler's `Err` | [`Outcome::Ignore`] | refunded (the delay it may have started runs on) |
/// | none: the request dropped (a client gone mid-attempt) | | kept |
///
/// With [`explicit`](Self::explicit), every response is ignored, nothing
/// is reserved (the layer only checks whether the account is delayed) and
/// the handler reports through [`LoginAttempts`](super::LoginAttempts).
///
/// # Examples
///
/// ```
/// use tollgate_tower::inbound::{Classify, Outcome};
/// use tollgate_tower::login::FailedLogins;
///
/// let res = |status: u16| http::Response::builder().status(status).body(()).unwrap();
/// assert_eq!(FailedLogins::by_status().classify(&res(401)), Outcome::Count);
/// assert_eq!(FailedLogins::by_status().classify(&res(200)), Outcome::Reset);
/// assert_eq!(FailedLogins::by_status().classify(&res(500)), Outcome::Ignore);
/// assert_eq!(FailedLogins::explicit().classify(&res(401)), Outcome::Ignore);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailedLogins {
    by_status: bool,
}

impl FailedLogins {
    /// Counts by response status (see the table).
    pub fn by_status() -> Self {
        Self { by_status: true }
    }

    /// Counts nothing from responses: the handler reports outcomes.
    pub fn explicit() -> Self {
        Self { by_status: false }
    }

    /// The outcome of a login answered with `status`.
    pub fn outcome(&self, status: StatusCode) -> Outcome {
        if !self.by_status {
            return Outcome::Ignore;
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
        self.by_status
    }

    /// The handler failed: no failed login, the attempt is refunded.
    fn on_error(&self) -> Outcome {
        Outcome::Ignore
    }

    fn classify(&self, response: &http::Response<B>) -> Outcome {
        self.outcome(response.status())
    }
}
