//! Member identity: each cluster store has a random **store id**, created with the store, and
//! the replicated membership names the store id of every member ([`MemberNode::store`]).
//! Every Raft message and every answer carries its sender's store id.
//!
//! Why: a member whose data directory was lost (wiped, replaced disk, restored from nothing)
//! and restarted with the same flags comes back with an empty log and no vote. Raft's safety
//! rests on what each member persisted — an empty member can vote twice in a term and can be
//! counted in a majority for entries it no longer has — so it could let a committed grant be
//! lost and its epoch issued again (P1, P8). The rules, enforced where a count is made:
//!
//! 1. **An answer counts only from the store the membership names** ([`Identity::admit`]): a
//!    leader counts an append acknowledgement, a candidate a granted vote, only if the
//!    answering member presents the store id that the requester's membership names for it. A
//!    wiped member's acknowledgements and votes count nowhere until it is re-added.
//! 2. **A member whose own store is not the one its membership names sends nothing**
//!    ([`Identity::may_send`]): it cannot stand for election (its own vote would be counted
//!    without crossing the network) nor replicate. It still receives the leader's entries.
//! 3. Requests are not refused by store: a lagging member may hold an old membership that
//!    names a peer's old store (the peer was re-added since), and it can only catch up by
//!    taking that peer's entries. Who may send Raft traffic at all is the transport's
//!    question (peer authentication).
//!
//! 4. **A member that restarts with a log votes and stands for election only once it is caught
//!    up** ([`Identity::may_vote`]): once an AppendEntries from a leader has left it holding
//!    every entry that leader says is committed ([`Identity::heard_leader`]), or after
//!    [`PROBATION_MAX`] without one, or when it is the only voter. Its disk may be an older
//!    copy that nothing can tell from the real one (a whole-volume snapshot put back, witness
//!    included): voting from it, it could elect a lagging member that lacks entries the
//!    member itself had acknowledged, and those entries would be lost (P8). Until then its
//!    vote requests are refused before Raft sees them and its elections are off. The timeout
//!    keeps a cluster available when the only other way to a majority is this member (a
//!    whole-cluster restart, a peer down for good); past it the member votes as before, so a
//!    put-back member *and* a second fault at once (the only other holder of an entry down)
//!    can still lose it: two faults in three members, beyond what a majority protocol
//!    survives.
//!
//! The way back for a wiped member is the one for any new member: `palisade cluster remove
//! ID`, start it with `--join`, `palisade cluster add`, which asks the node for its store id
//! and commits it into the membership.
//!
//! Before, each member learned a peer's store id from the first message it saw (trust on first
//! use). A member added with `--join` talks only to the leader, so a peer that had never
//! exchanged a message with it accepted whatever it presented first: a twice-wiped member
//! could vote for a lagging member that lacked a committed epoch. Now every member checks
//! against the replicated membership, and a member that applies "remove 3" and "add 3" in one
//! batch simply has 3's new store id.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use openraft::{Membership, RaftMetrics};
use redb::{Database, ReadableTable, TableDefinition};
use tokio::sync::watch;

use super::{ClusterError, MemberNode, NodeId};

/// This store's id, in a table of its own.
const OWN_STORE: TableDefinition<&str, &str> = TableDefinition::new("store_identity");

/// gRPC metadata of the sender's node id on Raft messages.
pub const FROM_METADATA: &str = "palisade-raft-from";
/// gRPC metadata of the sender's (or the answering member's) store id.
pub const STORE_METADATA: &str = "palisade-raft-store";

/// Why a message from, or an answer by, a peer is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The membership names another store for the peer: it lost its data directory, or another
    /// machine uses its node id.
    #[error(
        "node {peer} presents another store than the membership names for it: node {peer} \
         lost its data directory (or another machine uses its id). Its messages are refused. \
         To bring it back: `palisade cluster remove {peer}`, start it with --join and an empty \
         data directory, then `palisade cluster add {peer} HOST:PORT`"
    )]
    ChangedStore {
        /// The peer.
        peer: NodeId,
    },
    /// The peer is not in this member's membership.
    #[error("node {peer} is not a member of this cluster")]
    NotAMember {
        /// The peer.
        peer: NodeId,
    },
    /// This member's own store is not the one its membership names: it lost its data (or
    /// another machine uses its id) and has not been re-added.
    #[error(
        "this member's store is not the one the membership names for node {node}: it lost its \
         data directory (or another machine uses its id). It takes no part in elections or \
         replication until re-added: `palisade cluster remove {node}` on the leader, restart \
         it with --join and an empty data directory, then `palisade cluster add`"
    )]
    Replaced {
        /// This member's node id.
        node: NodeId,
    },
    /// This member's Raft has not started yet.
    #[error("this member is starting")]
    Starting,
    /// This member restarted with a log and has not caught up with a leader yet.
    #[error(
        "this member restarted with a log and has not caught up with a leader yet: it votes \
         once it holds every entry a leader says is committed (or after {}s without one)",
        PROBATION_MAX.as_secs()
    )]
    Probation,
}

/// How long a member that restarted with a log waits to catch up with a leader before it
/// votes and stands for election anyway (rule 4 above).
pub const PROBATION_MAX: Duration = Duration::from_secs(5);

/// A restarted member's wait before it votes (rule 4).
#[derive(Debug)]
struct Probation {
    since: tokio::time::Instant,
    caught_up: AtomicBool,
}

/// Whether `membership` counts an answer by `peer` presenting `store`. A member that knows no
/// membership yet (it starts with `--join`, or a new cluster is not founded yet) counts nothing
/// anyway (it makes no requests); it admits anyone.
pub fn check(
    membership: &Membership<NodeId, MemberNode>,
    peer: NodeId,
    store: &str,
) -> Result<(), Refused> {
    if membership.nodes().next().is_none() {
        return Ok(());
    }
    match membership.get_node(&peer) {
        Some(node) if !node.store.is_empty() && node.store == store => Ok(()),
        Some(_) => Err(Refused::ChangedStore { peer }),
        None => Err(Refused::NotAMember { peer }),
    }
}

/// Whether member `me` with store `store` is who `membership` says node `me` is (true when the
/// membership does not name node `me`).
pub fn own_store_named(
    membership: &Membership<NodeId, MemberNode>,
    me: NodeId,
    store: &str,
) -> Result<(), Refused> {
    match membership.get_node(&me) {
        Some(node) if node.store != store => Err(Refused::Replaced { node: me }),
        _ => Ok(()),
    }
}

/// This member's store id, and the membership it checks peers against. Clones share it.
#[derive(Clone)]
pub struct Identity {
    store: String,
    metrics: Arc<OnceLock<watch::Receiver<RaftMetrics<NodeId, MemberNode>>>>,
    probation: Arc<Probation>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl Identity {
    /// Loads the store id, creating it with a new store.
    pub(crate) fn open(db: &Database) -> Result<Self, ClusterError> {
        let store_error = |e: &dyn std::fmt::Display| ClusterError::Store(e.to_string());
        let txn = db.begin_write().map_err(|e| store_error(&e))?;
        let store = {
            let mut own = txn.open_table(OWN_STORE).map_err(|e| store_error(&e))?;
            let existing = own
                .get("store_id")
                .map_err(|e| store_error(&e))?
                .map(|v| v.value().to_string());
            match existing {
                Some(id) => id,
                None => {
                    let id = new_store_id()?;
                    own.insert("store_id", id.as_str())
                        .map_err(|e| store_error(&e))?;
                    id
                }
            }
        };
        txn.commit().map_err(|e| store_error(&e))?;
        Ok(Self {
            store,
            metrics: Arc::new(OnceLock::new()),
            probation: Arc::new(Probation {
                since: tokio::time::Instant::now(),
                caught_up: AtomicBool::new(false),
            }),
        })
    }

    /// This store's id.
    pub fn store(&self) -> &str {
        &self.store
    }

    /// Checks peers against the membership of this Raft member from now on. A member whose
    /// Raft starts with an empty log has nothing it could have lost: it is not on probation.
    pub fn attach(&self, metrics: watch::Receiver<RaftMetrics<NodeId, MemberNode>>) {
        if metrics.borrow().last_log_index.is_none() {
            self.probation.caught_up.store(true, Ordering::Relaxed);
        }
        let _ = self.metrics.set(metrics);
    }

    /// An AppendEntries from a leader succeeded, leaving this member's log matching the
    /// leader's up to `matched`, while the leader had committed up to `leader_commit`: once
    /// that covers every committed entry, this member votes again (rule 4).
    pub fn heard_leader(&self, matched: Option<u64>, leader_commit: Option<u64>) {
        if leader_commit.is_none_or(|commit| matched.is_some_and(|m| m >= commit))
            && !self.probation.caught_up.swap(true, Ordering::Relaxed)
        {
            tracing::info!("caught up with the leader: this member votes again");
        }
    }

    /// Whether this member may vote and stand for election (rule 4): it started with an empty
    /// log, or has caught up with a leader, or is the only voter, or waited [`PROBATION_MAX`].
    pub fn may_vote(&self) -> Result<(), Refused> {
        if self.probation.caught_up.load(Ordering::Relaxed) {
            return Ok(());
        }
        let metrics = self.metrics.get().ok_or(Refused::Starting)?;
        let alone = {
            let metrics = metrics.borrow();
            let mut voters = metrics.membership_config.membership().voter_ids();
            voters.next() == Some(metrics.id) && voters.next().is_none()
        };
        if alone || self.probation.since.elapsed() >= PROBATION_MAX {
            if !self.probation.caught_up.swap(true, Ordering::Relaxed) && !alone {
                tracing::warn!(
                    "no leader caught this member up within {}s of its start: it votes again",
                    PROBATION_MAX.as_secs()
                );
            }
            return Ok(());
        }
        Err(Refused::Probation)
    }

    /// Admits an answer by `peer` presenting `store`: the membership this member holds (its
    /// latest, committed or not) must name that store for that node.
    pub fn admit(&self, peer: NodeId, store: &str) -> Result<(), Refused> {
        let metrics = self.metrics.get().ok_or(Refused::Starting)?;
        let metrics = metrics.borrow();
        check(metrics.membership_config.membership(), peer, store)
    }

    /// Whether `peer` may send to this member: it is in the membership this member holds, or
    /// this member holds none yet (a node started with `--join`, or a cluster being founded).
    pub fn knows(&self, peer: NodeId) -> bool {
        let Some(metrics) = self.metrics.get() else {
            return false;
        };
        let metrics = metrics.borrow();
        let membership = metrics.membership_config.membership();
        membership.nodes().next().is_none() || membership.get_node(&peer).is_some()
    }

    /// Whether this member may send requests: its membership names this store for it (or
    /// does not name it at all: a learner being added, a member not yet founded).
    pub fn may_send(&self) -> Result<(), Refused> {
        let metrics = self.metrics.get().ok_or(Refused::Starting)?;
        let metrics = metrics.borrow();
        own_store_named(
            metrics.membership_config.membership(),
            metrics.id,
            &self.store,
        )
    }
}

fn new_store_id() -> Result<String, ClusterError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| ClusterError::Randomness(e.to_string()))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;

    fn node(addr: &str, store: &str) -> MemberNode {
        MemberNode {
            addr: addr.into(),
            store: store.into(),
        }
    }

    fn membership(nodes: &[(NodeId, &str)]) -> Membership<NodeId, MemberNode> {
        let voters: BTreeSet<NodeId> = nodes.iter().map(|(id, _)| *id).collect();
        let nodes: BTreeMap<NodeId, MemberNode> = nodes
            .iter()
            .map(|(id, store)| (*id, node(&format!("127.0.0.1:{}", 7000 + id), store)))
            .collect();
        Membership::new(vec![voters], nodes)
    }

    #[test]
    fn p1_a_peer_is_admitted_only_with_the_store_the_membership_names() {
        let m = membership(&[(1, "aaaa"), (2, "bbbb"), (3, "cccc")]);
        assert_eq!(check(&m, 2, "bbbb"), Ok(()));
        assert_eq!(
            check(&m, 2, "ffff"),
            Err(Refused::ChangedStore { peer: 2 }),
            "a wiped member (new store) is refused by every member, whether or not it ever \
             talked to it"
        );
        assert_eq!(check(&m, 4, "dddd"), Err(Refused::NotAMember { peer: 4 }));
        assert_eq!(
            check(&membership(&[(1, "aaaa"), (2, "")]), 2, ""),
            Err(Refused::ChangedStore { peer: 2 }),
            "a membership without a store id admits nobody under it"
        );
    }

    #[test]
    fn p1_remove_and_add_in_one_batch_leaves_the_new_store() {
        // A lagging member applies "remove 3" and "add 3 (new store)" together: what it checks
        // against is the membership it ends with — no remembered id can outlive it.
        let after = membership(&[(1, "aaaa"), (2, "bbbb"), (3, "3333")]);
        assert_eq!(check(&after, 3, "3333"), Ok(()));
        assert_eq!(
            check(&after, 3, "cccc"),
            Err(Refused::ChangedStore { peer: 3 })
        );
    }

    #[test]
    fn p1_p8_a_member_whose_own_store_was_replaced_sends_nothing() {
        // A wiped member that took the leader's entries (so it holds a membership naming its
        // old store) must not stand for election: its own vote is counted without crossing
        // the network, and it lost the vote and the entries it acknowledged before.
        let m = membership(&[(1, "aaaa"), (2, "bbbb"), (3, "cccc")]);
        assert_eq!(own_store_named(&m, 2, "bbbb"), Ok(()));
        assert_eq!(
            own_store_named(&m, 2, "ffff"),
            Err(Refused::Replaced { node: 2 })
        );
        assert_eq!(
            own_store_named(&m, 4, "dddd"),
            Ok(()),
            "a learner being added"
        );
    }

    #[test]
    fn a_member_without_a_membership_admits_its_future_leader() {
        let empty = Membership::<NodeId, MemberNode>::new(vec![BTreeSet::new()], BTreeMap::new());
        assert_eq!(check(&empty, 1, "aaaa"), Ok(()));
    }

    #[test]
    fn the_store_id_is_stable_across_restarts_and_new_with_a_new_store() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        let first = Identity::open(&Database::create(&path).unwrap()).unwrap();
        let again = Identity::open(&Database::create(&path).unwrap()).unwrap();
        assert_eq!(first.store(), again.store());
        assert_eq!(first.store().len(), 32);
        let other = tempfile::tempdir().unwrap();
        let fresh =
            Identity::open(&Database::create(other.path().join("s.redb")).unwrap()).unwrap();
        assert_ne!(fresh.store(), first.store());
        assert_eq!(
            fresh.admit(1, "x"),
            Err(Refused::Starting),
            "nothing is admitted before Raft runs"
        );
    }
}
