//! Raft traffic over the project's own gRPC (`service Raft` in `proto/palisade.proto`): the
//! client side ([`Network`], one lazily connected channel per peer) and the server side
//! ([`RaftService`]). Payloads are openraft's messages as JSON. Appends travel on one
//! long-lived stream per leader and follower ([`stream`]); votes and snapshots are unary calls.

// openraft's `RPCError` is large and its traits return it: nothing to box here.
#![allow(clippy::result_large_err)]

mod stream;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::Vote;
use palisade_listener::PeerCertificates;
use palisade_proto::v1 as pb;
use pb::raft_client::RaftClient;
use pb::raft_server::{Raft as RaftRpc, RaftServer};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Response, Status};

use super::health::{Condition, Health};
use super::identity::{Identity, Introduction, FROM_METADATA, STORE_METADATA};
use super::membership::{Introducer, Introducing, ReadingClock, INTRODUCE_TIMEOUT};
use super::peer_tls::PeerTls;
use super::{MemberNode, NodeId, RaftNode, TypeConfig};

/// Largest Raft message accepted (entries are batched by `max_payload_entries`, snapshots are
/// sent in chunks far below this).
pub const MAX_RAFT_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
/// How long connecting to a peer may take.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// How often a refusal between members is logged, per peer.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// When a refusal by each peer was last logged: shared by every client of a member's network,
/// since openraft makes a new client for every election round (a per-client record would log
/// every round's refusals).
type RefusalLog = Arc<std::sync::Mutex<HashMap<NodeId, std::time::Instant>>>;

/// Makes the per-peer clients openraft asks for.
pub struct Network {
    node: NodeId,
    identity: Identity,
    tls: Option<Arc<PeerTls>>,
    channels: HashMap<NodeId, (String, Channel)>,
    refusals: RefusalLog,
    non_members: crate::departure::NonMemberRefusals,
}

impl Network {
    /// The network of member `node`, whose store is `identity`; with `tls`, every peer is
    /// dialled over mutual TLS.
    pub fn new(node: NodeId, identity: Identity, tls: Option<Arc<PeerTls>>) -> Self {
        Self {
            node,
            identity,
            tls,
            channels: HashMap::new(),
            refusals: RefusalLog::default(),
            non_members: crate::departure::NonMemberRefusals::default(),
        }
    }

    /// What peers said of this member's vote requests ([`crate::departure`]).
    pub fn non_member_refusals(&self) -> crate::departure::NonMemberRefusals {
        self.non_members.clone()
    }
}

/// A lazily connected channel to member `target` at `addr`: over mutual TLS with `tls`.
fn peer_channel(target: NodeId, addr: &str, tls: Option<&PeerTls>) -> Result<Endpoint, String> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
        .map_err(|e| e.to_string())?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true);
    if let Some(tls) = tls {
        endpoint = endpoint
            .tls_config(tls.client_config(target))
            .map_err(|e| format!("peer TLS: {e}"))?;
    }
    Ok(endpoint)
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &MemberNode) -> PeerClient {
        let channel = match self.channels.get(&target) {
            Some((addr, channel)) if *addr == node.addr => channel.clone(),
            _ => {
                let channel = peer_channel(target, &node.addr, self.tls.as_deref())
                    .expect("member addresses and peer credentials are validated at start")
                    .connect_lazy();
                self.channels
                    .insert(target, (node.addr.clone(), channel.clone()));
                channel
            }
        };
        PeerClient {
            target,
            from: self.node,
            identity: self.identity.clone(),
            refusals: self.refusals.clone(),
            non_members: self.non_members.clone(),
            appends: None,
            unary_appends: false,
            client: RaftClient::new(channel)
                .max_decoding_message_size(MAX_RAFT_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_RAFT_MESSAGE_BYTES),
        }
    }
}

/// Sends Raft messages to one peer.
pub struct PeerClient {
    target: NodeId,
    from: NodeId,
    identity: Identity,
    refusals: RefusalLog,
    non_members: crate::departure::NonMemberRefusals,
    client: RaftClient<Channel>,
    /// The open append stream to `target`, if any ([`stream`]).
    appends: Option<stream::AppendStream>,
    /// `target` does not serve the append stream (a member of an older build): appends are
    /// unary calls.
    unary_appends: bool,
}

type RpcResult<T, E> = Result<T, RPCError<NodeId, MemberNode, RaftError<NodeId, E>>>;

impl PeerClient {
    async fn call<Req, Resp, E>(
        &mut self,
        kind: Kind,
        request: &Req,
        ttl: Duration,
    ) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let (store, json) = self.send(kind, request, ttl).await.map_err(status_error)?;
        self.answer(&store, &json)
    }

    /// Sends `request` to `self.target`: its answer (the store it names, the JSON) or the
    /// status it failed with.
    async fn send<Req: Serialize>(
        &mut self,
        kind: Kind,
        request: &Req,
        ttl: Duration,
    ) -> Result<(String, Vec<u8>), Status> {
        // A member whose own store is not the one its membership names sends nothing.
        if let Err(replaced) = self.identity.may_send() {
            self.log_refusal(&replaced.to_string());
            return Err(Status::unavailable(replaced.to_string()));
        }
        let mut message = Request::new(payload(request));
        message.set_timeout(ttl);
        self.stamp(message.metadata_mut());
        let reply = match kind {
            Kind::Append => self.client.append_entries(message).await,
            Kind::Vote => self.client.vote(message).await,
            Kind::Snapshot => self.client.install_snapshot(message).await,
        }?;
        Ok((store_of(reply.metadata()), reply.into_inner().json))
    }

    /// Names this member and its store on a message or stream to `self.target`.
    fn stamp(&self, metadata: &mut tonic::metadata::MetadataMap) {
        metadata.insert(
            FROM_METADATA,
            self.from
                .to_string()
                .parse()
                .expect("a number is valid metadata"),
        );
        name_store(metadata, &self.identity);
    }

    /// Decodes `json`, an answer from `self.target` whose store is `store`. The answer counts
    /// only if it comes from the store this member knows the peer by.
    fn answer<Resp, E>(&mut self, store: &str, json: &[u8]) -> RpcResult<Resp, E>
    where
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        if let Err(refused) = self.identity.admit(self.target, store) {
            self.log_refusal(&refused.to_string());
            return Err(RPCError::Unreachable(Unreachable::new(&refused)));
        }
        let decoded: Result<Resp, RaftError<NodeId, E>> =
            serde_json::from_slice(json).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        decoded.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

/// A Raft message as it travels.
fn payload<T: Serialize>(message: &T) -> pb::RaftPayload {
    pb::RaftPayload {
        json: serde_json::to_vec(message).expect("raft messages serialize"),
    }
}

/// Names `identity`'s store on a message, a stream or an answer: the other side counts it only
/// if the store is the one its membership names.
fn name_store(metadata: &mut tonic::metadata::MetadataMap, identity: &Identity) {
    metadata.insert(
        STORE_METADATA,
        identity
            .store()
            .parse()
            .expect("a hex store id is valid metadata"),
    );
}

/// The store id a peer's answer names (empty when it names none: refused by the identity).
fn store_of(metadata: &tonic::metadata::MetadataMap) -> String {
    metadata
        .get(STORE_METADATA)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

/// A failed call as openraft weighs it: `UNAVAILABLE` means the peer is not there (openraft
/// backs off), anything else a network error.
fn status_error<E: std::error::Error>(status: Status) -> RPCError<NodeId, MemberNode, E> {
    if status.code() == Code::Unavailable {
        RPCError::Unreachable(Unreachable::new(&status))
    } else {
        RPCError::Network(NetworkError::new(&status))
    }
}

impl PeerClient {
    /// `vote`, from `self.target`'s answer, as openraft may adopt it (see [`not_own_lost_vote`]).
    fn not_own_lost_vote(&self, sent: &Vote<NodeId>, vote: Vote<NodeId>) -> Vote<NodeId> {
        let adopted = not_own_lost_vote(self.from, sent, vote);
        if adopted != vote {
            tracing::warn!(
                %vote,
                peer = self.target,
                "a peer holds a committed vote naming this member that this member does not \
                 hold: its disk went back in time; it does not lead that term again"
            );
        }
        adopted
    }

    fn log_refusal(&mut self, why: &str) {
        if self.refusal_log_due() {
            tracing::error!(peer = self.target, "raft traffic refused: {why}");
        }
    }

    /// Whether a refusal by `self.target` is to be logged now: at most every
    /// [`REFUSAL_LOG_INTERVAL`] per peer, across every client of this member.
    fn refusal_log_due(&self) -> bool {
        let mut logged = self.refusals.lock().expect("not poisoned");
        let due = logged
            .get(&self.target)
            .is_none_or(|at| at.elapsed() >= REFUSAL_LOG_INTERVAL);
        if due {
            logged.insert(self.target, std::time::Instant::now());
        }
        due
    }
}

/// A peer's vote, from its answer to an append or snapshot `me` sent with vote `sent`, as `me`
/// may adopt it. One greater than `sent` that names `me` as a committed leader can only be
/// one `me` lost: `me` never sends as the leader of a term before its vote for that term is
/// on disk, so its disk went back in time (a whole-volume snapshot put back). openraft adopts a higher vote from these answers
/// as it is, and a committed vote naming `me` would make `me` the leader of that old term
/// again, with a log that may lack what it appended then: its next entries would take the
/// log ids of entries its peers hold, with other content (`identity` rule 5). Not committed,
/// it only moves `me`'s term on, as openraft already does with vote answers.
fn not_own_lost_vote(me: NodeId, sent: &Vote<NodeId>, vote: Vote<NodeId>) -> Vote<NodeId> {
    if vote.leader_id.node_id == me && vote.committed && &vote > sent {
        return Vote::new(vote.leader_id.term, vote.leader_id.node_id);
    }
    vote
}

#[derive(Clone, Copy)]
enum Kind {
    Append,
    Vote,
    Snapshot,
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible> {
        let answer = if self.unary_appends {
            self.call(Kind::Append, &rpc, option.hard_ttl()).await
        } else {
            self.append_streamed(&rpc, option.hard_ttl()).await
        };
        answer.map(|answer| match answer {
            AppendEntriesResponse::HigherVote(vote) => {
                AppendEntriesResponse::HigherVote(self.not_own_lost_vote(&rpc.vote, vote))
            }
            other => other,
        })
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        let answer = self.call(Kind::Snapshot, &rpc, option.hard_ttl()).await;
        answer.map(
            |answer: InstallSnapshotResponse<NodeId>| InstallSnapshotResponse {
                vote: self.not_own_lost_vote(&rpc.vote, answer.vote),
            },
        )
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, openraft::error::Infallible> {
        match self.send(Kind::Vote, &rpc, option.hard_ttl()).await {
            // The peer does not count this member as a member (with peer TLS: it was removed,
            // or the peer has not learnt of its addition yet). Answered as the refusal it is,
            // logged here at most every REFUSAL_LOG_INTERVAL: as an error, openraft logged it
            // on every election round, about 13 lines a second for a removed member until
            // `departure` stops it.
            Err(status) if status.code() == Code::Unauthenticated => {
                self.non_members.refused(self.target);
                if self.refusal_log_due() {
                    tracing::warn!(
                        peer = self.target,
                        "node {} refuses this member's vote requests ({}): it does not count \
                         this member in its membership",
                        self.target,
                        status.message()
                    );
                }
                Ok(VoteResponse {
                    vote: rpc.vote,
                    vote_granted: false,
                    last_log_id: None,
                })
            }
            Err(status) => Err(status_error(status)),
            Ok((store, json)) => {
                self.non_members.answered(self.target);
                self.answer(&store, &json)
            }
        }
    }
}

/// How far an AppendEntries reaches: where the receiver's log matches the leader's once Raft
/// accepts it, and how far the leader had committed. A member on probation
/// ([`Identity::may_vote`]) votes again once an accepted one covers every committed entry.
#[derive(Debug, Clone, Copy)]
pub struct AppendReach {
    matched: Option<u64>,
    leader_commit: Option<u64>,
}

impl AppendReach {
    /// The reach of `request`, read before it is handed to Raft.
    pub fn of(request: &AppendEntriesRequest<TypeConfig>) -> Self {
        Self {
            matched: request
                .entries
                .last()
                .map(|entry| entry.log_id.index)
                .or(request.prev_log_id.map(|id| id.index)),
            leader_commit: request.leader_commit.map(|id| id.index),
        }
    }

    /// Tells `identity` what Raft answered: only an accepted append is a leader's word.
    pub fn tell<E>(self, identity: &Identity, answer: &Result<AppendEntriesResponse<NodeId>, E>) {
        match answer {
            Ok(AppendEntriesResponse::Success) => {
                identity.heard_leader(self.matched, self.leader_commit);
            }
            Ok(AppendEntriesResponse::PartialSuccess(matched)) => {
                identity.heard_leader(matched.map(|id| id.index), self.leader_commit);
            }
            _ => {}
        }
    }
}

/// An AppendEntries whose entries do not continue its `prev_log_id` exactly.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed append-entries: {0}")]
pub struct MalformedAppend(String);

/// Checks what openraft 0.9.25 checks only in debug builds (upstream issue #1795): the entries
/// of an AppendEntries start right after `prev_log_id`, run without a gap, never go back in
/// term, and none is from a term after the sender's vote. A follower that accepted a message
/// breaking this would write a log with a hole and stop for good. Every receiver (the gRPC
/// service, the simulation's network) calls this before handing the message to Raft.
pub fn check_append_entries(
    request: &AppendEntriesRequest<TypeConfig>,
) -> Result<(), MalformedAppend> {
    // The index the next entry must have; `None` after u64::MAX (no entry can follow: a
    // forged message, whose `+ 1` would panic in a debug build and wrap to 0 in a release one).
    let mut expected = request
        .prev_log_id
        .map_or(Some(0), |prev| prev.index.checked_add(1));
    let mut previous_term = request.prev_log_id.map_or(0, |prev| prev.leader_id.term);
    let vote_term = request.vote.leader_id().term;
    if previous_term > vote_term {
        return Err(MalformedAppend(format!(
            "prev_log_id {} is from a term after the sender's vote {}",
            request
                .prev_log_id
                .expect("a term above 0 comes from a log id"),
            request.vote
        )));
    }
    for entry in &request.entries {
        let log_id = entry.log_id;
        if Some(log_id.index) != expected {
            return Err(MalformedAppend(format!(
                "entry {log_id} where entry {} must come next (prev_log_id {:?})",
                expected.map_or_else(|| "none".to_owned(), |i| i.to_string()),
                request.prev_log_id
            )));
        }
        expected = log_id.index.checked_add(1);
        if log_id.leader_id.term < previous_term || log_id.leader_id.term > vote_term {
            return Err(MalformedAppend(format!(
                "entry {log_id} has a term outside [{previous_term}, {vote_term}]"
            )));
        }
        previous_term = log_id.leader_id.term;
    }
    Ok(())
}

/// An AppendEntries that contradicts entries this member already applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "refusing entries that contradict history this member applied: {0}. The members that \
     elected this leader lost entries a majority had acknowledged (their volumes went back in \
     time together?); this member keeps that history and does not follow. Recover from it: \
     palisade backup --data-dir of this member, then palisade restore --cluster"
)]
pub struct DivergedHistory(String);

/// Refuses what no leader of this member's history can send: an entry (or `prev_log_id`) at or
/// below this member's last applied entry `applied` whose term is above `applied`'s, or that
/// differs from `applied` at its index. A leader holds every committed entry (Raft's leader
/// completeness), so its entries up to `applied` are this member's, whose terms are at most
/// `applied`'s. Only members that lost committed entries — a majority whose volumes were put
/// back, or one put back with a lagging peer — elect a leader that sends such entries;
/// openraft 0.9 assumes entries below the commit index match and, handed one, panics (debug)
/// or applies a range that ends before its last applied entry (release: index out of bounds).
pub fn check_history(
    request: &AppendEntriesRequest<TypeConfig>,
    applied: Option<openraft::LogId<NodeId>>,
) -> Result<(), DivergedHistory> {
    let Some(applied) = applied else {
        return Ok(());
    };
    let sent = request
        .prev_log_id
        .iter()
        .chain(request.entries.iter().map(|entry| &entry.log_id));
    for log_id in sent {
        if log_id.index > applied.index {
            break;
        }
        let contradicts = log_id.leader_id.term > applied.leader_id.term
            || (log_id.index == applied.index && *log_id != applied);
        if contradicts {
            return Err(DivergedHistory(format!(
                "the leader sent {log_id}, this member applied {applied}"
            )));
        }
    }
    Ok(())
}

/// The server side: hands each message from an admitted peer to the local Raft node.
#[derive(Clone)]
pub struct RaftService {
    node: NodeId,
    raft: RaftNode,
    identity: Identity,
    /// Who may send (mutual TLS, or anyone with `--insecure-peers`): checked again here after
    /// the server's check before bodies.
    admission: PeerAdmission,
    /// Set when the member stops: open append streams end, so that the listener's graceful
    /// shutdown does not wait for the leader to close them.
    shutdown: tokio::sync::watch::Receiver<bool>,
    /// Where a refused divergent history is reported (not ready) until an append is taken.
    health: Health,
}

/// The answer to a Raft message that did not come from an authenticated member: it says
/// nothing about this member (no store id, term or membership).
/// Who may send Raft messages, judged from a request's path, metadata and connection alone:
/// the server asks before it reads a byte of the body (a message may be up to
/// [`MAX_RAFT_MESSAGE_BYTES`]), so that anyone who reaches the port without a member's
/// certificate is refused at the cost of its headers. [`RaftService`] checks again.
#[derive(Clone)]
pub struct PeerAdmission {
    /// Peers prove who they are with certificates (false: `--insecure-peers`).
    certificates_required: bool,
    identity: Identity,
}

impl PeerAdmission {
    /// The admission of a member whose peers prove who they are (`certificates_required`) to
    /// `identity`.
    pub fn new(certificates_required: bool, identity: Identity) -> Self {
        Self {
            certificates_required,
            identity,
        }
    }

    /// `Ok` when a request to `path` with `metadata` over a connection that presented
    /// `certificates` (a chain the peer CA signed) may be read: any member's certificate for
    /// `Identify` and `Clock` (the asker may not be in the membership yet), otherwise one that
    /// certifies the member the request names, which this member knows.
    pub fn admit(
        &self,
        path: &str,
        metadata: &tonic::metadata::MetadataMap,
        certificates: Option<&PeerCertificates>,
    ) -> Result<(), Status> {
        if path.ends_with("/Identify") || path.ends_with("/Clock") {
            self.any_member(certificates)
        } else {
            self.sender(metadata, certificates).map(|_| ())
        }
    }

    /// `Ok` when peers need no certificate, or `certificates` is a member's (any member's).
    pub fn any_member(&self, certificates: Option<&PeerCertificates>) -> Result<(), Status> {
        match certificates {
            Some(certificates) if !certificates.0.is_empty() => Ok(()),
            _ if !self.certificates_required => Ok(()),
            _ => Err(not_a_peer()),
        }
    }

    /// `Ok` when `from`, certified when its stream opened, is still a member this member
    /// knows (membership may change while a stream is open); always without certificates.
    pub fn still_member(&self, from: NodeId) -> Result<(), Status> {
        if self.certificates_required && !self.identity.knows(from) {
            return Err(not_a_peer());
        }
        Ok(())
    }

    /// The member `metadata` names as the sender, when it may send: peers need no
    /// certificate, or `certificates` certify that member and this member knows it.
    pub fn sender(
        &self,
        metadata: &tonic::metadata::MetadataMap,
        certificates: Option<&PeerCertificates>,
    ) -> Result<Option<NodeId>, Status> {
        let from = metadata
            .get(FROM_METADATA)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<NodeId>().ok());
        if !self.certificates_required {
            return Ok(from);
        }
        match (certificates, from) {
            (Some(certificates), Some(from))
                if PeerTls::certifies(certificates, from) && self.identity.knows(from) =>
            {
                Ok(Some(from))
            }
            _ => Err(not_a_peer()),
        }
    }
}

fn not_a_peer() -> Status {
    Status::unauthenticated("raft traffic is accepted only from cluster members over mutual TLS")
}

/// Logs a refused divergent history at most every 10 s (the leader retries at every heartbeat).
fn log_diverged(diverged: &DivergedHistory) {
    static LAST_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let now_ms = palisade_core::clock::now_ms();
    let last = LAST_MS.load(std::sync::atomic::Ordering::Relaxed);
    if now_ms.saturating_sub(last) >= 10_000 {
        LAST_MS.store(now_ms, std::sync::atomic::Ordering::Relaxed);
        tracing::error!(%diverged, "this member does not follow a leader that lost its history");
    }
}

/// The gRPC service of Raft traffic for member `node`'s `raft`, whose store is `identity`;
/// with `tls`, only from members authenticated by their peer certificates. Its append streams
/// end when `shutdown` is set. A leader's history it refuses is reported to `health`.
pub fn service(
    node: NodeId,
    raft: RaftNode,
    identity: Identity,
    tls: Option<Arc<PeerTls>>,
    shutdown: tokio::sync::watch::Receiver<bool>,
    health: Health,
) -> RaftServer<RaftService> {
    RaftServer::new(RaftService {
        node,
        raft,
        admission: PeerAdmission::new(tls.is_some(), identity.clone()),
        identity,
        shutdown,
        health,
    })
    .max_decoding_message_size(MAX_RAFT_MESSAGE_BYTES)
    .max_encoding_message_size(MAX_RAFT_MESSAGE_BYTES)
}

impl RaftService {
    /// Decodes a message. Its sender's node id and store id are required (they name the
    /// sender in logs); which store counts is the requester's check on the answer
    /// ([`super::identity`]), and who may send at all is the transport's.
    fn admit<T: DeserializeOwned>(&self, request: Request<pb::RaftPayload>) -> Result<T, Status> {
        self.sender(request.metadata(), request.extensions())?;
        decode(&request.into_inner().json)
    }

    /// The member that sends a message or opens a stream, from its metadata and (with peer
    /// TLS) its connection's certificate.
    fn sender(
        &self,
        metadata: &tonic::metadata::MetadataMap,
        extensions: &tonic::Extensions,
    ) -> Result<NodeId, Status> {
        // Before anything else: over a clear-text (client) connection, or with a certificate
        // that does not name the node the message claims, nothing is decoded.
        let from = self
            .admission
            .sender(metadata, extensions.get::<PeerCertificates>())?;
        let from = from
            .ok_or_else(|| Status::invalid_argument("raft message without its sender's node id"))?;
        metadata
            .get(STORE_METADATA)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| {
                Status::invalid_argument("raft message without its sender's store id")
            })?;
        Ok(from)
    }

    /// Names this member's store on an answer: the requester counts it only if the store is
    /// the one it knows this member by.
    fn stamp(&self, metadata: &mut tonic::metadata::MetadataMap) {
        name_store(metadata, &self.identity);
    }

    fn encode<T: Serialize>(&self, value: &T) -> Result<Response<pb::RaftPayload>, Status> {
        let mut response = Response::new(payload(value));
        self.stamp(response.metadata_mut());
        Ok(response)
    }

    /// Hands an admitted AppendEntries to Raft, after the checks every append passes.
    async fn append(
        &self,
        request: AppendEntriesRequest<TypeConfig>,
    ) -> Result<pb::RaftPayload, Status> {
        check_append_entries(&request).map_err(|e| Status::invalid_argument(e.to_string()))?;
        // A member on probation takes no entries from a deposed leader (`identity` rule 4).
        self.identity
            .may_follow(&request.vote)
            .map_err(|refused| Status::unavailable(refused.to_string()))?;
        let applied = self.raft.metrics().borrow().last_applied;
        if let Err(diverged) = check_history(&request, applied) {
            log_diverged(&diverged);
            self.health
                .set(Condition::DivergedHistory, diverged.to_string());
            return Err(Status::failed_precondition(diverged.to_string()));
        }
        let reach = AppendReach::of(&request);
        let answer = self.raft.append_entries(request).await;
        if answer.is_ok() {
            self.health.clear(Condition::DivergedHistory);
        }
        reach.tell(&self.identity, &answer);
        Ok(payload(&answer))
    }
}

/// A Raft message from its travelling form.
fn decode<T: DeserializeOwned>(json: &[u8]) -> Result<T, Status> {
    serde_json::from_slice(json)
        .map_err(|e| Status::invalid_argument(format!("undecodable raft message: {e}")))
}

#[tonic::async_trait]
impl RaftRpc for RaftService {
    async fn append_entries(
        &self,
        request: Request<pb::RaftPayload>,
    ) -> Result<Response<pb::RaftPayload>, Status> {
        let request: AppendEntriesRequest<TypeConfig> = self.admit(request)?;
        let mut response = Response::new(self.append(request).await?);
        self.stamp(response.metadata_mut());
        Ok(response)
    }

    type AppendStreamStream = stream::Replies;

    async fn append_stream(
        &self,
        request: Request<tonic::Streaming<pb::RaftPayload>>,
    ) -> Result<Response<Self::AppendStreamStream>, Status> {
        self.open_append_stream(request)
    }

    async fn vote(
        &self,
        request: Request<pb::RaftPayload>,
    ) -> Result<Response<pb::RaftPayload>, Status> {
        let request: VoteRequest<NodeId> = self.admit(request)?;
        // A member on probation (restarted, not caught up) grants no candidate before its
        // census, and none below the census floor after it: its disk may be an older copy
        // (`identity`, rule 4). The candidate counts no vote.
        if let Err(probation) = self
            .identity
            .may_grant(request.last_log_id.as_ref(), &request.vote)
        {
            // Answered as Raft answers a candidate it refuses (see `Identity::refusal`).
            return match self.identity.refusal() {
                Some(refusal) => self.encode(&Ok::<_, RaftError<NodeId>>(refusal)),
                None => Err(Status::unavailable(probation.to_string())),
            };
        }
        self.encode(&self.raft.vote(request).await)
    }

    async fn install_snapshot(
        &self,
        request: Request<pb::RaftPayload>,
    ) -> Result<Response<pb::RaftPayload>, Status> {
        let request: InstallSnapshotRequest<TypeConfig> = self.admit(request)?;
        self.identity
            .may_follow(&request.vote)
            .map_err(|refused| Status::unavailable(refused.to_string()))?;
        self.encode(&self.raft.install_snapshot(request).await)
    }

    async fn identify(
        &self,
        request: Request<pb::RaftPayload>,
    ) -> Result<Response<pb::RaftPayload>, Status> {
        // Who asks must be a member too (any member: the leader adding this node).
        self.admission
            .any_member(request.extensions().get::<PeerCertificates>())?;
        let introduction =
            Introduction::of(self.node, &self.identity, &self.raft.metrics().borrow());
        self.encode(&introduction)
    }

    async fn clock(
        &self,
        request: Request<pb::RaftPayload>,
    ) -> Result<Response<pb::RaftPayload>, Status> {
        // Any member may ask (a leader checking its clock before it commits a floor).
        self.admission
            .any_member(request.extensions().get::<PeerCertificates>())?;
        self.encode(&ClockReading {
            wall_ms: palisade_core::clock::now_ms(),
        })
    }
}

/// A member's answer to `Clock`: what its wall clock read.
#[derive(Debug, Serialize, Deserialize)]
struct ClockReading {
    /// Milliseconds since 1970.
    wall_ms: u64,
}

/// Asks nodes who they are over gRPC (`Identify`), one short-lived connection per question;
/// with peer credentials over mutual TLS, to a certificate naming the node expected there.
pub struct GrpcIntroducer {
    /// This member's peer credentials (`None`: `--insecure-peers`).
    pub tls: Option<Arc<PeerTls>>,
}

impl Introducer for GrpcIntroducer {
    fn introduce(&self, node: NodeId, addr: &str) -> Introducing {
        let endpoint = peer_channel(node, addr, self.tls.as_deref());
        Box::pin(async move {
            let channel = endpoint?
                .timeout(INTRODUCE_TIMEOUT)
                .connect()
                .await
                .map_err(|e| format!("connect: {e}"))?;
            let reply = RaftClient::new(channel)
                .identify(pb::RaftPayload { json: Vec::new() })
                .await
                .map_err(|status| format!("{}: {}", status.code(), status.message()))?;
            serde_json::from_slice(&reply.into_inner().json)
                .map_err(|e| format!("an answer that is not an introduction: {e}"))
        })
    }

    fn read_clock(&self, node: NodeId, addr: &str) -> ReadingClock {
        let endpoint = peer_channel(node, addr, self.tls.as_deref());
        Box::pin(async move {
            let channel = endpoint?
                .timeout(crate::clock_check::READ_TIMEOUT)
                .connect()
                .await
                .map_err(|e| format!("connect: {e}"))?;
            let reply = RaftClient::new(channel)
                .clock(pb::RaftPayload { json: Vec::new() })
                .await
                .map_err(|status| format!("{}: {}", status.code(), status.message()))?;
            let reading: ClockReading = serde_json::from_slice(&reply.into_inner().json)
                .map_err(|e| format!("an answer that is not a clock reading: {e}"))?;
            Ok(reading.wall_ms)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::testing::{blank_ent, log_id};

    fn request(prev: Option<u64>, entries: &[(u64, u64)]) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: Vote::new_committed(3, 1),
            prev_log_id: prev.map(|index| log_id(2, 1, index)),
            leader_commit: None,
            entries: entries
                .iter()
                .map(|(term, index)| blank_ent::<TypeConfig>(*term, 1, *index))
                .collect(),
        }
    }

    mod fuzz {
        //! Raft message decoding against arbitrary bytes and arbitrary log ids (P1, P8: no
        //! message a client can send stops a member). `PALISADE_FUZZ_CASES` cases (default
        //! 1,000, fixed seed); `scripts/fuzz` runs many more.
        use super::*;
        use proptest::prelude::*;

        fn config() -> ProptestConfig {
            ProptestConfig {
                cases: std::env::var("PALISADE_FUZZ_CASES")
                    .ok()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(1_000),
                rng_seed: std::env::var("PROPTEST_RNG_SEED")
                    .ok()
                    .and_then(|seed| seed.parse().ok())
                    .map_or(
                        proptest::test_runner::RngSeed::Fixed(0x7261_6674),
                        proptest::test_runner::RngSeed::Fixed,
                    ),
                failure_persistence: None,
                ..ProptestConfig::default()
            }
        }

        proptest! {
            #![proptest_config(config())]

            /// Arbitrary bytes (and a real message cut or altered in one byte) never panic the
            /// decoder; whatever decodes never panics the append check.
            #[test]
            fn p8_arbitrary_bytes_never_panic_the_raft_decoder(
                bytes in proptest::collection::vec(any::<u8>(), 0..512),
                at in any::<prop::sample::Index>(),
                with in any::<u8>(),
            ) {
                let _ = serde_json::from_slice::<AppendEntriesRequest<TypeConfig>>(&bytes);
                let _ = serde_json::from_slice::<VoteRequest<NodeId>>(&bytes);
                let _ = serde_json::from_slice::<InstallSnapshotRequest<TypeConfig>>(&bytes);
                let mut real = serde_json::to_vec(&request(Some(24), &[(2, 25), (3, 26)])).unwrap();
                let i = at.index(real.len());
                real[i] = with;
                if let Ok(decoded) = serde_json::from_slice::<AppendEntriesRequest<TypeConfig>>(&real) {
                    let _ = check_append_entries(&decoded);
                }
            }

            /// Any log ids at all, up to u64::MAX, are judged without a panic (overflow
            /// included), and what passes the check is a run with no gap whose terms never go
            /// back and never pass the sender's vote.
            #[test]
            fn p1_p8_any_log_ids_are_judged_without_a_panic(
                vote_term in any::<u64>(),
                prev in proptest::option::of((any::<u64>(), prop_oneof![any::<u64>(), Just(u64::MAX)])),
                entries in proptest::collection::vec((any::<u64>(), prop_oneof![any::<u64>(), Just(u64::MAX)]), 0..4),
            ) {
                let request = AppendEntriesRequest::<TypeConfig> {
                    vote: Vote::new_committed(vote_term, 1),
                    prev_log_id: prev.map(|(term, index)| log_id(term, 1, index)),
                    leader_commit: None,
                    entries: entries
                        .iter()
                        .map(|(term, index)| blank_ent::<TypeConfig>(*term, 1, *index))
                        .collect(),
                };
                if check_append_entries(&request).is_ok() {
                    let mut expected = request.prev_log_id.map(|p| p.index.checked_add(1));
                    let mut term = request.prev_log_id.map_or(0, |p| p.leader_id.term);
                    prop_assert!(term <= vote_term);
                    for entry in &request.entries {
                        if let Some(next) = expected {
                            prop_assert_eq!(Some(entry.log_id.index), next);
                        } else {
                            prop_assert_eq!(entry.log_id.index, 0);
                        }
                        prop_assert!(entry.log_id.leader_id.term >= term);
                        prop_assert!(entry.log_id.leader_id.term <= vote_term);
                        term = entry.log_id.leader_id.term;
                        expected = Some(entry.log_id.index.checked_add(1));
                    }
                }
            }
        }
    }

    #[test]
    fn p1_p8_entries_must_continue_prev_log_id_without_a_gap() {
        assert_eq!(check_append_entries(&request(Some(24), &[])), Ok(()));
        assert_eq!(
            check_append_entries(&request(Some(24), &[(2, 25), (3, 26)])),
            Ok(())
        );
        assert_eq!(
            check_append_entries(&request(None, &[(1, 0), (1, 1)])),
            Ok(())
        );
        // The message a deposed leader's replication task sent (seed 900442): prev 24, then
        // entries from 26.
        let hole = check_append_entries(&request(Some(24), &[(2, 26), (2, 27), (2, 28)]));
        assert!(hole
            .unwrap_err()
            .to_string()
            .contains("entry 25 must come next"));
        assert!(check_append_entries(&request(Some(24), &[(2, 25), (2, 27)])).is_err());
        assert!(check_append_entries(&request(Some(24), &[(2, 24)])).is_err());
        assert!(check_append_entries(&request(None, &[(1, 1)])).is_err());
    }

    #[test]
    fn p1_p8_entries_that_contradict_applied_history_are_refused() {
        let applied = Some(log_id(3, 1, 30));
        // The same history resent, and entries past it: accepted.
        assert!(check_history(&request(Some(28), &[(3, 29), (3, 30), (4, 31)]), applied).is_ok());
        assert!(check_history(&request(Some(29), &[(3, 30), (5, 31)]), applied).is_ok());
        assert!(check_history(&request(Some(10), &[]), None).is_ok());
        // A leader of a later term with entries at or below what was applied: its electors
        // lost them (seen after a majority's volumes were put back).
        let lost = check_history(&request(Some(25), &[(5, 26)]), applied).unwrap_err();
        assert!(
            lost.to_string().contains("palisade restore --cluster"),
            "{lost}"
        );
        assert!(check_history(&request(Some(29), &[(2, 30)]), applied).is_err());
        assert!(check_history(&request(Some(26), &[]), applied).is_ok());
        let mut prev_later_term = request(Some(26), &[]);
        prev_later_term.prev_log_id = Some(log_id(4, 1, 26));
        assert!(check_history(&prev_later_term, applied).is_err());
    }

    #[test]
    fn p1_entry_terms_never_go_back_nor_pass_the_senders_vote() {
        assert!(check_append_entries(&request(Some(24), &[(1, 25)])).is_err());
        assert!(check_append_entries(&request(Some(24), &[(3, 25), (2, 26)])).is_err());
        assert!(check_append_entries(&request(Some(24), &[(4, 25)])).is_err());
        let mut future_prev = request(Some(24), &[]);
        future_prev.prev_log_id = Some(log_id(5, 1, 24));
        assert!(check_append_entries(&future_prev).is_err());
    }

    #[test]
    fn p8_a_member_never_adopts_a_lost_leadership_of_its_own_from_an_answer() {
        // Member 1, put back to a disk from term 1, sends as the leader of term 1; a peer
        // answers with the vote it holds: member 1 as the committed leader of term 13, a
        // leadership member 1 lost with its disk. Adopted as is, member 1 would lead term 13
        // again with the log of term 1 (rule 5): it moves to term 13 without leading it.
        let sent = Vote::new_committed(1, 1);
        let lost = Vote::new_committed(13, 1);
        assert_eq!(not_own_lost_vote(1, &sent, lost), Vote::new(13, 1));
        // Another member's leadership, and this member's own current one, pass unchanged.
        let other = Vote::new_committed(13, 2);
        assert_eq!(not_own_lost_vote(1, &sent, other), other);
        let current = Vote::new_committed(13, 1);
        assert_eq!(not_own_lost_vote(1, &current, current), current);
    }
}
