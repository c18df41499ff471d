//! A deterministic simulation of Palisade: the real lease table (`palisade-core`), the real
//! fence rules and token verification (`palisade-fence`, Ed25519), simulated time and a
//! simulated network, driven by one seeded generator.
//!
//! Each run ([`run`]) plays a few clients that acquire a lock, maybe activate, write to a fenced
//! resource and release — while the simulator pauses clients past their TTL, delays messages
//! (a buffering proxy), drops and reorders them, sends forged tokens, crashes and restarts
//! the coordinator from its durable image, restores it (from its last backup: a directory
//! copied back beside its high-water bound, or a lost machine restored with the resource as a
//! floor — the real restore rule, `palisade_core::restore`), and puts the resource back to an
//! older copy with a restore floor from the coordinator (P6). The resource records every
//! decision in a
//! [`History`]; the history checker verifies P1, P2 and P4 on it after every run.
//!
//! Everything is a function of the seed: running a seed twice gives the same trace hash.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod network;
mod rng;
mod world;

use palisade_history::{History, Mode, Summary, Violation};
use serde::Serialize;

pub use rng::SplitMix64;
pub use world::World;

/// What a run may do, and a planted bug for showing that the checker sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimConfig {
    /// Simulated clients.
    pub clients: usize,
    /// Locks they contend for.
    pub locks: usize,
    /// Simulated duration, in milliseconds.
    pub duration_ms: u64,
    /// Plant a bug: the coordinator forgets its epoch counter when it restarts.
    pub plant_epoch_reset: bool,
    /// Plant a bug: the resource accepts a strict write with an equal epoch.
    pub plant_equal_accepted: bool,
    /// Plant a bug: in activated mode the resource accepts a write above the fence that was
    /// never activated.
    pub plant_unactivated_accepted: bool,
    /// Plant a bug: a restored coordinator starts from its backup's counter alone (no
    /// high-water bound, no resource floor, no margin).
    pub plant_restore_from_backup_only: bool,
    /// Plant a bug: the resource put back to an older copy gets no restore floor.
    pub plant_resource_restore_without_floor: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            clients: 4,
            locks: 2,
            duration_ms: 20_000,
            plant_epoch_reset: false,
            plant_equal_accepted: false,
            plant_unactivated_accepted: false,
            plant_restore_from_backup_only: false,
            plant_resource_restore_without_floor: false,
        }
    }
}

/// Faults the simulator injected in one run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Faults {
    /// Client pauses (GC, SIGSTOP), some past the lease's TTL.
    pub pauses: u64,
    /// Messages held for a long time (a buffering proxy).
    pub delays: u64,
    /// Messages lost.
    pub drops: u64,
    /// Messages delivered out of the order they were sent in.
    pub reorders: u64,
    /// Coordinator crashes (restarted from its durable image).
    pub crashes: u64,
    /// Coordinator restores from its last backup (instead of a plain restart).
    pub restores: u64,
    /// Resource restores: put back to an older copy, then floored.
    pub resource_restores: u64,
    /// Writes and activations sent with a forged or altered token.
    pub forged: u64,
}

impl Faults {
    /// All faults of the run.
    pub fn total(&self) -> u64 {
        self.pauses
            + self.delays
            + self.drops
            + self.reorders
            + self.crashes
            + self.restores
            + self.resource_restores
            + self.forged
    }
}

/// The result of one seed.
#[derive(Debug, Clone)]
pub struct SimReport {
    /// The seed.
    pub seed: u64,
    /// The resource's mode in this run.
    pub mode: Mode,
    /// FNV-1a hash of every event, in order: equal for equal seeds.
    pub trace_hash: u64,
    /// Events processed.
    pub events: u64,
    /// Faults injected.
    pub faults: Faults,
    /// The recorded history.
    pub history: History,
    /// The checker's verdict.
    pub verdict: Result<Summary, Violation>,
}

/// Runs one seed.
pub fn run(seed: u64, config: SimConfig) -> SimReport {
    World::new(seed, config).run()
}
