//! The simulation in CI: 1,000 seeds, each checked for P1, P2 and P4; reproducibility; and
//! planted bugs that the checker must find.

use palisade_history::Mode;
use palisade_sim::{run, SimConfig};

/// Seeds run by every `scripts/test`. A longer run: `palisade simulate --seeds 100000`.
const CI_SEEDS: u64 = 1_000;

#[test]
fn p1_p2_p4_hold_on_1000_seeds_with_pauses_delays_drops_reorders_and_crashes() {
    // Two threads, each a fixed half of the seeds: the result does not depend on scheduling.
    let half = |parity: u64| {
        let (mut faults, mut stale) = (0, 0);
        for seed in (0..CI_SEEDS).filter(|s| s % 2 == parity) {
            let report = run(seed, SimConfig::default());
            match &report.verdict {
                Ok(summary) => stale += summary.stale_attempted,
                Err(violation) => panic!(
                    "seed {seed} (rerun: palisade simulate --from {seed} --seeds 1):\n{}",
                    violation.excerpt(&report.history)
                ),
            }
            faults += report.faults.total();
        }
        (faults, stale)
    };
    let (even, odd) = std::thread::scope(|scope| {
        let even = scope.spawn(|| half(0));
        let odd = scope.spawn(|| half(1));
        (even.join().unwrap(), odd.join().unwrap())
    });
    let (faults, stale) = (even.0 + odd.0, even.1 + odd.1);
    eprintln!("{CI_SEEDS} seeds: {faults} faults injected, {stale} stale writes refused");
    assert!(faults > CI_SEEDS * 10, "too few faults injected: {faults}");
    assert!(
        stale as u64 > CI_SEEDS,
        "too few stale writes attempted: {stale}"
    );
}

#[test]
fn a_seed_replays_to_the_same_trace() {
    for seed in [0, 7, 123_456_789] {
        let first = run(seed, SimConfig::default());
        let second = run(seed, SimConfig::default());
        assert_eq!(first.trace_hash, second.trace_hash, "seed {seed}");
        assert_eq!(first.history.entries, second.history.entries);
    }
    assert_ne!(
        run(1, SimConfig::default()).trace_hash,
        run(2, SimConfig::default()).trace_hash
    );
}

#[test]
fn p1_a_coordinator_that_forgets_its_epoch_counter_is_caught() {
    let config = SimConfig {
        plant_epoch_reset: true,
        ..SimConfig::default()
    };
    let caught = (0..50)
        .filter(|&seed| run(seed, config).verdict.is_err())
        .count();
    assert!(
        caught >= 40,
        "the planted epoch reset was found in {caught} of 50 seeds"
    );
}

#[test]
fn p2_a_resource_that_accepts_equal_epochs_is_caught() {
    let config = SimConfig {
        plant_equal_accepted: true,
        ..SimConfig::default()
    };
    let caught = (0..100)
        .filter(|&seed| run(seed, config).verdict.is_err_and(|v| v.property == "P2"))
        .count();
    assert!(
        caught >= 10,
        "the planted <= was found in {caught} of 100 seeds"
    );
}

#[test]
fn p2_a_resource_that_accepts_a_never_activated_epoch_is_caught() {
    // Some owners write without activating (a lost or forgotten activation); a resource that
    // then accepts any epoch above its fence lets them in before the old owner is fenced out.
    // Before, every simulated owner activated first and this planted bug passed every seed.
    let config = SimConfig {
        plant_unactivated_accepted: true,
        ..SimConfig::default()
    };
    let caught = (0..200)
        .map(|seed| run(seed, config))
        .filter(|r| r.mode == Mode::Activated)
        .filter(|r| r.verdict.as_ref().is_err_and(|v| v.property == "P2"))
        .count();
    assert!(
        caught >= 5,
        "the planted never-activated acceptance was found in {caught} of 200 seeds"
    );
}

#[test]
fn p6_restores_happen_and_a_coordinator_restored_from_its_backup_alone_is_caught() {
    let (mut restores, mut resource_restores) = (0, 0);
    for seed in 0..200 {
        let report = run(seed, SimConfig::default());
        assert!(report.verdict.is_ok(), "seed {seed}");
        restores += report.faults.restores;
        resource_restores += report.faults.resource_restores;
    }
    assert!(
        restores >= 50,
        "{restores} coordinator restores in 200 seeds"
    );
    assert!(
        resource_restores >= 50,
        "{resource_restores} resource restores in 200 seeds"
    );
    // Restored from the backup's counter alone, it issues epochs a second time (P1).
    let config = SimConfig {
        plant_restore_from_backup_only: true,
        ..SimConfig::default()
    };
    let caught = (0..200)
        .filter(|&seed| run(seed, config).verdict.is_err_and(|v| v.property == "P1"))
        .count();
    eprintln!(
        "200 seeds: {restores} coordinator and {resource_restores} resource restores; the \
         planted backup-only restore was found in {caught}"
    );
    assert!(
        caught >= 20,
        "the planted backup-only restore was found in {caught} of 200 seeds"
    );
}

#[test]
fn p6_a_resource_put_back_to_an_older_copy_without_a_floor_is_caught() {
    let config = SimConfig {
        plant_resource_restore_without_floor: true,
        ..SimConfig::default()
    };
    let caught = (0..200)
        .filter(|&seed| run(seed, config).verdict.is_err_and(|v| v.property == "P2"))
        .count();
    eprintln!("the planted floorless resource restore was found in {caught} of 200 seeds");
    assert!(
        caught >= 10,
        "the planted floorless resource restore was found in {caught} of 200 seeds"
    );
}
