//! The replicated coordinator under the simulation in CI.

use palisade_cluster_sim::{run, ClusterSimConfig};

#[test]
fn probe() {
    let seed: u64 = std::env::var("SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let started = std::time::Instant::now();
    let report = run(seed, ClusterSimConfig::default());
    eprintln!(
        "seed {seed}: {:?} wall, events {}, grants {}, faults {:?}, msgs {:?}, syncs {}, leaders {}, final epoch {}, recovery {:?}, hash {:x}",
        started.elapsed(), report.events, report.grants(), report.faults, report.messages, report.syncs,
        report.leader_starts, report.final_epoch, report.recovery_ms, report.trace_hash
    );
    report.outcome().unwrap();
}
