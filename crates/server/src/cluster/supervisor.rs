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

use openraft::ServerState;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;

use super::storage::SmState;
use super::{Command, NodeId, RaftLeaseStore, RaftNode, COMMIT_TIMEOUT, QUORUM_LOSS_MS};
use crate::engine::{self, LeaderHint, Transition};
use crate::gateway::Serving;
use crate::metrics::Metrics;
use crate::store::StoreError;

/// How often the supervisor re-checks the quorum without a metrics change.
const CHECK_INTERVAL: Duration = Duration::from_millis(50);

/// What the supervisor needs.
pub struct Supervisor {
    /// The Raft member.
    pub raft: RaftNode,
    /// This node.
    pub node_id: NodeId,
    /// The applied state.
    pub state: Arc<Mutex<SmState>>,
    /// This node's token key: id and base64url public key.
    pub key: (String, String),
    /// Metrics of the engine.
    pub metrics: Arc<Metrics>,
    /// Where the gateway looks.
    pub serving: watch::Sender<Serving>,
    /// The channel every engine publishes on.
    pub transitions: broadcast::Sender<Transition>,
}

struct Running {
    term: u64,
    started: tokio::time::Instant,
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<(), StoreError>>,
}

impl Running {
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

impl Supervisor {
    /// Runs until `shutdown`, or until Raft stops. Raft stopping on a fatal error (a storage
    /// failure: disk full, I/O error, corrupt data) is returned, so that the server exits
    /// loudly instead of lingering without a working log.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) -> Result<(), String> {
        let mut metrics = self.raft.metrics();
        let mut running: Option<Running> = None;
        let mut tick = tokio::time::interval(CHECK_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut outcome = Ok(());
        loop {
            let mut closed = false;
            tokio::select! {
                biased;
                _ = shutdown.wait_for(|stop| *stop) => break,
                changed = metrics.changed() => closed = changed.is_err(),
                _ = tick.tick() => {}
            }
            let m = metrics.borrow().clone();
            if let Err(fatal) = &m.running_state {
                if !matches!(fatal, openraft::error::Fatal::Stopped) {
                    tracing::error!(%fatal, "raft stopped on a fatal error; this member stops");
                    outcome = Err(format!("raft stopped on a fatal error: {fatal}"));
                }
                break;
            }
            if closed {
                break;
            }
            let leader = m.state == ServerState::Leader && m.current_leader == Some(self.node_id);
            let quorum = m
                .millis_since_quorum_ack
                .is_none_or(|ms| ms < QUORUM_LOSS_MS);
            if let Some(engine) = running.take() {
                let why = if !leader {
                    Some("no longer the leader")
                } else if engine.term != m.current_term {
                    Some("the term changed")
                } else if !quorum
                    && engine.started.elapsed().as_millis() > u128::from(QUORUM_LOSS_MS)
                {
                    // openraft publishes this figure with its metrics, which can be older than
                    // the engine: judge it only once the engine has run for that long.
                    Some("no majority heard from")
                } else if engine.task.is_finished() {
                    Some("the engine stopped (a commit failed)")
                } else {
                    None
                };
                match why {
                    Some(why) => {
                        let _ = self.serving.send(Serving::Unavailable(format!(
                            "node {} is changing roles: {why}",
                            self.node_id
                        )));
                        engine.stop(why).await;
                    }
                    None => running = Some(engine),
                }
            }
            if running.is_some() {
                continue;
            }
            // Starting needs no quorum check: the barrier commits only with a majority.
            if leader {
                let _ = self.serving.send(Serving::Unavailable(format!(
                    "node {} was elected and is loading the replicated state",
                    self.node_id
                )));
                match self.start_engine(m.current_term).await {
                    Ok(engine) => running = Some(engine),
                    Err(error) => {
                        tracing::warn!(%error, "could not start deciding as leader; will retry");
                        let _ = self.serving.send(Serving::Unavailable(format!(
                            "node {} leads but could not commit with a majority: {error}",
                            self.node_id
                        )));
                    }
                }
            } else {
                let hint = m.current_leader.and_then(|id| {
                    m.membership_config
                        .membership()
                        .get_node(&id)
                        .map(|node| LeaderHint {
                            id,
                            url: format!("http://{}", node.addr),
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
        }
        let _ = self
            .serving
            .send(Serving::Unavailable("the coordinator is stopping".into()));
        if let Some(engine) = running {
            engine.stop("shutting down").await;
        }
        outcome
    }

    /// Commits the barrier, loads the applied state, starts an engine over Raft.
    async fn start_engine(&self, term: u64) -> Result<Running, String> {
        let barrier = Command::LeaderStart {
            node: self.node_id,
            key_id: self.key.0.clone(),
            public_key: self.key.1.clone(),
        };
        match tokio::time::timeout(COMMIT_TIMEOUT, self.raft.client_write(barrier)).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => return Err(format!("leader barrier: {error}")),
            Err(_) => return Err("leader barrier did not commit in time".into()),
        }
        let store = RaftLeaseStore::new(self.raft.clone(), self.state.clone());
        let (stop, stop_signal) = watch::channel(false);
        let (handle, task) = engine::start_with(
            store,
            self.metrics.clone(),
            stop_signal,
            self.transitions.clone(),
        )
        .map_err(|e| e.to_string())?;
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
