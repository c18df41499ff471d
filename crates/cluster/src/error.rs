//! Why a membership change was refused or did not complete, typed: a caller can tell a
//! refused change from one that timed out.

use super::NodeId;

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
