//! Members that leave, leave: a member removed from the membership (`palisade cluster
//! remove`) stops instead of campaigning in a cluster that no longer counts it.
//!
//! openraft never tells a member it was removed: a leader stops replicating to it as soon as
//! it appends the membership without it, so the removed member keeps the membership it holds
//! (which names it), hears no leader, and stands for election again and again. With peer TLS
//! its peers refuse each of its vote requests at admission, as coming from a member their
//! membership does not name (`network::PeerClient::vote`). Those refusals are the evidence:
//! when a majority of the voters its own membership names have refused it as a non-member,
//! each for at least [`EVIDENCE`] with no vote answered since, the membership those peers hold
//! leaves it out — a majority holds it, so it is the cluster's — and this member stops:
//! elections off, one line, and `palisade serve` exits 10 (`ClusterError::Removed`).
//!
//! A member that applies the membership that removes it (openraft replicates a joint change to
//! the member it removes until the change commits) sees it in its own log: it leaves too
//! ([`seen_in_own_log`]), and refuses to start again over the same directory.
//!
//! It asks nothing of anyone: the evidence is the answers to the vote requests it sends anyway
//! (an earlier design asked its peers every 0.5 s; the extra messages changed the simulation's
//! schedules and two seeded runs lost liveness, cause not understood). Without peer TLS
//! (`--insecure-peers`) peers cannot tell a member apart and nothing is refused as a
//! non-member: a removed member then campaigns until it is stopped. Stopping a member weakens
//! no property; a member wrongly stopped is started again by its operator.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::{LogId, RaftMetrics};

use super::{MemberNode, NodeId};

/// How long a peer must have refused this member as a non-member, with no vote answered
/// since, before the refusal counts.
pub const EVIDENCE: Duration = Duration::from_secs(5);

/// What each peer said of this member's vote requests: refused as a non-member since when
/// (until it answers a vote again).
#[derive(Debug, Clone, Default)]
pub struct NonMemberRefusals(Arc<Mutex<BTreeMap<NodeId, Instant>>>);

impl NonMemberRefusals {
    /// `peer` refused a vote request as coming from a non-member.
    pub fn refused(&self, peer: NodeId) {
        let mut refused = self.0.lock().expect("not poisoned");
        refused.entry(peer).or_insert_with(Instant::now);
    }

    /// `peer` answered a vote request: it counts this member.
    pub fn answered(&self, peer: NodeId) {
        self.0.lock().expect("not poisoned").remove(&peer);
    }

    /// The peers that have refused this member as a non-member for at least `evidence`.
    pub fn standing(&self, evidence: Duration) -> BTreeSet<NodeId> {
        let refused = self.0.lock().expect("not poisoned");
        refused
            .iter()
            .filter(|(_, since)| since.elapsed() >= evidence)
            .map(|(peer, _)| *peer)
            .collect()
    }
}

/// Whether `refusing` (the peers whose refusals stand) is a majority of `voters` (the voters
/// of this member's own membership, which names it): then the membership a majority holds
/// leaves this member out.
pub fn removed(me: NodeId, voters: &BTreeSet<NodeId>, refusing: &BTreeSet<NodeId>) -> bool {
    voters.contains(&me)
        && refusing
            .iter()
            .filter(|peer| voters.contains(peer) && **peer != me)
            .count()
            > voters.len() / 2
}

/// Whether `membership` names member `node` with store `store` as a voter.
pub fn names_as_voter(
    membership: &openraft::Membership<NodeId, MemberNode>,
    node: NodeId,
    store: &str,
) -> bool {
    membership
        .get_node(&node)
        .is_some_and(|named| named.store == store)
        && membership.voter_ids().any(|voter| voter == node)
}

/// A removal this member's own log shows: it applied (so it is committed) a membership that
/// does not name its store, later than `named_at` (the latest membership seen naming it as a
/// voter in this run; `None`: none, as for a `--join` member replaying the memberships from
/// before it was added, or a learner). The log id of that membership.
pub fn seen_in_own_log(
    store: &str,
    metrics: &RaftMetrics<NodeId, MemberNode>,
    named_at: Option<LogId<NodeId>>,
) -> Option<LogId<NodeId>> {
    let held = &metrics.membership_config;
    let at = (*held.log_id())?;
    let named_at = named_at?;
    let committed = metrics.last_applied.is_some_and(|applied| applied >= at);
    let named = held
        .membership()
        .get_node(&metrics.id)
        .is_some_and(|node| node.store == store);
    (committed && at > named_at && !named).then_some(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[NodeId]) -> BTreeSet<NodeId> {
        ids.iter().copied().collect()
    }

    #[test]
    fn a_majority_of_the_voters_refusing_is_a_removal_and_less_is_not() {
        assert!(removed(3, &set(&[1, 2, 3]), &set(&[1, 2])));
        assert!(
            !removed(3, &set(&[1, 2, 3]), &set(&[1])),
            "one peer is no majority"
        );
        assert!(removed(5, &set(&[1, 2, 3, 4, 5]), &set(&[1, 2, 3])));
        assert!(!removed(5, &set(&[1, 2, 3, 4, 5]), &set(&[1, 2])));
        assert!(
            !removed(4, &set(&[1, 2, 3]), &set(&[1, 2, 3])),
            "not a voter: no verdict"
        );
        assert!(
            !removed(3, &set(&[1, 2, 3]), &set(&[7, 8])),
            "refusals of non-voters"
        );
    }

    #[test]
    fn a_refusal_stands_only_after_the_evidence_time_and_until_a_vote_is_answered() {
        let refusals = NonMemberRefusals::default();
        refusals.refused(1);
        assert!(refusals.standing(Duration::from_secs(60)).is_empty());
        assert_eq!(refusals.standing(Duration::ZERO), set(&[1]));
        refusals.answered(1);
        assert!(refusals.standing(Duration::ZERO).is_empty());
    }
}
