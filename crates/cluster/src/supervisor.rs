//! Runs an engine on this node exactly while it leads with a quorum.
//!
//! The supervisor watches openraft's metrics. When this node becomes leader it commits a
//! `LeaderStart` entry (a barrier: once applied, everything committed before is applied), loads
//! the replicated state into a fresh engine — every lease at its full TTL — and points the
//! gateway at it. When the node stops leading, changes term, or hears from no majority for
//! [`QUORUM_LOSS_MS`], the engine is stopped first and the gateway refuses (`not leader`, or
//! `unavailable`), so a node that cannot commit never answers as if it could.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::{RaftMetrics, ServerState};
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;

use super::storage::SmState;
use super::{
    ClusterError, Command, MemberNode, NodeId, RaftLeaseStore, RaftNode, COMMIT_TIMEOUT,
    QUORUM_LOSS_MS,
};
use palisade_coordinator::engine::{self, LeaderHint, Transition};
use palisade_coordinator::gateway::Serving;
use palisade_coordinator::metrics::Metrics;
use palisade_coordinator::store::StoreError;

/// How often the supervisor re-checks the quorum without a metrics change.
const CHECK_INTERVAL: Duration = Duration::from_millis(50);
/// Between two census attempts of a member on probation (`identity` rule 4).
const CENSUS_RETRY: Duration = Duration::from_millis(250);

/// How long a leader waits between attempts to finish a joint membership.
const FINISH_JOINT_INTERVAL: Duration = Duration::from_millis(500);

/// What the supervisor needs.
pub struct Supervisor {
    /// The Raft member.
    pub raft: RaftNode,
    /// This node.
    pub node_id: NodeId,
    /// Its store's identity (its store id, and whether it may vote yet).
    pub identity: super::identity::Identity,
    /// The applied state.
    pub state: Arc<Mutex<SmState>>,
    /// This node's token key: id and base64url public key.
    pub key: (String, String),
    /// The epoch counter a restore started this member at (0: not restored); every term it
    /// leads starts by raising the replicated counter to it.
    pub floor: palisade_core::Epoch,
    /// The wall clock: every term this member leads starts by raising the replicated counter
    /// to its floor, so a cluster whose members' volumes were all put back, or a member put
    /// back that leads with a lagging peer, issues above every epoch acknowledged before
    /// ([`palisade_core::clock`]).
    pub clock: Arc<dyn palisade_core::clock::WallClock>,
    /// Metrics of the engine.
    pub metrics: Arc<Metrics>,
    /// Where the gateway looks.
    pub serving: watch::Sender<Serving>,
    /// The channel every engine publishes on.
    pub transitions: broadcast::Sender<Transition>,
    /// Membership changes: the leader finishes a joint membership its predecessor left.
    pub changes: Arc<super::membership::Changes>,
    /// The scheme of the members' client URLs in leader hints (`http` or `https`).
    pub client_scheme: &'static str,
    /// This member's clock against its peers': a leader commits a clock floor only with a
    /// clock a majority agrees with, and a member whose clock they refuse does not lead.
    pub clock_check: Arc<super::clock_check::ClockCheck>,
    /// The `--cluster` list (node id → address): whom the census of a member with no
    /// membership of its own asks (`identity` rule 4).
    pub listed: std::collections::BTreeMap<NodeId, String>,
    /// The vote refusals of peers that do not count this member ([`super::departure`]).
    pub refusals: Option<super::departure::NonMemberRefusals>,
}

struct Running {
    term: u64,
    started: tokio::time::Instant,
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<(), StoreError>>,
}

impl Running {
    fn view(&self) -> EngineView {
        EngineView {
            term: self.term,
            age_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            finished: self.task.is_finished(),
        }
    }

    async fn stop(self, why: &str) {
        tracing::info!(term = self.term, why, "stopping the leader engine");
        let _ = self.stop.send(true);
        match self.task.await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%error, "the leader engine ended with an error"),
            Err(error) => tracing::error!(%error, "the leader engine task failed"),
        }
    }
}

/// What the supervisor sees of Raft at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View {
    /// This node leads (openraft's state, and it names itself leader).
    pub leader: bool,
    /// The current term.
    pub term: u64,
    /// A majority acknowledged this leader within [`QUORUM_LOSS_MS`] (or it has no figure).
    pub quorum: bool,
    /// This member's clock is beyond the maximum offset from a majority
    /// ([`super::clock_check::Verdict::refused`]).
    pub clock_refused: bool,
}

/// What the supervisor sees of the running engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineView {
    /// The term it was started in.
    pub term: u64,
    /// How long it has run, ms.
    pub age_ms: u64,
    /// Its task ended (a commit failed).
    pub finished: bool,
}

/// What to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Keep the running engine.
    Keep,
    /// Stop the running engine, for this reason (then decide again).
    Stop(&'static str),
    /// Lead: commit the barrier and start an engine.
    Start,
    /// Follow: refuse with `not leader` and the leader's URL.
    Follow,
    /// Lead no more: this member leads, but its clock is beyond the maximum offset from a
    /// majority; it starts no engine and stops its heartbeats, so that another is elected.
    Abstain,
}

/// Whether this member may stand for election: its membership names it with its own store.
/// A member that lost its data (its old store is named) must not campaign — openraft raises
/// its term for every attempt, and a member that answers a leader with a higher term deposes
/// it — and neither must a rejoining member replaying old memberships that name its old store.
pub fn may_elect(metrics: &openraft::RaftMetrics<NodeId, super::MemberNode>, store: &str) -> bool {
    metrics
        .membership_config
        .membership()
        .get_node(&metrics.id)
        .is_some_and(|node| node.store == store)
}

/// The supervisor's decision, with no I/O: an engine runs exactly while this node leads in
/// the engine's term and hears from a majority; a node that cannot commit never keeps
/// answering as if it could.
pub fn decide(view: View, engine: Option<EngineView>) -> Action {
    match engine {
        Some(engine) => {
            if !view.leader {
                Action::Stop("no longer the leader")
            } else if engine.term != view.term {
                Action::Stop("the term changed")
            } else if !view.quorum && engine.age_ms > QUORUM_LOSS_MS {
                // openraft publishes this figure with its metrics, which can be older than
                // the engine: judge it only once the engine has run for that long.
                Action::Stop("no majority heard from")
            } else if engine.finished {
                Action::Stop("the engine stopped (a commit failed)")
            } else if view.clock_refused {
                Action::Stop("its clock is beyond the maximum offset from a majority")
            } else {
                Action::Keep
            }
        }
        None if view.leader && view.clock_refused => Action::Abstain,
        // Starting needs no quorum check: the barrier commits only with a majority.
        None if view.leader => Action::Start,
        None => Action::Follow,
    }
}

impl Supervisor {
    /// Copies Raft's view into the Prometheus metrics.
    fn export(
        &self,
        m: &openraft::RaftMetrics<super::NodeId, super::MemberNode>,
        last_leader: &mut Option<Option<super::NodeId>>,
    ) {
        let metrics = &self.metrics;
        metrics.raft_term.set(m.current_term as i64);
        metrics
            .raft_is_leader
            .set(i64::from(m.state == ServerState::Leader));
        metrics
            .raft_members
            .set(m.membership_config.membership().nodes().count() as i64);
        metrics
            .raft_last_log_index
            .set(m.last_log_index.unwrap_or(0) as i64);
        metrics
            .raft_last_applied_index
            .set(m.last_applied.map_or(0, |l| l.index) as i64);
        if last_leader.is_some_and(|known| known != m.current_leader) {
            metrics.raft_leader_changes.inc();
        }
        *last_leader = Some(m.current_leader);
    }

    /// Runs until `shutdown`, or until Raft stops. Raft stopping on a fatal error (a storage
    /// failure: disk full, I/O error, corrupt data) is returned, so that the server exits
    /// loudly instead of lingering without a working log.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) -> Result<(), ClusterError> {
        let mut metrics = self.raft.metrics();
        let mut running: Option<Running> = None;
        let mut tick = tokio::time::interval(CHECK_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut outcome = Ok(());
        let mut electing = false;
        let mut heartbeats = true;
        let mut last_leader = None;
        let mut chores = Chores::default();
        let mut named_at = None;
        loop {
            let mut closed = false;
            tokio::select! {
                biased;
                _ = shutdown.wait_for(|stop| *stop) => break,
                changed = metrics.changed() => closed = changed.is_err(),
                _ = tick.tick() => {}
            }
            let m = metrics.borrow().clone();
            self.export(&m, &mut last_leader);
            if let Err(fatal) = &m.running_state {
                if !matches!(fatal, openraft::error::Fatal::Stopped) {
                    tracing::error!(%fatal, "raft stopped on a fatal error; this member stops");
                    outcome = Err(ClusterError::RaftStopped(fatal.to_string()));
                }
                break;
            }
            if closed {
                break;
            }
            if let Some(removed) = self.removed(&m, &mut named_at) {
                outcome = Err(removed);
                break;
            }
            chores.census(&self);
            chores.read_clocks(&self);
            self.switch_elections(&m, &mut electing);
            self.step_engine(&m, &mut running, &mut heartbeats).await;
            chores.finish_joint(&self, &m, running.is_some());
        }
        chores.abort();
        let _ = self
            .serving
            .send(Serving::Unavailable("the coordinator is stopping".into()));
        if let Some(engine) = running {
            engine.stop("shutting down").await;
        }
        outcome
    }

    /// A removal a majority of this member's voters showed by refusing its vote requests as a
    /// non-member ([`super::departure`]): elections off, one line, and the error that makes
    /// `palisade serve` exit 10.
    fn removed(
        &self,
        m: &RaftMetrics<NodeId, MemberNode>,
        named_at: &mut Option<openraft::LogId<NodeId>>,
    ) -> Option<ClusterError> {
        let store = self.identity.store();
        let membership = m.membership_config.membership();
        if super::departure::names_as_voter(membership, self.node_id, store) {
            *named_at = (*named_at).max(*m.membership_config.log_id());
        }
        if let Some(at) = super::departure::seen_in_own_log(store, m, *named_at) {
            return Some(self.leave(format!("the membership committed at {at} leaves it out")));
        }
        let refusals = self.refusals.as_ref()?;
        if m.current_leader.is_some() {
            return None;
        }
        let voters: std::collections::BTreeSet<NodeId> =
            m.membership_config.membership().voter_ids().collect();
        let refusing = refusals.standing(super::departure::EVIDENCE);
        if !super::departure::removed(self.node_id, &voters, &refusing) {
            return None;
        }
        Some(self.leave(format!(
            "voters {refusing:?} of {voters:?} refuse its vote requests as a non-member's"
        )))
    }

    /// Leaves a cluster that removed this member (`why`): elections off, one line, and the
    /// error that makes `palisade serve` exit 10.
    fn leave(&self, why: String) -> ClusterError {
        self.raft.runtime_config().elect(false);
        tracing::warn!(
            "removed from the cluster's membership ({why}): this member stops (exit code 10)"
        );
        ClusterError::Removed(format!(
            "node {} was removed from the cluster ({why}), so it stops rather than campaign. \
             To bring it back: start it with an empty data directory and --join, then \
             `palisade cluster add {} HOST:PORT` on the leader",
            self.node_id, self.node_id
        ))
    }

    /// Elections on only while the membership names this member's store and its identity
    /// lets it campaign; `electing` is what openraft was last told.
    fn switch_elections(&self, m: &RaftMetrics<NodeId, MemberNode>, electing: &mut bool) {
        let named = may_elect(m, self.identity.store());
        let clock_refused = self.clock_check.refused();
        let may_elect = named
            && !clock_refused
            && self
                .identity
                .may_campaign(self.identity.last_log().as_ref());
        if may_elect == *electing {
            return;
        }
        *electing = may_elect;
        self.raft.runtime_config().elect(may_elect);
        if may_elect {
            tracing::info!("the membership names this member's store: elections on");
        } else if !named {
            tracing::warn!(
                "elections off: {}",
                super::identity::Refused::Replaced { node: self.node_id }
            );
        } else if clock_refused {
            tracing::warn!(
                "elections off: this member's clock is beyond the maximum offset from a majority"
            );
        }
    }

    /// Starts, stops or keeps the engine as [`decide`] says for what Raft now shows.
    async fn step_engine(
        &self,
        m: &RaftMetrics<NodeId, MemberNode>,
        running: &mut Option<Running>,
        heartbeats: &mut bool,
    ) {
        let view = View {
            leader: m.state == ServerState::Leader && m.current_leader == Some(self.node_id),
            term: m.current_term,
            quorum: m
                .millis_since_quorum_ack
                .is_none_or(|ms| ms < QUORUM_LOSS_MS),
            clock_refused: self.clock_check.refused(),
        };
        // A leader whose clock a majority refuses sends no heartbeats, so that the others
        // elect one of theirs (openraft has no step-down); any other member sends them as
        // usual once it leads.
        let beat = !(view.leader && view.clock_refused);
        if beat != *heartbeats {
            *heartbeats = beat;
            self.raft.runtime_config().heartbeat(beat);
        }
        let mut action = decide(view, running.as_ref().map(Running::view));
        if let Action::Stop(why) = action {
            let _ = self.serving.send(Serving::Unavailable(format!(
                "node {} is changing roles: {why}",
                self.node_id
            )));
            running
                .take()
                .expect("stop a running engine")
                .stop(why)
                .await;
            action = decide(view, None);
        }
        match action {
            Action::Keep | Action::Stop(_) => {}
            Action::Start => *running = self.lead(view.term).await,
            Action::Follow => self.follow(m),
            Action::Abstain => {
                let _ = self.serving.send(Serving::Unavailable(format!(
                    "node {} was elected but does not lead: {}",
                    self.node_id,
                    self.clock_check
                        .fresh()
                        .map_or_else(String::new, |verdict| verdict.refusal())
                )));
            }
        }
    }

    /// Starts deciding in `term`, or says why not (retried on the next check).
    async fn lead(&self, term: u64) -> Option<Running> {
        let _ = self.serving.send(Serving::Unavailable(format!(
            "node {} was elected and is loading the replicated state",
            self.node_id
        )));
        match self.start_engine(term).await {
            Ok(engine) => Some(engine),
            Err(error) => {
                tracing::warn!(%error, "could not start deciding as leader; will retry");
                let _ = self.serving.send(Serving::Unavailable(format!(
                    "node {} leads but cannot decide yet: {error}",
                    self.node_id
                )));
                None
            }
        }
    }

    /// Refuses with `not leader`, naming the leader this node knows of.
    fn follow(&self, m: &openraft::RaftMetrics<NodeId, super::MemberNode>) {
        let hint = m.current_leader.and_then(|id| {
            m.membership_config
                .membership()
                .get_node(&id)
                .map(|node| LeaderHint {
                    id,
                    url: format!("{}://{}", self.client_scheme, node.addr),
                })
        });
        self.serving.send_if_modified(|serving| {
            let same = matches!(serving, Serving::NotLeader(current) if *current == hint);
            if !same {
                *serving = Serving::NotLeader(hint.clone());
            }
            !same
        });
    }

    /// Checks this member's clock against a majority's, commits the barrier with its clock
    /// floor, loads the applied state, starts an engine over Raft.
    async fn start_engine(&self, term: u64) -> Result<Running, ClusterError> {
        let verdict = self
            .clock_check
            .measure(&self.raft, self.changes.introducer(), &self.clock)
            .await;
        if !verdict.agrees {
            return Err(ClusterError::Raft(if verdict.refused {
                verdict.refusal()
            } else {
                format!(
                    "too few voters answered for their clocks ({} of {} agree, {} needed); no \
                     clock floor is committed before a majority agrees with this clock",
                    verdict.agreeing.len(),
                    verdict.peers.len() + 1,
                    verdict.majority
                )
            }));
        }
        let clock_floor = palisade_core::clock::checked_floor_at(self.clock.now_ms())
            .map_err(|e| ClusterError::Raft(e.to_string()))?;
        let barrier = Command::LeaderStart {
            node: self.node_id,
            key_id: self.key.0.clone(),
            public_key: self.key.1.clone(),
            floor: self.floor.max(palisade_core::Epoch(clock_floor)),
        };
        match tokio::time::timeout(COMMIT_TIMEOUT, self.raft.client_write(barrier)).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => return Err(ClusterError::Raft(format!("leader barrier: {error}"))),
            Err(_) => {
                return Err(ClusterError::Raft(
                    "leader barrier did not commit in time".into(),
                ))
            }
        }
        let store = RaftLeaseStore::new(self.raft.clone(), self.state.clone());
        let (stop, stop_signal) = watch::channel(false);
        // The majority agrees with this clock: a counter ahead of it was raised by a clock
        // that was wrong, and is issued above rather than waited for.
        let rules = engine::ClockRules {
            clock: self.clock.clone(),
            counter_ahead: engine::CounterAhead::Outvoted {
                max_wait_ms: self.clock_check.max_offset_ms,
            },
        };
        let (handle, task) = engine::start_with_rules(
            store,
            self.metrics.clone(),
            stop_signal,
            self.transitions.clone(),
            rules,
        )
        .map_err(|e| ClusterError::Raft(format!("the leader engine: {e}")))?;
        tracing::info!(
            node = self.node_id,
            term,
            "leading: deciding grants, renewals and expiries (every lease at its full TTL)"
        );
        let _ = self.serving.send(Serving::Engine(handle));
        Ok(Running {
            term,
            started: tokio::time::Instant::now(),
            stop,
            task,
        })
    }
}

/// The supervisor's background tasks, each in its own task so that the loop stays free to
/// stop the engine at once, and each spaced out.
struct Chores {
    /// The census of a member on probation (`identity` rule 4).
    census: Option<JoinHandle<()>>,
    census_after: tokio::time::Instant,
    /// Finishing a joint membership a deposed leader left.
    finishing: Option<JoinHandle<()>>,
    finish_after: tokio::time::Instant,
    /// Reading the peers' clocks ([`super::clock_check`]).
    clocks: Option<JoinHandle<()>>,
    clocks_after: tokio::time::Instant,
}

impl Default for Chores {
    fn default() -> Self {
        let now = tokio::time::Instant::now();
        Self {
            census: None,
            census_after: now,
            finishing: None,
            finish_after: now,
            clocks: None,
            clocks_after: now,
        }
    }
}

impl Chores {
    /// On probation (`identity` rule 4): asks the other voters where their logs end, every
    /// [`CENSUS_RETRY`] until a leader has caught this member up.
    fn census(&mut self, supervisor: &Supervisor) {
        if self.census.as_ref().is_none_or(JoinHandle::is_finished)
            && tokio::time::Instant::now() >= self.census_after
            && supervisor.identity.needs_census()
        {
            self.census_after = tokio::time::Instant::now() + CENSUS_RETRY;
            let (changes, identity) = (supervisor.changes.clone(), supervisor.identity.clone());
            let targets = identity.census_targets(&supervisor.listed);
            self.census = Some(tokio::spawn(async move {
                identity.record_census(&changes.census(targets).await);
            }));
        }
    }

    /// Every [`super::clock_check::PROBE_INTERVAL`]: reads the peers' clocks and judges this
    /// member's (the verdict the supervisor, the metrics and `cluster status` use).
    fn read_clocks(&mut self, supervisor: &Supervisor) {
        if self.clocks.as_ref().is_none_or(JoinHandle::is_finished)
            && tokio::time::Instant::now() >= self.clocks_after
        {
            self.clocks_after = tokio::time::Instant::now() + super::clock_check::PROBE_INTERVAL;
            let check = supervisor.clock_check.clone();
            let (raft, clock) = (supervisor.raft.clone(), supervisor.clock.clone());
            let introducer = supervisor.changes.introducer().clone();
            self.clocks = Some(tokio::spawn(async move {
                check.measure(&raft, &introducer, &clock).await;
            }));
        }
    }

    /// While this member leads (`leading`) a joint membership: finishes it. Spaced out: every
    /// attempt makes openraft publish metrics, which wakes the loop.
    fn finish_joint(
        &mut self,
        supervisor: &Supervisor,
        m: &RaftMetrics<NodeId, MemberNode>,
        leading: bool,
    ) {
        let joint = m.membership_config.membership().get_joint_config().len() > 1;
        let idle = self.finishing.as_ref().is_none_or(JoinHandle::is_finished);
        if leading && joint && idle && self.finish_after <= tokio::time::Instant::now() {
            self.finish_after = tokio::time::Instant::now() + FINISH_JOINT_INTERVAL;
            let changes = supervisor.changes.clone();
            self.finishing = Some(tokio::spawn(async move {
                if let Err(error) = changes.finish_joint().await {
                    // Busy (an operator's change runs) or not committed yet: next check.
                    tracing::debug!(%error, "the joint membership is not finished yet");
                }
            }));
        }
    }

    fn abort(self) {
        for task in [self.census, self.finishing, self.clocks]
            .into_iter()
            .flatten()
        {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEADING: View = View {
        leader: true,
        term: 4,
        quorum: true,
        clock_refused: false,
    };

    fn engine(term: u64, age_ms: u64, finished: bool) -> Option<EngineView> {
        Some(EngineView {
            term,
            age_ms,
            finished,
        })
    }

    #[test]
    fn p8_an_engine_runs_only_while_its_node_leads_its_term_with_a_majority() {
        assert_eq!(decide(LEADING, None), Action::Start);
        assert_eq!(decide(LEADING, engine(4, 10, false)), Action::Keep);
        let deposed = View {
            leader: false,
            ..LEADING
        };
        assert_eq!(
            decide(deposed, engine(4, 10, false)),
            Action::Stop("no longer the leader")
        );
        assert_eq!(decide(deposed, None), Action::Follow);
        let next_term = View { term: 5, ..LEADING };
        assert_eq!(
            decide(next_term, engine(4, 10, false)),
            Action::Stop("the term changed")
        );
        assert_eq!(
            decide(LEADING, engine(4, 10, true)),
            Action::Stop("the engine stopped (a commit failed)")
        );
    }

    #[test]
    fn p8_a_leader_that_hears_from_no_majority_stops_once_its_engine_is_old_enough_to_judge() {
        let alone = View {
            quorum: false,
            ..LEADING
        };
        assert_eq!(
            decide(alone, engine(4, QUORUM_LOSS_MS + 1, false)),
            Action::Stop("no majority heard from")
        );
        // The figure may predate a fresh engine: not judged yet.
        assert_eq!(decide(alone, engine(4, 5, false)), Action::Keep);
    }

    #[test]
    fn p1_a_leader_whose_clock_a_majority_refuses_never_starts_and_stops_deciding() {
        let refused = View {
            clock_refused: true,
            ..LEADING
        };
        assert_eq!(decide(refused, None), Action::Abstain);
        assert_eq!(
            decide(refused, engine(4, 10, false)),
            Action::Stop("its clock is beyond the maximum offset from a majority")
        );
        // A follower whose clock is refused just follows.
        let follower = View {
            leader: false,
            ..refused
        };
        assert_eq!(decide(follower, None), Action::Follow);
    }
}
