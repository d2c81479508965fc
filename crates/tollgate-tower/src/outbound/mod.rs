//! The outbound adaptive layer.
