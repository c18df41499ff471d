//! The cluster layer's errors, typed: a caller can tell a bad configuration from a storage
//! failure, a refused membership change from one that timed out.

use super::NodeId;

/// Why a cluster member could not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// `--node-id` / `--cluster` / `--join` do not describe a valid member.
    #[error("invalid cluster configuration: {0}")]
    Config(String),
    /// The cluster store could not be opened, read or written.
    #[error("cluster store: {0}")]
    Store(String),
    /// The data directory holds something a cluster member must not start over.
    #[error("{0}")]
    DataDirectory(String),
    /// openraft refused to start or failed.
    #[error("raft: {0}")]
    Raft(String),
    /// Raft stopped on a fatal error (a storage failure): the member no longer takes part.
    #[error("raft stopped on a fatal error: {0}")]
    RaftStopped(String),
    /// No randomness for a store id.
    #[error("no randomness for a store id: {0}")]
    Randomness(String),
}

/// Why a membership change (`palisade cluster add|remove`, or founding a new cluster) was
/// refused or did not complete.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MembershipError {
    /// The request itself is wrong (node id 0, a bad address, the last voter, too many members).
    #[error("{0}")]
    Invalid(String),
    /// The node id or address is taken, or the node is not a member.
    #[error("{0}")]
    Conflict(String),
    /// The node is not a member.
    #[error("node {0} is not a member")]
    Unknown(NodeId),
    /// Another membership change is in progress on this leader: changes run one at a time.
    #[error("another membership change is in progress; retry when it has finished")]
    Busy,
    /// The node at the address did not answer who it is.
    #[error("the node at {addr} did not answer: {why}")]
    Unreachable {
        /// Its address.
        addr: String,
        /// What failed.
        why: String,
    },
    /// The node at the address is not the one named, or already belongs to a cluster.
    #[error("{0}")]
    WrongNode(String),
    /// The new member did not catch up in time; it never voted.
    #[error(
        "node {id} did not catch up within {secs} s as a learner and never voted; {} (is it \
         running with --join, and reachable from every member?)",
        if *removed {
            "it was removed again".to_owned()
        } else {
            format!("it could not be removed again (remove it: `palisade cluster remove {id}`)")
        }
    )]
    CatchUpTimeout {
        /// The node.
        id: NodeId,
        /// The time it had.
        secs: u64,
        /// It was removed again (else it stays a learner: it never votes).
        removed: bool,
    },
    /// The change was not committed in time (no majority?). It may still complete: check
    /// `palisade cluster status`.
    #[error(
        "the change was not committed within {secs} s (no majority reachable?); it may still \
         complete: check `palisade cluster status`"
    )]
    CommitTimeout {
        /// The time it had.
        secs: u64,
    },
    /// openraft refused the change (e.g. this node stopped leading).
    #[error("raft refused the change: {0}")]
    Raft(String),
}
