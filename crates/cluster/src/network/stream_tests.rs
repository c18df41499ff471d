//! The leader's side of the append stream against peers served in-process on loopback: a
//! member of an older build (no stream), a peer that answers from another store, one that does
//! not answer in time.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use openraft::error::RaftError;
use openraft::network::{RaftNetwork as _, RaftNetworkFactory as _};
use openraft::{Membership, RaftMetrics, Vote};
use pb::raft_server::{Raft as RaftRpc, RaftServer};
use tokio::sync::watch;

use super::super::{Network, STORE_METADATA};
use super::*;

const PEER_STORE: &str = "00000000000000aa";

/// How the fake peer behaves.
#[derive(Clone, Copy, PartialEq)]
enum Peer {
    /// Serves unary appends only (an older build).
    Old,
    /// Serves the stream, answering each append.
    Streams,
    /// Serves the stream and never answers.
    Silent,
}

struct FakePeer {
    behaves: Peer,
    /// The store it names in its answers.
    store: &'static str,
    unary: Arc<AtomicUsize>,
    opened: Arc<AtomicUsize>,
}

fn success() -> pb::RaftPayload {
    payload(&Ok::<_, RaftError<NodeId>>(
        AppendEntriesResponse::<NodeId>::Success,
    ))
}

#[tonic::async_trait]
impl RaftRpc for FakePeer {
    async fn append_entries(
        &self,
        _: Request<pb::RaftPayload>,
    ) -> Result<Response<pb::RaftPayload>, Status> {
        self.unary.fetch_add(1, Ordering::SeqCst);
        let mut response = Response::new(success());
        response
            .metadata_mut()
            .insert(STORE_METADATA, self.store.parse().unwrap());
        Ok(response)
    }

    type AppendStreamStream = Replies;

    async fn append_stream(
        &self,
        request: Request<Streaming<pb::RaftPayload>>,
    ) -> Result<Response<Replies>, Status> {
        if self.behaves == Peer::Old {
            return Err(Status::unimplemented("no such method"));
        }
        self.opened.fetch_add(1, Ordering::SeqCst);
        let (replies, answers) = mpsc::channel(1);
        let mut incoming = request.into_inner();
        let silent = self.behaves == Peer::Silent;
        tokio::spawn(async move {
            while let Ok(Some(_)) = incoming.message().await {
                if silent {
                    continue;
                }
                if replies.send(Ok(success())).await.is_err() {
                    return;
                }
            }
        });
        let mut response = Response::new(ReceiverStream::new(answers));
        response
            .metadata_mut()
            .insert(STORE_METADATA, self.store.parse().unwrap());
        Ok(response)
    }

    async fn vote(&self, _: Request<pb::RaftPayload>) -> Result<Response<pb::RaftPayload>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn install_snapshot(
        &self,
        _: Request<pb::RaftPayload>,
    ) -> Result<Response<pb::RaftPayload>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn identify(
        &self,
        _: Request<pb::RaftPayload>,
    ) -> Result<Response<pb::RaftPayload>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn clock(
        &self,
        _: Request<pb::RaftPayload>,
    ) -> Result<Response<pb::RaftPayload>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
}

struct Setup {
    client: PeerClient,
    unary: Arc<AtomicUsize>,
    opened: Arc<AtomicUsize>,
    _dir: tempfile::TempDir,
    _metrics: watch::Sender<RaftMetrics<NodeId, MemberNode>>,
}

/// Member 1 (the leader) with a client to member 2, a fake peer on loopback that the
/// membership knows by [`PEER_STORE`].
async fn setup(behaves: Peer, store: &'static str) -> Setup {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (unary, opened) = (Arc::default(), Arc::default());
    let peer = FakePeer {
        behaves,
        store,
        unary: Arc::clone(&unary),
        opened: Arc::clone(&opened),
    };
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RaftServer::new(peer))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );

    let dir = tempfile::tempdir().unwrap();
    let (_log, sm) = crate::storage::open(&dir.path().join("s.redb")).unwrap();
    let identity = sm.identity();
    let nodes = BTreeMap::from([
        (
            1,
            MemberNode {
                addr: "127.0.0.1:1".into(),
                store: identity.store().to_owned(),
            },
        ),
        (
            2,
            MemberNode {
                addr: addr.clone(),
                store: PEER_STORE.into(),
            },
        ),
    ]);
    let mut metrics = RaftMetrics::new_initial(1);
    metrics.membership_config = Arc::new(openraft::StoredMembership::new(
        Some(openraft::testing::log_id(1, 1, 0)),
        Membership::new(vec![BTreeSet::from([1, 2])], nodes.clone()),
    ));
    let (sender, receiver) = watch::channel(metrics);
    identity.attach(receiver);
    let mut network = Network::new(1, identity, None);
    let client = network.new_client(2, &nodes[&2]).await;
    Setup {
        client,
        unary,
        opened,
        _dir: dir,
        _metrics: sender,
    }
}

fn heartbeat() -> AppendEntriesRequest<TypeConfig> {
    AppendEntriesRequest {
        vote: Vote::new_committed(1, 1),
        prev_log_id: None,
        leader_commit: None,
        entries: Vec::new(),
    }
}

const TTL: Duration = Duration::from_secs(5);

#[tokio::test]
async fn p8_appends_share_one_stream_and_each_answer_is_read_in_turn() {
    let mut setup = setup(Peer::Streams, PEER_STORE).await;
    for _ in 0..5 {
        let answer = setup.client.append_streamed(&heartbeat(), TTL).await;
        assert!(
            matches!(answer, Ok(AppendEntriesResponse::Success)),
            "{answer:?}"
        );
    }
    assert_eq!(
        setup.opened.load(Ordering::SeqCst),
        1,
        "one stream for every append"
    );
    assert_eq!(setup.unary.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_member_of_an_older_build_gets_unary_appends() {
    let mut setup = setup(Peer::Old, PEER_STORE).await;
    for _ in 0..3 {
        let answer = setup.client.append_entries(heartbeat(), rpc_option()).await;
        assert!(
            matches!(answer, Ok(AppendEntriesResponse::Success)),
            "{answer:?}"
        );
    }
    assert_eq!(setup.unary.load(Ordering::SeqCst), 3);
    assert!(setup.client.unary_appends, "asked once, then unary");
}

#[tokio::test]
async fn p8_an_answer_on_the_stream_from_another_store_does_not_count() {
    let mut setup = setup(Peer::Streams, "00000000000000bb").await;
    let answer = setup.client.append_streamed(&heartbeat(), TTL).await;
    assert!(
        matches!(answer, Err(RPCError::Unreachable(_))),
        "{answer:?}"
    );
}

#[tokio::test]
async fn p8_an_append_not_answered_in_time_drops_the_stream_so_no_late_answer_is_misread() {
    let mut setup = setup(Peer::Silent, PEER_STORE).await;
    let ttl = Duration::from_millis(200);
    let answer = setup.client.append_streamed(&heartbeat(), ttl).await;
    assert!(matches!(answer, Err(RPCError::Network(_))), "{answer:?}");
    assert!(setup.client.appends.is_none(), "the stream is dropped");
    let answer = setup.client.append_streamed(&heartbeat(), ttl).await;
    assert!(answer.is_err());
    assert_eq!(
        setup.opened.load(Ordering::SeqCst),
        2,
        "a new stream for the next append"
    );
}

fn rpc_option() -> openraft::network::RPCOption {
    openraft::network::RPCOption::new(TTL)
}
