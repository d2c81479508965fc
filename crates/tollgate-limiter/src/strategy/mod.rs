//! One module per strategy: its policy type, its state in the reference
//! model, the model's operations on that state, and their docs.
//!
//! What every strategy shares stays outside: [`Policy`](crate::Policy) and
//! [`State`](crate::model::State) dispatch to these modules, and
//! [`model`](crate::model) holds the key space (slots, expiry, overrides).
//! The public paths (`tollgate_limiter::TokenBucket`,
//! `tollgate_limiter::model::TokenBucketState`, ...) are re-exports.

pub mod calendar;
pub mod composite;
pub mod concurrency;
pub mod progressive_delay;
pub mod reservation;
pub mod sliding_window;
pub mod token_bucket;
