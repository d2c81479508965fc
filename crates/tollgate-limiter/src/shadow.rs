//! Shadow mode: decide and record, never refuse.
//!
//! A limiter in [`Mode::Shadow`] asks its backend exactly as an enforcing
//! one does: the key's state is charged as the policy says, the decision
//! metrics count it, and local denials and overrides work unchanged. Only
//! the answer differs: what enforcement would have refused (a refusal by
//! the limit, a cost the policy can never grant, or a fail-closed backend
//! failure) passes as [`Verdict::Shadowed`](crate::Verdict::Shadowed),
//! carrying the [`Denied`](crate::Denied) the caller would have got. It is
//! counted with the outcome `shadow` (see [`metrics`](crate::metrics))
//! and logged at info level at most once per limiter every
//! [`SHADOW_LOG_PERIOD`], with the number of refusals kept quiet.
//!
//! This is how a team rolls a new limit out: ship it in shadow mode, watch
//! `tollgate_decisions_total{outcome="shadow"}` (who would have been
//! refused, and how often), then switch the limiter to
//! [`Mode::Enforce`] in configuration. A whole deployment can be put in
//! shadow mode at once (the top-level `shadow = true` of
//! [`Config`](crate::Config), or
//! [`ConfigBuilder::shadow`](crate::ConfigBuilder::shadow)), e.g. for a
//! first rollout of tollgate in front of a service.
//!
//! # Examples
//!
//! ```
//! # async fn example<B: tollgate_limiter::Backend>(backend: B) {
//! use std::time::Duration;
//! use tollgate_limiter::{Key, Limiter, Mode, SlidingWindow, Verdict};
//!
//! let limiter = Limiter::builder("new-limit", SlidingWindow::new(1, Duration::from_secs(60)).unwrap(), backend)
//!     .mode(Mode::Shadow)
//!     .build();
//! let k = Key::new("203.0.113.7");
//! assert!(limiter.check(&k).await.is_allowed());
//! // Refused by the limit, passed by shadow mode.
//! let v = limiter.check(&k).await;
//! assert!(v.is_allowed() && v.is_shadowed());
//! # }
//! ```

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// How often, at most, a limiter logs a shadowed refusal.
pub const SHADOW_LOG_PERIOD: Duration = Duration::from_secs(10);

/// Whether a limiter refuses what its policy refuses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Refuse (the default).
    #[default]
    Enforce,
    /// Decide and record, but let every request pass (see the [module
    /// docs](self)).
    Shadow,
}

impl FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "enforce" => Ok(Self::Enforce),
            "shadow" => Ok(Self::Shadow),
            other => Err(format!(
                "expected \"enforce\" or \"shadow\", found {other:?}"
            )),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Enforce => "enforce",
            Self::Shadow => "shadow",
        })
    }
}
