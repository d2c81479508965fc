//! The backend conformance suite (being written).
