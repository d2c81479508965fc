//! Key extractors: who a request is counted for.
//!
//! An extractor looks at a request and answers `Some(key)` or `None`. A
//! missing key is not an error: the layer settles it with its
//! [`MissingKey`](crate::MissingKey) policy.
//!
//! Any closure `Fn(&Req) -> Option<Key>` is an extractor, so a channel, a
//! tenant or a path segment is one line:
//!
//! ```
//! use tollgate_limiter::Key;
//! use tollgate_tower::extract::KeyExtractor;
//!
//! let channel = |req: &http::Request<()>| {
//!     req.headers().get("x-channel")?.to_str().ok().map(Key::new)
//! };
//! let req = http::Request::builder().header("x-channel", "C042").body(()).unwrap();
//! assert_eq!(channel.extract(&req), Some(Key::new("C042")));
//! ```
//!
//! The built-ins cover the common cases: [`ClientIp`] (the socket address,
//! or a forwarding header from trusted proxies only), [`ApiKey`] (a header
//! or a bearer token, hashed with a [`KeyHasher`]) and [`FromBody`] (a key found in the body by
//! [`BufferBodyLayer`](crate::BufferBodyLayer), e.g. a normalised, hashed
//! email).

mod api_key;
mod client_ip;

use tollgate_limiter::Key;

pub use api_key::{ApiKey, DEFAULT_MAX_CREDENTIAL_LEN};
pub use client_ip::{ClientIp, PeerAddr, ProxyHeader};
pub use ipnet::IpNet;
pub use tollgate_limiter::KeyHasher;

pub use crate::buffer_body::{BodyKey, FromBody};

/// Finds the key a request is counted for.
///
/// Implemented for every closure `Fn(&Req) -> Option<Key>`.
pub trait KeyExtractor<Req> {
    /// The key, or `None` when the request carries none.
    fn extract(&self, req: &Req) -> Option<Key>;
}

impl<F, Req> KeyExtractor<Req> for F
where
    F: Fn(&Req) -> Option<Key>,
{
    fn extract(&self, req: &Req) -> Option<Key> {
        self(req)
    }
}
