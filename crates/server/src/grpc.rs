//! The gRPC API (`proto/palisade.proto`), served on the same port as HTTP.

use std::pin::Pin;

use futures::Stream;
use palisade_core::limits::DEFAULT_TTL_MS;
use palisade_core::{AcquireRequest, HolderId, LeaseError, LeaseId, LockClass, LockName};
use palisade_core::{Lease, LockSummary, RequestId};
use palisade_proto::v1 as pb;
use pb::coordinator_server::{Coordinator, CoordinatorServer};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt as _;
use tonic::{Request, Response, Status, Streaming};

use crate::api::Api;
use crate::auth::{Caller, Denied, Limited, Right};
use crate::tls::CertificatePrincipal;
use palisade_coordinator::engine::{CoordinatorError, TransitionKind, MAX_LIST};

/// Responses buffered per keepalive or watch stream before the server waits for the client.
const STREAM_BUFFER: usize = 16;

/// Holder recorded when a gRPC acquire names none.
const DEFAULT_HOLDER: &str = "anonymous";

/// The tonic service for [`Api`]. A request message is at most
/// [`MAX_BODY_BYTES`](crate::http::MAX_BODY_BYTES), like an HTTP body (tonic's default, 4 MiB,
/// would let each stream of a connection buffer 4 MiB before any check).
pub fn service(api: Api) -> CoordinatorServer<GrpcApi> {
    CoordinatorServer::new(GrpcApi { api }).max_decoding_message_size(crate::http::MAX_BODY_BYTES)
}

/// Metadata key of an `UNAVAILABLE` status from a follower: the leader's URL, when known.
pub const LEADER_METADATA: &str = "palisade-leader";

/// Implements the generated `Coordinator` trait over the shared [`Api`].
pub struct GrpcApi {
    api: Api,
}

type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// How often a watch stream checks that its caller still has the right to it.
const RIGHTS_RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

fn status(error: CoordinatorError) -> Status {
    let message = error.to_string();
    match error {
        CoordinatorError::Lease(LeaseError::InvalidInput(_)) => Status::invalid_argument(message),
        CoordinatorError::Lease(LeaseError::Held { .. })
        | CoordinatorError::WaitTimedOut { .. } => Status::already_exists(message),
        CoordinatorError::Lease(
            LeaseError::TooManyWaiters { .. }
            | LeaseError::PrincipalLimit { .. }
            | LeaseError::EpochsExhausted { .. },
        ) => Status::resource_exhausted(message),
        CoordinatorError::Lease(LeaseError::UnknownLease(_)) => Status::not_found(message),
        CoordinatorError::Lease(LeaseError::NotHolder(_)) | CoordinatorError::LostRight { .. } => {
            Status::permission_denied(message)
        }
        CoordinatorError::Lease(_) => Status::invalid_argument(message),
        CoordinatorError::Unavailable(_) => Status::unavailable(message),
        CoordinatorError::Refused(_) => Status::failed_precondition(message),
        CoordinatorError::NotLeader { leader } => {
            let mut status = Status::unavailable(message);
            if let Some(url) = leader.and_then(|l| l.url.parse().ok()) {
                status.metadata_mut().insert(LEADER_METADATA, url);
            }
            status
        }
    }
}

fn denied(denied: Denied) -> Status {
    match denied {
        Denied::Unauthenticated(message) => Status::unauthenticated(message),
        denied @ Denied::PermissionDenied { .. } => Status::permission_denied(denied.to_string()),
    }
}

fn lease_id(text: &str) -> Result<LeaseId, Status> {
    text.parse()
        .map_err(|e: palisade_core::InvalidInput| Status::invalid_argument(e.0))
}

impl GrpcApi {
    /// The caller of `request`, from its `authorization` metadata.
    fn caller<T>(&self, request: &Request<T>) -> Result<Caller, Status> {
        let authorization = request
            .metadata()
            .get("authorization")
            .map(|value| value.as_bytes());
        let certificate = request.extensions().get::<CertificatePrincipal>();
        self.api
            .auth
            .authenticate(authorization, certificate)
            .map_err(denied)
    }
}

fn class_to_proto(class: LockClass) -> i32 {
    match class {
        LockClass::Critical => pb::LockClass::Critical as i32,
        LockClass::Efficiency => pb::LockClass::Efficiency as i32,
    }
}

/// The class a request named (`UNSPECIFIED`: none; the policy decides, critical without one).
fn class_from_proto(class: i32) -> Result<Option<LockClass>, Status> {
    match pb::LockClass::try_from(class) {
        Ok(pb::LockClass::Unspecified) => Ok(None),
        Ok(pb::LockClass::Critical) => Ok(Some(LockClass::Critical)),
        Ok(pb::LockClass::Efficiency) => Ok(Some(LockClass::Efficiency)),
        Err(_) => Err(Status::invalid_argument(format!(
            "unknown lock class {class}"
        ))),
    }
}

fn lock_name(name: String) -> Result<LockName, Status> {
    LockName::new(name).map_err(|e| Status::invalid_argument(e.0))
}

/// The proto form of a lock's state, as `caller` may see it.
pub fn lock_info(summary: &LockSummary, caller: &Caller) -> pb::LockInfo {
    let mut info = pb::LockInfo {
        lock: summary.lock.to_string(),
        remaining_ms: summary.remaining_ms,
        waiters: u32::try_from(summary.waiters).unwrap_or(u32::MAX),
        ..Default::default()
    };
    if let Some(lease) = &summary.lease {
        fill_lease(&mut info, lease, caller);
    }
    info
}

fn fill_lease(info: &mut pb::LockInfo, lease: &Lease, caller: &Caller) {
    info.held = true;
    info.epoch = lease.epoch.0;
    if caller.sees_lease_id(lease) {
        info.lease_id = lease.id.to_string();
    }
    info.holder = lease.holder.to_string();
    info.principal = lease.principal.to_string();
    info.ttl_ms = lease.ttl_ms;
    info.class = class_to_proto(lease.class);
    info.granted_unix_ms = lease.granted_unix_ms;
    info.renewed_unix_ms = lease.renewed_unix_ms;
}

#[tonic::async_trait]
impl Coordinator for GrpcApi {
    async fn acquire(
        &self,
        request: Request<pb::AcquireRequest>,
    ) -> Result<Response<pb::AcquireResponse>, Status> {
        let caller = self.caller(&request)?;
        let request = request.into_inner();
        let lock = lock_name(request.lock)?;
        caller
            .require(Right::Acquire, Some(&lock))
            .map_err(denied)?;
        let holder = if request.holder.is_empty() {
            DEFAULT_HOLDER.to_owned()
        } else {
            request.holder
        };
        let requested = class_from_proto(request.class)?;
        let acquire = AcquireRequest {
            lock,
            holder: HolderId::new(holder).map_err(|e| Status::invalid_argument(e.0))?,
            principal: caller.principal().clone(),
            ttl_ms: request.ttl_ms.unwrap_or(DEFAULT_TTL_MS),
            wait_ms: request.wait_ms,
            class: requested.unwrap_or_default(),
            request_id: if request.request_id.is_empty() {
                None
            } else {
                Some(
                    RequestId::new(request.request_id)
                        .map_err(|e| Status::invalid_argument(e.0))?,
                )
            },
        };
        let _slot = self
            .api
            .auth
            .admit(&caller, Limited::Waiters)
            .map_err(|at_limit| {
                self.api.metrics.refused("principal_limit");
                Status::resource_exhausted(at_limit.to_string())
            })?;
        let leases = self.api.auth.limit(&caller, Limited::Leases);
        let grant = self
            .api
            .acquire(acquire, requested, leases)
            .await
            .map_err(status)?;
        let lease = grant.lease;
        Ok(Response::new(pb::AcquireResponse {
            lock: lease.lock.to_string(),
            epoch: lease.epoch.0,
            lease_id: lease.id.to_string(),
            ttl_ms: lease.ttl_ms,
            holder: lease.holder.to_string(),
            token: grant.token,
            class: class_to_proto(lease.class),
            principal: lease.principal.to_string(),
        }))
    }

    async fn renew(
        &self,
        request: Request<pb::RenewRequest>,
    ) -> Result<Response<pb::RenewResponse>, Status> {
        let caller = self.caller(&request)?;
        let id = lease_id(&request.into_inner().lease_id)?;
        let lease = self.api.renew(id, &caller).await.map_err(status)?;
        Ok(Response::new(renew_response(&lease)))
    }

    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        let caller = self.caller(&request)?;
        let id = lease_id(&request.into_inner().lease_id)?;
        let lease = self
            .api
            .coordinator
            .release(id, caller.lease_actor())
            .await
            .map_err(status)?;
        Ok(Response::new(pb::ReleaseResponse {
            lease_id: lease.id.to_string(),
        }))
    }

    type KeepaliveStream = ResponseStream<pb::RenewResponse>;

    async fn keepalive(
        &self,
        request: Request<Streaming<pb::RenewRequest>>,
    ) -> Result<Response<Self::KeepaliveStream>, Status> {
        let caller = self.caller(&request)?;
        let mut inbound = request.into_inner();
        let (sender, receiver) = mpsc::channel(STREAM_BUFFER);
        let api = self.api.clone();
        tokio::spawn(async move {
            while let Some(message) = inbound.next().await {
                // The stream authenticated when it opened; a principal removed since (SIGHUP)
                // renews nothing more, and each renew is checked against the ACL in force.
                let Some(current) = api.auth.refreshed(&caller) else {
                    let revoked = Status::unauthenticated("the stream's principal was removed");
                    let _ = sender.send(Err(revoked)).await;
                    break;
                };
                let reply = match message {
                    Ok(renew) => match lease_id(&renew.lease_id) {
                        Ok(id) => api.renew(id, &current).await.map_err(status),
                        Err(bad) => Err(bad),
                    },
                    Err(_) => break, // the client went away
                };
                let failed = reply.is_err();
                let reply = reply.map(|lease| renew_response(&lease));
                if sender.send(reply).await.is_err() || failed {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(receiver))))
    }

    async fn describe(
        &self,
        request: Request<pb::DescribeRequest>,
    ) -> Result<Response<pb::LockInfo>, Status> {
        let caller = self.caller(&request)?;
        let lock = lock_name(request.into_inner().lock)?;
        caller.require(Right::Read, Some(&lock)).map_err(denied)?;
        let summary = self.api.coordinator.describe(lock).await.map_err(status)?;
        Ok(Response::new(lock_info(&summary, &caller)))
    }

    async fn list(
        &self,
        request: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ListResponse>, Status> {
        let caller = self.caller(&request)?;
        let locks = self.api.coordinator.list(MAX_LIST).await.map_err(status)?;
        Ok(Response::new(pb::ListResponse {
            locks: locks
                .iter()
                .filter(|summary| caller.can(Right::Read, Some(&summary.lock)))
                .map(|summary| lock_info(summary, &caller))
                .collect(),
        }))
    }

    type WatchStream = ResponseStream<pb::LockEvent>;

    async fn watch(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let caller = self.caller(&request)?;
        let scope = WatchScope::of(request.into_inner())?;
        if let WatchScope::Lock(lock) = &scope {
            caller.require(Right::Read, Some(lock)).map_err(denied)?;
        }
        let slot = self
            .api
            .auth
            .admit(&caller, Limited::Watches)
            .map_err(|at_limit| Status::resource_exhausted(at_limit.to_string()))?;
        // Subscribe before reading the current state, so no transition falls in between.
        let transitions = self.api.coordinator.subscribe();
        let current = match &scope {
            WatchScope::Lock(lock) => vec![self
                .api
                .coordinator
                .describe(lock.clone())
                .await
                .map_err(status)?],
            WatchScope::Prefix(prefix) => self
                .api
                .coordinator
                .list(palisade_coordinator::engine::MAX_LIST)
                .await
                .map_err(status)?
                .into_iter()
                .filter(|s| s.lease.is_some() && s.lock.as_str().starts_with(prefix.as_str()))
                .filter(|s| caller.can(Right::Read, Some(&s.lock)))
                .collect(),
        };
        let (sender, receiver) = mpsc::channel(STREAM_BUFFER);
        let watch = Watch {
            auth: self.api.auth.clone(),
            caller,
            scope,
            sender,
        };
        tokio::spawn(async move {
            // The watch counts against its principal's limit until the stream ends.
            let _slot = slot;
            watch.run(current, transitions).await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(receiver))))
    }

    async fn keys(
        &self,
        _request: Request<pb::KeysRequest>,
    ) -> Result<Response<pb::KeysResponse>, Status> {
        let keys = self
            .api
            .public_keys()
            .into_iter()
            .map(|k| pb::PublicKey {
                key_id: k.key_id,
                public_key: k.public_key,
                algorithm: k.algorithm.into(),
            })
            .collect();
        Ok(Response::new(pb::KeysResponse { keys }))
    }
}

fn renew_response(lease: &Lease) -> pb::RenewResponse {
    pb::RenewResponse {
        lease_id: lease.id.to_string(),
        ttl_ms: lease.ttl_ms,
        epoch: lease.epoch.0,
    }
}

/// What a watch follows.
enum WatchScope {
    /// One lock.
    Lock(LockName),
    /// Every lock whose name starts with this (each event only if the caller may read it).
    Prefix(String),
}

impl WatchScope {
    fn of(request: pb::WatchRequest) -> Result<Self, Status> {
        match (request.lock.is_empty(), request.prefix.is_empty()) {
            (false, true) => Ok(Self::Lock(lock_name(request.lock)?)),
            (true, false) if request.prefix.len() <= palisade_core::limits::MAX_LOCK_NAME_BYTES => {
                Ok(Self::Prefix(request.prefix))
            }
            (true, false) => Err(Status::invalid_argument(
                "the prefix is longer than a lock name",
            )),
            _ => Err(Status::invalid_argument(
                "a watch names either a lock or a prefix (one of them, not empty)",
            )),
        }
    }

    fn covers(&self, lock: &LockName) -> bool {
        match self {
            Self::Lock(watched) => watched == lock,
            Self::Prefix(prefix) => lock.as_str().starts_with(prefix.as_str()),
        }
    }
}

/// One watch stream: the transitions of a lock (or of the locks under a prefix), to a caller
/// whose rights are checked again on each transition and every [`RIGHTS_RECHECK`].
struct Watch {
    auth: std::sync::Arc<crate::auth::Auth>,
    caller: Caller,
    scope: WatchScope,
    sender: mpsc::Sender<Result<pb::LockEvent, Status>>,
}

impl Watch {
    /// Sends the lock's `current` state, then each of its transitions, until the caller goes
    /// away, loses its right, falls behind, or the coordinator stops.
    async fn run(
        mut self,
        current: Vec<LockSummary>,
        mut transitions: broadcast::Receiver<palisade_coordinator::engine::Transition>,
    ) {
        for summary in current {
            let now = pb::LockEvent {
                state: Some(lock_info(&summary, &self.caller)),
                kind: "current".into(),
                by: String::new(),
            };
            if self.sender.send(Ok(now)).await.is_err() {
                return;
            }
        }
        let mut recheck = tokio::time::interval(RIGHTS_RECHECK);
        loop {
            let transition = tokio::select! {
                received = transitions.recv() => Some(received),
                () = self.sender.closed() => return,
                _ = recheck.tick() => None,
            };
            if let Err(lost) = self.recheck_rights() {
                let _ = self.sender.send(Err(lost)).await;
                return;
            }
            let event = match transition {
                None => continue,
                Some(Ok(t)) if !self.scope.covers(&t.lease.lock) => continue,
                // Under a prefix, each lock's events go only to a caller that may read it.
                Some(Ok(t)) if !self.caller.can(Right::Read, Some(&t.lease.lock)) => continue,
                Some(Ok(t)) => Ok(self.event(&t)),
                Some(Err(broadcast::error::RecvError::Lagged(missed))) => Err(Status::data_loss(
                    format!("watch fell {missed} transitions behind; watch again"),
                )),
                Some(Err(broadcast::error::RecvError::Closed)) => return,
            };
            let stop = event.is_err();
            if self.sender.send(event).await.is_err() || stop {
                return;
            }
        }
    }

    /// Rights hold for as long as the stream lives: a principal removed, or one that lost
    /// `read` on the lock (SIGHUP), is told so and the stream ends.
    fn recheck_rights(&mut self) -> Result<(), Status> {
        let lock = match &self.scope {
            WatchScope::Lock(lock) => Some(lock),
            WatchScope::Prefix(_) => None,
        };
        match self.auth.refreshed(&self.caller) {
            None => Err(Status::unauthenticated("the watch's principal was removed")),
            Some(current) if lock.is_some_and(|lock| !current.can(Right::Read, Some(lock))) => {
                Err(Status::permission_denied(format!(
                    "{} no longer has the read right on lock {}",
                    current.principal(),
                    lock.map(ToString::to_string).unwrap_or_default()
                )))
            }
            Some(current) => {
                self.caller = current;
                Ok(())
            }
        }
    }

    /// The event of transition `t` of the watched lock, as this caller may see it.
    fn event(&self, t: &palisade_coordinator::engine::Transition) -> pb::LockEvent {
        let mut state = pb::LockInfo {
            lock: t.lease.lock.to_string(),
            ..Default::default()
        };
        if t.kind == TransitionKind::Granted {
            fill_lease(&mut state, &t.lease, &self.caller);
            state.remaining_ms = t.remaining_ms;
        } else {
            state.epoch = t.lease.epoch.0;
            if self.caller.sees_lease_id(&t.lease) {
                state.lease_id = t.lease.id.to_string();
            }
            state.holder = t.lease.holder.to_string();
            state.principal = t.lease.principal.to_string();
        }
        pb::LockEvent {
            state: Some(state),
            kind: t.kind.as_str().into(),
            by: t.by.as_ref().map(ToString::to_string).unwrap_or_default(),
        }
    }
}
