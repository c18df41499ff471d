//! A deterministic simulation of the replicated coordinator: the real cluster code — openraft,
//! the redb cluster store, the supervisor, the engine and its group commit — with 3 or 5
//! members on one thread and a paused clock, a simulated network and simulated disks, driven
//! by one seeded generator.
//!
//! Each run ([`run`]) starts the members, lets a few clients acquire, renew (or pause past
//! their TTL) and release leases with request ids and leader hints, and meanwhile injects:
//! crash-restarts of every member in turn (a power cut: writes after the last fsync are lost),
//! isolation of the serving leader, minority partitions, one-way link cuts, and moments when no
//! majority can talk; messages are delayed and dropped throughout. Then it heals everything and
//! checks:
//!
//! - **P1** (`palisade-history`): grants of a lock strictly increase in real-time order, and no
//!   epoch is granted twice;
//! - **P8, held leases survive**: no two clients believed they held one lock at the same time
//!   (a client counts its lease valid until TTL after it *sent* its last confirmed acquire or
//!   renewal, so a grant to someone else inside that window means an acknowledged lease was
//!   lost or cut short across a leader change);
//! - **P8, nothing acknowledged is lost**: every granted epoch is at most the epoch counter
//!   every member holds after recovery;
//! - **recovery**: after healing, a leader serves an acquire within 10 s, and once the clients
//!   stop every member applies the same state.
//!
//! Determinism: election timeouts come from the seed (`cluster::runtime`), every task runs on
//! one thread under tokio's paused clock, and every delay, drop and fault is drawn from the
//! seed. The one source not under the seed is tokio's own `select!` fairness, which matters
//! only when two branches are ready at the same instant; [`run`] reports the trace hash so a
//! rerun shows whether it replayed.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod disk;
mod network;
mod world;

use std::collections::BTreeMap;

use palisade_history::{check, History, Mode, Outcome, Summary, Violation};
use serde::Serialize;

pub use disk::{Disk, DiskHandle};
pub use network::{Endpoint, Introductions, NetStats, Router};

/// What a run simulates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterSimConfig {
    /// Members: 3 or 5.
    pub members: usize,
    /// Simulated clients.
    pub clients: usize,
    /// Locks they contend for.
    pub locks: usize,
    /// Simulated time with faults and clients, ms (recovery comes after it).
    pub duration_ms: u64,
    /// Plant a bug: every disk's fsync is a no-op, so a crash loses acknowledged entries.
    pub plant_lying_fsync: bool,
    /// Half the crashes also lose the member's whole disk (an operator wipes its data
    /// directory, a replaced machine): it restarts empty with the same flags.
    pub wipe_on_crash: bool,
    /// Found the cluster with member 1 alone and add every other member as an operator would:
    /// start it with `--join`, `palisade cluster add` (a member added this way talks to the
    /// leader only until it is a voter).
    pub join_members: bool,
    /// Crashes alternate between copying the member's disk (`cp -a` of its stopped data
    /// directory) and, in half of the later ones, putting that older copy back (P6): its
    /// witness refuses the start, and the operator wipes and re-adds it.
    pub copy_back_on_crash: bool,
    /// Plant a bug: a member put back to an older copy starts from it (no witness).
    pub plant_no_witness: bool,
    /// With `copy_back_on_crash`: the copy is of the member's whole volume — its disk *and*
    /// its witness — and both are put back together (a VM or disk snapshot restore), so the
    /// member starts from the older state and nothing on it refuses.
    pub rollback_volumes: bool,
    /// Where the members' wall clocks start, in ms since 1970 (each then skewed by a few ms).
    /// 0 with [`Self::frozen_clocks`]: the clocks read 0 throughout.
    pub wall_clock_origin_ms: u64,
    /// The members' clocks never move from `wall_clock_origin_ms` (the Raft store's
    /// conformance suite, which counts epochs from 0: no clock floor above 0 then).
    pub frozen_clocks: bool,
}

impl Default for ClusterSimConfig {
    fn default() -> Self {
        Self {
            members: 3,
            clients: 4,
            locks: 3,
            duration_ms: 15_000,
            plant_lying_fsync: false,
            wipe_on_crash: false,
            join_members: false,
            copy_back_on_crash: false,
            plant_no_witness: false,
            rollback_volumes: false,
            wall_clock_origin_ms: 1_800_000_000_000,
            frozen_clocks: false,
        }
    }
}

impl ClusterSimConfig {
    /// The default run for `members` (3 or 5): 5 members run longer, so that every one of
    /// them crashes and restarts.
    pub fn for_members(members: usize) -> Self {
        Self {
            members,
            duration_ms: if members >= 5 { 20_000 } else { 15_000 },
            ..Self::default()
        }
    }
}

/// Faults injected in one run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ClusterFaults {
    /// Member crashes (each followed by a restart).
    pub crashes: u64,
    /// The serving leader cut off from every other member.
    pub leader_isolations: u64,
    /// A minority cut off from the rest.
    pub minority_partitions: u64,
    /// One direction of one link cut.
    pub one_way_cuts: u64,
    /// Every member cut off from every other.
    pub majority_losses: u64,
    /// Distinct members that crashed (and restarted) at least once.
    pub members_crashed: u64,
    /// Crashes that also lost the member's disk.
    pub wipes: u64,
    /// Crashes after which an older copy of the member's disk was put back.
    pub copy_backs: u64,
    /// Of those, starts the member's witness refused (then wiped and re-added).
    pub copy_backs_refused: u64,
}

impl ClusterFaults {
    /// All faults of the run.
    pub fn total(&self) -> u64 {
        self.crashes
            + self.leader_isolations
            + self.minority_partitions
            + self.one_way_cuts
            + self.majority_losses
    }
}

/// A client's ownership of a lock, as the client believed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Hold {
    /// The lock.
    pub lock: String,
    /// The epoch of its lease.
    pub epoch: u64,
    /// The client.
    pub holder: String,
    /// When the grant reached it, ms.
    pub from_ms: u64,
    /// When it stopped believing it held the lock (release sent, or TTL after its last
    /// confirmed renewal was sent), ms.
    pub until_ms: u64,
}

/// The result of one seed.
#[derive(Debug, Clone)]
pub struct ClusterSimReport {
    /// The seed.
    pub seed: u64,
    /// Members.
    pub members: usize,
    /// FNV-1a over every traced event and its time.
    pub trace_hash: u64,
    /// Events traced.
    pub events: u64,
    /// The traced events, `TIME_US EVENT`, in order (faults, starts, crashes, client outcomes).
    pub trace: Vec<String>,
    /// Faults injected.
    pub faults: ClusterFaults,
    /// Raft messages delivered and lost.
    pub messages: NetStats,
    /// fsyncs of all simulated disks.
    pub syncs: u64,
    /// Leader terms that started serving (`LeaderStart` entries).
    pub leader_starts: u64,
    /// The acquire history.
    pub history: History,
    /// What clients believed they held.
    pub holds: Vec<Hold>,
    /// The epoch counter every member agreed on after recovery.
    pub final_epoch: u64,
    /// For each crash of the serving leader: time until another member served, ms (crashes
    /// that the member outlived by restarting first are not counted).
    pub failovers_ms: Vec<u64>,
    /// Time from the last heal to the first acquire served, ms.
    pub recovery_ms: Option<u64>,
    /// The P1 checker's verdict.
    pub verdict: Result<Summary, Violation>,
    /// Violations of P8 and of recovery, for people.
    pub violations: Vec<String>,
}

impl ClusterSimReport {
    /// Grants in the history.
    pub fn grants(&self) -> usize {
        self.history
            .entries
            .iter()
            .filter(|e| matches!(e.outcome, Outcome::Granted { .. }))
            .count()
    }

    /// `Ok` when every check passed; else every violation, for people.
    pub fn outcome(&self) -> Result<(), String> {
        let mut problems = Vec::new();
        if let Err(violation) = &self.verdict {
            problems.push(violation.excerpt(&self.history));
        }
        problems.extend(self.violations.iter().cloned());
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("\n"))
        }
    }
}

thread_local! {
    /// Panics on this thread since the run began (a panicking task is otherwise silent).
    static PANICS: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Records every panic of a simulation thread, then lets the previous hook print it.
fn watch_panics() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let _ = PANICS.try_with(|panics| panics.borrow_mut().push(info.to_string()));
            previous(info);
        }));
    });
    PANICS.with(|panics| panics.borrow_mut().clear());
}

/// A single-threaded runtime whose clock is paused (it jumps to the next timer when idle).
fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime")
}

/// Runs one seed on a fresh single-threaded runtime with a paused clock.
pub fn run(seed: u64, config: ClusterSimConfig) -> ClusterSimReport {
    assert!(
        config.members == 3 || config.members == 5,
        "a simulated cluster has 3 or 5 members"
    );
    let runtime = paused_runtime();
    watch_panics();
    palisade_server::cluster::runtime::seed_election_timers(seed);
    let mut report = runtime.block_on(simulate(seed, config));
    drop(runtime);
    palisade_server::cluster::runtime::unseed_election_timers();
    let panics = PANICS.with(|panics| std::mem::take(&mut *panics.borrow_mut()));
    report
        .violations
        .extend(panics.into_iter().map(|p| format!("a task panicked: {p}")));
    report
}

async fn simulate(seed: u64, config: ClusterSimConfig) -> ClusterSimReport {
    let mut cluster = world::Cluster::new(seed, &config);
    let mut violations = Vec::new();
    if let Err(error) = cluster.form().await {
        violations.push(error);
    }
    let clients: Vec<_> = (0..config.clients)
        .map(|i| tokio::spawn(world::client(cluster.shared.clone(), i, config.locks)))
        .collect();
    if let Err(error) = cluster.drive_faults(config.duration_ms).await {
        violations.push(error);
    }
    let recovery = cluster.recover().await;
    cluster.stop_clients();
    for client in clients {
        let _ = client.await;
    }
    let recovery_ms = match recovery {
        Ok(ms) => Some(ms),
        Err(error) => {
            violations.push(format!("recovery: {error}"));
            None
        }
    };
    if let Err(error) = cluster.settle().await {
        violations.push(format!("recovery: the members did not converge: {error}"));
    }
    let shared = cluster.shared.clone();
    let history = shared.history.lock().expect("not poisoned").clone();
    let holds = shared.holds.lock().expect("not poisoned").clone();
    violations.extend(cluster.stopped_rafts());
    let final_epoch = cluster.last_epoch();
    violations.extend(check_holds(&holds));
    violations.extend(check_durable(&history, final_epoch));
    let verdict = check(&history, Mode::Strict);
    let (trace_hash, events) = shared.trace_hash();
    let report = ClusterSimReport {
        seed,
        members: config.members,
        trace_hash,
        events,
        trace: shared.log.lock().expect("not poisoned").clone(),
        faults: cluster.faults,
        messages: cluster.messages(),
        syncs: cluster.syncs(),
        leader_starts: cluster.leader_starts(),
        history,
        holds,
        final_epoch,
        failovers_ms: cluster.failovers_ms.clone(),
        recovery_ms,
        verdict,
        violations,
    };
    cluster.shutdown().await;
    report
}

/// P8: no two clients believed they held one lock at once.
pub fn check_holds(holds: &[Hold]) -> Vec<String> {
    let mut by_lock: BTreeMap<&str, Vec<&Hold>> = BTreeMap::new();
    for hold in holds.iter().filter(|h| h.until_ms > h.from_ms) {
        by_lock.entry(&hold.lock).or_default().push(hold);
    }
    let mut violations = Vec::new();
    for (lock, mut holds) in by_lock {
        holds.sort_by_key(|h| (h.from_ms, h.epoch));
        for pair in holds.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            if a.epoch != b.epoch && b.from_ms < a.until_ms {
                violations.push(format!(
                    "P8: two clients held {lock} at once: {} while {}",
                    world::describe(b),
                    world::describe(a)
                ));
            }
        }
    }
    violations
}

/// P8: every granted epoch is covered by the epoch counter every member holds.
pub fn check_durable(history: &History, final_epoch: u64) -> Vec<String> {
    history
        .entries
        .iter()
        .filter_map(|entry| match entry.outcome {
            Outcome::Granted { epoch } if epoch > final_epoch => Some(format!(
                "P8: epoch {epoch} was granted ({entry}) but the recovered cluster's counter is \
                 {final_epoch}"
            )),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use palisade_server::engine::CoordinatorError;

    /// Polls `ready` every 10 ms of simulated time, for at most `limit_ms`.
    async fn eventually<T>(limit_ms: u64, mut ready: impl FnMut() -> Option<T>) -> Option<T> {
        for _ in 0..limit_ms / 10 {
            if let Some(value) = ready() {
                return Some(value);
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        None
    }

    /// A 3-member cluster for `seed`, once one of them leads and serves.
    async fn three_members(seed: u64) -> (world::Cluster, u64) {
        let mut cluster = world::Cluster::new(seed, &ClusterSimConfig::default());
        for id in 1..=3 {
            cluster.start(id).await.unwrap();
        }
        let leader = eventually(5_000, || cluster.serving_leader())
            .await
            .expect("a first leader");
        (cluster, leader)
    }

    fn request(lock: &str) -> palisade_core::AcquireRequest {
        palisade_core::AcquireRequest {
            lock: palisade_core::LockName::new(lock).unwrap(),
            holder: palisade_core::HolderId::new("h").unwrap(),
            principal: palisade_core::Principal::anonymous(),
            ttl_ms: 1_000,
            wait_ms: 0,
            class: palisade_core::LockClass::Critical,
            request_id: None,
        }
    }

    #[test]
    fn p1_p8_without_a_majority_no_member_grants_and_all_answer_unavailable() {
        paused_runtime().block_on(async {
            let (mut cluster, leader) = three_members(5).await;
            cluster.isolate_all();
            // The leader cannot commit: the acquire it takes fails (after COMMIT_TIMEOUT).
            let answer = cluster
                .gateway(leader)
                .unwrap()
                .acquire(request("nomajority/a"))
                .await;
            assert!(
                matches!(answer, Err(CoordinatorError::Unavailable(_))),
                "{answer:?}"
            );
            // Past QUORUM_LOSS_MS every member refuses at once (503), none grants.
            tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
            for id in 1..=3 {
                let answer = cluster
                    .gateway(id)
                    .unwrap()
                    .acquire(request("nomajority/b"))
                    .await;
                assert!(
                    matches!(
                        answer,
                        Err(CoordinatorError::Unavailable(_) | CoordinatorError::NotLeader { .. })
                    ),
                    "node {id}: {answer:?}"
                );
            }
            assert_eq!(cluster.serving_leader(), None);
            // Healed, a leader serves again, above every earlier epoch.
            cluster.heal_all();
            let next = eventually(5_000, || cluster.serving_leader())
                .await
                .expect("a leader after healing");
            let granted = cluster
                .gateway(next)
                .unwrap()
                .acquire(request("nomajority/b"))
                .await
                .expect("granted once a majority is back");
            assert!(granted.epoch.0 >= 1);
            cluster.shutdown().await;
        });
    }

    #[test]
    fn p8_a_deposed_leader_never_answers_from_state_another_leader_moved_on_from() {
        // The old leader is cut off; another is elected and grants a lock. Before, the old
        // leader kept answering reads (describe, `Held` refusals) from its own state until it
        // had heard from no majority for QUORUM_LOSS_MS (1 s), longer than the others take to
        // elect a leader (450–600 ms): it said the lock was free while another held it.
        for seed in [11, 12, 13] {
            paused_runtime().block_on(async {
                let (mut cluster, old) = three_members(seed).await;
                let held = cluster
                    .gateway(old)
                    .unwrap()
                    .acquire(request("deposed/held"))
                    .await
                    .expect("granted by the first leader");
                cluster.isolate_member(old);
                let new = eventually(5_000, || cluster.serving_leader().filter(|l| *l != old))
                    .await
                    .expect("another leader");
                let granted = cluster
                    .gateway(new)
                    .unwrap()
                    .acquire(request("deposed/free"))
                    .await
                    .expect("granted by the new leader");
                let lock = palisade_core::LockName::new("deposed/free").unwrap();
                let old_gateway = cluster.gateway(old).unwrap();
                match old_gateway.describe(lock).await {
                    Err(CoordinatorError::Unavailable(_) | CoordinatorError::NotLeader { .. }) => {}
                    other => panic!(
                        "seed {seed}: the deposed leader answered {other:?} while node {new} \
                         holds the lock at epoch {}",
                        granted.epoch
                    ),
                }
                let refused = old_gateway.acquire(request("deposed/held")).await;
                assert!(
                    matches!(
                        refused,
                        Err(CoordinatorError::Unavailable(_) | CoordinatorError::NotLeader { .. })
                    ),
                    "seed {seed}: the deposed leader answered {refused:?} about the lease at \
                     epoch {}",
                    held.epoch
                );
                cluster.shutdown().await;
            });
        }
    }

    #[test]
    fn p8_a_member_whose_disk_fills_stops_serving_and_says_why() {
        paused_runtime().block_on(async {
            let (mut cluster, leader) = three_members(3).await;
            cluster.fill_disk(leader);
            let gateway = cluster.gateway(leader).unwrap();
            let answer = gateway.acquire(request("full/a")).await;
            assert!(answer.is_err(), "granted with a full disk: {answer:?}");
            let mut outcome = None;
            for _ in 0..500 {
                outcome = cluster.stopped(leader).await;
                if outcome.is_some() {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            let error = outcome
                .expect("the member stops")
                .expect_err("and reports the failure");
            assert!(error.contains("fatal"), "{error}");
            assert!(gateway.not_serving().is_some(), "it no longer serves");
            // The two others elect a leader that grants.
            let next = eventually(5_000, || cluster.serving_leader())
                .await
                .expect("a new leader");
            assert_ne!(next, leader);
            let granted = cluster
                .gateway(next)
                .unwrap()
                .acquire(request("full/a"))
                .await;
            assert!(granted.is_ok(), "{granted:?}");
            cluster.shutdown().await;
        });
    }

    fn hold(lock: &str, epoch: u64, from_ms: u64, until_ms: u64) -> Hold {
        Hold {
            lock: lock.into(),
            epoch,
            holder: format!("c{epoch}"),
            from_ms,
            until_ms,
        }
    }

    #[test]
    fn overlapping_holds_of_one_lock_are_a_p8_violation() {
        let holds = [hold("a", 1, 0, 100), hold("a", 2, 90, 200)];
        assert_eq!(check_holds(&holds).len(), 1);
    }

    #[test]
    fn consecutive_holds_and_other_locks_are_not() {
        let holds = [
            hold("a", 1, 0, 100),
            hold("a", 2, 100, 200),
            hold("b", 3, 50, 150),
        ];
        assert!(check_holds(&holds).is_empty());
    }

    #[test]
    fn a_grant_above_the_recovered_counter_is_a_lost_acknowledgement() {
        let mut history = History::default();
        history.push(palisade_history::Entry {
            process: "c0".into(),
            lock: "a".into(),
            op: palisade_history::Op::Acquire,
            invoked: 0,
            completed: 1,
            outcome: Outcome::Granted { epoch: 9 },
        });
        assert!(check_durable(&history, 9).is_empty());
        assert_eq!(check_durable(&history, 8).len(), 1);
    }

    /// Introduces a node that exists only in this answer: it never answers Raft. Isolates the
    /// membership logic from a node's behaviour (the real introducers are tested with real
    /// members: the simulation's network here, gRPC in `cli/tests/it/cluster.rs`).
    struct Phantom;

    impl palisade_server::cluster::membership::Introducer for Phantom {
        fn introduce(
            &self,
            _node: palisade_server::cluster::NodeId,
            _addr: &str,
        ) -> palisade_server::cluster::membership::Introducing {
            Box::pin(async {
                Ok(palisade_server::cluster::membership::Introduction {
                    node_id: 4,
                    store: "44444444444444444444444444444444".into(),
                    holds_log: false,
                    last_log: None,
                    vote: None,
                })
            })
        }
    }

    fn voters(raft: &palisade_server::cluster::RaftNode) -> Vec<u64> {
        raft.metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .collect()
    }

    #[test]
    fn p1_p8_a_member_that_cannot_catch_up_never_votes_and_the_cluster_keeps_serving() {
        // Before, `cluster add` of an unreachable address made it a voter at once (openraft's
        // blocking add_learner ignores its own wait's outcome): three such adds took the
        // majority away from a 3-member cluster for good, and even DELETE answered 503.
        use palisade_server::cluster::membership::Changes;
        use palisade_server::cluster::MembershipError;
        paused_runtime().block_on(async {
            let (mut cluster, _) = three_members(21).await;
            for attempt in 0..3 {
                let leader = eventually(5_000, || cluster.serving_leader())
                    .await
                    .expect("a leader");
                let (_, raft) = cluster.member(leader).unwrap();
                let changes = Changes::with_timeouts(
                    raft.clone(),
                    Arc::new(Phantom),
                    std::time::Duration::from_secs(3),
                    std::time::Duration::from_secs(3),
                );
                match changes.add(4, "127.0.0.1:7004").await {
                    Err(MembershipError::CatchUpTimeout { id: 4, .. }) => {}
                    // The leader changed during the change: refused, never a voter.
                    Err(MembershipError::Raft(_) | MembershipError::CommitTimeout { .. }) => {}
                    other => panic!("attempt {attempt}: {other:?}"),
                }
                assert_eq!(voters(&raft), vec![1, 2, 3], "attempt {attempt}");
            }
            // Whatever is left of node 4 is a learner; a serving leader removes it, and grants.
            let leader = eventually(5_000, || cluster.serving_leader())
                .await
                .expect("a leader");
            let (real, raft) = cluster.member(leader).unwrap();
            if raft
                .metrics()
                .borrow()
                .membership_config
                .membership()
                .get_node(&4)
                .is_some()
            {
                real.remove(4).await.unwrap();
            }
            assert_eq!(voters(&raft), vec![1, 2, 3]);
            let granted = cluster
                .gateway(leader)
                .unwrap()
                .acquire(request("members/after"))
                .await;
            assert!(granted.is_ok(), "{granted:?}");
            // An address where nobody answers is refused before anything changes.
            let unreachable = real.add(4, "127.0.0.1:7004").await;
            assert!(
                matches!(unreachable, Err(MembershipError::Unreachable { .. })),
                "{unreachable:?}"
            );
            // So is the address of another node.
            let wrong = real.add(5, "127.0.0.1:7002").await;
            assert!(
                matches!(wrong, Err(MembershipError::WrongNode(_))),
                "{wrong:?}"
            );
            cluster.shutdown().await;
        });
    }

    #[test]
    fn membership_changes_run_one_at_a_time() {
        // Before, add and remove rebuilt the voter set from a read taken before the change, so
        // two changes at once could undo each other.
        use palisade_server::cluster::membership::Changes;
        use palisade_server::cluster::MembershipError;
        paused_runtime().block_on(async {
            let (mut cluster, leader) = three_members(22).await;
            let (_, raft) = cluster.member(leader).unwrap();
            let changes = Arc::new(Changes::with_timeouts(
                raft.clone(),
                Arc::new(Phantom),
                std::time::Duration::from_secs(2),
                std::time::Duration::from_secs(2),
            ));
            let slow = tokio::spawn({
                let changes = changes.clone();
                async move { changes.add(4, "127.0.0.1:7004").await }
            });
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            let other = if leader == 3 { 2 } else { 3 };
            assert_eq!(changes.remove(other).await, Err(MembershipError::Busy));
            assert!(slow.await.unwrap().is_err());
            assert_eq!(voters(&raft), vec![1, 2, 3]);
            // Once the first change is over, the next one runs.
            assert!(changes.remove(other).await.is_ok());
            let remaining: Vec<u64> = (1..=3).filter(|id| *id != other).collect();
            assert_eq!(voters(&raft), remaining);
            cluster.shutdown().await;
        });
    }

    /// The configurations of `raft`'s membership: one when uniform, two when joint.
    fn configs(raft: &palisade_server::cluster::RaftNode) -> Vec<Vec<u64>> {
        raft.metrics()
            .borrow()
            .membership_config
            .membership()
            .get_joint_config()
            .iter()
            .map(|config| config.iter().copied().collect())
            .collect()
    }

    #[test]
    fn p8_a_joint_membership_left_by_a_deposed_leader_is_finished_by_the_next() {
        // openraft commits a change in two steps; a leader deposed between them leaves the
        // cluster joint, where every decision needs a majority of both configurations. Seed
        // 9,000,792 (--wipe) lost a third member in that state and could never commit again:
        // an `add` retried after the joint step saw the node among the voters and returned.
        // Now the next leader finishes the change and `add` counts only uniform voters.
        paused_runtime().block_on(async {
            let config = ClusterSimConfig::for_members(5);
            let mut cluster = world::Cluster::new(41, &config);
            cluster.form().await.unwrap();
            // Past the founding elections.
            tokio::time::sleep(std::time::Duration::from_secs(3)).await;
            let leader = eventually(5_000, || cluster.serving_leader().filter(|l| *l != 5))
                .await
                .expect("seed 41 elects a leader other than 5");
            let (changes, raft) = cluster.member(leader).unwrap();
            let before = raft.metrics().borrow().last_log_index.unwrap_or(0);
            let removal = tokio::spawn(async move { changes.remove(5).await });
            // The moment the joint step (the next entry) is applied on the leader, it is cut
            // off: the second step never commits under it.
            let joint = raft
                .wait(Some(std::time::Duration::from_secs(5)))
                .applied_index_at_least(Some(before + 1), "the joint step applied")
                .await;
            assert!(joint.is_ok(), "the removal reached its joint step");
            cluster.isolate_member(leader);
            let others: Vec<u64> = (1..=5).filter(|id| *id != leader).collect();
            let (_, follower) = cluster.member(others[0]).unwrap();
            assert!(
                removal.await.unwrap().is_err(),
                "the second step did not commit under the deposed leader"
            );
            let finished = eventually(10_000, || {
                (configs(&follower) == vec![vec![1, 2, 3, 4]]
                    && cluster.serving_leader().is_some_and(|l| l != leader))
                .then_some(())
            })
            .await;
            assert!(
                finished.is_some(),
                "the next leader finished the removal: {:?}",
                configs(&follower)
            );
            cluster.shutdown().await;
        });
    }

    #[test]
    fn p1_a_member_that_missed_a_remove_and_add_admits_the_new_store() {
        // Member 5 is cut off while member 3 loses its disk and is removed and added back with
        // a new store. Before, 5 kept 3's old store id (it learned ids from first messages and
        // forgot them only when it applied a membership without 3, which it may never see on
        // its own: it can apply "remove 3" and "add 3" in one batch) and refused the new 3 for
        // good. Now it checks the replicated membership it catches up to.
        paused_runtime().block_on(async {
            let config = ClusterSimConfig::for_members(5);
            let mut cluster = world::Cluster::new(31, &config);
            cluster.form().await.unwrap();
            let leader = eventually(5_000, || {
                cluster.serving_leader().filter(|l| *l != 5 && *l != 3)
            })
            .await;
            let Some(_) = leader else {
                // The seed elected 3 or 5: the case needs another leader.
                cluster.shutdown().await;
                panic!("seed 31 must elect a leader other than 3 and 5");
            };
            cluster.isolate_member(5);
            cluster.wipe_and_readd(3).await.unwrap();
            cluster.heal_all();
            let (_, raft5) = cluster.member(5).unwrap();
            let (_, raft3) = cluster.member(3).unwrap();
            let store3 = raft3
                .metrics()
                .borrow()
                .membership_config
                .membership()
                .get_node(&3)
                .cloned();
            let caught_up = eventually(5_000, || {
                let m = raft5
                    .metrics()
                    .borrow()
                    .membership_config
                    .membership()
                    .get_node(&3)
                    .cloned();
                (m.is_some() && m == store3).then_some(())
            })
            .await;
            assert!(caught_up.is_some(), "member 5 caught up with 3's new store");
            // Now only 3, 4 and 5 are left: 5 must take 3's messages for them to elect.
            for gone in [1, 2] {
                cluster.crash(gone).await;
            }
            let next = eventually(10_000, || cluster.serving_leader()).await;
            assert!(next.is_some(), "3, 4 and 5 elect a leader");
            let granted = cluster
                .gateway(next.unwrap())
                .unwrap()
                .acquire(request("members/readded"))
                .await;
            assert!(granted.is_ok(), "{granted:?}");
            cluster.shutdown().await;
        });
    }

    #[test]
    fn p1_a_member_whose_history_a_rolled_back_majority_lost_refuses_it_and_never_panics() {
        // Member 2's whole volume (disk and witness) is snapshotted; 3 goes down and 1 + 2
        // grant; 1 goes down, 2's snapshot is put back, and 2 + 3 — both behind — form a
        // majority and grant again: above every earlier epoch (the clock floor). Then 1, which
        // holds the lost history, rejoins: its log conflicts with entries it applied. openraft
        // 0.9 panicked there (index out of bounds applying an empty range); now its store
        // refuses the truncation, its Raft stops with that error, and nothing panics.
        paused_runtime().block_on(async {
            let mut cluster = world::Cluster::new(43, &ClusterSimConfig::default());
            cluster.form().await.unwrap();
            let mut issued = Vec::new();
            async fn acquire(cluster: &world::Cluster, lock: &str) -> palisade_core::Epoch {
                let leader = eventually(10_000, || cluster.serving_leader())
                    .await
                    .expect("a serving leader");
                cluster
                    .gateway(leader)
                    .unwrap()
                    .acquire(request(lock))
                    .await
                    .expect("granted")
                    .epoch
            }
            issued.push(acquire(&cluster, "rollback/a").await);
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            cluster.crash(2).await;
            let snapshot = cluster.snapshot_volume(2);
            cluster.start(2).await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            cluster.crash(3).await;
            for n in 0..5 {
                issued.push(acquire(&cluster, &format!("rollback/b{n}")).await);
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            cluster.crash(1).await;
            cluster.crash(2).await;
            cluster.put_back_volume(2, snapshot);
            cluster.start(2).await.unwrap();
            cluster.start(3).await.unwrap();
            let highest = *issued.iter().max().unwrap();
            let next = acquire(&cluster, "rollback/c").await;
            assert!(next > highest, "P1: {next} issued again or below {highest}");
            // Member 1 rejoins with the history the others lost: it refuses the leader's
            // entries, keeps its history, and nothing panics.
            cluster.start(1).await.unwrap();
            let (_, raft1) = cluster.member(1).unwrap();
            let applied = raft1.metrics().borrow().last_applied;
            tokio::time::sleep(std::time::Duration::from_secs(3)).await;
            assert!(cluster.raft_runs(1), "{:?}", cluster.raft_error(1));
            assert!(
                cluster.messages().diverged > 0,
                "the leader's entries were refused"
            );
            assert_eq!(raft1.metrics().borrow().last_applied, applied);
            // The other two go on serving, above everything.
            let after = acquire(&cluster, "rollback/d").await;
            assert!(after > next);
            cluster.shutdown().await;
        });
    }

    #[test]
    fn p8_a_member_put_back_does_not_vote_a_lagging_member_in_before_it_catches_up() {
        // Member 2's whole volume is snapshotted; 3 is down while 1 + 2 grant; then 2's
        // snapshot is put back and 2 and 3 start while 1 is cut off for 2 s. 2 + 3 are a
        // majority that lacks the grants 1 + 2 committed: had 2 voted from its older disk, 3
        // would lead without them and 1 would have to refuse its entries. 2 is on probation
        // (restarted with a log, not caught up): it neither votes nor campaigns, so nobody
        // leads until 1 is back, and then 1 leads and every member converges on its history.
        paused_runtime().block_on(async {
            let (mut cluster, _) = three_members(11).await;
            async fn acquire(cluster: &world::Cluster, lock: &str) -> palisade_core::Epoch {
                let leader = eventually(10_000, || cluster.serving_leader())
                    .await
                    .expect("a serving leader");
                cluster
                    .gateway(leader)
                    .unwrap()
                    .acquire(request(lock))
                    .await
                    .expect("granted")
                    .epoch
            }
            acquire(&cluster, "probation/a").await;
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            cluster.crash(2).await;
            let snapshot = cluster.snapshot_volume(2);
            cluster.start(2).await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            cluster.crash(3).await;
            let mut issued = Vec::new();
            for n in 0..5 {
                issued.push(acquire(&cluster, &format!("probation/b{n}")).await);
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            cluster.crash(2).await;
            cluster.put_back_volume(2, snapshot);
            cluster.isolate_member(1);
            cluster.start(3).await.unwrap();
            cluster.start(2).await.unwrap();
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            assert_eq!(
                cluster.serving_leader(),
                None,
                "2 + 3 formed a majority without the entries 1 + 2 committed"
            );
            cluster.heal_all();
            let next = acquire(&cluster, "probation/c").await;
            assert!(next > *issued.iter().max().unwrap());
            cluster.settle().await.expect("every member converges");
            assert_eq!(
                cluster.messages().diverged,
                0,
                "no member refused a history"
            );
            assert!(cluster.last_epoch() >= next.0, "P8: every grant is kept");
            cluster.shutdown().await;
        });
    }

    #[test]
    fn p8_a_member_put_back_votes_no_lagging_member_in_while_it_hears_the_holder() {
        // As above, but 1 (which holds the grants 1 + 2 committed) is cut off from 3 only, for
        // longer than the probation's timeout, and 2 — put back — hears both. 3 lacks the
        // grants and campaigns; 2's census hears 1's log, so 2 votes only for a candidate at
        // or above it (without the census, 2 would vote for whichever candidate asked first
        // once its probation timed out): nothing is lost and no member diverges. The floor's
        // rule itself is `identity.rs`'s `p8_a_restarted_member_votes_only_above…`; across
        // the simulation's fresh --rollback seeds it cut the failures from 48 to 17 of 2,000.
        paused_runtime().block_on(async {
            let (mut cluster, _) = three_members(12).await;
            async fn acquire(cluster: &world::Cluster, lock: &str) -> palisade_core::Epoch {
                let leader = eventually(10_000, || cluster.serving_leader())
                    .await
                    .expect("a serving leader");
                cluster
                    .gateway(leader)
                    .unwrap()
                    .acquire(request(lock))
                    .await
                    .expect("granted")
                    .epoch
            }
            acquire(&cluster, "census/a").await;
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            cluster.crash(2).await;
            let snapshot = cluster.snapshot_volume(2);
            cluster.start(2).await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            cluster.crash(3).await;
            let mut issued = Vec::new();
            for n in 0..5 {
                issued.push(acquire(&cluster, &format!("census/b{n}")).await);
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            cluster.crash(1).await;
            cluster.crash(2).await;
            cluster.put_back_volume(2, snapshot);
            cluster.start(1).await.unwrap();
            cluster.cut_between(1, 3);
            cluster.start(3).await.unwrap();
            cluster.start(2).await.unwrap();
            tokio::time::sleep(std::time::Duration::from_secs(8)).await;
            cluster.heal_all();
            let next = acquire(&cluster, "census/c").await;
            assert!(next > *issued.iter().max().unwrap());
            cluster.settle().await.expect("every member converges");
            assert!(cluster.raft_runs(1), "{:?}", cluster.raft_error(1));
            assert_eq!(
                cluster.messages().diverged,
                0,
                "no member refused a history"
            );
            assert!(cluster.last_epoch() >= next.0, "P8: every grant is kept");
            cluster.shutdown().await;
        });
    }

    /// The Raft store of cluster mode under the `LeaseStore` conformance suite: a 3-member
    /// simulated cluster; a restart is a power cut of every member (unsynced writes lost) and
    /// a store over the new leader once it serves (its `LeaderStart` applied).
    struct RaftHarness(Option<world::Cluster>);

    impl RaftHarness {
        fn new() -> Self {
            Self(None)
        }

        async fn leader_store(
            cluster: &world::Cluster,
        ) -> palisade_server::cluster::RaftLeaseStore {
            let leader = eventually(10_000, || cluster.serving_leader())
                .await
                .expect("a serving leader");
            cluster.lease_store(leader).expect("the leader runs")
        }
    }

    impl palisade_server::store_conformance::Harness for RaftHarness {
        type Store = palisade_server::cluster::RaftLeaseStore;

        async fn open(&mut self) -> Self::Store {
            // Clocks frozen at 0: the suite counts epochs from 0, and the clock floor (tested
            // by the engine's and the simulation's own runs) would start them at 2^61.
            let sim = ClusterSimConfig {
                wall_clock_origin_ms: 0,
                frozen_clocks: true,
                ..ClusterSimConfig::default()
            };
            let mut cluster = world::Cluster::new(41, &sim);
            cluster.form().await.unwrap();
            let store = Self::leader_store(&cluster).await;
            self.0 = Some(cluster);
            store
        }

        async fn restart(&mut self, store: Self::Store) -> Self::Store {
            drop(store);
            let cluster = self.0.as_mut().expect("opened");
            cluster.power_cut().await.unwrap();
            Self::leader_store(cluster).await
        }
    }

    mod raft_store {
        use super::*;
        palisade_server::lease_store_suite!(RaftHarness::new(), |case| paused_runtime()
            .block_on(case));
    }
}
