//! tollgate's cross-crate integration tests: a tower layer, a real
//! redis-server and the operations CLI together, so that each crate's own
//! tests stay unit-sized. Nothing here is published; the tests live in
//! `tests/tests/`, and `tollgate-under-test` is the CLI built in this
//! package so that they can run it.
//!
//! ```sh
//! CI=true cargo test -p tollgate-integration
//! ```
