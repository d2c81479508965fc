use http::StatusCode;

use crate::inbound::{Classify, Outcome};

/// The per-account classifier of [`LoginLayer`](super::LoginLayer): which
/// login responses count.
///
/// | response | outcome |
/// |---|---|
/// | `401 Unauthorized`, `403 Forbidden` | a failure: [`Outcome::Count`] |
/// | `2xx` | a success: [`Outcome::Reset`] clears the account |
/// | anything else (`400`, `5xx`, redirects) | [`Outcome::Ignore`] |
///
/// With [`explicit`](Self::explicit), every response is ignored and the
/// handler reports through [`LoginAttempts`](super::LoginAttempts).
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
    fn classify(&self, response: &http::Response<B>) -> Outcome {
        self.outcome(response.status())
    }
}
