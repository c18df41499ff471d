//! The replicated coordinator under the seeded simulation, in every test run: P1 and P8 on
//! 3- and 5-member clusters through crash-restarts of every member, leader isolation, minority
//! partitions, one-way cuts and lost majorities; reproducibility; and a planted bug that the
//! checks must find.

use palisade_cluster_sim::{run, ClusterSimConfig, ClusterSimReport};

/// Runs `seeds` on two threads (a fixed half each: the result does not depend on scheduling)
/// and fails on the first violation, naming the seed.
fn run_all(seeds: std::ops::Range<u64>, config: ClusterSimConfig) -> Vec<ClusterSimReport> {
    let half = |parity: u64| {
        seeds
            .clone()
            .filter(|s| s % 2 == parity)
            .map(|seed| {
                let report = run(seed, config);
                if let Err(problems) = report.outcome() {
                    panic!(
                        "seed {seed} ({} members; rerun: palisade simulate --cluster {} --from \
                         {seed} --seeds 1):\n{problems}",
                        config.members, config.members
                    );
                }
                report
            })
            .collect::<Vec<_>>()
    };
    std::thread::scope(|scope| {
        let even = scope.spawn(|| half(0));
        let odd = scope.spawn(|| half(1));
        let mut all = even.join().unwrap();
        all.extend(odd.join().unwrap());
        all
    })
}

fn assert_every_fault_happened(reports: &[ClusterSimReport], members: u64) {
    for report in reports {
        assert_eq!(
            report.faults.members_crashed, members,
            "seed {}: every member crashes and restarts",
            report.seed
        );
        assert!(report.grants() > 0, "seed {}: no grant at all", report.seed);
    }
    let sum = |f: fn(&ClusterSimReport) -> u64| reports.iter().map(f).sum::<u64>();
    let isolations = sum(|r| r.faults.leader_isolations);
    let partitions = sum(|r| r.faults.minority_partitions);
    let cuts = sum(|r| r.faults.one_way_cuts);
    let lost = sum(|r| r.faults.majority_losses);
    let snapshots = sum(|r| r.messages.snapshot_chunks);
    let grants = sum(|r| r.grants() as u64);
    let leaders = sum(|r| r.leader_starts);
    eprintln!(
        "{} seeds, {members} members: {grants} grants, {leaders} leader terms, {} crashes, \
         {isolations} leader isolations, {partitions} minority partitions, {cuts} one-way cuts, \
         {lost} lost majorities, {snapshots} snapshot chunks installed",
        reports.len(),
        sum(|r| r.faults.crashes)
    );
    for (what, count) in [
        ("leader isolations", isolations),
        ("minority partitions", partitions),
        ("one-way cuts", cuts),
        ("lost majorities", lost),
        ("snapshot installs", snapshots),
    ] {
        assert!(count > 0, "no {what} in {} seeds", reports.len());
    }
}

#[test]
fn p1_p8_hold_on_3_member_clusters_through_crashes_partitions_and_lost_messages() {
    let reports = run_all(0..160, ClusterSimConfig::for_members(3));
    assert_every_fault_happened(&reports, 3);
}

#[test]
fn p1_p8_hold_on_5_member_clusters_through_crashes_partitions_and_lost_messages() {
    let reports = run_all(0..40, ClusterSimConfig::for_members(5));
    assert_every_fault_happened(&reports, 5);
}

#[test]
fn p1_p8_hold_when_members_lose_their_data_and_are_added_back() {
    // Half the crashes also wipe the member's disk and restart it with the same flags: its
    // peers must refuse it (store identity), then the operator's procedure — remove, restart
    // with --join, add — brings it back. Without the refusal about half of these seeds broke
    // P1 or left members diverged.
    let config = ClusterSimConfig {
        wipe_on_crash: true,
        ..ClusterSimConfig::for_members(3)
    };
    let reports = run_all(1_000..1_060, config);
    let wipes: u64 = reports.iter().map(|r| r.faults.wipes).sum();
    let refused: u64 = reports.iter().map(|r| r.messages.refused).sum();
    eprintln!("60 seeds: {wipes} members lost their data, {refused} of their messages refused");
    assert!(
        wipes > 60 && refused > 0,
        "{wipes} wipes, {refused} refusals"
    );
}

#[test]
fn p1_p8_hold_when_members_added_with_join_lose_their_data() {
    // Member 1 founds the cluster alone; 2 and 3 start with --join and are added. Before store
    // ids were in the replicated membership, a member learned a peer's store from the first
    // message it saw: members added with --join talk only to the leader, so a wiped member's
    // new store was accepted by a peer that had never heard from it.
    let config = ClusterSimConfig {
        wipe_on_crash: true,
        join_members: true,
        ..ClusterSimConfig::for_members(3)
    };
    let reports = run_all(2_000..2_040, config);
    let wipes: u64 = reports.iter().map(|r| r.faults.wipes).sum();
    let refused: u64 = reports.iter().map(|r| r.messages.refused).sum();
    eprintln!("40 seeds: {wipes} members lost their data, {refused} of their messages refused");
    assert!(
        wipes > 30 && refused > 0,
        "{wipes} wipes, {refused} refusals"
    );
}

#[test]
fn p6_p8_hold_when_members_are_put_back_to_older_copies() {
    // Crashes alternate between copying the stopped member's disk (`cp -a`) and, half of the
    // later times, putting that older copy back: its witness refuses the start, and the
    // operator wipes and re-adds it (the way back the refusal names).
    let config = ClusterSimConfig {
        copy_back_on_crash: true,
        ..ClusterSimConfig::for_members(3)
    };
    let reports = run_all(3_000..3_060, config);
    let copy_backs: u64 = reports.iter().map(|r| r.faults.copy_backs).sum();
    let refused: u64 = reports.iter().map(|r| r.faults.copy_backs_refused).sum();
    eprintln!("60 seeds: {copy_backs} members put back to an older copy, {refused} refused");
    assert!(
        copy_backs >= 20 && refused > 0,
        "{copy_backs} copy-backs, {refused} refused"
    );
}

#[test]
fn p6_p8_a_member_that_starts_from_an_older_copy_without_its_witness_loses_nothing() {
    // Without the witness, a member put back to an older copy starts from it, forgetting
    // entries and votes it acknowledged. This used to be the planted bug the checks caught
    // (it formed a majority with a member that lacked those entries, in some of these 60
    // seeds). The witness is now the second line: a restarted member's probation and census
    // and its never leading a term again (`identity` rules 4 and 5) keep every property by
    // themselves, as with a whole volume put back (`--rollback`). The checks still catch a
    // lost entry: see the lying disks below.
    let config = ClusterSimConfig {
        copy_back_on_crash: true,
        plant_no_witness: true,
        ..ClusterSimConfig::for_members(3)
    };
    let seeds: Vec<u64> = (3_000..3_060).collect();
    let reports = run_all_seeds(&seeds, config);
    let put_back: u64 = reports.iter().map(|r| r.faults.copy_backs).sum();
    assert!(put_back >= 20, "only {put_back} copies put back");
}

#[test]
fn a_seed_replays_to_the_same_trace() {
    for seed in [0, 7, 123_456_789] {
        let first = run(seed, ClusterSimConfig::default());
        let second = run(seed, ClusterSimConfig::default());
        assert_eq!(first.trace_hash, second.trace_hash, "seed {seed}");
        assert_eq!(first.history.entries, second.history.entries);
        assert_eq!(first.holds, second.holds);
    }
    assert_ne!(
        run(1, ClusterSimConfig::default()).trace_hash,
        run(2, ClusterSimConfig::default()).trace_hash
    );
}

#[test]
fn p1_p8_disks_that_lie_about_fsync_are_caught() {
    // A planted bug: fsync returns without making anything durable, so a crash loses entries
    // a majority acknowledged. The checks must see it (an epoch granted twice, a lost grant,
    // members that disagree, or openraft's own assertions).
    let config = ClusterSimConfig {
        plant_lying_fsync: true,
        ..ClusterSimConfig::default()
    };
    let caught = (0..10)
        .filter(|seed| run(*seed, config).outcome().is_err())
        .count();
    eprintln!("lying fsync caught in {caught} of 10 seeds");
    assert!(
        caught >= 5,
        "lying fsync caught in only {caught} of 10 seeds"
    );
}

#[test]
fn p1_p8_regression_a_deposed_leaders_replication_never_leaves_a_follower_with_a_log_hole() {
    // Seeds outside CI's range that failed (about 1 in 500): a deposed leader's replication
    // task read a log range whose start it had purged, sent the rest after the old
    // prev_log_id, and the follower wrote a log with a hole — its Raft stopped and it could
    // not restart. Fixed three ways (a read returns a run from the range's start or nothing,
    // the receiver refuses a message whose entries do not follow prev_log_id, append refuses
    // a gap); a member whose Raft stops is reported as such.
    let reports = run_all_seeds(
        &[777_010, 900_405, 900_442],
        ClusterSimConfig::for_members(3),
    );
    assert_eq!(reports.len(), 3);
}

/// Runs the listed seeds on this thread, failing on the first violation.
fn run_all_seeds(seeds: &[u64], config: ClusterSimConfig) -> Vec<ClusterSimReport> {
    seeds
        .iter()
        .map(|&seed| {
            let report = run(seed, config);
            if let Err(problems) = report.outcome() {
                panic!("seed {seed}:\n{problems}");
            }
            report
        })
        .collect()
}

#[test]
fn p8_regression_a_retried_acquire_never_leaves_two_holders() {
    // Clients count a lease from the send time of the attempt that was answered, as a client
    // retrying with its request id does. When a request-id match returned the lease without
    // renewing it, these seeds had two clients holding one lock at once.
    let reports = run_all_seeds(&[5_000_095, 5_000_136], ClusterSimConfig::for_members(3));
    assert_eq!(reports.len(), 2);
}

#[test]
fn p8_regression_a_joint_membership_is_never_left_behind() {
    // With lost data directories: an `add` retried after a leader change found its node in a
    // joint membership's voters and returned; the joint stayed, a second member lost its data,
    // and no majority of both configurations was left to commit anything again.
    let config = ClusterSimConfig {
        wipe_on_crash: true,
        ..ClusterSimConfig::for_members(3)
    };
    let reports = run_all_seeds(&[9_000_792], config);
    assert_eq!(reports.len(), 1);
}

#[test]
fn p1_p8_hold_when_members_whole_volumes_are_put_back() {
    // Crashes alternate between snapshotting a member's whole volume (disk *and* witness) and,
    // half of the later times, putting both back: nothing on the member can tell, so it
    // starts from its older state. Every property holds in every seed: no epoch granted twice
    // or below an earlier one (P1: every leader's start floors the counter at its clock), no
    // acknowledged grant lost and no two holders (P8: the restarted member's probation and
    // census, `identity` rule 4), and the members converge on one history (a restarted member
    // never leads again the term it led before, rule 5). Before rules 4 and 5, 2 to 3 seeds
    // in 100 lost an acknowledged grant or applied different states under one log id.
    let config = ClusterSimConfig {
        copy_back_on_crash: true,
        rollback_volumes: true,
        ..ClusterSimConfig::default()
    };
    let seeds: Vec<u64> = (0..40).collect();
    let reports = run_all_seeds(&seeds, config);
    let put_back: u64 = reports.iter().map(|r| r.faults.copy_backs).sum();
    assert!(put_back >= 20, "only {put_back} volumes put back");
    // Fresh seeds that failed after rules 4 and 5 (3 of 18,000): a member put back to a vote
    // without entries was taken for a new one (7007748), a census heard the log a snapshot
    // had replaced (7009589), and candidates refused without an answer never learned that a
    // greater log existed, so no leader was elected (8003243). Their fixes changed the runs,
    // so these seeds now pass through other histories; the cases themselves are
    // `lib_tests.rs`'s `p8_a_member_put_back_to_a_vote_without_entries…` and `identity`'s
    // and `storage`'s unit tests that name the seeds.
    run_all_seeds(&[7_007_748, 7_009_589, 8_003_243], config);
}

#[test]
fn p1_holds_and_grants_go_on_when_members_clocks_jump_and_drift() {
    // Half the network faults are clock faults: one member's clock jumps ahead or back, within
    // or beyond the maximum offset (up to a day), or drifts; or a majority's jump ahead
    // together (their floor is committed, and the counter stays ahead once the clocks are
    // corrected). No epoch is granted twice or below an earlier one, no acknowledged grant is
    // lost, and the cluster grants again after every fault: a member whose clock a majority
    // refuses does not lead, and a counter ahead of the clocks stops nobody.
    let config = ClusterSimConfig {
        clock_faults: true,
        ..ClusterSimConfig::default()
    };
    let seeds: Vec<u64> = (0..12).collect();
    let reports = run_all_seeds(&seeds, config);
    let mut clock = palisade_cluster_sim::ClockFaults::default();
    reports.iter().for_each(|r| clock.add(&r.faults.clock));
    for (kind, count) in [
        ("ahead within", clock.ahead_within),
        ("ahead beyond", clock.ahead_beyond),
        ("back within", clock.back_within),
        ("back beyond", clock.back_beyond),
        ("drifts", clock.drifts),
        ("majority ahead", clock.majority_ahead),
    ] {
        assert!(
            count > 0,
            "no seed injected a clock fault {kind}: {clock:?}"
        );
    }
    assert!(reports.iter().all(|r| r.grants() > 0));
}

/// P8 through power cuts that land inside a Raft log write and keep any subset of its
/// 512-byte sectors (`--torn-sectors`): every member starts again, cut back to its last whole
/// append. Before appends were framed, 8 of 100 seeds from 11,000,000 failed (a member refused
/// its own log as damaged), 11,000,000 and 11,000,008 among them.
#[test]
fn p8_holds_when_power_cuts_keep_any_subset_of_a_raft_log_writes_sectors() {
    let config = ClusterSimConfig {
        torn_sectors: true,
        ..ClusterSimConfig::for_members(3)
    };
    let reports = run_all(11_000_000..11_000_030, config);
    let torn: u64 = reports.iter().map(|r| r.faults.torn_sector_crashes).sum();
    let out_of_order: u64 = reports
        .iter()
        .map(|r| r.faults.torn_sectors_out_of_order)
        .sum();
    eprintln!("30 seeds: {torn} crashes in a raft log write, {out_of_order} out of order");
    assert!(
        torn >= 60 && out_of_order > 0,
        "{torn} torn writes, {out_of_order} with a sector lost before a kept one"
    );
}

#[test]
fn liveness_regression_volumes_go_back_only_while_a_majority_holds_the_history() {
    // Seed 7_009_361 of the 20,000 `--all-faults` seeds: the three members' volumes, each
    // copied before its first vote, were put back one after the other (2, then 1 while 2 had
    // not caught up, then 3): no member held the acknowledged grants any more, the cluster
    // (rightly) never granted again, and the liveness watchdog failed the seed. A majority
    // gone back together is the operator's restore, not a fault the cluster answers by
    // itself: the driver now puts a volume back (or wipes it) only while a majority of the
    // other members holds the history, and counts the put-backs it held.
    let config = ClusterSimConfig {
        wipe_on_crash: true,
        copy_back_on_crash: true,
        rollback_volumes: true,
        torn_sectors: true,
        copy_anytime: true,
        clock_faults: true,
        ..ClusterSimConfig::for_members(3)
    };
    let reports = run_all_seeds(&[7_009_361], config);
    assert!(
        reports[0].faults.put_backs_held >= 1,
        "{:?}",
        reports[0].faults
    );
}
