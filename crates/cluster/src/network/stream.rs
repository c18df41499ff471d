//! Appends on one long-lived gRPC stream per leader and follower (`AppendStream`).
//!
//! A unary call costs a stream of its own each way: HEADERS, DATA and an end-of-stream frame
//! from the leader, HEADERS, DATA and trailers back, and the stream's setup on both sides. An
//! entry takes two rounds per follower (one carrying it, one carrying the new commit index),
//! so that setup is paid four times per entry on a 3-member cluster. On a stream, a message is
//! one DATA frame each way.
//!
//! The protocol on the stream is strictly request, answer, request, answer: openraft 0.9 sends
//! a follower its next AppendEntries only after the answer to the previous one, so the stream
//! keeps exactly its one-at-a-time order and needs no ids. What a unary call checks is checked
//! here too:
//! - the sender (peer certificate, node id, store id) when the stream opens, and with peer TLS
//!   that the membership still knows it before each message;
//! - the answering member's store (named once, in the stream's response headers) against the
//!   one this member knows it by, before each answer counts;
//! - every append passes the same checks as a unary one ([`RaftService::append`]).
//!
//! Any error, a timeout or the end of the stream drops it: the next append opens a new one, so
//! a late answer can never be taken for the answer to a later request. A member that does not
//! serve the stream (an older build) gets unary appends.

// openraft's `RPCError` is large and its traits return it: nothing to box here.
#![allow(clippy::result_large_err)]

use std::time::Duration;

use openraft::error::{NetworkError, RPCError, Unreachable};
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse};
use palisade_proto::v1 as pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Response, Status, Streaming};

use super::{
    decode, payload, status_error, store_of, MemberNode, NodeId, PeerClient, RaftService,
    RpcResult, TypeConfig,
};

/// The answers a follower streams back, one per append, in order.
pub type Replies = ReceiverStream<Result<pb::RaftPayload, Status>>;

/// An open append stream to one peer.
pub(super) struct AppendStream {
    /// Appends to the peer (one in flight at a time).
    to_peer: mpsc::Sender<pb::RaftPayload>,
    /// The peer's answers.
    from_peer: Streaming<pb::RaftPayload>,
    /// The store the peer named when the stream opened.
    store: String,
}

/// Why an exchange on the stream failed, as openraft weighs it.
type Failure = RPCError<NodeId, MemberNode, openraft::error::RaftError<NodeId>>;

fn unreachable(why: &str) -> Failure {
    RPCError::Unreachable(Unreachable::new(&std::io::Error::other(why.to_string())))
}

impl PeerClient {
    /// Sends `request` on the append stream (opening it when there is none) and waits up to
    /// `ttl` for its answer.
    pub(super) async fn append_streamed(
        &mut self,
        request: &AppendEntriesRequest<TypeConfig>,
        ttl: Duration,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible> {
        // A member whose own store is not the one its membership names sends nothing.
        if let Err(replaced) = self.identity.may_send() {
            self.log_refusal(&replaced.to_string());
            return Err(RPCError::Unreachable(Unreachable::new(&replaced)));
        }
        let exchanged = tokio::time::timeout(ttl, self.exchange(payload(request))).await;
        let (store, reply) = match exchanged {
            Ok(Ok(answer)) => answer,
            Ok(Err(failure)) => {
                self.appends = None;
                return match failure {
                    Exchange::Unimplemented => {
                        // An older build: its unary call, from now on.
                        self.unary_appends = true;
                        self.call(super::Kind::Append, request, ttl).await
                    }
                    Exchange::Failed(failure) => Err(failure),
                };
            }
            Err(elapsed) => {
                self.appends = None;
                return Err(RPCError::Network(NetworkError::new(&elapsed)));
            }
        };
        self.answer(&store, &reply.json)
    }

    /// One append and its answer on the stream; the answer comes with the peer's store.
    async fn exchange(
        &mut self,
        message: pb::RaftPayload,
    ) -> Result<(String, pb::RaftPayload), Exchange> {
        let stream = match self.appends.take() {
            Some(stream) => {
                stream
                    .to_peer
                    .send(message)
                    .await
                    .map_err(|_| Exchange::Failed(unreachable("the append stream closed")))?;
                self.appends.insert(stream)
            }
            None => {
                let stream = self.open(message).await?;
                self.appends.insert(stream)
            }
        };
        match stream.from_peer.message().await {
            Ok(Some(reply)) => Ok((stream.store.clone(), reply)),
            Ok(None) => Err(Exchange::Failed(unreachable(
                "the peer ended the append stream",
            ))),
            Err(status) => Err(Exchange::Failed(status_error(status))),
        }
    }

    /// Opens the stream with `first` as its first message.
    async fn open(&mut self, first: pb::RaftPayload) -> Result<AppendStream, Exchange> {
        let (to_peer, outgoing) = mpsc::channel(1);
        to_peer
            .send(first)
            .await
            .expect("a new channel with room for one message");
        let mut request = Request::new(ReceiverStream::new(outgoing));
        self.stamp(request.metadata_mut());
        let response = match self.client.append_stream(request).await {
            Ok(response) => response,
            Err(status) if status.code() == Code::Unimplemented => {
                return Err(Exchange::Unimplemented)
            }
            Err(status) => return Err(Exchange::Failed(status_error(status))),
        };
        Ok(AppendStream {
            store: store_of(response.metadata()),
            to_peer,
            from_peer: response.into_inner(),
        })
    }
}

/// How an exchange on the stream failed (rare, and moved once: not worth a box).
#[allow(clippy::large_enum_variant)]
enum Exchange {
    /// The peer does not serve the stream.
    Unimplemented,
    /// Anything else: the stream is dropped.
    Failed(Failure),
}

impl RaftService {
    /// Admits a stream's sender once, then answers its appends in order until it ends, a
    /// message fails, or this member stops.
    pub(super) fn open_append_stream(
        &self,
        request: Request<Streaming<pb::RaftPayload>>,
    ) -> Result<Response<Replies>, Status> {
        let from = self.sender(request.metadata(), request.extensions())?;
        let (replies, answers) = mpsc::channel(1);
        tokio::spawn(
            self.clone()
                .answer_appends(from, request.into_inner(), replies),
        );
        let mut response = Response::new(ReceiverStream::new(answers));
        self.stamp(response.metadata_mut());
        Ok(response)
    }

    async fn answer_appends(
        self,
        from: NodeId,
        mut incoming: Streaming<pb::RaftPayload>,
        replies: mpsc::Sender<Result<pb::RaftPayload, Status>>,
    ) {
        let mut shutdown = self.shutdown.clone();
        loop {
            let message = tokio::select! {
                message = incoming.message() => message,
                _ = shutdown.wait_for(|stop| *stop) => return,
            };
            let Ok(Some(message)) = message else { return };
            let reply = self.append_message(from, &message.json).await;
            let failed = reply.is_err();
            if replies.send(reply).await.is_err() || failed {
                return;
            }
        }
    }

    /// One append from the stream of `from`.
    async fn append_message(&self, from: NodeId, json: &[u8]) -> Result<pb::RaftPayload, Status> {
        // Certificates belong to the connection and were checked when the stream opened;
        // membership may have changed since.
        self.admission.still_member(from)?;
        self.append(decode(json)?).await
    }
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
