//! The simulated network between members: every Raft message goes through a [`Router`] that
//! knows which members are up, which links are cut (partitions, one-way or both), and delays
//! or drops messages with the run's seeded generator.

// openraft's `RPCError` is large and its traits return it: nothing to box here.
#![allow(clippy::result_large_err)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use palisade_cluster::identity::Identity;
use palisade_cluster::identity::Introduction;
use palisade_cluster::membership::{Introducer, Introducing, ReadingClock};
use palisade_cluster::network::{check_append_entries, check_history, AppendReach};
use palisade_cluster::{MemberNode, NodeId, RaftNode, TypeConfig};
use palisade_sim::SplitMix64;

/// Longest delay of one message, ms (each way).
const MAX_DELAY_MS: u64 = 8;
/// Chance that a message is lost, percent.
const DROP_PERCENT: u64 = 1;

#[derive(Default)]
struct Links {
    /// Members that are up: their Raft node and their store's identity.
    up: BTreeMap<NodeId, (RaftNode, Identity)>,
    /// Every member's wall clock (it runs while the member is down, as a machine's does).
    clocks: BTreeMap<NodeId, Arc<dyn palisade_core::clock::WallClock>>,
    /// Directed links that carry nothing.
    cut: BTreeSet<(NodeId, NodeId)>,
    /// Directed links that carry everything but a leader's entries (a test's timing: one
    /// leader's entries arriving first).
    no_entries: BTreeSet<(NodeId, NodeId)>,
}

/// Counts of what the network did.
#[derive(Debug, Clone, Copy, Default)]
pub struct NetStats {
    /// Messages delivered.
    pub delivered: u64,
    /// Messages lost to a cut link, a down member or a random drop.
    pub lost: u64,
    /// Snapshot chunks delivered (a member caught up from a snapshot, not the log).
    pub snapshot_chunks: u64,
    /// Requests not sent, or answers not counted, because a member's store is not the one the
    /// membership names (it lost its data).
    pub refused: u64,
    /// AppendEntries refused by the receiver because their entries do not continue their
    /// `prev_log_id` ([`palisade_cluster::network::check_append_entries`]).
    pub malformed: u64,
    /// AppendEntries refused because they contradict entries the receiver applied
    /// ([`palisade_cluster::network::check_history`]): its history was lost by the
    /// members that elected the sender.
    pub diverged: u64,
}

/// The network of one run; clones share it.
#[derive(Clone)]
pub struct Router {
    links: Arc<Mutex<Links>>,
    rng: Arc<Mutex<SplitMix64>>,
    stats: Arc<Mutex<NetStats>>,
}

impl Router {
    /// A network drawing delays and drops from `rng`.
    pub fn new(rng: Arc<Mutex<SplitMix64>>) -> Self {
        Self {
            links: Arc::default(),
            rng,
            stats: Arc::default(),
        }
    }

    /// `id` is up and reachable at `raft`; its messages present `identity`.
    pub fn up(&self, id: NodeId, raft: RaftNode, identity: Identity) {
        self.links().up.insert(id, (raft, identity));
    }

    /// Member `id`'s wall clock, read when a peer asks for it.
    pub fn clock(&self, id: NodeId, clock: Arc<dyn palisade_core::clock::WallClock>) {
        self.links().clocks.insert(id, clock);
    }

    /// `id` is down: messages to it are lost.
    pub fn down(&self, id: NodeId) {
        self.links().up.remove(&id);
    }

    /// Cuts the link `from → to`.
    pub fn cut(&self, from: NodeId, to: NodeId) {
        self.links().cut.insert((from, to));
    }

    /// Cuts every link between `group` and the rest (both ways).
    pub fn isolate(&self, group: &[NodeId], all: &[NodeId]) {
        for a in group {
            for b in all.iter().filter(|b| !group.contains(b)) {
                self.cut(*a, *b);
                self.cut(*b, *a);
            }
        }
    }

    /// The link `from → to` carries no AppendEntries and no snapshot, and everything else.
    pub fn hold_entries(&self, from: NodeId, to: NodeId) {
        self.links().no_entries.insert((from, to));
    }

    /// Restores every link.
    pub fn heal(&self) {
        let mut links = self.links();
        links.cut.clear();
        links.no_entries.clear();
    }

    /// True when a majority of `voters` is up, each with the store its membership names, and
    /// every link among them carries messages both ways (the liveness check's premise).
    pub fn majority_connected(&self, voters: &[NodeId]) -> bool {
        let links = self.links();
        let alive: Vec<NodeId> = voters
            .iter()
            .copied()
            .filter(|id| {
                links
                    .up
                    .get(id)
                    .is_some_and(|(_, identity)| identity.may_send().is_ok())
            })
            .collect();
        let quorum = voters.len() / 2 + 1;
        // At most 7 voters: every subset of the live ones.
        (0u32..1 << alive.len())
            .filter(|mask| mask.count_ones() as usize >= quorum)
            .any(|mask| {
                let group: Vec<NodeId> = (0..alive.len())
                    .filter(|i| mask & (1 << i) != 0)
                    .map(|i| alive[i])
                    .collect();
                group.iter().all(|a| {
                    group
                        .iter()
                        .all(|b| a == b || !links.cut.contains(&(*a, *b)))
                })
            })
    }

    /// What the network did so far.
    pub fn stats(&self) -> NetStats {
        *self.stats.lock().expect("not poisoned")
    }

    /// A member's side of the network for its questions "who is at this address?". Addresses
    /// are `127.0.0.1:{7000 + id}`, as the simulation's members are configured.
    pub fn introducer(&self, from: NodeId) -> Introductions {
        Introductions {
            from,
            router: self.clone(),
        }
    }

    /// A member's side of the network.
    pub fn endpoint(&self, from: NodeId) -> Endpoint {
        Endpoint {
            from,
            router: self.clone(),
        }
    }

    fn holds_entries(&self, from: NodeId, to: NodeId) -> bool {
        self.links().no_entries.contains(&(from, to))
    }

    fn links(&self) -> std::sync::MutexGuard<'_, Links> {
        self.links.lock().expect("not poisoned")
    }

    /// The target if `from → to` carries a message now.
    fn route(&self, from: NodeId, to: NodeId) -> Option<(RaftNode, Identity)> {
        let links = self.links();
        if links.cut.contains(&(from, to)) || !links.up.contains_key(&from) {
            return None;
        }
        links.up.get(&to).cloned()
    }

    /// One clock reading's message `from → to`: delivered at once if the link is up, with no
    /// draw and no timer, so that the members' clock reads (every second,
    /// `palisade_cluster::clock_check`) leave the seed's draws and timers — every other
    /// delay, drop and fault — as they were.
    fn carry_clock_read(&self, from: NodeId, to: NodeId) -> Option<()> {
        self.route(from, to).map(|_| ())
    }

    /// One message `from → to`: a delay, then delivery if the link is still up and the
    /// message not dropped.
    async fn carry(&self, from: NodeId, to: NodeId) -> Option<(RaftNode, Identity)> {
        let (delay, dropped) = {
            let mut rng = self.rng.lock().expect("not poisoned");
            (rng.range(0, MAX_DELAY_MS + 1), rng.chance(DROP_PERCENT))
        };
        tokio::time::sleep(Duration::from_millis(delay)).await;
        let target = if dropped { None } else { self.route(from, to) };
        let mut stats = self.stats.lock().expect("not poisoned");
        match target {
            Some(_) => stats.delivered += 1,
            None => stats.lost += 1,
        }
        target
    }

    /// A request `from → to` and its answer back, or `Unreachable` if either way fails.
    /// `deliver` is the receiver: it hands the message to Raft, or refuses it before Raft sees
    /// it (a network error at the sender).
    async fn call<T, E, F, Fut>(
        &self,
        from: NodeId,
        to: NodeId,
        deliver: F,
    ) -> Result<T, RPCError<NodeId, MemberNode, RaftError<NodeId, E>>>
    where
        E: std::error::Error,
        F: FnOnce(RaftNode, Identity) -> Fut,
        Fut: std::future::Future<Output = Result<Result<T, RaftError<NodeId, E>>, NetworkError>>,
    {
        let unreachable = || {
            RPCError::Unreachable(Unreachable::new(&std::io::Error::other(format!(
                "no route {from} -> {to} (down, cut or dropped)"
            ))))
        };
        let (target, target_identity) = self.carry(from, to).await.ok_or_else(unreachable)?;
        let sender = self
            .links()
            .up
            .get(&from)
            .map(|(_, identity)| identity.clone());
        let sender = sender.ok_or_else(unreachable)?;
        // As `PeerClient` does: a member whose own store is not the one its membership names
        // sends nothing.
        if let Err(replaced) = sender.may_send() {
            self.stats.lock().expect("not poisoned").refused += 1;
            return Err(RPCError::Unreachable(Unreachable::new(&replaced)));
        }
        let answer = deliver(target, target_identity.clone())
            .await
            .map_err(RPCError::Network)?;
        // The answer travels back over the reverse link, and counts only from the store the
        // sender knows the receiver by (as `PeerClient` checks).
        self.carry(to, from).await.ok_or_else(unreachable)?;
        if let Err(refused) = sender.admit(to, target_identity.store()) {
            self.stats.lock().expect("not poisoned").refused += 1;
            return Err(RPCError::Unreachable(Unreachable::new(&refused)));
        }
        answer.map_err(|e| RPCError::RemoteError(RemoteError::new(to, e)))
    }
}

/// One member's network: the factory openraft asks for clients to its peers.
pub struct Endpoint {
    from: NodeId,
    router: Router,
}

impl RaftNetworkFactory<TypeConfig> for Endpoint {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, _node: &MemberNode) -> Peer {
        Peer {
            from: self.from,
            to: target,
            router: self.router.clone(),
        }
    }
}

/// Messages from one member to one peer.
pub struct Peer {
    from: NodeId,
    to: NodeId,
    router: Router,
}

type RpcResult<T, E> = Result<T, RPCError<NodeId, MemberNode, RaftError<NodeId, E>>>;

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible> {
        if self.router.holds_entries(self.from, self.to) {
            return Err(RPCError::Unreachable(Unreachable::new(
                &std::io::Error::other("entries held on this link"),
            )));
        }
        let stats = self.router.stats.clone();
        self.router
            .call(
                self.from,
                self.to,
                |raft: RaftNode, identity: Identity| async move {
                    // The receiver's check, as `RaftService` makes it: a malformed message never
                    // reaches Raft, and its sender sees a network error.
                    if let Err(malformed) = check_append_entries(&rpc) {
                        stats.lock().expect("not poisoned").malformed += 1;
                        return Err(NetworkError::new(&malformed));
                    }
                    if let Err(probation) = identity.may_follow(&rpc.vote) {
                        return Err(NetworkError::new(&probation));
                    }
                    let applied = raft.metrics().borrow().last_applied;
                    if let Err(diverged) = check_history(&rpc, applied) {
                        stats.lock().expect("not poisoned").diverged += 1;
                        return Err(NetworkError::new(&diverged));
                    }
                    let reach = AppendReach::of(&rpc);
                    let answer = raft.append_entries(rpc).await;
                    reach.tell(&identity, &answer);
                    Ok(answer)
                },
            )
            .await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        let answer = self
            .router
            .call(
                self.from,
                self.to,
                |raft: RaftNode, identity: Identity| async move {
                    if let Err(probation) = identity.may_follow(&rpc.vote) {
                        return Err(NetworkError::new(&probation));
                    }
                    Ok(raft.install_snapshot(rpc).await)
                },
            )
            .await;
        if answer.is_ok() {
            self.router
                .stats
                .lock()
                .expect("not poisoned")
                .snapshot_chunks += 1;
        }
        answer
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, openraft::error::Infallible> {
        self.router
            .call(
                self.from,
                self.to,
                |raft: RaftNode, identity: Identity| async move {
                    // As `RaftService` refuses: a member on probation grants no candidate before
                    // its census, and none below the floor after it.
                    if let Err(probation) = identity.may_grant(rpc.last_log_id.as_ref(), &rpc.vote)
                    {
                        // And answers as it does (see `Identity::refusal`).
                        return match identity.refusal() {
                            Some(refusal) => Ok(Ok(refusal)),
                            None => Err(NetworkError::new(&probation)),
                        };
                    }
                    Ok(raft.vote(rpc).await)
                },
            )
            .await
    }
}

/// One member's `Identify` questions, over the simulated links (a cut link or a down member
/// leaves it unanswered).
pub struct Introductions {
    from: NodeId,
    router: Router,
}

impl Introducer for Introductions {
    fn introduce(&self, _node: NodeId, addr: &str) -> Introducing {
        let (from, router) = (self.from, self.router.clone());
        let to = addr
            .strip_prefix("127.0.0.1:")
            .and_then(|port| port.parse::<NodeId>().ok())
            .and_then(|port| port.checked_sub(7000));
        Box::pin(async move {
            let to = to.ok_or_else(|| "no simulated member has that address".to_owned())?;
            let (raft, identity) = router
                .carry(from, to)
                .await
                .ok_or_else(|| format!("no route {from} -> {to}"))?;
            let introduction = Introduction::of(to, &identity, &raft.metrics().borrow());
            router
                .carry(to, from)
                .await
                .ok_or_else(|| format!("no route {to} -> {from}"))?;
            Ok(introduction)
        })
    }

    fn read_clock(&self, node: NodeId, _addr: &str) -> ReadingClock {
        let (from, router) = (self.from, self.router.clone());
        Box::pin(async move {
            router
                .carry_clock_read(from, node)
                .ok_or_else(|| format!("no route {from} -> {node}"))?;
            let clock = router.links().clocks.get(&node).cloned();
            let wall_ms = clock
                .ok_or_else(|| format!("node {node} has no clock"))?
                .now_ms();
            router
                .carry_clock_read(node, from)
                .ok_or_else(|| format!("no route {node} -> {from}"))?;
            Ok(wall_ms)
        })
    }
}
