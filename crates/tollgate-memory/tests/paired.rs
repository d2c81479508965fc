//! The short form of `examples/paired.rs` (the memory path against
//! governor in interleaved pairs): every case, two pairs of small runs.
//! It checks the harness, not speed: both libraries decide as each
//! workload says before and after the runs, on every thread count, and
//! every run is timed.

#[path = "../benches/common/mod.rs"]
#[allow(dead_code)] // what serves the criterion bench only
mod common;

use common::{Workload, measure_pairs};

#[test]
fn every_case_runs_in_pairs_and_decides_as_its_workload_says() {
    for workload in [Workload::Admitting, Workload::Refusing] {
        for keys in [1, 10_000] {
            for threads in [1, 2] {
                let p = measure_pairs(workload, keys, threads, 2, 2_000);
                let case = format!("{}/{keys}-keys/{threads}-threads", workload.name());
                assert!(p.tollgate_ns > 0.0 && p.governor_ns > 0.0, "{case}");
                assert!(p.ratio.is_finite() && p.ratio > 0.0, "{case}");
                assert!(p.ratio_quartiles.0 <= p.ratio_quartiles.1, "{case}");
            }
        }
    }
}
