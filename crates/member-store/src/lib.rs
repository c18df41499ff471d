//! What a cluster member holds on disk, and the types its Raft log carries: openraft's type
//! configuration ([`TypeConfig`], the log's [`Command`]s), the Raft log and state machine over
//! redb ([`storage`]), the member's identity and probation kept in the same file
//! ([`identity`]), and the async runtime openraft runs on ([`runtime`], seeded in the
//! simulation).
//!
//! No network and no engine: `palisade-cluster` runs these stores under openraft and talks to
//! the peers; the cluster simulation (`palisade-cluster-sim`) opens them over its simulated disk.

#![forbid(unsafe_code)]

mod error;
pub mod identity;
pub mod raft_log;
pub mod runtime;
pub mod storage;

use std::io::Cursor;

use palisade_core::{Ended, Epoch, Lease, LockName};
use serde::{Deserialize, Serialize};

pub use error::ClusterError;

/// A member's id (`--node-id`), 1 or more.
pub type NodeId = u64;

/// A member as the replicated membership knows it: where it is, and which store it is. Every
/// member checks its peers' messages against the store ids here ([`identity`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberNode {
    /// `HOST:PORT`: its client and Raft address.
    pub addr: String,
    /// Its store id (random, created with its store; a wiped member has a new one).
    pub store: String,
}

impl std::fmt::Display for MemberNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (store {})", self.addr, self.store)
    }
}

openraft::declare_raft_types!(
    /// openraft's type configuration for the coordinator.
    pub TypeConfig:
        D = Command,
        R = Applied,
        Node = MemberNode,
        AsyncRuntime = runtime::Runtime,
);

/// An entry of the replicated log.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Command {
    /// A node became leader: its first entry. Registers its token key, so that every member
    /// serves it at `/v1/keys`; once applied, every earlier entry is applied too.
    LeaderStart {
        /// The new leader.
        node: NodeId,
        /// Its token key id.
        key_id: String,
        /// Its public key (base64url).
        public_key: String,
        /// The epoch counter a restore started this member at (`palisade restore --cluster`,
        /// `palisade restore --cluster`, `palisade_coordinator::backup`): applying the entry raises the counter to it (0: none).
        #[serde(default, skip_serializing_if = "is_zero")]
        floor: Epoch,
    },
    /// An operator retired a signing key (`palisade keys retire`): it leaves the published
    /// list for good, and a later `LeaderStart` carrying it does not bring it back.
    RetireKey {
        /// The key id (16 hex digits).
        key_id: String,
    },
    /// One group commit of the leader's engine.
    Apply {
        /// The epoch counter after the batch.
        last_epoch: Epoch,
        /// The locks the batch changed, with their lease now (`None`: free).
        locks: Vec<(LockName, Option<Lease>)>,
        /// How the leases that ended in the batch ended (for the history every member keeps,
        /// [`AppliedTransition`]; absent in entries of earlier versions).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        ended: Vec<Ended>,
    },
}

/// An ownership transition as a member applied it: every member, the leader included, keeps
/// the same history of grants and ends, so the console's feed survives a failover. For people:
/// no decision reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedTransition {
    /// `granted`, `released`, `expired`, `broken`, or `ended` (an entry of an earlier version
    /// that did not say how).
    pub kind: String,
    /// The lease.
    pub lease: Lease,
    /// Who broke it (`broken` only).
    pub by: Option<String>,
}

fn is_zero(epoch: &Epoch) -> bool {
    epoch.0 == 0
}

/// What applying an entry answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Applied {
    /// The epoch counter after the entry.
    pub last_epoch: Epoch,
}
