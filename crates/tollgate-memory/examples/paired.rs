//! The memory path against governor in interleaved pairs: the cases of
//! `benches/memory.rs` (`Limiter::check` over `MemoryBackend`, default
//! settings, against governor's keyed limiter; 1 and 10k keys, admitting
//! and refusing, 1 and 2 threads), each measured as PAIRS pairs of runs of
//! CHUNK decisions, tollgate then governor and governor then tollgate in
//! turn, on the same pinned threads.
//!
//! ```sh
//! cargo run --release -p tollgate-memory --example paired [PAIRS] [CHUNK] [FILTER]
//! ```
//!
//! PAIRS 100 and CHUNK 200,000 by default (about 4 s a case); FILTER, a
//! substring of the case (`refuse/1-keys`), runs only the cases it matches.
//! `GOVERNOR_HASHER=foldhash` in the environment gives governor's keyed
//! limiter the hasher tollgate's memory backend uses (hashbrown's default,
//! foldhash) instead of governor's default (std's SipHash), which
//! `RateLimiter::keyed` and governor's docs use: the hasher is much of a
//! keyed check, so the two runs tell its share of a ratio.
//!
//! Why pairs: on the shared 2-core VMs this project is measured on, the
//! speed of both libraries moves together by up to 3x for seconds at a
//! time (criterion runs of one case a minute apart: 47 and 136 ns), so
//! medians of separate runs compare different moments. A pair's two runs
//! take about 20 ms together and see the same machine. This prints, per
//! case, each library's median time per decision, the median of the pairs'
//! ratios (governor / tollgate: above 1.0x tollgate is ahead) and their
//! quartiles.

#![allow(missing_docs)]

#[path = "../benches/common/mod.rs"]
#[allow(dead_code)] // what serves the criterion bench only
mod common;

use common::{Workload, measure_pairs};

fn main() {
    let mut args = std::env::args().skip(1);
    let pairs: usize = args.next().map_or(100, |a| a.parse().expect("PAIRS"));
    let chunk: u64 = args.next().map_or(200_000, |a| a.parse().expect("CHUNK"));
    let filter = args.next().unwrap_or_default();
    println!("governor's hasher: {}", common::Governor::hasher());
    println!(
        "{:<28} {:>11} {:>11} {:>7}  quartiles of the pairs' ratios",
        "case", "tollgate ns", "governor ns", "ratio"
    );
    for workload in [Workload::Admitting, Workload::Refusing] {
        for keys in [1usize, 10_000] {
            for threads in [1usize, 2] {
                let name = format!("{}/{keys}-keys/{threads}-threads", workload.name());
                if !name.contains(&filter) {
                    continue;
                }
                let pairs = measure_pairs(workload, keys, threads, pairs, chunk);
                println!(
                    "{name:<28} {:>11.1} {:>11.1} {:>6.2}x  {:.2}x-{:.2}x",
                    pairs.tollgate_ns,
                    pairs.governor_ns,
                    pairs.ratio,
                    pairs.ratio_quartiles.0,
                    pairs.ratio_quartiles.1,
                );
            }
        }
    }
}
