//! Raft traffic over the project's own gRPC (`service Raft` in `proto/palisade.proto`): the
//! client side ([`Network`], one lazily connected channel per peer) and the server side
//! ([`RaftService`]). Payloads are openraft's messages as JSON.

// openraft's `RPCError` is large and its traits return it: nothing to box here.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use palisade_proto::v1 as pb;
use pb::raft_client::RaftClient;
use pb::raft_server::{Raft as RaftRpc, RaftServer};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Response, Status};

use super::{NodeId, RaftNode, TypeConfig};

/// Largest Raft message accepted (entries are batched by `max_payload_entries`, snapshots are
/// sent in chunks far below this).
pub const MAX_RAFT_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
/// How long connecting to a peer may take.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// Makes the per-peer clients openraft asks for.
#[derive(Default)]
pub struct Network {
    channels: HashMap<NodeId, (String, Channel)>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerClient {
        let channel = match self.channels.get(&target) {
            Some((addr, channel)) if *addr == node.addr => channel.clone(),
            _ => {
                let channel = Endpoint::from_shared(format!("http://{}", node.addr))
                    .expect("member addresses are validated at start")
                    .connect_timeout(CONNECT_TIMEOUT)
                    .tcp_nodelay(true)
                    .connect_lazy();
                self.channels
                    .insert(target, (node.addr.clone(), channel.clone()));
                channel
            }
        };
        PeerClient {
            target,
            client: RaftClient::new(channel)
                .max_decoding_message_size(MAX_RAFT_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_RAFT_MESSAGE_BYTES),
        }
    }
}

/// Sends Raft messages to one peer.
pub struct PeerClient {
    target: NodeId,
    client: RaftClient<Channel>,
}

type RpcResult<T, E> = Result<T, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>;

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
        let mut message = Request::new(pb::RaftPayload {
            json: serde_json::to_vec(request).expect("raft messages serialize"),
        });
        message.set_timeout(ttl);
        let reply = match kind {
            Kind::Append => self.client.append_entries(message).await,
            Kind::Vote => self.client.vote(message).await,
            Kind::Snapshot => self.client.install_snapshot(message).await,
        };
        let reply = match reply {
            Ok(reply) => reply.into_inner(),
            Err(status) if status.code() == Code::Unavailable => {
                return Err(RPCError::Unreachable(Unreachable::new(&status)))
            }
            Err(status) => return Err(RPCError::Network(NetworkError::new(&status))),
        };
        let decoded: Result<Resp, RaftError<NodeId, E>> = serde_json::from_slice(&reply.json)
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        decoded.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
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
        self.call(Kind::Append, &rpc, option.hard_ttl()).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        self.call(Kind::Snapshot, &rpc, option.hard_ttl()).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, openraft::error::Infallible> {
        self.call(Kind::Vote, &rpc, option.hard_ttl()).await
    }
}

/// The server side: hands each message to the local Raft node.
pub struct RaftService {
    raft: RaftNode,
}

/// The gRPC service of Raft traffic for `raft`.
pub fn service(raft: RaftNode) -> RaftServer<RaftService> {
    RaftServer::new(RaftService { raft })
        .max_decoding_message_size(MAX_RAFT_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_RAFT_MESSAGE_BYTES)
}

fn decode<T: DeserializeOwned>(request: Request<pb::RaftPayload>) -> Result<T, Status> {
    serde_json::from_slice(&request.into_inner().json)
        .map_err(|e| Status::invalid_argument(format!("undecodable raft message: {e}")))
}

fn encode<T: Serialize>(value: &T) -> Result<Response<pb::RaftPayload>, Status> {
    Ok(Response::new(pb::RaftPayload {
        json: serde_json::to_vec(value).expect("raft messages serialize"),
    }))
}

#[tonic::async_trait]
impl RaftRpc for RaftService {
    async fn append_entries(
        &self,
        request: Request<pb::RaftPayload>,
    ) -> Result<Response<pb::RaftPayload>, Status> {
        let request: AppendEntriesRequest<TypeConfig> = decode(request)?;
        encode(&self.raft.append_entries(request).await)
    }

    async fn vote(
        &self,
        request: Request<pb::RaftPayload>,
    ) -> Result<Response<pb::RaftPayload>, Status> {
        let request: VoteRequest<NodeId> = decode(request)?;
        encode(&self.raft.vote(request).await)
    }

    async fn install_snapshot(
        &self,
        request: Request<pb::RaftPayload>,
    ) -> Result<Response<pb::RaftPayload>, Status> {
        let request: InstallSnapshotRequest<TypeConfig> = decode(request)?;
        encode(&self.raft.install_snapshot(request).await)
    }
}
