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
//! 4. **A member that restarts with a log or a vote votes and stands for election only once
//!    it knows it cannot lose a committed entry** ([`Identity::may_grant`],
//!    [`Identity::may_campaign`]). Its disk may be an older copy that nothing on it can tell
//!    from the real one (a whole-volume snapshot put back, witness included): voting from it,
//!    it could elect a lagging member that lacks entries it had itself acknowledged, and those
//!    entries would be lost (P8). A vote without a log is such a copy too (taken between the
//!    member's first vote and its first entry); only a store that never voted (founding, or
//!    added with `--join`) acknowledged nothing. It is on probation until either
//!    - an AppendEntries from a leader has left it holding every entry that leader says is
//!      committed, and at or above the latest census below (its log at the floor, its
//!      vote at every vote heard: the leader may be a deposed one that has not heard of the
//!      newer term yet) ([`Identity::heard_leader`]), or
//!    - a **census** ([`Identity::record_census`]): it has heard the last log id of `n − q + 1`
//!      other voters (`n` voters, majority `q`: both others of 3, three of the four others of
//!      5), with the store the membership names for each. Every entry committed with this
//!      member's acknowledgement is on `q − 1` other voters, so at least one of those it heard
//!      holds it: the greatest log id heard (the census floor) is at or above every such
//!      entry. Then it votes only for a candidate whose last log id is at or above the floor,
//!      only in a term no member heard voted past and, in that term, only for the candidate
//!      they voted for (its own vote may have gone back with its disk: never twice in a term),
//!      and stands for election only when its own log is at or above the floor. A later
//!      round that hears too few keeps the census: the first round that heard enough covers
//!      every entry committed before the restart for good. But when no round has heard
//!      enough for [`PROBATION_MAX`], the member holding the floor may be gone for good
//!      (refused, wiped), and it votes as before (a floor nobody alive can meet stopped every
//!      election, the removal of that member's included). The votes that bind it are those
//!      of that first round: a vote cast since it restarted cannot be one it lost, and a
//!      member campaigning again and again must not keep it from voting in a later term.
//!      Every round that hears enough is a census on its own, so the floor is the lowest any
//!      of them gave: the greatest log of one round may be an uncommitted entry of a member
//!      that is gone by the next.
//!      A voter that answers with another store than the one the membership names has lost
//!      its disk, and every entry only it held with it: a round that heard every other voter,
//!      some of them that way, is a census too (its floor counts the intact ones). Without it
//!      a member whose floor was set by a since-wiped leader refused every candidate, and the
//!      removal of that leader, which needs a leader, never came.
//!
//!    Until then its vote requests are refused before Raft sees them and its elections are
//!    off, and it takes entries only from a leader at or above every established leadership
//!    the latest census round heard ([`Identity::may_follow`]): with its vote gone back, it
//!    would otherwise acknowledge a deposed leader, which could commit with it entries under
//!    log ids the newer term committed otherwise. A candidate it refuses gets Raft's answer
//!    to a candidate whose log is behind ([`Identity::refusal`]: its vote, the greatest log
//!    it knows of), not silence. A member with no membership yet (a vote, no entry) cannot
//!    tell whom a census counts, learns nothing from one, and waits out the bound below.
//!    After [`PROBATION_MAX`] with neither, or when it is the only voter, it votes as
//!    before: that keeps a cluster available when the only way to a majority is this member
//!    (one of three down for good, or wiped and being re-added). So a put-back member *and* a
//!    second fault at once (the only other holder of an entry down for longer than
//!    [`PROBATION_MAX`]) can still lose that entry: two faults in three members, beyond what a
//!    majority protocol survives. Without the timeout the simulation's wiped-member seeds
//!    deadlocked (7 of 600: the member being re-added is the one the census needs).
//!
//! 5. **A restarted member never resumes leading a term** (`storage.rs`'s `read_vote`,
//!    `network.rs`'s `not_own_lost_vote`). openraft restores a member whose committed vote
//!    names itself as that term's leader at once, with the log it finds, and adopts a
//!    committed vote naming itself from a peer's answer. From a disk put back to a snapshot
//!    taken while it led, its log lacks what it appended later in that term, and its next
//!    entries would take the log ids of entries its followers hold, with other content: the
//!    members then apply different states under one log id. So its vote is read as not
//!    committed (it still refuses every other candidate of that term and follows that term's
//!    leader), a peer's committed vote naming it is taken as not committed, and it leads only
//!    after winning a later term, whose votes check its log. The cost: a leader that merely
//!    restarts is not restored; a member is elected in the next term (one election timeout).
//!    This closed the last failures of the simulation's `--rollback` seeds (54 of 5,000 on
//!    3 members, 3 of 1,000 on 5, before; 0 after).
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
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use openraft::{LogId, Membership, RaftMetrics};
use redb::{Database, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
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
        "this member restarted with a log and has neither caught up with a leader nor heard \
         the logs of enough other members: it votes once it has (its disk may be an older \
         copy; voting from it could lose entries it acknowledged), or after {}s",
        PROBATION_MAX.as_secs()
    )]
    Probation,
    /// The candidate's log ends below an entry another member holds (the census floor).
    #[error("the candidate's log ends below the last log id of a member this one heard")]
    BehindCensus,
    /// A member this one heard has voted in a later term, or for another candidate in the
    /// candidate's term: this member's own vote there may have been lost with its disk.
    #[error("a member this one heard voted in a later term or for another candidate")]
    VotedElsewhere,
    /// The sender leads a term older than a leadership a member this one heard has seen
    /// established: it was deposed and does not know yet.
    #[error("the sender leads a term older than one another member follows: it was deposed")]
    DeposedLeader,
}

/// The greatest last log id a census heard (`None` inside: every member heard was empty).
type Floor = Option<LogId<NodeId>>;

/// How long a member that restarted with a log waits to catch up with a leader, or to hear
/// enough members, before it votes and stands for election anyway (rule 4 above).
pub const PROBATION_MAX: Duration = Duration::from_secs(5);

/// A restarted member's wait before it votes (rule 4).
#[derive(Debug)]
struct Probation {
    since: tokio::time::Instant,
    caught_up: AtomicBool,
    /// Set by a census that heard enough voters.
    floor: Mutex<Option<Census>>,
    /// When a census round last heard enough voters (`None` before the first).
    heard_enough: Mutex<Option<tokio::time::Instant>>,
    /// The greatest term of a committed vote the latest census round heard, however few
    /// answered (`None` before the first round returns).
    leader_term: Mutex<Option<u64>>,
}

/// What a census that heard enough voters learned.
#[derive(Debug, Clone)]
struct Census {
    /// The greatest last log id heard.
    floor: Floor,
    /// The votes the first census that heard enough heard. A vote this member cast before its
    /// disk went back counted in an election only with the votes of a majority, and at least
    /// one member of it was heard: granting only in a term no member heard voted past, and in
    /// that term only to the candidate every member heard there voted for, never votes twice
    /// in a term.
    votes: Vec<openraft::Vote<NodeId>>,
}

/// `a` is at or above `b` in Raft's log order (false when the two are not comparable).
fn at_or_above(a: Option<&LogId<NodeId>>, b: Option<&LogId<NodeId>>) -> bool {
    matches!(
        a.partial_cmp(&b),
        Some(std::cmp::Ordering::Greater | std::cmp::Ordering::Equal)
    )
}

/// Where a member's history ends, for a census: the end of its log, or the last applied entry
/// when that is later (a snapshot installed over a shorter log, before the log's purge has
/// caught up).
pub fn holds_up_to(last_log: Floor, applied: Floor) -> Floor {
    if at_or_above(applied.as_ref(), last_log.as_ref()) {
        applied
    } else {
        last_log
    }
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

/// Whether `peer`, answering with `store`, is a voter whose named store is gone: the
/// membership names another (non-empty) store for it, so its data directory was lost or
/// replaced, and with it every entry only that store held.
fn lost_its_store(membership: &Membership<NodeId, MemberNode>, peer: NodeId, store: &str) -> bool {
    membership
        .get_node(&peer)
        .is_some_and(|node| !node.store.is_empty() && node.store != store)
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
    /// Where this member's log ends (kept by its log store).
    last_log: Arc<Mutex<Floor>>,
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
                floor: Mutex::new(None),
                heard_enough: Mutex::new(None),
                leader_term: Mutex::new(None),
            }),
            last_log: Arc::default(),
        })
    }

    /// This store's id.
    pub fn store(&self) -> &str {
        &self.store
    }

    /// Checks peers against the membership of this Raft member from now on. `voted`: its store
    /// holds a vote. A member whose Raft starts with an empty log and no vote has never taken
    /// part in an election, so it never acknowledged an entry it could have lost: it is not on
    /// probation. One with an empty log but a vote may be a volume put back to a copy taken
    /// before its first entry, whose member acknowledged entries since: it is (rule 4).
    pub fn attach(&self, metrics: watch::Receiver<RaftMetrics<NodeId, MemberNode>>, voted: bool) {
        if metrics.borrow().last_log_index.is_none() && !voted {
            self.probation.caught_up.store(true, Ordering::Relaxed);
        }
        let _ = self.metrics.set(metrics);
    }

    /// An AppendEntries from a leader succeeded, leaving this member's log matching the
    /// leader's up to `matched`, while the leader had committed up to `leader_commit`. This
    /// member votes again (rule 4) once that covers the leader's commit *and* the latest
    /// census: its log at or above the census floor, its vote (now that leader's) at or above
    /// every vote the census heard. A leader's word alone is not enough: a leader cut off
    /// since a newer term began (it does not know yet) catches a member up to its own, older
    /// commit, and the member, off probation, could then vote a candidate in that lacks
    /// entries the newer term committed with this member's forgotten acknowledgement.
    pub fn heard_leader(&self, matched: Option<u64>, leader_commit: Option<u64>) {
        let covers = leader_commit.is_none_or(|commit| matched.is_some_and(|m| m >= commit));
        if !covers || self.probation.caught_up.load(Ordering::Relaxed) {
            return;
        }
        let Some(census) = self.probation.floor.lock().expect("not poisoned").clone() else {
            return;
        };
        let Some(vote) = self.metrics.get().map(|m| m.borrow().vote) else {
            return;
        };
        let reaches = at_or_above(self.last_log().as_ref(), census.floor.as_ref())
            && census.votes.iter().all(|heard| {
                matches!(
                    vote.leader_id.partial_cmp(&heard.leader_id),
                    Some(std::cmp::Ordering::Greater | std::cmp::Ordering::Equal)
                )
            });
        if reaches && !self.probation.caught_up.swap(true, Ordering::Relaxed) {
            tracing::info!("caught up with the leader and the census: this member votes again");
        }
    }

    /// The log store's report of where the log ends (after each append and truncation).
    pub(crate) fn set_last_log(&self, last: Floor) {
        *self.last_log.lock().expect("not poisoned") = last;
    }

    /// The id of the last entry of this member's log (what a census asks).
    pub fn last_log(&self) -> Floor {
        *self.last_log.lock().expect("not poisoned")
    }

    /// True while this member is on probation (rule 4): it should ask the other voters where
    /// their logs end, again and again (a member it heard may have gone since).
    pub fn needs_census(&self) -> bool {
        !self.probation.caught_up.load(Ordering::Relaxed) && self.alone() != Some(true)
    }

    /// True when this member is the only voter of its membership (`None`: not started).
    fn alone(&self) -> Option<bool> {
        let metrics = self.metrics.get()?;
        let metrics = metrics.borrow();
        let mut voters = metrics.membership_config.membership().voter_ids();
        Some(voters.next() == Some(metrics.id) && voters.next().is_none())
    }

    /// The census floor while on probation: `Ok(None)` when off probation (caught up with a
    /// leader, started empty, or the only voter), `Ok(Some(floor))` on probation after a
    /// census, `Err` on probation before one.
    fn floor(&self) -> Result<Option<Census>, Refused> {
        if self.probation.caught_up.load(Ordering::Relaxed) {
            return Ok(None);
        }
        if self.alone().ok_or(Refused::Starting)? {
            return Ok(None);
        }
        let heard_lately = self
            .probation
            .heard_enough
            .lock()
            .expect("not poisoned")
            .is_some_and(|at| at.elapsed() < PROBATION_MAX);
        let census = self.probation.floor.lock().expect("not poisoned").clone();
        if heard_lately && census.is_some() {
            // A census round heard enough members lately: one of them, alive, holds the
            // greatest log, so the floor can be met.
            return Ok(census);
        }
        if !heard_lately && self.probation.since.elapsed() >= PROBATION_MAX {
            // No round heard enough members for `PROBATION_MAX`: the member holding the
            // floor may be gone for good (refused, wiped), and a floor nobody alive can meet
            // would stop every election, the removal of that member's included.
            if !self.probation.caught_up.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "neither caught up by a leader nor heard by enough members for {}s: this \
                     member votes again",
                    PROBATION_MAX.as_secs()
                );
            }
            return Ok(None);
        }
        match census {
            Some(census) => Ok(Some(census)),
            None => Err(Refused::Probation),
        }
    }

    /// Whether this member may vote at all (rule 4): off probation, or on it after a census.
    pub fn may_vote(&self) -> Result<(), Refused> {
        self.floor().map(|_| ())
    }

    /// Whether this member may grant its vote to a candidate whose log ends at `candidate`
    /// (rule 4; Raft's own check follows): on probation after a census, only at or above the
    /// census floor.
    pub fn may_grant(
        &self,
        candidate: Option<&LogId<NodeId>>,
        vote: &openraft::Vote<NodeId>,
    ) -> Result<(), Refused> {
        let Some(census) = self.floor()? else {
            return Ok(());
        };
        if !at_or_above(candidate, census.floor.as_ref()) {
            return Err(Refused::BehindCensus);
        }
        let elsewhere = census.votes.iter().any(|heard| {
            heard.leader_id.term > vote.leader_id.term
                || (heard.leader_id.term == vote.leader_id.term
                    && heard.leader_id.node_id != vote.leader_id.node_id)
        });
        if elsewhere {
            return Err(Refused::VotedElsewhere);
        }
        Ok(())
    }

    /// The answer to a candidate this member refuses (rule 4), as Raft answers one whose log
    /// is behind: not granted, with this member's vote and the greatest log it knows of (its
    /// own, or the census floor above it). A refusal without an answer (a network error)
    /// hides both: the candidate never learns that a greater log exists, so it is never held
    /// back before its next election, and a member that refuses by census never learns the
    /// candidate's term. A lagging member with the higher node id then stood in every term the
    /// eligible one stood in, and won each tie of the same term against it (the leader id
    /// orders by node id within a term): no leader for good. `None` before Raft has started.
    pub fn refusal(&self) -> Option<openraft::raft::VoteResponse<NodeId>> {
        let vote = self.metrics.get()?.borrow().vote;
        let census = self.probation.floor.lock().expect("not poisoned").clone();
        let greatest = holds_up_to(self.last_log(), census.and_then(|census| census.floor));
        Some(openraft::raft::VoteResponse::new(vote, greatest, false))
    }

    /// Whether this member may take the entries (or snapshot) of a leader that sends with
    /// `vote` (rule 4). A member on probation may have lost its vote with its disk: Raft has
    /// it refuse a leader of a term older than the one it voted in, and without that vote it
    /// would acknowledge a deposed leader (cut off since, unaware of the newer term), which
    /// could then commit, with this acknowledgement, entries under log ids the newer term has
    /// committed otherwise. So on probation it takes entries only from a leader at or above
    /// every established leadership the latest census round heard, and none before the first
    /// round returns.
    pub fn may_follow(&self, vote: &openraft::Vote<NodeId>) -> Result<(), Refused> {
        if self.probation.caught_up.load(Ordering::Relaxed) {
            return Ok(());
        }
        // Past the probation's bound, it follows anyone, as it votes for anyone.
        if self.floor().is_ok_and(|census| census.is_none()) {
            return Ok(());
        }
        match *self.probation.leader_term.lock().expect("not poisoned") {
            None => Err(Refused::Probation),
            Some(term) if term > vote.leader_id.term => Err(Refused::DeposedLeader),
            Some(_) => Ok(()),
        }
    }

    /// Whether this member, whose log ends at `own`, may stand for election (rule 4).
    pub fn may_campaign(&self, own: Option<&LogId<NodeId>>) -> bool {
        match self.floor() {
            Ok(None) => true,
            Ok(Some(census)) => at_or_above(own, census.floor.as_ref()),
            Err(_) => false,
        }
    }

    /// Records a census: the last log ids `answers` gave (node, store it presented, last log
    /// id). Answers from this member, from non-voters, or from a store the membership does not
    /// name are not counted; with `n − q + 1` other voters counted, the greatest of their log
    /// ids becomes the floor (rule 4). With fewer, the census held so far stays: every entry
    /// committed with this member's forgotten acknowledgement was committed before it
    /// restarted, so the first census that heard enough covers it for good. If the member
    /// holding the floor is gone, elections this member takes part in wait for it (the entries
    /// only it may hold must not be lost). Every round, however few answer, raises the term
    /// below which a leader is deposed ([`Identity::may_follow`]).
    pub fn record_census(&self, answers: &[Introduction]) {
        let Some(metrics) = self.metrics.get() else {
            return;
        };
        let (me, membership) = {
            let metrics = metrics.borrow();
            (metrics.id, metrics.membership_config.membership().clone())
        };
        let voters: Vec<NodeId> = membership.voter_ids().collect();
        if voters.is_empty() {
            // No membership yet (a member that voted but holds no entry): it cannot tell whom
            // to count, so it learns nothing and its probation runs to its bound.
            return;
        }
        let n = voters.len();
        let needed = n - n / 2;
        let Tally {
            heard,
            lost,
            floor,
            votes,
        } = Tally::of(me, &membership, &voters, answers);
        let leader_term = votes
            .iter()
            .filter(|vote| vote.committed)
            .map(|vote| vote.leader_id.term)
            .max()
            .unwrap_or(0);
        // A leadership, once established, deposes every older term for good.
        let mut known_term = self.probation.leader_term.lock().expect("not poisoned");
        *known_term = Some(known_term.unwrap_or(0).max(leader_term));
        drop(known_term);
        let others = voters.iter().filter(|&&voter| voter != me).count();
        let everyone = heard.len() + lost.difference(&heard).count() == others;
        if heard.len() < needed && !everyone {
            return;
        }
        *self.probation.heard_enough.lock().expect("not poisoned") =
            Some(tokio::time::Instant::now());
        let mut known = self.probation.floor.lock().expect("not poisoned");
        match known.as_mut() {
            // The votes stay those of the first census: a vote cast since this member
            // restarted cannot be one it lost, and a member campaigning again and again
            // (its term rising every round) must not keep it from voting in a later term.
            // Each census alone covers every entry committed before the restart: the lowest
            // floor any of them gave does.
            Some(census) => {
                if at_or_above(census.floor.as_ref(), floor.as_ref()) {
                    census.floor = floor;
                }
            }
            None => {
                tracing::info!(
                    heard = heard.len(),
                    ?floor,
                    "heard the logs of enough members: this member votes for candidates at or \
                     above the greatest of them"
                );
                *known = Some(Census { floor, votes });
            }
        }
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
    Ok(palisade_core::hex(&bytes))
}

/// What one census round heard from the other voters.
struct Tally {
    /// Voters that answered from the store the membership names.
    heard: std::collections::BTreeSet<NodeId>,
    /// Voters that answered from another store: they lost their disk.
    lost: std::collections::BTreeSet<NodeId>,
    /// The greatest log end `heard` reported.
    floor: Floor,
    /// Their votes.
    votes: Vec<openraft::Vote<NodeId>>,
}

impl Tally {
    /// Counts `answers` of the `voters` of `membership` other than `me`, each once.
    fn of(
        me: NodeId,
        membership: &Membership<NodeId, MemberNode>,
        voters: &[NodeId],
        answers: &[Introduction],
    ) -> Self {
        let mut tally = Tally {
            heard: std::collections::BTreeSet::new(),
            lost: std::collections::BTreeSet::new(),
            floor: None,
            votes: Vec::new(),
        };
        for answer in answers {
            let node = answer.node_id;
            if node == me || !voters.contains(&node) {
                continue;
            }
            if lost_its_store(membership, node, &answer.store) {
                tally.lost.insert(node);
                continue;
            }
            let counted = check(membership, node, &answer.store).is_ok();
            if !counted || !tally.heard.insert(node) {
                continue;
            }
            if !at_or_above(tally.floor.as_ref(), answer.last_log.as_ref()) {
                tally.floor = answer.last_log;
            }
            tally.votes.extend(answer.vote);
        }
        tally
    }
}

/// Who a node says it is (the `Identify` Raft RPC).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Introduction {
    /// Its `--node-id`.
    pub node_id: NodeId,
    /// Its store id.
    pub store: String,
    /// True when it holds log entries (of a cluster founded before).
    pub holds_log: bool,
    /// The id of its last log entry, for a restarted member's census (`identity` rule 4).
    #[serde(default)]
    pub last_log: Option<openraft::LogId<NodeId>>,
    /// Its vote (term and candidate), for the same census.
    #[serde(default)]
    pub vote: Option<openraft::Vote<NodeId>>,
}

impl Introduction {
    /// How member `node_id`, with `identity` and Raft `metrics`, introduces itself. Its history
    /// ends at its last log entry, or at its last applied one when that is later (a snapshot
    /// installed over a shorter log, before the log's purge caught up): a census must not hear
    /// less than the member holds.
    pub fn of(
        node_id: NodeId,
        identity: &Identity,
        metrics: &openraft::RaftMetrics<NodeId, MemberNode>,
    ) -> Self {
        Self {
            node_id,
            store: identity.store().to_owned(),
            holds_log: metrics.last_log_index.is_some(),
            last_log: holds_up_to(identity.last_log(), metrics.last_applied),
            vote: Some(metrics.vote),
        }
    }
}

#[cfg(test)]
#[path = "identity_tests.rs"]
mod tests;
