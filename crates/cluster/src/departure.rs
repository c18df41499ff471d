//! Members that leave, leave: a member removed from the membership (`palisade cluster
//! remove`) stops instead of campaigning in a cluster that no longer counts it.
//!
//! openraft never tells a member it was removed. A leader stops replicating to a member as soon
//! as it appends the membership without it, so the removed member usually never receives that
//! entry: it keeps the last membership it holds (which names it), hears no leader, and stands
//! for election again and again. Its peers refuse every vote request (with peer TLS as traffic
//! from a non-member; without, as a candidate while their leader is alive), and openraft logged
//! each refusal as an error: about 13 lines a second, for as long as it ran. A member removed
//! while it was down wakes up in the same state.
//!
//! So a member named in its membership that knows no leader asks the other members it names who
//! they are (`Identify`, the census's question, which any member's certificate may ask) every
//! [`CHECK_INTERVAL`]; a follower asks the leader it follows every
//! [`CHECK_INTERVAL_FOLLOWING`]. If one answers with a later membership that it has applied
//! (so it is committed) and that does not name this member's store, this member was removed
//! for good ([`told_by_peers`]); likewise if its own log applies such a membership after one
//! that named it ([`seen_in_own_log`]). It then switches elections off, logs one line and stops:
//! `palisade serve` exits 10 ([`ClusterError::Removed`](super::ClusterError::Removed)).
//!
//! Why it is safe: stopping a member never breaks a property (it takes no committed entry away),
//! and the verdict never rests on an uncommitted membership, which a leader change could still
//! undo. A member re-added later is added as a new store (`--join`, empty), as before.

use std::collections::BTreeSet;
use std::time::Duration;

use openraft::{LogId, Membership, RaftMetrics, StoredMembership};

use super::identity::Introduction;
use super::{MemberNode, NodeId};

/// Between two questions of a member that knows no leader. A removed member campaigns about
/// every 0.5 s meanwhile (its peers refuse it; see `network::PeerClient::vote`).
pub const CHECK_INTERVAL: Duration = Duration::from_millis(500);
/// Between two questions of a follower to the leader it follows: a removed member whose
/// elections are off (on probation, or its clock refused) does not campaign and still names
/// the leader that removed it. One short connection to one peer every 2 s per follower.
pub const CHECK_INTERVAL_FOLLOWING: Duration = Duration::from_secs(2);

/// Why this member no longer belongs to the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removal {
    /// This member.
    pub node: NodeId,
    /// The committed membership entry that leaves it out.
    pub log_id: LogId<NodeId>,
    /// The voters of that membership.
    pub voters: BTreeSet<NodeId>,
    /// The member whose answer showed it (`None`: this member's own log).
    pub told_by: Option<NodeId>,
}

impl std::fmt::Display for Removal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let node = self.node;
        let source = match self.told_by {
            Some(peer) => format!(" (as node {peer} holds it)"),
            None => String::new(),
        };
        write!(
            f,
            "node {node} was removed from the cluster: the membership committed at {}{source} \
             has voters {:?} and does not name this member's store, so it stops rather than \
             campaign. To bring it back: start it with an empty data directory and --join, \
             then `palisade cluster add {node} HOST:PORT` on the leader",
            self.log_id, self.voters
        )
    }
}

/// Whether `membership` names member `node` with store `store` as a voter. Only a voter
/// leaves when it is removed: a learner never campaigns, and one removed because its
/// `cluster add` timed out waits quietly, so that repeating the `add` resumes it.
pub fn names_as_voter(
    membership: &Membership<NodeId, MemberNode>,
    node: NodeId,
    store: &str,
) -> bool {
    names(membership, node, store) && membership.voter_ids().any(|voter| voter == node)
}

/// Whether `membership` names member `node` with store `store`.
pub fn names(membership: &Membership<NodeId, MemberNode>, node: NodeId, store: &str) -> bool {
    membership
        .get_node(&node)
        .is_some_and(|named| named.store == store)
}

/// A removal that a peer's answer shows: a membership it has applied (committed), later than
/// `own` (the one this member holds, which names it), that does not name member `node` with
/// store `store`.
pub fn told_by_peers(
    node: NodeId,
    store: &str,
    own: &StoredMembership<NodeId, MemberNode>,
    answers: &[Introduction],
) -> Option<Removal> {
    answers.iter().find_map(|answer| {
        let held = answer.membership.as_ref()?;
        let at = (*held.log_id())?;
        let committed = answer.applied.is_some_and(|applied| applied >= at);
        let later = own.log_id().is_none_or(|own| at > own);
        (committed && later && !names(held.membership(), node, store)).then(|| Removal {
            node,
            log_id: at,
            voters: held.membership().voter_ids().collect(),
            told_by: Some(answer.node_id),
        })
    })
}

/// A removal this member's own log shows: it applied a membership that does not name its
/// store, later than `named_at` (the latest membership seen naming it in this run; `None`:
/// none, as for a `--join` member replaying the memberships from before it was added).
pub fn seen_in_own_log(
    store: &str,
    metrics: &RaftMetrics<NodeId, MemberNode>,
    named_at: Option<LogId<NodeId>>,
) -> Option<Removal> {
    let held = &metrics.membership_config;
    let at = (*held.log_id())?;
    let named_at = named_at?;
    let committed = metrics.last_applied.is_some_and(|applied| applied >= at);
    (committed && at > named_at && !names(held.membership(), metrics.id, store)).then(|| Removal {
        node: metrics.id,
        log_id: at,
        voters: held.membership().voter_ids().collect(),
        told_by: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::testing::log_id;
    use std::collections::BTreeMap;

    fn membership(at: u64, nodes: &[(NodeId, &str)]) -> StoredMembership<NodeId, MemberNode> {
        let voters: BTreeSet<NodeId> = nodes.iter().map(|(id, _)| *id).collect();
        let nodes: BTreeMap<NodeId, MemberNode> = nodes
            .iter()
            .map(|(id, store)| {
                let node = MemberNode {
                    addr: format!("127.0.0.1:{}", 7000 + id),
                    store: (*store).to_owned(),
                };
                (*id, node)
            })
            .collect();
        StoredMembership::new(Some(log_id(1, 1, at)), Membership::new(vec![voters], nodes))
    }

    fn answer(
        node: NodeId,
        held: StoredMembership<NodeId, MemberNode>,
        applied: u64,
    ) -> Introduction {
        Introduction {
            node_id: node,
            store: format!("s{node}"),
            holds_log: true,
            last_log: Some(log_id(1, 1, applied)),
            vote: None,
            membership: Some(held),
            applied: Some(log_id(1, 1, applied)),
        }
    }

    const FOUR: [(NodeId, &str); 4] = [(1, "s1"), (2, "s2"), (3, "s3"), (4, "s4")];
    const THREE: [(NodeId, &str); 3] = [(1, "s1"), (2, "s2"), (3, "s3")];

    #[test]
    fn a_member_is_told_it_was_removed_only_by_a_later_committed_membership() {
        let own = membership(10, &FOUR);
        let removed = told_by_peers(4, "s4", &own, &[answer(1, membership(12, &THREE), 12)]);
        assert_eq!(
            removed,
            Some(Removal {
                node: 4,
                log_id: log_id(1, 1, 12),
                voters: BTreeSet::from([1, 2, 3]),
                told_by: Some(1),
            })
        );
        // Appended but not applied by the peer that holds it: a leader change may undo it.
        assert_eq!(
            told_by_peers(4, "s4", &own, &[answer(1, membership(12, &THREE), 11)]),
            None
        );
        // An older membership without it (before it was added) says nothing.
        assert_eq!(
            told_by_peers(4, "s4", &own, &[answer(1, membership(5, &THREE), 20)]),
            None
        );
        // A later membership that still names it: still a member.
        assert_eq!(
            told_by_peers(4, "s4", &own, &[answer(1, membership(12, &FOUR), 12)]),
            None
        );
        // An older build that does not say what it applied never tells.
        let mut old = answer(1, membership(12, &THREE), 12);
        old.applied = None;
        assert_eq!(told_by_peers(4, "s4", &own, &[old]), None);
    }

    #[test]
    fn a_member_whose_id_now_names_another_store_was_removed_too() {
        let own = membership(10, &FOUR);
        let replaced = [(1, "s1"), (2, "s2"), (3, "s3"), (4, "new")];
        let told = told_by_peers(4, "s4", &own, &[answer(2, membership(14, &replaced), 14)]);
        assert_eq!(told.map(|removal| removal.told_by), Some(Some(2)));
    }

    #[test]
    fn its_own_log_shows_a_removal_only_after_a_membership_that_named_it() {
        let mut metrics = RaftMetrics::new_initial(4);
        metrics.membership_config = std::sync::Arc::new(membership(12, &THREE));
        metrics.last_applied = Some(log_id(1, 1, 12));
        // A `--join` member replaying the memberships from before it was added.
        assert_eq!(seen_in_own_log("s4", &metrics, None), None);
        let removal = seen_in_own_log("s4", &metrics, Some(log_id(1, 1, 10)));
        assert_eq!(removal.map(|removal| removal.told_by), Some(None));
        // Not applied yet: not committed as far as this member knows.
        metrics.last_applied = Some(log_id(1, 1, 11));
        assert_eq!(
            seen_in_own_log("s4", &metrics, Some(log_id(1, 1, 10))),
            None
        );
        // A log cut back to an older membership (an uncommitted addition undone) is no removal.
        metrics.membership_config = std::sync::Arc::new(membership(5, &THREE));
        assert_eq!(
            seen_in_own_log("s4", &metrics, Some(log_id(1, 1, 10))),
            None
        );
    }
}
