//! Membership changes, one at a time: founding a new cluster, `palisade cluster add` and
//! `palisade cluster remove`.
//!
//! - Every member is known by its node id, address **and store id** ([`MemberNode`]); the
//!   store id comes from the node itself ([`Introducer`]), so the replicated membership is
//!   what every member checks its peers against ([`super::identity`]).
//! - A new cluster is founded by its lowest node id, once every founding member has said who
//!   it is and that it holds no cluster yet; the others wait to be replicated to. One member
//!   writes the first entry, so no two members can write different first entries.
//! - `add` makes the node a learner, waits until it has caught up, and only then makes it a
//!   voter; a node that does not catch up in time is removed again and never votes. An
//!   unreachable address therefore cannot become a voter and cannot take the quorum away.
//! - Changes are expressed as add/remove of one node (openraft computes the new set against
//!   the membership it holds when it applies the change), never as a voter set rebuilt from a
//!   read taken earlier, and a leader runs one change at a time ([`MembershipError::Busy`]).
//! - Every step has a deadline; a change that cannot complete returns an error and leaves the
//!   cluster serving.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use openraft::ChangeMembers;

use super::identity::Introduction;
use super::{MemberNode, MembershipError, NodeId, RaftNode, MAX_MEMBERS};

/// How long a new member has to catch up as a learner before `add` gives up.
pub const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one membership entry has to commit.
pub const CHANGE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long asking a node who it is may take.
pub const INTRODUCE_TIMEOUT: Duration = Duration::from_secs(2);
/// Between two founding attempts.
const FOUND_RETRY: Duration = Duration::from_millis(100);
/// Between two "still waiting to found" log lines.
const FOUND_LOG_EVERY: Duration = Duration::from_secs(5);

/// A boxed future of an introduction.
pub type Introducing = Pin<Box<dyn Future<Output = Result<Introduction, String>> + Send>>;

/// A boxed future of a peer's wall-clock reading (ms since 1970).
pub type ReadingClock = Pin<Box<dyn Future<Output = Result<u64, String>> + Send>>;

/// Asks the node at an address who it is, and what its clock reads: gRPC between real
/// members, the simulated network in the cluster simulation.
pub trait Introducer: Send + Sync + 'static {
    /// The node at `addr`, or why it did not answer.
    fn introduce(&self, node: NodeId, addr: &str) -> Introducing;
    /// The wall clock of the node at `addr` (`crate::clock_check`), or why it did not answer.
    fn read_clock(&self, node: NodeId, addr: &str) -> ReadingClock;
}

/// Runs membership changes on this member (they succeed only while it leads).
pub struct Changes {
    raft: RaftNode,
    introducer: Arc<dyn Introducer>,
    /// Held for the whole of a change: one change at a time.
    running: tokio::sync::Mutex<()>,
    catch_up: Duration,
    commit: Duration,
}

impl Changes {
    /// Changes of `raft`'s membership, asking new nodes who they are through `introducer`.
    pub fn new(raft: RaftNode, introducer: Arc<dyn Introducer>) -> Self {
        Self::with_timeouts(raft, introducer, CATCH_UP_TIMEOUT, CHANGE_TIMEOUT)
    }

    /// As [`Self::new`], with other deadlines (the simulation's clock is faster).
    pub fn with_timeouts(
        raft: RaftNode,
        introducer: Arc<dyn Introducer>,
        catch_up: Duration,
        commit: Duration,
    ) -> Self {
        Self {
            raft,
            introducer,
            running: tokio::sync::Mutex::new(()),
            catch_up,
            commit,
        }
    }

    /// Adds node `id` at `addr` (started with `--join`): learner first, voter once caught up.
    /// Returns the voters after the change. Repeating an `add` that timed out resumes it (the
    /// same node, the same store): from catching up, or nothing to do if it votes already.
    pub async fn add(&self, id: NodeId, addr: &str) -> Result<BTreeSet<NodeId>, MembershipError> {
        if id == 0 {
            return Err(MembershipError::Invalid("node ids start at 1".into()));
        }
        super::validate_addr(addr).map_err(MembershipError::Invalid)?;
        let _one_at_a_time = self.running.try_lock().map_err(|_| MembershipError::Busy)?;
        let introduction = self.introduce(id, addr).await?;
        if introduction.node_id != id {
            return Err(MembershipError::WrongNode(format!(
                "the node at {addr} is node {}, not {id}",
                introduction.node_id
            )));
        }
        let node = MemberNode {
            addr: addr.to_owned(),
            store: introduction.store,
        };
        let membership = self.membership();
        match membership.get_node(&id) {
            Some(known) if *known == node => {
                if self.is_voter(id) {
                    return Ok(self.membership().voter_ids().collect());
                }
                // A learner, or a voter of a joint membership whose second step was lost with
                // a leader: both resume (catching up is quick, the last step finishes it).
                tracing::info!(id, addr, "resuming the addition of node {id}");
            }
            Some(known) => {
                return Err(MembershipError::Conflict(format!(
                    "node {id} is already a member at {} (another store); to replace it, \
                     `palisade cluster remove {id}` first",
                    known.addr
                )))
            }
            None => {
                // A node started with --join may already hold entries: a leader's messages in
                // flight reach it before it is added. What binds it is its store id.
                self.check_new(&membership, addr)?;
                self.change(ChangeMembers::AddNodes(BTreeMap::from([(id, node)])))
                    .await?;
            }
        }
        self.wait_caught_up(id, addr).await?;
        self.change(ChangeMembers::AddVoterIds(BTreeSet::from([id])))
            .await?;
        Ok(self.membership().voter_ids().collect())
    }

    /// True when `id` votes in the membership this member holds and that membership is
    /// uniform. In a joint membership (`[{1,2},{1,2,3}]`: an addition whose second step has
    /// not committed) node 3 is not yet a voter that the cluster can count on.
    pub fn is_voter(&self, id: NodeId) -> bool {
        let membership = self.membership();
        let configs = membership.get_joint_config();
        configs.len() == 1 && configs[0].contains(&id)
    }

    /// Finishes a joint membership a deposed leader left behind: openraft commits a change in
    /// two steps (joint, then uniform), and a leader that loses its term between them leaves
    /// the cluster joint, where every decision needs a majority of *both* configurations, so
    /// one more lost member can stop it for good and no `remove` can help. Proposes the
    /// joint's last configuration (the change's target), which is always safe once the joint
    /// entry committed (openraft refuses until it has). Returns whether there was one to
    /// finish; `Busy` while an operator's change runs (it finishes its own joint).
    pub async fn finish_joint(&self) -> Result<bool, MembershipError> {
        let _one_at_a_time = self.running.try_lock().map_err(|_| MembershipError::Busy)?;
        let membership = self.membership();
        let configs = membership.get_joint_config();
        if configs.len() < 2 {
            return Ok(false);
        }
        let target = configs[configs.len() - 1].clone();
        tracing::warn!(
            joint = ?configs,
            ?target,
            "finishing the joint membership a previous leader left behind"
        );
        self.change(ChangeMembers::ReplaceAllVoters(target)).await?;
        Ok(true)
    }

    /// A node that is not a member yet may join: its address is free and the cluster has room.
    fn check_new(
        &self,
        membership: &openraft::Membership<NodeId, MemberNode>,
        addr: &str,
    ) -> Result<(), MembershipError> {
        if let Some((other, _)) = membership.nodes().find(|(_, n)| n.addr == addr) {
            return Err(MembershipError::Conflict(format!(
                "node {other} already has address {addr}"
            )));
        }
        if membership.nodes().count() >= MAX_MEMBERS {
            return Err(MembershipError::Invalid(format!(
                "the cluster already has {MAX_MEMBERS} members"
            )));
        }
        Ok(())
    }

    /// Waits until learner `id` has every entry up to the membership that added it; removes
    /// it again if it does not within the deadline (it never voted).
    async fn wait_caught_up(&self, id: NodeId, addr: &str) -> Result<(), MembershipError> {
        let me = self.raft.metrics().borrow().id;
        let added = self
            .raft
            .metrics()
            .borrow()
            .membership_config
            .log_id()
            .to_owned();
        let waited = self
            .raft
            .wait(Some(self.catch_up))
            .metrics(
                |m| {
                    m.current_leader != Some(me)
                        || m.replication
                            .as_ref()
                            .and_then(|r| r.get(&id))
                            .is_some_and(|matched| *matched >= added)
                },
                "the new learner caught up (or this node stopped leading)",
            )
            .await;
        if let Ok(metrics) = &waited {
            if metrics.current_leader != Some(me) {
                // The new leader resumes the change when it is repeated: node `id` is a learner
                // in the membership with the same store.
                return Err(MembershipError::Raft(format!(
                    "this node stopped leading while node {id} caught up (the leader is now \
                     {:?}); repeat the change: it resumes on the new leader",
                    metrics.current_leader
                )));
            }
            return Ok(());
        }
        tracing::warn!(
            id,
            addr,
            "the new member did not catch up: removing it again"
        );
        let removed = self
            .change(ChangeMembers::RemoveNodes(BTreeSet::from([id])))
            .await;
        if let Err(error) = &removed {
            tracing::error!(%error, id, "could not remove the learner that did not catch up");
        }
        Err(MembershipError::CatchUpTimeout {
            id,
            secs: self.catch_up.as_secs(),
            removed: removed.is_ok(),
        })
    }

    /// Removes node `id` (voter or learner). Returns the voters after the change.
    pub async fn remove(&self, id: NodeId) -> Result<BTreeSet<NodeId>, MembershipError> {
        let _one_at_a_time = self.running.try_lock().map_err(|_| MembershipError::Busy)?;
        let membership = self.membership();
        if membership.get_node(&id).is_none() {
            return Err(MembershipError::Unknown(id));
        }
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let change = if voters.contains(&id) {
            // The target is computed from the last configuration (the one a joint moves to).
            let target = membership
                .get_joint_config()
                .last()
                .cloned()
                .unwrap_or_default();
            if target.len() == 1 && target.contains(&id) {
                return Err(MembershipError::Invalid(
                    "cannot remove the last voter".into(),
                ));
            }
            ChangeMembers::RemoveVoters(BTreeSet::from([id]))
        } else {
            ChangeMembers::RemoveNodes(BTreeSet::from([id]))
        };
        self.change(change).await?;
        Ok(self.membership().voter_ids().collect())
    }

    fn membership(&self) -> openraft::Membership<NodeId, MemberNode> {
        self.raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .clone()
    }

    /// How this member asks other nodes who they are and what their clocks read.
    pub fn introducer(&self) -> &Arc<dyn Introducer> {
        &self.introducer
    }

    /// Asks each of `targets` (node, address) who it is, where its log ends and what
    /// membership it holds, at once; the answers that came within [`INTRODUCE_TIMEOUT`] (a
    /// census of a member on probation, `identity` rule 4: `Identity::census_targets`).
    pub async fn census(&self, targets: Vec<(NodeId, String)>) -> Vec<Introduction> {
        let asking = targets.into_iter().map(|(id, addr)| async move {
            let answer = self.introduce(id, &addr).await.ok()?;
            (answer.node_id == id).then_some(answer)
        });
        futures::future::join_all(asking)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    async fn introduce(&self, node: NodeId, addr: &str) -> Result<Introduction, MembershipError> {
        match tokio::time::timeout(INTRODUCE_TIMEOUT, self.introducer.introduce(node, addr)).await {
            Ok(Ok(introduction)) => Ok(introduction),
            Ok(Err(why)) => Err(MembershipError::Unreachable {
                addr: addr.to_owned(),
                why,
            }),
            Err(_) => Err(MembershipError::Unreachable {
                addr: addr.to_owned(),
                why: format!("no answer within {INTRODUCE_TIMEOUT:?}"),
            }),
        }
    }

    /// Commits one change (both steps of a joint change) within the deadline; returns the
    /// log id of the entry that carries it.
    async fn change(
        &self,
        change: ChangeMembers<NodeId, MemberNode>,
    ) -> Result<openraft::LogId<NodeId>, MembershipError> {
        // `retain = false`: a voter removed from the voters leaves the membership entirely.
        match tokio::time::timeout(self.commit, self.raft.change_membership(change, false)).await {
            Ok(Ok(response)) => Ok(response.log_id),
            Ok(Err(error)) => Err(MembershipError::Raft(error.to_string())),
            Err(_) => Err(MembershipError::CommitTimeout {
                secs: self.commit.as_secs(),
            }),
        }
    }
}

/// Founds a new cluster of `members` (node id → address) from member `me`, the lowest id:
/// asks every other member who it is until all have answered as the node their entry names,
/// none holding log entries, then writes the first membership entry with every store id.
/// Stops when `shutdown` is set, or (with an error log) when a member already holds a cluster
/// (this member lost its data after founding: it must be re-added with `--join`).
pub async fn found(
    raft: RaftNode,
    me: (NodeId, String),
    members: BTreeMap<NodeId, String>,
    introducer: Arc<dyn Introducer>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let started = tokio::time::Instant::now();
    let mut last_log = started;
    loop {
        match founding_membership(&me, &members, introducer.as_ref()).await {
            Ok(nodes) => {
                match raft.initialize(nodes).await {
                    Ok(()) => tracing::info!(
                        members = %super::format_members(&members),
                        "founded a new cluster"
                    ),
                    Err(error) => tracing::info!(%error, "not founding (already initialised)"),
                }
                return;
            }
            Err(Founding::Refused(why)) => {
                tracing::error!("not founding a new cluster: {why}");
                return;
            }
            Err(Founding::Waiting(why)) => {
                if last_log.elapsed() >= FOUND_LOG_EVERY {
                    last_log = tokio::time::Instant::now();
                    tracing::warn!(
                        waited_s = started.elapsed().as_secs(),
                        "waiting for every founding member before founding the cluster: {why}"
                    );
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(FOUND_RETRY) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
    }
}

enum Founding {
    /// A member did not answer (yet).
    Waiting(String),
    /// Founding must not happen.
    Refused(String),
}

async fn founding_membership(
    me: &(NodeId, String),
    members: &BTreeMap<NodeId, String>,
    introducer: &dyn Introducer,
) -> Result<BTreeMap<NodeId, MemberNode>, Founding> {
    let mut nodes = BTreeMap::new();
    for (id, addr) in members {
        let store = if *id == me.0 {
            me.1.clone()
        } else {
            let answer =
                tokio::time::timeout(INTRODUCE_TIMEOUT, introducer.introduce(*id, addr)).await;
            let introduction = match answer {
                Ok(Ok(introduction)) => introduction,
                Ok(Err(why)) => {
                    return Err(Founding::Waiting(format!("node {id} at {addr}: {why}")))
                }
                Err(_) => return Err(Founding::Waiting(format!("node {id} at {addr}: no answer"))),
            };
            if introduction.node_id != *id {
                return Err(Founding::Waiting(format!(
                    "the node at {addr} says it is node {}, not {id}",
                    introduction.node_id
                )));
            }
            if introduction.holds_log {
                return Err(Founding::Refused(format!(
                    "node {id} already holds this cluster's log, so this member lost its data \
                     after the cluster was founded: `palisade cluster remove {}` on the leader, \
                     restart this member with --join and an empty data directory, then \
                     `palisade cluster add`",
                    me.0
                )));
            }
            introduction.store
        };
        nodes.insert(
            *id,
            MemberNode {
                addr: addr.clone(),
                store,
            },
        );
    }
    Ok(nodes)
}
