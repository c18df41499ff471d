//! Unit tests of member identity and probation (`identity.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::*;

fn node(addr: &str, store: &str) -> MemberNode {
    MemberNode {
        addr: addr.into(),
        store: store.into(),
    }
}

type Started = (
    tempfile::TempDir,
    Identity,
    watch::Sender<RaftMetrics<NodeId, MemberNode>>,
);

/// A member `me` of `members` that restarted with a log of 30 entries, on probation,
/// with the sender of its metrics.
fn restarted(me: NodeId, members: &[(NodeId, &str)]) -> Started {
    let mut metrics = RaftMetrics::new_initial(me);
    metrics.last_log_index = Some(30);
    metrics.membership_config = Arc::new(openraft::StoredMembership::new(
        Some(openraft::testing::log_id(1, 1, 0)),
        membership(members),
    ));
    started(metrics)
}

/// A member whose Raft starts with `metrics`.
fn started(metrics: RaftMetrics<NodeId, MemberNode>) -> Started {
    let dir = tempfile::tempdir().unwrap();
    let identity = Identity::open(&Database::create(dir.path().join("s.redb")).unwrap()).unwrap();
    let (tx, rx) = watch::channel(metrics);
    identity.attach(rx);
    (dir, identity, tx)
}

/// Node `node`'s answer to a census: the store it presents, where its log ends, its vote.
fn introduction(
    node: NodeId,
    store: &str,
    last: Option<LogId<NodeId>>,
    vote: openraft::Vote<NodeId>,
) -> super::Introduction {
    super::Introduction {
        node_id: node,
        store: store.to_owned(),
        holds_log: last.is_some(),
        last_log: last,
        vote: Some(vote),
        membership: None,
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
    let fresh = Identity::open(&Database::create(other.path().join("s.redb")).unwrap()).unwrap();
    assert_ne!(fresh.store(), first.store());
    assert_eq!(
        fresh.admit(1, "x"),
        Err(Refused::Starting),
        "nothing is admitted before Raft runs"
    );
}

/// P8 (rule 4): a member that restarted with a log, possibly an older copy, votes only
/// after hearing `n − q + 1` other voters (their stores as the membership names them),
/// then only for candidates at or above the greatest log it heard; a census that hears
/// too few leaves no floor; a leader catching it up to the census ends the probation.
#[test]
fn p8_a_restarted_member_votes_only_above_the_logs_a_census_heard() {
    use openraft::testing::log_id;
    let dir = tempfile::tempdir().unwrap();
    let identity = Identity::open(&Database::create(dir.path().join("s.redb")).unwrap()).unwrap();
    let members = [(1, "s1"), (2, "s2"), (3, "s3"), (4, "s4"), (5, "s5")];
    let mut metrics = RaftMetrics::new_initial(1);
    metrics.last_log_index = Some(30);
    metrics.membership_config = Arc::new(openraft::StoredMembership::new(
        Some(log_id(1, 1, 0)),
        membership(&members),
    ));
    let (tx, rx) = watch::channel(metrics);
    identity.attach(rx);
    assert_eq!(identity.may_vote(), Err(Refused::Probation));
    assert!(!identity.may_campaign(Some(&log_id(9, 1, 99))));
    assert!(identity.needs_census());
    let answer = |node: NodeId, store: &str, last: Option<LogId<NodeId>>| {
        introduction(node, store, last, openraft::Vote::new(4, 3))
    };
    let vote = |term: u64, node: NodeId| openraft::Vote::new(term, node);
    // Five voters: three of the four others must answer. Itself, a non-member and a
    // store the membership does not name (a wiped member) do not count.
    identity.record_census(&[
        answer(1, "s1", Some(log_id(9, 1, 99))),
        answer(2, "s2", Some(log_id(3, 2, 10))),
        answer(4, "wiped", Some(log_id(8, 4, 80))),
        answer(9, "s9", Some(log_id(8, 9, 80))),
        answer(5, "s5", None),
    ]);
    assert_eq!(identity.may_vote(), Err(Refused::Probation));
    identity.record_census(&[
        answer(2, "s2", Some(log_id(3, 2, 10))),
        answer(3, "s3", Some(log_id(4, 3, 7))),
        answer(5, "s5", None),
    ]);
    assert_eq!(identity.may_vote(), Ok(()));
    assert_eq!(
        identity.may_grant(Some(&log_id(3, 2, 20)), &vote(6, 2)),
        Err(Refused::BehindCensus),
        "a longer log of an older term is below the floor"
    );
    assert_eq!(
        identity.may_grant(None, &vote(6, 2)),
        Err(Refused::BehindCensus)
    );
    assert_eq!(
        identity.may_grant(Some(&log_id(4, 3, 7)), &vote(6, 3)),
        Ok(())
    );
    assert_eq!(
        identity.may_grant(Some(&log_id(5, 2, 1)), &vote(5, 2)),
        Ok(())
    );
    // The members heard voted for 3 in term 4: this member may have too, before its disk
    // went back. In term 4 it votes for 3 only; below it, for nobody.
    assert_eq!(
        identity.may_grant(Some(&log_id(4, 3, 7)), &vote(4, 3)),
        Ok(())
    );
    assert_eq!(
        identity.may_grant(Some(&log_id(4, 3, 7)), &vote(4, 2)),
        Err(Refused::VotedElsewhere)
    );
    assert_eq!(
        identity.may_grant(Some(&log_id(4, 3, 7)), &vote(3, 3)),
        Err(Refused::VotedElsewhere)
    );
    assert!(!identity.may_campaign(Some(&log_id(3, 1, 30))));
    assert!(identity.may_campaign(Some(&log_id(4, 3, 8))));
    // A later round that hears too few (a member cut off, a message lost) keeps the
    // census: it was covered from the first round that heard enough.
    identity.record_census(&[answer(2, "s2", Some(log_id(3, 2, 10)))]);
    assert_eq!(
        identity.may_grant(Some(&log_id(3, 2, 20)), &vote(6, 2)),
        Err(Refused::BehindCensus)
    );
    // A leader's AppendEntries that covers its commit ends the probation only at or
    // above the census: its log at the floor, its vote at every vote heard.
    identity.set_last_log(Some(log_id(4, 3, 40)));
    // A deposed leader of term 3 caught this member up (its vote now names that leader):
    // the census heard votes of term 4, so the probation goes on.
    let mut deposed = RaftMetrics::new_initial(1);
    deposed.vote = openraft::Vote::new_committed(3, 2);
    deposed.membership_config = tx.borrow().membership_config.clone();
    tx.send_replace(deposed.clone());
    identity.heard_leader(Some(40), Some(40));
    assert_eq!(
        identity.may_grant(Some(&log_id(4, 3, 7)), &vote(4, 2)),
        Err(Refused::VotedElsewhere)
    );
    // The leader of term 4 catches it up: at the floor and every vote heard, it is off
    // probation.
    let mut current = deposed;
    current.vote = openraft::Vote::new_committed(4, 3);
    tx.send_replace(current);
    identity.heard_leader(Some(40), Some(40));
    assert_eq!(identity.may_grant(None, &vote(1, 2)), Ok(()));
    assert!(!identity.needs_census());
}

/// P8 (rule 4): a voter that answers with another store than the membership names lost
/// its disk: a round that heard every other voter, some of them that way, is a census
/// (its floor from the intact ones), and a later census lowers the floor, never raises
/// it. The regression: a floor set by an uncommitted entry of a leader wiped since made
/// this member refuse every candidate, and the removal of that leader never came.
#[test]
fn p8_a_census_counts_a_voter_that_lost_its_store_and_keeps_the_lowest_floor() {
    use openraft::testing::log_id;
    let (_dir, identity, _tx) = restarted(3, &[(1, "s1"), (2, "s2"), (3, "s3")]);
    let answer = |node: NodeId, store: &str, last: LogId<NodeId>| {
        introduction(node, store, Some(last), openraft::Vote::new(5, 1))
    };
    // The lost voter alone is not every other voter: no census.
    identity.record_census(&[answer(1, "wiped", log_id(1, 1, 1))]);
    assert_eq!(identity.may_vote(), Err(Refused::Probation));
    // Both others heard: leader 1's last entry (uncommitted) sets the floor.
    identity.record_census(&[
        answer(1, "s1", log_id(5, 1, 36)),
        answer(2, "s2", log_id(5, 1, 35)),
    ]);
    assert_eq!(
        identity.may_grant(Some(&log_id(5, 1, 35)), &openraft::Vote::new(6, 2)),
        Err(Refused::BehindCensus)
    );
    // Member 1 comes back wiped: every other voter answered, one of them from another
    // store, and the floor goes down to what the intact one holds.
    identity.record_census(&[
        answer(1, "wiped", log_id(1, 1, 1)),
        answer(2, "s2", log_id(5, 1, 35)),
    ]);
    assert_eq!(
        identity.may_grant(Some(&log_id(5, 1, 35)), &openraft::Vote::new(6, 2)),
        Ok(())
    );
    // A later census with a greater log does not raise it again.
    identity.record_census(&[
        answer(1, "s1", log_id(6, 2, 50)),
        answer(2, "s2", log_id(6, 2, 50)),
    ]);
    assert_eq!(
        identity.may_grant(Some(&log_id(5, 1, 35)), &openraft::Vote::new(7, 2)),
        Ok(())
    );
}

/// P8 (rule 4): a census floor holds however long the member holding it is away — no timer
/// lowers it. Before, it lapsed when no round had heard enough voters for 5 s: a restarted
/// member booted 5 s before the one holding its forgotten entries voted a lagging member in.
#[tokio::test(start_paused = true)]
async fn p8_a_census_floor_holds_however_long_its_holder_is_down() {
    use openraft::testing::log_id;
    let (_dir, identity, _tx) = restarted(1, &[(1, "s1"), (2, "s2"), (3, "s3")]);
    let answer = |node: NodeId, store: &str, last: LogId<NodeId>| {
        introduction(node, store, Some(last), openraft::Vote::new(5, 3))
    };
    let behind = || identity.may_grant(Some(&log_id(5, 3, 35)), &openraft::Vote::new(6, 2));
    identity.record_census(&[
        answer(2, "s2", log_id(5, 3, 35)),
        answer(3, "s3", log_id(5, 3, 36)),
    ]);
    assert_eq!(behind(), Err(Refused::BehindCensus));
    // Member 3 is away for a day; rounds hear member 2 only.
    for _ in 0..24 {
        tokio::time::advance(Duration::from_secs(3_600)).await;
        identity.record_census(&[answer(2, "s2", log_id(5, 3, 35))]);
        assert_eq!(behind(), Err(Refused::BehindCensus));
    }
    assert_eq!(identity.waiting_for(), vec![3]);
    assert!(identity.needs_census());
    // A store that never heard enough stays on probation as long, and follows nobody older
    // than what it heard.
    let (_dir, never, _tx) = restarted(1, &[(1, "s1"), (2, "s2"), (3, "s3")]);
    tokio::time::advance(Duration::from_secs(86_400)).await;
    never.record_census(&[answer(2, "s2", log_id(5, 3, 35))]);
    assert_eq!(never.may_vote(), Err(Refused::Probation));
    assert!(!never.may_campaign(Some(&log_id(9, 1, 99))));
}

/// P8 (rule 4), liveness: when the member a census waits for is gone for good, the operator
/// says so (`palisade cluster lost ID`) and the census counts it lost: the round that hears
/// every other voter completes, its floor from those heard. Without the word, the floor an
/// uncommitted entry of that member set refused every candidate for good, the removal of
/// that member's included (`--copy-back` seed 7600289, once answered by a 5 s expiry).
#[test]
fn p8_an_operator_declaring_a_member_lost_releases_a_census_that_cannot_complete() {
    use openraft::testing::log_id;
    let (_dir, identity, _tx) = restarted(1, &[(1, "s1"), (2, "s2"), (3, "s3")]);
    let answer = |node: NodeId, store: &str, last: LogId<NodeId>| {
        introduction(node, store, Some(last), openraft::Vote::new(5, 3))
    };
    let only_2 = [answer(2, "s2", log_id(5, 3, 35))];
    identity.record_census(&only_2);
    assert_eq!(identity.may_vote(), Err(Refused::Probation));
    assert_eq!(identity.waiting_for(), vec![3]);
    assert!(identity.declare_lost(3), "on probation");
    identity.record_census(&only_2);
    assert_eq!(
        identity.may_grant(Some(&log_id(5, 3, 35)), &openraft::Vote::new(6, 2)),
        Ok(())
    );
    assert_eq!(
        identity.may_grant(Some(&log_id(5, 3, 34)), &openraft::Vote::new(6, 2)),
        Err(Refused::BehindCensus),
        "the floor still holds what the member heard"
    );
    assert!(identity.waiting_for().is_empty());
    // A floor set while 3 answered comes down once 3 is declared lost and stays away.
    let (_dir, floored, _tx) = restarted(1, &[(1, "s1"), (2, "s2"), (3, "s3")]);
    floored.record_census(&[only_2[0].clone(), answer(3, "s3", log_id(5, 3, 36))]);
    assert_eq!(
        floored.may_grant(Some(&log_id(5, 3, 35)), &openraft::Vote::new(6, 2)),
        Err(Refused::BehindCensus)
    );
    floored.declare_lost(3);
    floored.record_census(&only_2);
    assert_eq!(
        floored.may_grant(Some(&log_id(5, 3, 35)), &openraft::Vote::new(6, 2)),
        Ok(())
    );
}

/// P8 (rule 4): on probation, a member takes entries from no leader before its first
/// census round, and none from a leader of a term older than an established leadership
/// the round heard (a deposed leader); a round with too few answers still counts for
/// this; off probation it follows anyone Raft accepts.
#[test]
fn p8_a_member_on_probation_takes_no_entries_from_a_deposed_leader() {
    use openraft::testing::log_id;
    use openraft::Vote;
    let (_dir, identity, _tx) = restarted(1, &[(1, "s1"), (2, "s2"), (3, "s3")]);
    let answer = |node: NodeId, store: &str, vote: Vote<NodeId>| {
        let last = log_id(vote.leader_id.term, vote.leader_id.node_id, 50);
        introduction(node, store, Some(last), vote)
    };
    assert_eq!(
        identity.may_follow(&Vote::new_committed(9, 3)),
        Err(Refused::Probation),
        "before the first census round"
    );
    // One answer of two needed: no floor, but member 2 follows the leader of term 10.
    identity.record_census(&[answer(2, "s2", Vote::new_committed(10, 2))]);
    assert_eq!(
        identity.may_follow(&Vote::new_committed(9, 3)),
        Err(Refused::DeposedLeader)
    );
    assert_eq!(identity.may_follow(&Vote::new_committed(10, 2)), Ok(()));
    assert_eq!(identity.may_follow(&Vote::new_committed(11, 3)), Ok(()));
    // A candidate's vote is no established leadership: the leader of term 10 still is.
    identity.record_census(&[
        answer(2, "s2", Vote::new_committed(10, 2)),
        answer(3, "s3", Vote::new(12, 3)),
    ]);
    assert_eq!(identity.may_follow(&Vote::new_committed(10, 2)), Ok(()));
    assert_eq!(
        identity.may_follow(&Vote::new_committed(9, 3)),
        Err(Refused::DeposedLeader)
    );
}

/// P8 (rule 4): a store with an empty log — new, or a copy taken before its member's first
/// vote or first entry — is on probation too. It cannot read its membership: its census
/// counts the voters of the latest membership an answer holds that names its store. Before,
/// one with no vote was exempt ("a store that never voted acknowledged nothing"), and put
/// back after its member had acknowledged entries it voted a lagging member in at once.
/// A store no membership names (a `--join` member not yet added) still follows the leader
/// that adds it once a census round has returned.
#[test]
fn p8_an_empty_store_is_on_probation_and_counts_the_membership_that_names_it() {
    use openraft::testing::log_id;
    let (_dir, identity, _tx) = started(RaftMetrics::new_initial(3));
    assert_eq!(identity.may_vote(), Err(Refused::Probation));
    assert!(!identity.may_campaign(None));
    assert!(identity.needs_census());
    let store = identity.store().to_owned();
    let named = openraft::StoredMembership::new(
        Some(log_id(1, 1, 0)),
        membership(&[(1, "s1"), (2, "s2"), (3, &store)]),
    );
    let answer = |node: NodeId, last: LogId<NodeId>, held: Option<_>| super::Introduction {
        membership: held,
        ..introduction(
            node,
            &format!("s{node}"),
            Some(last),
            openraft::Vote::new_committed(10, 1),
        )
    };
    // Nobody names this store (a `--join` member before `cluster add`): no census, but it
    // follows a leader at or above the leaderships it heard.
    let unnamed = openraft::StoredMembership::new(
        Some(log_id(1, 1, 0)),
        membership(&[(1, "s1"), (2, "s2"), (3, "another")]),
    );
    identity.record_census(&[answer(1, log_id(10, 1, 61), Some(unnamed.clone()))]);
    assert_eq!(identity.may_vote(), Err(Refused::Probation));
    assert_eq!(
        identity.may_follow(&openraft::Vote::new_committed(10, 1)),
        Ok(())
    );
    assert_eq!(
        identity.may_follow(&openraft::Vote::new_committed(9, 2)),
        Err(Refused::DeposedLeader)
    );
    // One answer names it: its census needs both other voters of that membership.
    identity.record_census(&[answer(1, log_id(10, 1, 61), Some(named.clone()))]);
    assert_eq!(identity.may_vote(), Err(Refused::Probation));
    let listed = BTreeMap::from([(1, "127.0.0.1:7001".to_owned())]);
    let targets: Vec<NodeId> = identity
        .census_targets(&listed)
        .iter()
        .map(|t| t.0)
        .collect();
    assert_eq!(
        targets,
        vec![1, 2],
        "the learned membership's voters are asked too"
    );
    identity.record_census(&[
        answer(1, log_id(10, 1, 61), Some(named)),
        answer(2, log_id(9, 1, 50), None),
    ]);
    assert_eq!(identity.may_vote(), Ok(()));
    assert_eq!(
        identity.may_grant(Some(&log_id(9, 1, 50)), &openraft::Vote::new(11, 2)),
        Err(Refused::BehindCensus),
        "the lagging member is not voted in"
    );
    assert_eq!(
        identity.may_grant(Some(&log_id(10, 1, 61)), &openraft::Vote::new(11, 1)),
        Ok(())
    );
}

/// P8 (rule 4), liveness: a member on probation refuses a candidate with an answer, as Raft
/// refuses one whose log is behind — its vote, and the greatest log it knows of (the census
/// floor when that is above its own) — never with silence. Seed 8003243 (`--rollback`):
/// refused without an answer, a lagging member with the higher node id never learned that a
/// greater log existed, stood in every term the eligible member stood in and won each tie of
/// the term against it: no leader for the whole recovery.
#[test]
fn p8_a_refused_candidate_hears_the_greatest_log_and_the_vote() {
    use openraft::testing::log_id;
    let (_dir, identity, tx) = restarted(1, &[(1, "s1"), (2, "s2"), (3, "s3")]);
    let mut metrics = tx.borrow().clone();
    metrics.vote = openraft::Vote::new(7, 1);
    tx.send_replace(metrics);
    identity.set_last_log(Some(log_id(3, 2, 30)));
    let refusal = identity.refusal().unwrap();
    assert!(!refusal.vote_granted);
    assert_eq!(refusal.vote, openraft::Vote::new(7, 1));
    assert_eq!(
        refusal.last_log_id,
        Some(log_id(3, 2, 30)),
        "before a census"
    );
    let answer = |node: NodeId, last: LogId<NodeId>| {
        let store = format!("s{node}");
        introduction(
            node,
            &store,
            Some(last),
            openraft::Vote::new_committed(10, 2),
        )
    };
    identity.record_census(&[answer(2, log_id(10, 2, 141)), answer(3, log_id(3, 2, 92))]);
    assert_eq!(
        identity.may_grant(Some(&log_id(3, 2, 92)), &openraft::Vote::new(11, 3)),
        Err(Refused::BehindCensus)
    );
    let refusal = identity.refusal().unwrap();
    assert!(!refusal.vote_granted);
    assert_eq!(
        refusal.last_log_id,
        Some(log_id(10, 2, 141)),
        "the census floor"
    );
}

/// P8 (rule 4): a census hears where a member's history ends — its last applied entry when
/// a snapshot installed over a shorter log put that beyond the log's end. Seed 7009589
/// (`--rollback`): a census heard the log a snapshot had replaced, set its floor below an
/// entry a majority held, and voted in a member that lacked it.
#[test]
fn p8_a_member_introduces_itself_with_what_it_applied_beyond_its_log() {
    use openraft::testing::log_id;
    let (_dir, identity, tx) = restarted(2, &[(1, "s1"), (2, "s2"), (3, "s3")]);
    identity.set_last_log(Some(log_id(1, 1, 9)));
    let mut metrics = tx.borrow().clone();
    metrics.last_applied = Some(log_id(8, 2, 90));
    tx.send_replace(metrics);
    let introduction = super::Introduction::of(2, &identity, &tx.borrow());
    assert_eq!(introduction.last_log, Some(log_id(8, 2, 90)));
    identity.set_last_log(Some(log_id(8, 2, 95)));
    let introduction = super::Introduction::of(2, &identity, &tx.borrow());
    assert_eq!(introduction.last_log, Some(log_id(8, 2, 95)));
}
