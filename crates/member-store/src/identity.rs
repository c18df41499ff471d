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
//! 4. **A store votes and stands for election only once it knows it cannot lose a committed
//!    entry** ([`Identity::may_grant`], [`Identity::may_campaign`]). Whatever it holds at
//!    start — a log, a vote, or nothing at all — its disk may be an older copy that nothing on
//!    it can tell from the real one (a whole-volume snapshot put back, witness included), taken
//!    at any instant: before the member's first vote, between a `--join` and its first entry,
//!    or later. Voting from it, it could elect a lagging member that lacks entries it had
//!    itself acknowledged, and those entries would be lost (P8). So every store starts on
//!    probation, and leaves it only when
//!    - an AppendEntries from a leader has left it holding every entry that leader says is
//!      committed, and at or above the latest census below (its log at the floor, its
//!      vote at every vote heard: the leader may be a deposed one that has not heard of the
//!      newer term yet) ([`Identity::heard_leader`]), or
//!    - it is the only voter of its membership.
//!
//!    Meanwhile it takes a **census** ([`Identity::record_census`]): it asks the other voters
//!    for their last log id, their vote and their membership, and once it has heard `n − q + 1`
//!    of them (`n` voters, majority `q`: both others of 3, three of the four others of 5), each
//!    from the store the membership names, it votes — only for a candidate whose last log id is
//!    at or above the greatest it heard (the census floor), only in a term no member heard
//!    voted past and, in that term, only for the candidate they voted for (its own vote may
//!    have gone back with its disk: never twice in a term) — and stands for election only
//!    when its own log is at or above the floor. Every entry committed with this member's
//!    acknowledgement is on `q − 1` other voters, so one of those it heard holds it. The votes
//!    that bind it are those of the first census (a vote cast since it restarted cannot be one
//!    it lost); each later round that hears enough is a census on its own, and the floor is the
//!    lowest any gave (the greatest log of one round may be an uncommitted entry of a member
//!    gone by the next). A round that hears too few changes nothing: the first census covers
//!    every entry committed before the restart for good.
//!
//!    A store with an empty log cannot read its membership: its census counts the voters of
//!    the latest membership an answer holds that names its store (voter or learner), asking
//!    the members of its `--cluster` list until one does. A store no membership names is new
//!    (founding, or started with `--join` and not added yet): nobody counts its vote, so its
//!    probation holds nothing up — founding members learn the founder's membership from its
//!    answer and vote once they have heard the others, and a `--join` member follows the
//!    leader that adds it once a census round has returned.
//!
//!    A voter counts as **lost** when it answers from another store than the membership names
//!    (its disk is gone, and every entry only it held with it), or when an operator declared
//!    it lost on this member ([`Identity::declare_lost`], `palisade cluster lost ID`) and it
//!    does not answer: a round that heard every other voter, some of them lost, is a census
//!    too, its floor from the intact ones. No timer ends a probation or lowers a floor: a
//!    member whose census waits for a voter that is down waits for it, however long it is
//!    away. What can stop an election for good is a voter gone for good (its store destroyed
//!    while down, never started again): the operator's word is the one way past it, and it is
//!    the assumption this rule rests on — a store declared lost that comes back may hold
//!    entries this member acknowledged, which may then be lost. The documented way back for a
//!    wiped member needs no such word: started again, empty, it answers from its new store.
//!
//!    Until then its vote requests are refused before Raft sees them and its elections are
//!    off, and it takes entries only from a leader at or above every established leadership
//!    any census round heard ([`Identity::may_follow`]): with its vote gone back, it would
//!    otherwise acknowledge a deposed leader, which could commit with it entries under log
//!    ids the newer term committed otherwise. A candidate it refuses gets Raft's answer to a
//!    candidate whose log is behind ([`Identity::refusal`]: its vote, the greatest log it
//!    knows of), not silence.
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

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use openraft::{LogId, Membership, RaftMetrics, StoredMembership};
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
    /// This member is on probation (rule 4): it has neither caught up with a leader nor heard
    /// enough other voters yet.
    #[error(
        "this member's store may be an older copy (restarted, or put back) and has neither \
         caught up with a leader nor heard the logs of enough other voters: it votes once it \
         has (voting from an older copy could lose entries it acknowledged). If a member it \
         waits for lost its data for good: `palisade cluster lost ID` on this member"
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

/// A store's probation (rule 4): from its start until it has caught up with a leader, or
/// for good after an operator's `palisade cluster lost` left nothing to wait for.
#[derive(Debug, Default)]
struct Probation {
    caught_up: AtomicBool,
    /// Set by the first census that heard enough voters; lowered by later ones.
    floor: Mutex<Option<Census>>,
    /// The greatest term of a committed vote any census round heard, however few answered
    /// (`None` before the first round returns).
    leader_term: Mutex<Option<u64>>,
    /// For a store that holds no membership of its own (an empty log): the latest membership
    /// a census answer held that names this store. Its census counts that membership's voters.
    learned: Mutex<Option<StoredMembership<NodeId, MemberNode>>>,
    /// Voters an operator declared lost for good (`palisade cluster lost`): a round that
    /// does not hear them counts them as it counts a voter answering from another store.
    declared_lost: Mutex<BTreeSet<NodeId>>,
    /// The voters the latest round that heard too few was waiting for (for the log, the
    /// operator and the simulation's driver).
    waiting_for: Mutex<Vec<NodeId>>,
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
            probation: Arc::default(),
            last_log: Arc::default(),
        })
    }

    /// This store's id.
    pub fn store(&self) -> &str {
        &self.store
    }

    /// Checks peers against the membership of this Raft member from now on. Every store
    /// starts on probation (rule 4), whatever it holds: an empty log and no vote is also what
    /// a copy taken before the member's first vote or first entry holds.
    pub fn attach(&self, metrics: watch::Receiver<RaftMetrics<NodeId, MemberNode>>) {
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
    /// leader, or the only voter), `Ok(Some(floor))` on probation after a census, `Err` on
    /// probation before one. No timer ends it: a floor stays until a leader catches this
    /// member up to it, however long the member holding it is away.
    fn floor(&self) -> Result<Option<Census>, Refused> {
        if self.probation.caught_up.load(Ordering::Relaxed) {
            return Ok(None);
        }
        if self.alone().ok_or(Refused::Starting)? {
            return Ok(None);
        }
        match self.probation.floor.lock().expect("not poisoned").clone() {
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
        // The only voter follows anyone, as it votes for anyone.
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
    /// id). The voters counted are those of this member's membership, or, when its log is
    /// empty, of the latest membership an answer holds that names this store (it cannot read
    /// its own). Answers from this member, from non-voters, or from a store the membership
    /// does not name are not counted; with `n − q + 1` other voters counted, the greatest of
    /// their log ids becomes the floor (rule 4). With fewer, the census held so far stays:
    /// every entry committed with this member's forgotten acknowledgement was committed
    /// before it restarted, so the first census that heard enough covers it for good, and
    /// elections this member takes part in wait for the member holding the floor (the
    /// entries only it may hold must not be lost) until an operator declares it lost
    /// ([`Identity::declare_lost`]). Every round, however few answer, raises the term below
    /// which a leader is deposed ([`Identity::may_follow`]).
    pub fn record_census(&self, answers: &[Introduction]) {
        let Some(metrics) = self.metrics.get() else {
            return;
        };
        let (me, own) = {
            let metrics = metrics.borrow();
            (metrics.id, metrics.membership_config.membership().clone())
        };
        self.raise_leader_term(me, answers);
        let Some(membership) = self.census_membership(me, own, answers) else {
            // No membership names this store: nobody counts its vote, and it learns whom to
            // count once one does.
            return;
        };
        let voters: Vec<NodeId> = membership.voter_ids().collect();
        let n = voters.len();
        let needed = n - n / 2;
        let declared = self
            .probation
            .declared_lost
            .lock()
            .expect("not poisoned")
            .clone();
        let tally = Tally::of(me, &membership, &voters, answers, &declared);
        let others: Vec<NodeId> = voters.iter().copied().filter(|&v| v != me).collect();
        let everyone =
            tally.heard.len() + tally.lost.difference(&tally.heard).count() == others.len();
        if tally.heard.len() < needed && !everyone {
            self.note_waiting(&others, &tally);
            return;
        }
        self.probation
            .waiting_for
            .lock()
            .expect("not poisoned")
            .clear();
        let mut known = self.probation.floor.lock().expect("not poisoned");
        match known.as_mut() {
            // The votes stay those of the first census: a vote cast since this member
            // restarted cannot be one it lost, and a member campaigning again and again
            // (its term rising every round) must not keep it from voting in a later term.
            // Each census alone covers every entry committed before the restart: the lowest
            // floor any of them gave does.
            Some(census) => {
                if at_or_above(census.floor.as_ref(), tally.floor.as_ref()) {
                    census.floor = tally.floor;
                }
            }
            None => {
                tracing::info!(
                    heard = tally.heard.len(),
                    lost = ?tally.lost,
                    floor = ?tally.floor,
                    "heard the logs of enough members: this member votes for candidates at or \
                     above the greatest of them"
                );
                *known = Some(Census {
                    floor: tally.floor,
                    votes: tally.votes,
                });
            }
        }
    }

    /// A leadership, once established, deposes every older term for good: the greatest term
    /// of a committed vote any member other than this one answers with (what a member holds
    /// is what it follows, whichever store it answers from).
    fn raise_leader_term(&self, me: NodeId, answers: &[Introduction]) {
        let heard = answers
            .iter()
            .filter(|answer| answer.node_id != me)
            .filter_map(|answer| answer.vote)
            .filter(|vote| vote.committed)
            .map(|vote| vote.leader_id.term)
            .max()
            .unwrap_or(0);
        let mut known = self.probation.leader_term.lock().expect("not poisoned");
        *known = Some(known.unwrap_or(0).max(heard));
    }

    /// The membership whose voters a census counts: this member's own, or, with none (an
    /// empty log: a new store, or a copy taken before its first entry), the latest one an
    /// answer holds that names this store as a voter or a learner, kept from round to round.
    fn census_membership(
        &self,
        me: NodeId,
        own: Membership<NodeId, MemberNode>,
        answers: &[Introduction],
    ) -> Option<Membership<NodeId, MemberNode>> {
        if own.nodes().next().is_some() {
            return Some(own);
        }
        let mut learned = self.probation.learned.lock().expect("not poisoned");
        let naming = answers
            .iter()
            .filter_map(|answer| answer.membership.as_ref())
            .filter(|held| {
                held.membership()
                    .get_node(&me)
                    .is_some_and(|node| node.store == self.store)
            });
        for held in naming {
            if learned
                .as_ref()
                .is_none_or(|known| held.log_id() > known.log_id())
            {
                *learned = Some(held.clone());
            }
        }
        learned.as_ref().map(|known| known.membership().clone())
    }

    /// Logs the voters a round that heard too few waits for, when they change.
    fn note_waiting(&self, others: &[NodeId], tally: &Tally) {
        let waiting: Vec<NodeId> = others
            .iter()
            .copied()
            .filter(|voter| !tally.heard.contains(voter) && !tally.lost.contains(voter))
            .collect();
        let mut known = self.probation.waiting_for.lock().expect("not poisoned");
        if *known != waiting {
            tracing::warn!(
                ?waiting,
                "on probation: waiting to hear from these voters (their logs may hold entries \
                 this member acknowledged before its disk went back). If one of them lost its \
                 data for good: `palisade cluster lost ID` on this member"
            );
            known.clone_from(&waiting);
        }
    }

    /// The voters this member's census waits for, while on probation without enough heard
    /// (empty: it waits for nobody, or is off probation).
    pub fn waiting_for(&self) -> Vec<NodeId> {
        if self.probation.caught_up.load(Ordering::Relaxed) {
            return Vec::new();
        }
        self.probation
            .waiting_for
            .lock()
            .expect("not poisoned")
            .clone()
    }

    /// An operator's word (`palisade cluster lost ID`) that member `node`'s store is gone for
    /// good — its data directory lost, its disk replaced — and every entry only it held with
    /// it: from the next round on, a census that does not hear it counts it as it counts a
    /// voter answering from another store, so a round that hears every other voter completes
    /// (its floor from those heard). The operator vouches for it: if the store comes back,
    /// entries only it held and this member acknowledged may be lost (P8). Returns whether
    /// this member is on probation (when it is not, the word changes nothing).
    pub fn declare_lost(&self, node: NodeId) -> bool {
        let on_probation = !self.probation.caught_up.load(Ordering::Relaxed);
        tracing::warn!(
            node,
            on_probation,
            "an operator declared node {node}'s store lost for good (`palisade cluster lost`): \
             this member's census counts it as lost from now on"
        );
        self.probation
            .declared_lost
            .lock()
            .expect("not poisoned")
            .insert(node);
        on_probation
    }

    /// Whom a census asks, with their addresses: the other voters of this member's membership
    /// (see [`Identity::record_census`] for a member with an empty log), and, with no
    /// membership of its own, the members of its `--cluster` list (`listed`) too: one of them
    /// may hold a membership that names this store.
    pub fn census_targets(
        &self,
        listed: &std::collections::BTreeMap<NodeId, String>,
    ) -> Vec<(NodeId, String)> {
        let Some(metrics) = self.metrics.get() else {
            return Vec::new();
        };
        let (me, own) = {
            let metrics = metrics.borrow();
            (metrics.id, metrics.membership_config.membership().clone())
        };
        let mut targets = std::collections::BTreeMap::new();
        let membership = if own.nodes().next().is_some() {
            Some(own)
        } else {
            targets.extend(listed.iter().map(|(id, addr)| (*id, addr.clone())));
            let learned = self.probation.learned.lock().expect("not poisoned");
            learned.as_ref().map(|known| known.membership().clone())
        };
        for membership in membership.iter() {
            for voter in membership.voter_ids() {
                if let Some(node) = membership.get_node(&voter) {
                    targets.insert(voter, node.addr.clone());
                }
            }
        }
        targets.remove(&me);
        targets.into_iter().collect()
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
    heard: BTreeSet<NodeId>,
    /// Voters that answered from another store (they lost their disk), or that an operator
    /// declared lost and that did not answer.
    lost: BTreeSet<NodeId>,
    /// The greatest log end `heard` reported.
    floor: Floor,
    /// Their votes.
    votes: Vec<openraft::Vote<NodeId>>,
}

impl Tally {
    /// Counts `answers` of the `voters` of `membership` other than `me`, each once; a voter
    /// in `declared_lost` that is not heard counts as lost.
    fn of(
        me: NodeId,
        membership: &Membership<NodeId, MemberNode>,
        voters: &[NodeId],
        answers: &[Introduction],
        declared_lost: &BTreeSet<NodeId>,
    ) -> Self {
        let mut tally = Tally {
            heard: BTreeSet::new(),
            lost: BTreeSet::new(),
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
        for voter in voters.iter().filter(|voter| declared_lost.contains(voter)) {
            if *voter != me && !tally.heard.contains(voter) {
                tally.lost.insert(*voter);
            }
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
    /// The membership it holds (`None`: none yet), for the census of a member with an empty
    /// log, which cannot read its own: does it name that member's store?
    #[serde(default)]
    pub membership: Option<StoredMembership<NodeId, MemberNode>>,
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
            membership: (metrics.membership_config.nodes().next().is_some())
                .then(|| metrics.membership_config.as_ref().clone()),
        }
    }
}

#[cfg(test)]
#[path = "identity_tests.rs"]
mod tests;
