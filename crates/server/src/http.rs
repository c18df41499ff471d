//! The HTTP/JSON API (README.md, "HTTP/JSON"). Every error is `{"error": CODE, "message"}`
//! with a fitting status; the server keeps serving after any bad request.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use palisade_core::limits::DEFAULT_TTL_MS;
use palisade_core::{
    AcquireRequest, HolderId, LeaseId, LockClass, LockName, LockSummary, RequestId,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::api::Api;
use crate::auth::{Caller, Limited, Right};
use crate::http_error::ApiError;
use crate::tls::CertificatePrincipal;
use palisade_cluster::MembershipError;
use palisade_coordinator::engine::{BreakOutcome, CoordinatorError, MAX_LIST};

/// Largest request body accepted. An acquire body is under 300 bytes.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Holder recorded when an HTTP acquire names none.
pub const DEFAULT_HOLDER: &str = "anonymous";

/// The HTTP routes.
pub fn router(api: Api) -> Router {
    let router = Router::new()
        .route("/v1/locks", get(list_locks))
        .route("/v1/locks/{name}", get(show_lock))
        .route("/v1/locks/{name}/acquire", post(acquire))
        .route("/v1/locks/{name}/floor", get(lock_floor))
        .route("/v1/locks/{name}/break", post(break_lock))
        .route("/v1/leases/{id}/renew", post(renew))
        .route("/v1/leases/{id}/release", post(release))
        .route("/v1/keys", get(keys))
        .route("/v1/keys/{id}/retire", post(retire_key))
        .route("/v1/backup", get(backup))
        .route("/v1/cluster", get(cluster_status))
        .route("/v1/cluster/members", post(add_member))
        .route(
            "/v1/cluster/members/{id}",
            axum::routing::delete(remove_member),
        )
        .route("/v1/cluster/members/{id}/lost", post(declare_lost))
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .merge(crate::console::routes())
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route") })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(api);
    // Declared-oversized bodies refused before they are read; stalled ones after a timeout.
    palisade_listener::bounded_bodies(
        router,
        MAX_BODY_BYTES,
        "body_too_large",
        std::time::Duration::from_millis(palisade_core::limits::BODY_READ_TIMEOUT_MS),
    )
}

/// Every handler that takes a [`Caller`] authenticates its request first: 401 on missing or
/// unknown credentials, before the body is parsed.
impl FromRequestParts<Api> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, api: &Api) -> Result<Self, ApiError> {
        let authorization = parts
            .headers
            .get(header::AUTHORIZATION)
            .map(|value| value.as_bytes());
        let certificate = parts.extensions.get::<CertificatePrincipal>();
        Ok(api.auth.authenticate(authorization, certificate)?)
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct AcquireBody {
    ttl_ms: Option<u64>,
    wait_ms: Option<u64>,
    holder: Option<String>,
    class: Option<String>,
    request_id: Option<String>,
}

#[derive(Serialize)]
struct AcquireReply {
    lock: LockName,
    #[serde(with = "palisade_core::json::string")]
    epoch: u64,
    lease_id: String,
    ttl_ms: u64,
    holder: String,
    principal: String,
    class: LockClass,
    token: String,
}

#[derive(Serialize)]
struct LockReply {
    lock: LockName,
    held: bool,
    #[serde(with = "palisade_core::json::option_string")]
    epoch: Option<u64>,
    /// Shown only to the lease's principal and to admins: the id is what renews and releases.
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_id: Option<String>,
    holder: Option<String>,
    principal: Option<String>,
    ttl_ms: Option<u64>,
    remaining_ms: u64,
    /// When the lease was granted (ms since the Unix epoch, the granting coordinator's
    /// clock); absent when free or unknown (granted before grant times were recorded).
    #[serde(skip_serializing_if = "Option::is_none")]
    granted_unix_ms: Option<u64>,
    /// When the lease was last renewed (absent: never).
    #[serde(skip_serializing_if = "Option::is_none")]
    renewed_unix_ms: Option<u64>,
    class: Option<LockClass>,
    waiters: usize,
}

impl LockReply {
    /// The lock as `caller` may see it.
    fn new(summary: LockSummary, caller: &Caller) -> Self {
        let lease = summary.lease.as_ref();
        Self {
            held: lease.is_some(),
            epoch: lease.map(|l| l.epoch.0),
            lease_id: lease
                .filter(|l| caller.sees_lease_id(l))
                .map(|l| l.id.to_string()),
            holder: lease.map(|l| l.holder.to_string()),
            principal: lease.map(|l| l.principal.to_string()),
            ttl_ms: lease.map(|l| l.ttl_ms),
            class: lease.map(|l| l.class),
            remaining_ms: summary.remaining_ms,
            granted_unix_ms: lease.map(|l| l.granted_unix_ms).filter(|ms| *ms > 0),
            renewed_unix_ms: lease.map(|l| l.renewed_unix_ms).filter(|ms| *ms > 0),
            waiters: summary.waiters,
            lock: summary.lock,
        }
    }
}

/// The request, and the class it named (the policy decides the lease's).
fn parse_acquire(
    name: String,
    body: &[u8],
    caller: &Caller,
) -> Result<(AcquireRequest, Option<LockClass>), ApiError> {
    let lock = LockName::new(name)?;
    caller.require(Right::Acquire, Some(&lock))?;
    let body: AcquireBody = if body.iter().all(u8::is_ascii_whitespace) {
        AcquireBody::default()
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))?
    };
    let requested = body.class.as_deref().map(LockClass::parse).transpose()?;
    let request = AcquireRequest {
        lock,
        holder: HolderId::new(body.holder.unwrap_or_else(|| DEFAULT_HOLDER.into()))?,
        principal: caller.principal().clone(),
        ttl_ms: body.ttl_ms.unwrap_or(DEFAULT_TTL_MS),
        wait_ms: body.wait_ms.unwrap_or(0),
        class: requested.unwrap_or_default(),
        request_id: body.request_id.map(RequestId::new).transpose()?,
    };
    Ok((request, requested))
}

fn parse_lease_id(id: &str) -> Result<LeaseId, ApiError> {
    Ok(id.parse::<LeaseId>()?)
}

async fn acquire(
    State(api): State<Api>,
    caller: Caller,
    Path(name): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<AcquireReply>, ApiError> {
    let (request, requested) = parse_acquire(name, &body?, &caller)?;
    let _slot = api
        .auth
        .admit(&caller, Limited::Waiters)
        .map_err(|at_limit| {
            api.metrics.refused("principal_limit");
            ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "principal_limit",
                at_limit.to_string(),
            )
        })?;
    let leases = api.auth.limit(&caller, Limited::Leases);
    let grant = api.acquire(request, requested, leases).await?;
    let lease = grant.lease;
    Ok(Json(AcquireReply {
        lock: lease.lock,
        epoch: lease.epoch.0,
        lease_id: lease.id.to_string(),
        ttl_ms: lease.ttl_ms,
        holder: lease.holder.to_string(),
        principal: lease.principal.to_string(),
        class: lease.class,
        token: grant.token,
    }))
}

async fn renew(
    State(api): State<Api>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let lease = api.renew(parse_lease_id(&id)?, &caller).await?;
    Ok(Json(json!({
        "lease_id": lease.id,
        "lock": lease.lock,
        "epoch": palisade_core::json::value(lease.epoch),
        "ttl_ms": lease.ttl_ms,
    })))
}

async fn release(
    State(api): State<Api>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let lease = api
        .coordinator
        .release(parse_lease_id(&id)?, caller.lease_actor())
        .await?;
    Ok(Json(json!({
        "lease_id": lease.id,
        "lock": lease.lock,
        "epoch": palisade_core::json::value(lease.epoch),
        "released": true,
    })))
}

/// `POST /v1/locks/{name}/break`: ends the lock's lease now, for an admin of the lock (an
/// operator whose worker lost its lease id must not wait out an hour's TTL). The next owner
/// gets a higher epoch, so fencing holds: the broken holder's writes are refused wherever the
/// next owner wrote. Recorded as `broken` (naming who broke it) in the feed, the watch streams
/// and the audit's findings, in `palisade_leases_broken_total` and in the log. A body
/// `{"epoch": "E"}` breaks only the lease at epoch E (409 `epoch_changed` otherwise).
async fn break_lock(
    State(api): State<Api>,
    caller: Caller,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<serde_json::Value>, ApiError> {
    let lock = LockName::new(name)?;
    caller.require(Right::Admin, Some(&lock))?;
    let body: BreakBody = if body.iter().all(u8::is_ascii_whitespace) {
        BreakBody::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))?
    };
    let by = caller.principal().clone();
    let epoch = body.epoch.map(palisade_core::Epoch);
    let ended = match api.coordinator.break_lock(lock.clone(), by, epoch).await? {
        BreakOutcome::Broken(ended) => ended,
        BreakOutcome::Free => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "not_held",
                format!("{lock} is not held: nothing to break"),
            ))
        }
        BreakOutcome::Other(held) => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "epoch_changed",
                format!(
                    "{lock} is held at epoch {} by {}, not at the epoch named: nothing broken",
                    held.epoch, held.holder
                ),
            ))
        }
    };
    api.metrics.leases_broken.inc();
    tracing::warn!(
        %lock,
        epoch = ended.epoch.0,
        holder = %ended.holder,
        principal = %ended.principal,
        by = %caller.principal(),
        "lock broken: its lease ended now; the next owner gets a higher epoch"
    );
    Ok(Json(json!({
        "lock": lock,
        "epoch": palisade_core::json::value(ended.epoch),
        "holder": ended.holder,
        "broken": true,
    })))
}

/// The body of a break: the epoch to break, if the caller names one.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct BreakBody {
    #[serde(default, with = "palisade_core::json::option_string")]
    epoch: Option<u64>,
}

/// `GET /v1/locks`: the locks the caller may read.
async fn list_locks(
    State(api): State<Api>,
    caller: Caller,
) -> Result<Json<serde_json::Value>, ApiError> {
    let locks = api.coordinator.list(MAX_LIST).await?;
    let truncated = locks.len() >= MAX_LIST;
    let locks: Vec<LockReply> = locks
        .into_iter()
        .filter(|summary| caller.can(Right::Read, Some(&summary.lock)))
        .map(|summary| LockReply::new(summary, &caller))
        .collect();
    Ok(Json(json!({"locks": locks, "truncated": truncated})))
}

async fn show_lock(
    State(api): State<Api>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<LockReply>, ApiError> {
    let lock = LockName::new(name)?;
    caller.require(Right::Read, Some(&lock))?;
    let summary = api.coordinator.describe(lock).await?;
    Ok(Json(LockReply::new(summary, &caller)))
}

/// `GET /v1/locks/{name}/floor`: a signed floor statement for the lock — every owner below
/// the floor is superseded or its lease has ended — for a resource that cannot trust its own
/// memory after a restart (its whole volume may have been put back). The floor is the held
/// lease's epoch, else the lock's last granted epoch, else one above the counter
/// ([`palisade_coordinator::engine::CoordinatorHandle::floor`]). Served without credentials, like `/v1/keys`:
/// it grants nothing (it never verifies as a token) and names no holder, principal or lease.
async fn lock_floor(
    State(api): State<Api>,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let lock = LockName::new(name)?;
    let floor = api.coordinator.floor(lock.clone()).await?;
    Ok(Json(json!({
        "lock": lock,
        "floor": palisade_core::json::value(floor),
        "statement": api.signer.sign_floor(&lock, floor, palisade_core::clock::now_ms()),
    })))
}

/// An online backup (`admin`): the epoch counter once it is durable, in the backup file format
/// ([`crate::backup`]).
async fn backup(State(api): State<Api>, caller: Caller) -> Result<Response, ApiError> {
    caller.require(Right::Admin, None)?;
    let last_epoch = api.coordinator.epoch_counter().await?;
    let backup = palisade_coordinator::backup::Backup {
        format: palisade_coordinator::backup::FORMAT,
        mode: if api.cluster.is_some() {
            "cluster"
        } else {
            "single"
        }
        .into(),
        last_epoch: last_epoch.0,
        taken_at_ms: palisade_core::clock::now_ms(),
        taken: "online".into(),
    };
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream")],
        palisade_coordinator::backup::encode(&backup),
    )
        .into_response())
}

async fn keys(State(api): State<Api>) -> Json<serde_json::Value> {
    Json(json!({"keys": api.public_keys()}))
}

async fn metrics(State(api): State<Api>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        api.metrics.render(),
    )
}

/// `GET /readyz`: a single node serves; a cluster member sees a leader (itself or another:
/// a follower forwards nobody, but a client it names the leader to is served, so a load
/// balancer or a Kubernetes Service may send clients to any ready member) and nothing keeps
/// it from following that leader ([`palisade_cluster::health`]). Either way its disk has
/// room for the next commit ([`crate::disk::not_ready`]). The answer says why when it is
/// not ready. `/healthz` is the process alone, and never depends on a leader.
async fn readyz(State(api): State<Api>) -> Result<&'static str, ApiError> {
    let unavailable =
        |why: String| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", why);
    if let Some(why) = crate::disk::not_ready(&api.data_dir) {
        return Err(unavailable(why));
    }
    if let Some(member) = &api.cluster {
        if let Some(why) = member.health.reasons().into_iter().next() {
            return Err(unavailable(why));
        }
        let leader = member.raft.metrics().borrow().current_leader;
        return match leader {
            Some(_) => Ok("ready\n"),
            None => Err(unavailable("this member sees no leader".into())),
        };
    }
    if api.coordinator.is_ready() {
        Ok("ready\n")
    } else if let Some(error @ CoordinatorError::NotLeader { .. }) = api.coordinator.not_serving() {
        Err(error.into())
    } else {
        Err(unavailable("not ready".into()))
    }
}

/// `GET /v1/cluster`: this node's view (a single node reports itself as a one-member cluster
/// with `"mode": "single"`). Any authenticated caller may read it.
async fn cluster_status(State(api): State<Api>, _caller: Caller) -> Json<serde_json::Value> {
    match &api.cluster {
        Some(member) => {
            let mut status = palisade_cluster::node_status(
                &member.raft,
                api.coordinator.is_ready(),
                &member.clock_check,
            );
            status.not_ready = member.health.reasons();
            status
                .not_ready
                .extend(crate::disk::not_ready(&api.data_dir));
            let mut value = serde_json::to_value(status).expect("status serializes");
            value["mode"] = json!("cluster");
            Json(value)
        }
        None => Json(json!({
            "mode": "single",
            "node_id": 1,
            "role": "leader",
            "term": 0,
            "leader": 1,
            "serving": api.coordinator.is_ready(),
            "members": [{"id": 1, "addr": null, "kind": "voter", "matched": null, "lag": 0}],
        })),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AddMemberBody {
    id: u64,
    addr: String,
}

fn cluster_member(api: &Api) -> Result<&crate::api::ClusterMember, ApiError> {
    api.cluster.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::CONFLICT,
            "not_a_cluster",
            "this coordinator runs as a single node; membership changes need cluster mode",
        )
    })
}

/// Refuses on a node that does not lead, naming the leader.
fn require_leader(api: &Api) -> Result<(), ApiError> {
    match api.coordinator.not_serving() {
        None => Ok(()),
        Some(error) => Err(error.into()),
    }
}

fn membership_error(error: MembershipError) -> ApiError {
    let (status, code) = match &error {
        MembershipError::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
        MembershipError::Conflict(_) => (StatusCode::CONFLICT, "member_exists"),
        MembershipError::Unknown(_) => (StatusCode::NOT_FOUND, "unknown_member"),
        MembershipError::Busy => (StatusCode::CONFLICT, "membership_change_in_progress"),
        MembershipError::Unreachable { .. } => (StatusCode::BAD_GATEWAY, "member_unreachable"),
        MembershipError::WrongNode(_) => (StatusCode::CONFLICT, "wrong_node"),
        MembershipError::CatchUpTimeout { .. } => {
            (StatusCode::GATEWAY_TIMEOUT, "member_did_not_catch_up")
        }
        MembershipError::CommitTimeout { .. } => (
            StatusCode::SERVICE_UNAVAILABLE,
            "membership_change_timed_out",
        ),
        MembershipError::Raft(_) => (StatusCode::SERVICE_UNAVAILABLE, "membership_change_failed"),
    };
    ApiError::new(status, code, format!("membership change refused: {error}"))
}

/// `POST /v1/cluster/members` `{"id","addr"}`: adds a node (started with `--join`): asks it
/// who it is, makes it a learner, waits until it caught up (else removes it again), then makes
/// it a voter. One change at a time.
async fn add_member(
    State(api): State<Api>,
    caller: Caller,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    caller.require(Right::Admin, None)?;
    let member = cluster_member(&api)?;
    let body: AddMemberBody = serde_json::from_slice(&body?)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))?;
    require_leader(&api)?;
    let voters = member
        .changes
        .add(body.id, &body.addr)
        .await
        .map_err(membership_error)?;
    Ok(Json(json!({"added": body.id, "voters": voters})))
}

/// `POST /v1/keys/{id}/retire` (`admin`, cluster mode): removes a signing key from the
/// replicated list for good, so resources that trust the coordinator drop it. Refused for the
/// key of a current member (remove the member first: re-added with an empty data directory, it
/// makes a new key) and for the leader's own.
async fn retire_key(
    State(api): State<Api>,
    caller: Caller,
    Path(key_id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    caller.require(Right::Admin, None)?;
    let member = api.cluster.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::CONFLICT,
            "not_a_cluster",
            "a single node publishes only the key it signs with; to rotate it, stop the \
             coordinator, move signing.key out of its data directory and start it again (it \
             makes a new key; owners acquire again)",
        )
    })?;
    require_leader(&api)?;
    if key_id == api.signer.key_id().to_string() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "key_in_use",
            "this is the leader's own signing key",
        ));
    }
    let owner = {
        let state = palisade_cluster::storage::lock_state(&member.state);
        if state.header.retired_keys.contains(&key_id) {
            return Ok(Json(json!({"retired": key_id, "already": true})));
        }
        if !state.header.keys.contains_key(&key_id) {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "unknown_key",
                format!("no registered key {key_id:?} (see GET /v1/keys)"),
            ));
        }
        state.header.key_owners.get(&key_id).copied()
    };
    let members = member.raft.metrics().borrow().membership_config.clone();
    if let Some(node) = owner.filter(|node| members.membership().get_node(node).is_some()) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "key_in_use",
            format!(
                "key {key_id} belongs to member {node}: remove it first (palisade cluster remove \
                 {node}); re-added with an empty data directory it makes a new key"
            ),
        ));
    }
    let command = palisade_cluster::Command::RetireKey {
        key_id: key_id.clone(),
    };
    match tokio::time::timeout(
        palisade_cluster::COMMIT_TIMEOUT,
        member.raft.client_write(command),
    )
    .await
    {
        Ok(Ok(_)) => Ok(Json(json!({"retired": key_id}))),
        Ok(Err(error)) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            format!("the retirement did not commit: {error}"),
        )),
        Err(_) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the retirement did not commit in time",
        )),
    }
}

/// A node id from a path segment.
fn node_id(id: &str) -> Result<u64, ApiError> {
    id.parse()
        .map_err(|_| ApiError::bad_request(format!("node id {id:?} is not a number")))
}

/// `DELETE /v1/cluster/members/{id}`: removes a member (voter or learner).
async fn remove_member(
    State(api): State<Api>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    caller.require(Right::Admin, None)?;
    let member = cluster_member(&api)?;
    let id = node_id(&id)?;
    require_leader(&api)?;
    let voters = member.changes.remove(id).await.map_err(membership_error)?;
    Ok(Json(json!({"removed": id, "voters": voters})))
}

/// `POST /v1/cluster/members/{id}/lost` (`admin`, cluster mode): the operator's word, to this
/// member, that member `id`'s store is gone for good (its data directory lost, its disk
/// replaced): this member's census (`identity` rule 4) stops waiting for it. Answered on
/// every member, leader or not: a member on probation is the one that needs it.
async fn declare_lost(
    State(api): State<Api>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    caller.require(Right::Admin, None)?;
    let member = cluster_member(&api)?;
    let id = node_id(&id)?;
    if id == member.node_id {
        return Err(ApiError::bad_request(
            "a member cannot declare its own store lost",
        ));
    }
    let on_probation = member.identity.declare_lost(id);
    Ok(Json(json!({
        "node_id": member.node_id,
        "lost": id,
        "on_probation": on_probation,
    })))
}
