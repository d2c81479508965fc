//! The AIMD controller for adaptive (outbound) limits (being written).
