//! What the engine tells watchers, the feed and the metrics after a commit: ownership
//! transitions, and what a break did.

use palisade_core::{Lease, Principal};

/// How a lease ended or began, for watchers and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransitionKind {
    /// A lease was granted.
    Granted,
    /// A lease was released.
    Released,
    /// A lease expired.
    Expired,
    /// An admin ended a lease it did not hold (`palisade lock break`).
    Broken,
}

impl TransitionKind {
    /// The kind's name in metrics and the watch stream.
    pub fn as_str(self) -> &'static str {
        match self {
            TransitionKind::Granted => "granted",
            TransitionKind::Released => "released",
            TransitionKind::Expired => "expired",
            TransitionKind::Broken => "broken",
        }
    }
}

/// What `palisade lock break` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BreakOutcome {
    /// This lease ended.
    Broken(Lease),
    /// Nobody held the lock: nothing to break.
    Free,
    /// The lock is held at another epoch than the one named: nothing was broken.
    Other(Lease),
}

/// A durable ownership transition, broadcast after its commit.
#[derive(Debug, Clone)]
pub struct Transition {
    /// What happened.
    pub kind: TransitionKind,
    /// The lease it happened to.
    pub lease: Lease,
    /// Time left on the lease at the commit (0 unless granted).
    pub remaining_ms: u64,
    /// Who broke it ([`TransitionKind::Broken`] only).
    pub by: Option<Principal>,
}
