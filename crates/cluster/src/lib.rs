//! Cluster mode: the coordinator replicated over an openraft group of 1 to [`MAX_MEMBERS`]
//! members (3 or 5 in production).
//!
//! The division of labour stays the one of a single node: the **engine** decides (lease table,
//! group commit) and a [`LeaseStore`] makes its decisions durable. In a cluster the store is
//! [`RaftLeaseStore`]: a commit is one Raft entry (`Command::Apply`), acknowledged only after a
//! majority has it on disk and it is applied. Only the leader runs an engine ([`supervisor`]);
//! followers refuse with `not leader` and the leader's URL.
//!
//! Why no epoch is issued twice or goes back across a leader change (P1):
//! 1. an epoch is issued (signed into a token) only after the entry granting it committed;
//! 2. a new leader starts its engine only after its own first entry (`LeaderStart`) is applied,
//!    and Raft applies entries in log order, so every entry committed by an earlier leader —
//!    in particular every issued epoch — is in the state the engine loads;
//! 3. entries an old leader appended but never committed are either committed before that
//!    `LeaderStart` (and so loaded too) or discarded (and were never acknowledged);
//! 4. a deposed leader cannot commit anything more (its term is superseded by a majority), so
//!    its engine's answers all fail; and the state machine never lowers the counter.
//!
//! Every lease restarts at its full TTL when a new engine loads it (a TTL is a lower bound).

#![forbid(unsafe_code)]

pub mod clock_check;
pub mod departure;
mod error;
pub mod health;
pub mod membership;
pub mod network;
pub mod peer_tls;
pub mod supervisor;
pub mod witness;

pub use palisade_member_store::{
    identity, raft_log, runtime, storage, Applied, AppliedTransition, ClusterError, Command,
    MemberNode, NodeId, TypeConfig,
};

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::ServerState;
use palisade_core::{Changes, Epoch};
use serde::{Deserialize, Serialize};

pub use error::MembershipError;
use palisade_coordinator::store::{DurableState, LeaseStore, PendingCommit, StoreError};
use storage::SmState;

/// A running Raft member.
pub type RaftNode = openraft::Raft<TypeConfig>;

/// Heartbeats from the leader, ms.
pub const HEARTBEAT_MS: u64 = 50;
/// Election timeout range, ms. A follower that knew a leader stands for election once it has
/// heard nothing for openraft's leader lease (the range's maximum) plus a random time in the
/// range: 450–600 ms after the last heartbeat, so a dead leader is replaced in ~0.6 s
/// (`palisade drill coordinator-failover`; 250–500 ms gave ~0.93 s). Trade-off: shorter
/// means faster failover but a needless election (a few hundred ms without grants) whenever a
/// leader is merely stalled that long (a GC or fsync stall, an overloaded machine).
pub const ELECTION_TIMEOUT_MS: (u64, u64) = (150, 300);
/// Longest wait for one replicated commit; past it the engine stops and the node answers
/// 503 until it has a quorum again (the entry may still commit later: clients retry with
/// their request id).
pub const COMMIT_TIMEOUT: Duration = Duration::from_secs(2);
/// A leader that has heard from no majority for this long stops deciding (503), ms.
pub const QUORUM_LOSS_MS: u64 = 1_000;
/// Entries per append message: a batch entry can hold thousands of lock changes.
pub const MAX_ENTRIES_PER_APPEND: u64 = 16;
/// Raft entries between two snapshots (after which older log entries are purged).
pub const SNAPSHOT_EVERY: u64 = 5_000;
pub use palisade_coordinator::CLUSTER_STORE_FILE;
/// Largest cluster `--cluster` accepts: 7 members tolerate three failures; every voter more
/// slows each commit (3 and 5 are the usual sizes).
pub const MAX_MEMBERS: usize = 7;

/// How this node takes part in a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// This node's id.
    pub node_id: NodeId,
    /// Every member: id → `HOST:PORT` (its client and Raft address).
    pub members: BTreeMap<NodeId, String>,
    /// Start without initialising: wait to be added by `palisade cluster add` on the leader.
    pub join: bool,
    /// Clients reach the members over TLS: a follower names the leader as `https://`.
    pub client_tls: bool,
    /// The greatest offset between a leader's clock and a majority's before it commits a
    /// clock floor (`--max-clock-offset-ms`, [`clock_check`]).
    pub max_clock_offset_ms: u64,
}

impl ClusterConfig {
    /// Parses `--node-id N --cluster 1=HOST:PORT,2=HOST:PORT,...`.
    pub fn parse(node_id: NodeId, cluster: &str, join: bool) -> Result<Self, ClusterError> {
        Self::parse_list(node_id, cluster, join).map_err(ClusterError::Config)
    }

    fn parse_list(node_id: NodeId, cluster: &str, join: bool) -> Result<Self, String> {
        let mut members = BTreeMap::new();
        for part in cluster.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (id, addr) = part
                .split_once('=')
                .ok_or_else(|| format!("cluster entry {part:?} is not ID=HOST:PORT"))?;
            let id: NodeId = id
                .trim()
                .parse()
                .ok()
                .filter(|id| *id >= 1)
                .ok_or_else(|| format!("cluster entry {part:?}: the id must be a number ≥ 1"))?;
            let addr = addr.trim();
            validate_addr(addr).map_err(|e| format!("cluster entry {part:?}: {e}"))?;
            if members.insert(id, addr.to_owned()).is_some() {
                return Err(format!("node id {id} appears twice in --cluster"));
            }
        }
        if members.is_empty() {
            return Err("--cluster lists no member".into());
        }
        if members.len() > MAX_MEMBERS {
            return Err(format!(
                "--cluster lists {} members; the maximum is {MAX_MEMBERS}",
                members.len()
            ));
        }
        let addrs: BTreeSet<&String> = members.values().collect();
        if addrs.len() != members.len() {
            return Err("two members of --cluster share an address".into());
        }
        if !members.contains_key(&node_id) {
            return Err(format!(
                "--node-id {node_id} is not in --cluster (its entry is its own address)"
            ));
        }
        Ok(Self {
            node_id,
            members,
            join,
            client_tls: false,
            max_clock_offset_ms: clock_check::DEFAULT_MAX_CLOCK_OFFSET_MS,
        })
    }

    /// This node's own address in the list.
    pub fn own_addr(&self) -> &str {
        &self.members[&self.node_id]
    }
}

/// Checks a `HOST:PORT`.
pub fn validate_addr(addr: &str) -> Result<(), String> {
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| format!("address {addr:?} has no port"))?;
    if host.is_empty() || host.contains('/') || host.contains(char::is_whitespace) {
        return Err(format!("address {addr:?} has no valid host"));
    }
    port.parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("address {addr:?} has no valid port"))?;
    Ok(())
}

/// The openraft configuration Palisade runs with.
pub fn raft_config() -> openraft::Config {
    openraft::Config {
        cluster_name: "palisade".into(),
        heartbeat_interval: HEARTBEAT_MS,
        election_timeout_min: ELECTION_TIMEOUT_MS.0,
        election_timeout_max: ELECTION_TIMEOUT_MS.1,
        max_payload_entries: MAX_ENTRIES_PER_APPEND,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(SNAPSHOT_EVERY),
        snapshot_max_chunk_size: 1024 * 1024,
        max_in_snapshot_log_to_keep: 1_000,
        ..Default::default()
    }
}

/// The engine's store in cluster mode: a commit is a replicated Raft entry.
pub struct RaftLeaseStore {
    raft: RaftNode,
    state: Arc<Mutex<SmState>>,
    runtime: tokio::runtime::Handle,
}

impl RaftLeaseStore {
    /// A store over `raft`, loading from the applied state `state`.
    pub fn new(raft: RaftNode, state: Arc<Mutex<SmState>>) -> Self {
        Self {
            raft,
            state,
            runtime: tokio::runtime::Handle::current(),
        }
    }
}

impl LeaseStore for RaftLeaseStore {
    fn load(&self) -> Result<DurableState, StoreError> {
        let state = storage::lock_state(&self.state);
        Ok(DurableState {
            last_epoch: state.header.last_epoch,
            leases: state.leases.values().cloned().collect(),
        })
    }

    /// Returns once a majority has the entry on disk and this node applied it. Blocks: call
    /// it off the runtime (the engine uses [`commit_async`](LeaseStore::commit_async)).
    fn commit(&mut self, changes: &Changes) -> Result<(), StoreError> {
        let pending = self.replicate(changes);
        self.runtime.block_on(pending)
    }

    fn commit_async(&mut self, changes: &Changes) -> Option<PendingCommit> {
        Some(Box::pin(self.replicate(changes)))
    }

    /// Read index: heartbeats to a majority confirm that this node still leads its term, so
    /// no other leader has committed anything (a deposed leader's reads fail instead of
    /// answering from state that another leader has moved on from).
    fn confirm_async(&mut self) -> Option<PendingCommit> {
        let raft = self.raft.clone();
        Some(Box::pin(async move {
            match tokio::time::timeout(COMMIT_TIMEOUT, raft.get_read_log_id()).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(error)) => Err(StoreError::Replication(format!(
                    "leadership not confirmed: {error}"
                ))),
                Err(_) => Err(StoreError::Replication(format!(
                    "leadership not confirmed by a majority within {COMMIT_TIMEOUT:?}"
                ))),
            }
        }))
    }
}

impl RaftLeaseStore {
    fn replicate(
        &self,
        changes: &Changes,
    ) -> impl std::future::Future<Output = Result<(), StoreError>> + Send + 'static {
        // Refused here, before it is proposed: the state machine would refuse it too, but by
        // stopping the member (an applied entry cannot be taken back).
        let applied = storage::lock_state(&self.state).header.last_epoch;
        let lower = (changes.last_epoch < applied).then(|| {
            StoreError::Corrupt(format!(
                "epoch counter would go back from {applied} to {}",
                changes.last_epoch
            ))
        });
        let command = Command::Apply {
            last_epoch: changes.last_epoch,
            locks: changes.locks.clone(),
            ended: changes.endings.clone(),
        };
        let raft = self.raft.clone();
        async move {
            if let Some(lower) = lower {
                return Err(lower);
            }
            match tokio::time::timeout(COMMIT_TIMEOUT, raft.client_write(command)).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(error)) => Err(StoreError::Replication(error.to_string())),
                Err(_) => Err(StoreError::Replication(format!(
                    "no majority committed the change within {COMMIT_TIMEOUT:?}"
                ))),
            }
        }
    }
}

/// One member as `cluster status` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct MemberStatus {
    /// Node id.
    pub id: NodeId,
    /// `HOST:PORT`.
    pub addr: String,
    /// `voter` or `learner`.
    pub kind: String,
    /// Index of the last entry the leader knows it has (leader's view only).
    pub matched: Option<u64>,
    /// Entries it is behind the leader's log (leader's view only).
    pub lag: Option<u64>,
}

/// One node's view of the cluster (`GET /v1/cluster`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NodeStatus {
    /// The node answering.
    pub node_id: NodeId,
    /// Its role: `leader`, `follower`, `candidate`, `learner`, `shutdown`.
    pub role: String,
    /// The current term.
    pub term: u64,
    /// The leader it knows of.
    pub leader: Option<NodeId>,
    /// Index of its last log entry.
    pub last_log_index: Option<u64>,
    /// Index of the last entry it applied.
    pub last_applied: Option<u64>,
    /// True while it decides (leader with an engine running).
    pub serving: bool,
    /// The members of the current membership.
    pub members: Vec<MemberStatus>,
    /// Why it is not ready although it may see a leader ([`health::Health`]); empty when
    /// nothing keeps it from being ready.
    #[serde(default)]
    pub not_ready: Vec<String>,
    /// Its clock against its peers' (the latest fresh verdict; `None`: none yet).
    #[serde(default)]
    pub clock: Option<clock_check::Verdict>,
}

/// This node's view of the cluster; `clock`: its clock's check against its peers'.
pub fn node_status(raft: &RaftNode, serving: bool, clock: &clock_check::ClockCheck) -> NodeStatus {
    let metrics = raft.metrics().borrow().clone();
    let membership = metrics.membership_config.membership();
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    let last_log = metrics.last_log_index;
    let members = membership
        .nodes()
        .map(|(id, node)| {
            let matched = metrics
                .replication
                .as_ref()
                .and_then(|r| r.get(id).cloned())
                .map(|m| m.map_or(0, |log_id| log_id.index));
            let matched = if *id == metrics.id && metrics.state == ServerState::Leader {
                last_log
            } else {
                matched
            };
            MemberStatus {
                id: *id,
                addr: node.addr.clone(),
                kind: if voters.contains(id) {
                    "voter"
                } else {
                    "learner"
                }
                .into(),
                matched,
                lag: matched.map(|m| last_log.unwrap_or(0).saturating_sub(m)),
            }
        })
        .collect();
    NodeStatus {
        node_id: metrics.id,
        role: match metrics.state {
            ServerState::Leader => "leader",
            ServerState::Follower => "follower",
            ServerState::Candidate => "candidate",
            ServerState::Learner => "learner",
            ServerState::Shutdown => "shutdown",
        }
        .into(),
        term: metrics.current_term,
        leader: metrics.current_leader,
        last_log_index: last_log,
        last_applied: metrics.last_applied.map(|l| l.index),
        serving,
        members,
        not_ready: Vec::new(),
        clock: clock.fresh(),
    }
}

/// A started cluster member.
pub struct Member {
    /// The Raft node.
    pub raft: RaftNode,
    /// Where the front ends send requests.
    pub gateway: palisade_coordinator::gateway::Gateway,
    /// The applied state.
    pub state: Arc<Mutex<SmState>>,
    /// Its store's identity, which its Raft traffic presents and checks.
    pub identity: identity::Identity,
    /// Its membership changes (`cluster add|remove`; they succeed while it leads).
    pub changes: Arc<membership::Changes>,
    /// Its clock against its peers' ([`clock_check`]).
    pub clock_check: Arc<clock_check::ClockCheck>,
    /// The supervisor; ends on shutdown, or with the fatal error that stopped Raft.
    pub supervisor: tokio::task::JoinHandle<Result<(), ClusterError>>,
    /// The applied log id known to be on disk
    /// ([`storage::StateMachine::durable_applied_watch`]).
    pub durable_applied: tokio::sync::watch::Receiver<Option<openraft::LogId<NodeId>>>,
    /// The ownership transitions this member applies ([`storage::StateMachine::history`]).
    pub history: tokio::sync::broadcast::Sender<AppliedTransition>,
}

/// Opens the cluster store in `dir`, checks the membership, starts Raft (initialising a new
/// cluster when every member starts empty) and the supervisor.
pub async fn start_member(
    config: &ClusterConfig,
    dir: &std::path::Path,
    signer: &palisade_core::TokenSigner,
    metrics: Arc<palisade_coordinator::metrics::Metrics>,
    peer_tls: Option<Arc<peer_tls::PeerTls>>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> Result<Member, ClusterError> {
    let single = dir.join(palisade_coordinator::STORE_FILE);
    let path = dir.join(CLUSTER_STORE_FILE);
    if palisade_coordinator::log_store::exists_in(dir) && !path.exists() {
        return Err(ClusterError::DataDirectory(format!(
            "{} holds a single-node coordinator ({}); a cluster member needs a data directory \
             of its own (starting a cluster over it would forget its epochs)",
            dir.display(),
            single.display()
        )));
    }
    let stores = storage::open(&path)?;
    let (applied, fresh) = {
        let shared = stores.1.shared();
        let state = shared.lock().expect("not poisoned");
        let seen = (
            state.header.last_applied.map_or(0, |l| l.index),
            state
                .header
                .membership
                .membership()
                .nodes()
                .next()
                .is_none(),
        );
        seen
    };
    let witness = witness::Witness::check(
        &witness::default_path(dir),
        config.node_id,
        &path.display().to_string(),
        stores.1.identity().store(),
        applied,
    )?;
    let floor = restored_floor(config, dir, fresh)?;
    tokio::spawn(witness.follow(
        stores.1.durable_applied_watch(),
        stores.1.syncer(),
        shutdown.clone(),
    ));
    let network = network::Network::new(config.node_id, stores.1.identity(), peer_tls.clone());
    let refusals = network.non_member_refusals();
    let start = MemberStart {
        config,
        raft_config: raft_config(),
        stores,
        store_name: path.display().to_string(),
        signer,
        metrics,
        shutdown,
        introducer: Arc::new(network::GrpcIntroducer { tls: peer_tls }),
        floor,
        clock: Arc::new(palisade_core::clock::SystemClock),
        refusals: Some(refusals),
    };
    start.run(network).await
}

/// The floor of a member restored by `palisade restore --cluster` (its `restore.json`), or 0.
/// A restored member that has not joined a cluster yet must found one alone: were another
/// (unrestored) member to lead first, it would issue epochs from 1 (P6). The others join it
/// empty with --join and `palisade cluster add`, and learn the counter from it.
fn restored_floor(
    config: &ClusterConfig,
    dir: &std::path::Path,
    fresh: bool,
) -> Result<Epoch, ClusterError> {
    let Some(record) = palisade_coordinator::backup::restore_record(dir) else {
        return Ok(Epoch(0));
    };
    if fresh && !config.join && config.members.len() > 1 {
        return Err(ClusterError::DataDirectory(format!(
            "{} was restored (palisade restore --cluster, counter {}): it founds the new \
             cluster alone. Start it with --cluster listing only itself ({}={}), start the \
             other members with empty data directories and --join, and add them with \
             `palisade cluster add ID HOST:PORT`",
            dir.display(),
            record.counter,
            config.node_id,
            config
                .members
                .get(&config.node_id)
                .map_or("HOST:PORT", String::as_str)
        )));
    }
    tracing::info!(
        counter = record.counter,
        floor = record.floor,
        decided_by = %record.decided_by,
        "restored member: every term it leads starts above the restored counter"
    );
    Ok(Epoch(record.counter))
}

/// What starting a member takes, whatever its storage backend and network.
pub struct MemberStart<'a> {
    /// Its id and the membership it expects.
    pub config: &'a ClusterConfig,
    /// openraft's settings ([`raft_config`]; a simulation snapshots more often).
    pub raft_config: openraft::Config,
    /// Its opened store ([`storage::open`], [`storage::open_backend`]).
    pub stores: (storage::LogStore, storage::StateMachine),
    /// The store's name in messages (its path).
    pub store_name: String,
    /// Its token signer.
    pub signer: &'a palisade_core::TokenSigner,
    /// Its metrics.
    pub metrics: Arc<palisade_coordinator::metrics::Metrics>,
    /// Stops its supervisor (and the engine) when set.
    pub shutdown: tokio::sync::watch::Receiver<bool>,
    /// Asks other nodes who they are (founding a cluster, `cluster add`).
    pub introducer: Arc<dyn membership::Introducer>,
    /// The epoch counter a restore started this member at (`palisade restore --cluster`; 0:
    /// none): its first entry as leader raises the replicated counter to it.
    pub floor: Epoch,
    /// The wall clock whose floor every term this member leads starts at
    /// ([`palisade_core::clock`]).
    pub clock: Arc<dyn palisade_core::clock::WallClock>,
    /// The vote refusals its network saw from peers that do not count it ([`departure`]);
    /// `None`: a network that cannot tell (the simulation's), and it never leaves by itself.
    pub refusals: Option<departure::NonMemberRefusals>,
}

/// Makes the state machine's applies durable every `FOLLOW_INTERVAL` (when one is not yet)
/// until `shutdown`: the log is a file of its own, and an apply commits without an fsync. A
/// failure is logged; the next round tries again (the applies stay in the log meanwhile).
async fn sync_applies(sync: storage::SmSync, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(palisade_core::witness::FOLLOW_INTERVAL) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        if let Err(error) = sync.sync() {
            tracing::warn!(%error, "the applies could not be made durable; retrying");
        }
    }
}

impl MemberStart<'_> {
    /// Checks the membership, starts Raft over `network` (initialising a new cluster when every
    /// member starts empty) and the supervisor.
    pub async fn run<N>(self, network: N) -> Result<Member, ClusterError>
    where
        N: openraft::RaftNetworkFactory<TypeConfig>,
    {
        let config = self.config;
        let (log, sm) = self.stores;
        let (durable_applied, history) = (sm.durable_applied_watch(), sm.history());
        tokio::spawn(sync_applies(sm.syncer(), self.shutdown.clone()));
        let (state, identity) = (sm.shared(), sm.identity());
        let raft = start_raft(config.node_id, self.raft_config, network, log, sm).await?;
        let stored = stored_membership(&raft).await?;
        identity.attach(raft.metrics());
        // A member may have voted in the founder's first election without receiving its first
        // entry (openraft calls it initialised): with no membership yet, it waits like a new one.
        if stored.nodes().next().is_some() {
            if let Err(error) = check_stored_membership(&stored, config, &self.store_name) {
                let _ = raft.shutdown().await;
                return Err(error);
            }
        } else {
            let me = (config.node_id, identity.store().to_owned());
            found_or_wait(&raft, config, me, &self.introducer, &self.shutdown);
        }
        let changes = Arc::new(membership::Changes::new(
            raft.clone(),
            self.introducer.clone(),
        ));
        let (serving, serving_signal) =
            tokio::sync::watch::channel(palisade_coordinator::gateway::Serving::Unavailable(
                "starting: no leader known yet".into(),
            ));
        let (gateway, transitions) =
            palisade_coordinator::gateway::Gateway::switching(serving_signal);
        let clock_check = Arc::new(clock_check::ClockCheck::new(
            config.max_clock_offset_ms,
            self.metrics.clone(),
        ));
        let supervisor = supervisor::Supervisor {
            clock_check: clock_check.clone(),
            raft: raft.clone(),
            node_id: config.node_id,
            identity: identity.clone(),
            state: state.clone(),
            key: (
                self.signer.key_id().to_string(),
                palisade_core::token::encode_public_key(&self.signer.verifying_key()),
            ),
            floor: self.floor,
            clock: self.clock,
            metrics: self.metrics,
            serving,
            transitions,
            changes: changes.clone(),
            client_scheme: if config.client_tls { "https" } else { "http" },
            listed: config.members.clone(),
            refusals: self.refusals,
        };
        let supervisor = tokio::spawn(supervisor.run(self.shutdown));
        Ok(Member {
            raft,
            gateway,
            state,
            identity,
            changes,
            clock_check,
            supervisor,
            durable_applied,
            history,
        })
    }
}

/// Starts Raft for `node_id` over `network` and its stores. Elections start switched off: the
/// supervisor switches them on once the membership names this member with its own store (see
/// `identity`: a member that lost its data must not campaign, and a rejoining one must not
/// while it replays old memberships).
async fn start_raft<N>(
    node_id: NodeId,
    raft_config: openraft::Config,
    network: N,
    log: storage::LogStore,
    sm: storage::StateMachine,
) -> Result<RaftNode, ClusterError>
where
    N: openraft::RaftNetworkFactory<TypeConfig>,
{
    let raft_config = openraft::Config {
        enable_elect: false,
        ..raft_config
    }
    .validate()
    .map_err(|e| ClusterError::Config(e.to_string()))?;
    openraft::Raft::new(node_id, Arc::new(raft_config), network, log, sm)
        .await
        .map_err(|e| ClusterError::Raft(format!("raft did not start: {e}")))
}

/// The membership Raft's storage holds (from Raft itself: its published metrics may not show
/// it yet; this waits until they do, so that peers are checked against it).
async fn stored_membership(
    raft: &RaftNode,
) -> Result<openraft::Membership<NodeId, MemberNode>, ClusterError> {
    let stored = raft
        .with_raft_state(|st| st.membership_state.effective().clone())
        .await
        .map_err(|e| ClusterError::Raft(e.to_string()))?;
    raft.wait(Some(Duration::from_secs(10)))
        .metrics(
            |m| m.membership_config.log_id() == stored.log_id(),
            "the metrics show the stored membership",
        )
        .await
        .map_err(|e| ClusterError::Raft(e.to_string()))?;
    Ok(stored.membership().clone())
}

/// A member with no membership yet: with `--join` it waits to be added; the first member of
/// the `--cluster` list founds the cluster once every member has started (`me`: its id and
/// store); the others wait for it.
fn found_or_wait(
    raft: &RaftNode,
    config: &ClusterConfig,
    me: (NodeId, String),
    introducer: &Arc<dyn membership::Introducer>,
    shutdown: &tokio::sync::watch::Receiver<bool>,
) {
    if config.join {
        tracing::info!("waiting to be added to a cluster (`palisade cluster add` on its leader)");
        return;
    }
    let founder = *config
        .members
        .keys()
        .next()
        .expect("--cluster lists a member");
    if founder == config.node_id {
        tokio::spawn(membership::found(
            raft.clone(),
            me,
            config.members.clone(),
            introducer.clone(),
            shutdown.clone(),
        ));
    } else {
        tracing::info!(
            founder,
            "waiting for node {founder} to found the cluster (it does once every member has \
             started)"
        );
    }
}

/// A member that holds a cluster starts only with the `--cluster` list its log holds, and only
/// if that membership names every member's store.
fn check_stored_membership(
    membership: &openraft::Membership<NodeId, MemberNode>,
    config: &ClusterConfig,
    store_name: &str,
) -> Result<(), ClusterError> {
    let stored: BTreeMap<NodeId, String> = membership
        .nodes()
        .map(|(id, node)| (*id, node.addr.clone()))
        .collect();
    if !stored.contains_key(&config.node_id) {
        // It applied the membership that removed it (`departure`): it is no member any more.
        return Err(ClusterError::Removed(format!(
            "node {} was removed from the cluster: the membership stored in {store_name} ({}) \
             does not name it, so it does not start. To bring it back: start it with an empty \
             data directory and --join, then `palisade cluster add {} HOST:PORT` on the leader",
            config.node_id,
            format_members(&stored),
            config.node_id
        )));
    }
    if stored != config.members {
        return Err(ClusterError::Config(format!(
            "--cluster {} disagrees with the membership stored in {store_name}: {}. Start with \
             the stored list; change membership with `palisade cluster add|remove`",
            format_members(&config.members),
            format_members(&stored)
        )));
    }
    if let Some((id, _)) = membership.nodes().find(|(_, node)| node.store.is_empty()) {
        return Err(ClusterError::DataDirectory(format!(
            "{store_name} holds a membership without store ids (node {id} has none): it was \
             written by an older Palisade that trusted a peer's first message. Found the \
             cluster anew, or re-add each member with `palisade cluster remove` / `add`"
        )));
    }
    Ok(())
}

/// `1=HOST:PORT,2=HOST:PORT`.
pub fn format_members(members: &BTreeMap<NodeId, String>) -> String {
    members
        .iter()
        .map(|(id, addr)| format!("{id}={addr}"))
        .collect::<Vec<_>>()
        .join(",")
}
