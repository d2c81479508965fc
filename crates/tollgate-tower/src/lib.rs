//! Tower layers for tollgate.

pub mod outbound;
