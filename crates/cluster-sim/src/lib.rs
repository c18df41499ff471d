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
//! - **liveness**: while a majority is up and connected, something is granted at least every
//!   [`LIVENESS_BOUND_MS`];
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
use std::sync::{Arc, Mutex};

use palisade_history::{check, History, Mode, Outcome, Summary, Violation};
use serde::Serialize;

pub use disk::{Disk, DiskHandle, Volume};
pub use network::{Endpoint, Introductions, NetStats, Router};
use world::liveness::Stalls;
pub use world::liveness::LIVENESS_BOUND_MS;
pub use world::ClockFaults;

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
    /// A crash lands inside the member's next Raft log write (within 500 ms) and the disk
    /// keeps a random subset of that write's 512-byte sectors (`disk.rs`).
    pub torn_sectors: bool,
    /// Whole-volume copies (disk and witness, as a VM snapshot) of running members taken at
    /// any instant — right after a founding member starts (before its first vote), between a
    /// `--join` start and its first append, during the founding elections, and at random
    /// moments later — each put back at a later crash of its member half of the time.
    pub copy_anytime: bool,
    /// Half the network faults are clock faults instead: members' clocks jump ahead and back,
    /// within and beyond the maximum offset, drift, or a majority's jump ahead together
    /// (`world::ClockFaults`).
    pub clock_faults: bool,
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
            torn_sectors: false,
            copy_anytime: false,
            clock_faults: false,
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
    /// Crashes that landed inside a Raft log write and kept a random subset of its sectors.
    pub torn_sector_crashes: u64,
    /// Of those, a lost sector before a kept one (a record lost, a later one of the same
    /// append kept).
    pub torn_sectors_out_of_order: u64,
    /// `--copy-anytime` copies, by the instant they were taken, and put-backs.
    pub anytime: AnytimeCopies,
    /// `palisade cluster lost` declarations the fault driver made, as an operator would: a
    /// member's census waited for a member whose store was gone for good (being re-added).
    pub lost_declarations: u64,
    /// Clock faults, by kind (`--clock-faults`).
    pub clock: ClockFaults,
    /// Volumes not put back (nor wiped) at a crash because fewer than a majority of the other
    /// members held the cluster's history then: a majority gone back together needs an
    /// operator's restore (`palisade restore --cluster`), which these runs do not make.
    pub put_backs_held: u64,
}

/// The whole-volume copies of `--copy-anytime`, by what the member had done when each was
/// taken, and the copies put back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct AnytimeCopies {
    /// Taken before the member's first vote (empty log, no vote; not started with `--join`).
    pub before_first_vote: u64,
    /// Taken between a `--join` start and the member's first append (empty log, no vote).
    pub before_first_append: u64,
    /// Taken after a vote but before any entry.
    pub voted_without_entry: u64,
    /// Taken with a log.
    pub with_log: u64,
    /// Copies put back at a crash of their member.
    pub put_back: u64,
    /// Of those, copies with an empty log (the first three kinds).
    pub put_back_empty: u64,
}

impl ClusterFaults {
    /// All faults of the run.
    pub fn total(&self) -> u64 {
        self.crashes
            + self.leader_isolations
            + self.minority_partitions
            + self.one_way_cuts
            + self.majority_losses
            + self.clock.total()
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
    /// The longest time a majority of members was up and connected but nothing was granted,
    /// ms (past [`LIVENESS_BOUND_MS`] it is a violation).
    pub longest_stall_ms: u64,
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
    palisade_cluster::runtime::seed_election_timers(seed);
    let mut report = runtime.block_on(simulate(seed, config));
    drop(runtime);
    palisade_cluster::runtime::unseed_election_timers();
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
    let stalls = Arc::new(Mutex::new(Stalls::default()));
    let watchdog = tokio::spawn(world::liveness::watch(
        cluster.shared.clone(),
        cluster.router(),
        cluster.ids(),
        config.duration_ms,
        stalls.clone(),
    ));
    if let Err(error) = cluster.drive_faults(config.duration_ms).await {
        violations.push(error);
    }
    let _ = watchdog.await;
    let stalls = std::mem::take(&mut *stalls.lock().expect("not poisoned"));
    violations.extend(stalls.violations);
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
        longest_stall_ms: stalls.longest_ms,
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
#[path = "lib_tests.rs"]
mod tests;
