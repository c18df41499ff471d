//! The reference store's HTTP routes.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use palisade_core::token::decode_unverified;
use palisade_core::LockName;
use palisade_fence::{
    Activation, FenceError, FencedResource, Outcome, Rejection, Write, MAX_VALUE_BYTES,
};
use palisade_fence_redb::RedbFence;
use serde_json::{json, Value};

use palisade_effects::http::Served;
use palisade_effects::{LocalLedger, RedbStore};

use crate::floors::{FloorCheck, Floors, LedgerHost};
use crate::keys::KeyRing;
use crate::metrics::{Metrics, Recent, RejectionRecord};

/// Header carrying the writer's token.
pub const TOKEN_HEADER: &str = "palisade-token";
/// Header carrying the sequence number (sequenced mode).
pub const SEQ_HEADER: &str = "palisade-seq";
/// Header of a read answer: the epoch that wrote the value.
pub const EPOCH_HEADER: &str = "palisade-epoch";

#[derive(Clone)]
pub struct State {
    inner: Arc<Inner>,
}

struct Inner {
    store: RedbFence,
    /// Each lock's floor as the coordinator signed it since this process started.
    floors: Arc<Floors>,
    keys: Arc<KeyRing>,
    metrics: Metrics,
    recent: Recent,
    effects: Arc<Served<RedbStore>>,
}

impl State {
    pub fn new(
        store: RedbFence,
        keys: Arc<KeyRing>,
        ledger: LocalLedger<RedbStore>,
        effects_admin_secret: Option<String>,
    ) -> Self {
        let floors = Arc::new(Floors::new(keys.clone()));
        let host = Arc::new(LedgerHost {
            keys: keys.clone(),
            floors: floors.clone(),
        });
        let effects = Served::with_host(ledger, effects_admin_secret, host);
        Self {
            inner: Arc::new(Inner {
                store,
                floors,
                metrics: Metrics::new(effects.metrics(), &keys),
                keys,

                recent: Recent::default(),
                effects,
            }),
        }
    }
}

pub fn router(state: State) -> Router {
    let effects = palisade_effects::http::routes(state.inner.effects.clone());
    let router = Router::new()
        .route("/v1/kv/{lock}/{key}", get(read).put(write))
        .route("/v1/fences/{lock}", get(fence))
        .route("/v1/fences/{lock}/activate", post(activate))
        .route("/v1/info", get(info))
        .route("/v1/rejections", get(rejections))
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "not_found", "no such route") })
        .layer(DefaultBodyLimit::max(MAX_VALUE_BYTES))
        .with_state(state)
        .nest("/v1/effects", effects);
    // Declared-oversized values refused before they are read; stalled ones after a timeout.
    palisade_listener::bounded_bodies(
        router,
        MAX_VALUE_BYTES,
        "value_too_large",
        std::time::Duration::from_millis(palisade_core::limits::BODY_READ_TIMEOUT_MS),
    )
}

/// A JSON error answer `{"error": CODE, "message", …}`, small enough to return by value.
struct HttpError {
    status: StatusCode,
    body: Value,
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body)).into_response()
    }
}

fn error(status: StatusCode, code: &str, message: impl std::fmt::Display) -> HttpError {
    let body = json!({"error": code, "message": message.to_string()});
    HttpError { status, body }
}

fn lock_name(name: String) -> Result<LockName, HttpError> {
    LockName::new(name).map_err(|e| error(StatusCode::BAD_REQUEST, "invalid_request", e))
}

fn header<'h>(headers: &'h HeaderMap, name: &str) -> Result<Option<&'h str>, HttpError> {
    headers
        .get(name)
        .map(|v| v.to_str())
        .transpose()
        .map_err(|_| {
            error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                format!("{name} is not text"),
            )
        })
}

fn token(headers: &HeaderMap) -> Result<&str, HttpError> {
    header(headers, TOKEN_HEADER)?.ok_or_else(|| {
        error(
            StatusCode::UNAUTHORIZED,
            "missing_token",
            "a Palisade-Token header is required",
        )
    })
}

fn rejection_response(rejection: &Rejection) -> HttpError {
    let (status, mut body) = match rejection {
        Rejection::StaleEpoch { fence, fence_seq } => {
            let mut body = json!({"fence": palisade_core::json::value(*fence)});
            if let Some(seq) = fence_seq {
                body["fence_seq"] = json!(seq);
            }
            (StatusCode::CONFLICT, body)
        }
        Rejection::NotActivated { fence } => (
            StatusCode::CONFLICT,
            json!({"fence": palisade_core::json::value(*fence)}),
        ),
        Rejection::ReplayMismatch { epoch, seq } => (
            StatusCode::CONFLICT,
            json!({"epoch": palisade_core::json::value(*epoch), "seq": seq}),
        ),
        Rejection::InvalidToken(_) => (StatusCode::FORBIDDEN, json!({})),
        _ => (StatusCode::BAD_REQUEST, json!({})),
    };
    body["error"] = json!(rejection.code());
    body["message"] = json!(rejection.to_string());
    HttpError { status, body }
}

fn storage_failure(state: &State, failure: &FenceError) -> HttpError {
    if let FenceError::RestoreRequired(why) = failure {
        // Not a storage fault: the store was found behind its witness (P6).
        return error(StatusCode::SERVICE_UNAVAILABLE, "restore_required", why);
    }
    state.inner.metrics.storage_errors.inc();
    tracing::error!(%failure, "fenced store failure");
    error(StatusCode::SERVICE_UNAVAILABLE, "storage_error", failure)
}

impl State {
    /// Refuses an owner below the lock's floor as the coordinator signed it since this store
    /// started (P6, see [`crate::floors`]): 409 `stale_epoch` at the floor, or 503
    /// `floor_unavailable` while the coordinator cannot be asked.
    async fn check_floor(
        &self,
        lock: &LockName,
        key: Option<&str>,
        token: &str,
    ) -> Result<(), HttpError> {
        if self.inner.store.restore_required().is_some() {
            return Ok(()); // the store refuses every write until its restore floor
        }
        match self.inner.floors.check(lock, token).await {
            FloorCheck::Admitted => Ok(()),
            FloorCheck::Unavailable(why) => Err(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "floor_unavailable",
                why,
            )),
            FloorCheck::Below { floor, .. } => {
                let rejection = Rejection::StaleEpoch {
                    fence: floor,
                    fence_seq: None,
                };
                self.inner.metrics.reject(rejection.code());
                self.remember(lock, key, token, &rejection);
                Err(rejection_response(&rejection))
            }
        }
    }

    /// Fetches the coordinator's keys first when the token names a key not trusted yet.
    async fn refresh_for(&self, token: &str) {
        self.inner.keys.refresh_for(token).await;
    }
}

async fn write(
    axum::extract::State(state): axum::extract::State<State>,
    Path((lock, key)): Path<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let started = std::time::Instant::now();
    let response = write_inner(&state, lock, key, &headers, body).await;
    let elapsed = started.elapsed().as_secs_f64();
    state.inner.metrics.write_duration.observe(elapsed);
    response.unwrap_or_else(IntoResponse::into_response)
}

async fn write_inner(
    state: &State,
    lock: String,
    key: String,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, HttpError> {
    let body = body.map_err(|r| {
        let code = if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            "value_too_large"
        } else {
            "invalid_request"
        };
        error(r.status(), code, r.body_text())
    })?;
    let lock = lock_name(lock)?;
    let token = token(headers).inspect_err(|_| state.inner.metrics.reject("missing_token"))?;
    let seq = header(headers, SEQ_HEADER)?
        .map(|s| s.trim().parse::<u64>())
        .transpose()
        .map_err(|_| {
            error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "Palisade-Seq is not a number",
            )
        })?;
    state.refresh_for(token).await;
    state.check_floor(&lock, Some(&key), token).await?;
    let write = Write {
        lock: &lock,
        key: &key,
        token,
        seq,
        value: &body,
    };
    let metrics = &state.inner.metrics;
    match state.inner.store.write(write).await {
        Ok(Outcome::Accepted { epoch, seq }) => {
            metrics.accepted.inc();
            let mut body = json!({"accepted": true, "epoch": palisade_core::json::value(epoch)});
            if let Some(seq) = seq {
                body["seq"] = json!(seq);
            }
            Ok(Json(body).into_response())
        }
        Ok(Outcome::Replayed { epoch, seq }) => {
            metrics.reject("replay");
            let body = json!({"accepted": true, "epoch": palisade_core::json::value(epoch), "seq": seq, "replay": true});
            Ok(Json(body).into_response())
        }
        Ok(Outcome::Rejected(rejection)) => {
            metrics.reject(rejection.code());
            state.remember(&lock, Some(&key), token, &rejection);
            Err(rejection_response(&rejection))
        }
        Err(failure) => Err(storage_failure(state, &failure)),
    }
}

async fn read(
    axum::extract::State(state): axum::extract::State<State>,
    Path((lock, key)): Path<(String, String)>,
) -> Response {
    let lock = match lock_name(lock) {
        Ok(lock) => lock,
        Err(response) => return response.into_response(),
    };
    match state.inner.store.read(&lock, &key).await {
        Ok(Some(stored)) => {
            let mut response = stored.value.into_response();
            let headers = response.headers_mut();
            headers.insert(EPOCH_HEADER, HeaderValue::from(stored.epoch.0));
            if let Some(seq) = stored.seq {
                headers.insert(SEQ_HEADER, HeaderValue::from(seq));
            }
            response
        }
        Ok(None) => {
            error(StatusCode::NOT_FOUND, "not_found", "no value at this key").into_response()
        }
        Err(failure) => storage_failure(&state, &failure).into_response(),
    }
}

async fn activate(
    axum::extract::State(state): axum::extract::State<State>,
    Path(lock): Path<String>,
    headers: HeaderMap,
) -> Response {
    let lock = match lock_name(lock) {
        Ok(lock) => lock,
        Err(response) => return response.into_response(),
    };
    let token = match token(&headers) {
        Ok(token) => token,
        Err(response) => {
            state.inner.metrics.reject("missing_token");
            return response.into_response();
        }
    };
    state.refresh_for(token).await;
    if let Err(refused) = state.check_floor(&lock, None, token).await {
        return refused.into_response();
    }
    match state.inner.store.activate(&lock, token).await {
        Ok(Activation::Activated { fence }) => {
            state.inner.metrics.activations.inc();
            Json(json!({"fence": palisade_core::json::value(fence)})).into_response()
        }
        Ok(Activation::Rejected(rejection)) => {
            state.inner.metrics.reject(rejection.code());
            state.remember(&lock, None, token, &rejection);
            rejection_response(&rejection).into_response()
        }
        Err(failure) => storage_failure(&state, &failure).into_response(),
    }
}

async fn fence(
    axum::extract::State(state): axum::extract::State<State>,
    Path(lock): Path<String>,
) -> Response {
    let lock = match lock_name(lock) {
        Ok(lock) => lock,
        Err(response) => return response.into_response(),
    };
    match state.inner.store.fence(&lock).await {
        Ok(fence) => {
            Json(json!({"lock": lock, "fence": palisade_core::json::value(fence)})).into_response()
        }
        Err(failure) => storage_failure(&state, &failure).into_response(),
    }
}

impl State {
    /// Keeps a rejection for `GET /v1/rejections`.
    fn remember(&self, lock: &LockName, key: Option<&str>, token: &str, rejection: &Rejection) {
        let fence = match rejection {
            Rejection::StaleEpoch { fence, .. } | Rejection::NotActivated { fence } => {
                Some(fence.0)
            }
            _ => None,
        };
        self.inner.recent.push(RejectionRecord {
            at_ms: palisade_effects::model::now_ms(),
            lock: lock.as_str().to_owned(),
            key: key.map(|k| k.chars().take(256).collect()),
            epoch: decode_unverified(token).ok().map(|claims| claims.epoch.0),
            fence,
            reason: rejection.code(),
        });
    }
}

#[derive(serde::Deserialize)]
struct RejectionsQuery {
    lock: Option<String>,
}

/// `GET /v1/rejections[?lock=L]`: the last refusals of signed tokens (newest first), then the
/// last refusals of requests that did not verify (rate-limited: `noise_dropped` counts those
/// left out), and the totals by reason since the store started.
async fn rejections(
    axum::extract::State(state): axum::extract::State<State>,
    axum::extract::Query(query): axum::extract::Query<RejectionsQuery>,
) -> Response {
    let recent = state.inner.recent.list(query.lock.as_deref());
    let mut totals = serde_json::Map::new();
    for reason in crate::metrics::REASONS {
        let count = state
            .inner
            .metrics
            .rejections
            .get_or_create(&crate::metrics::ReasonLabels { reason })
            .get();
        totals.insert(reason.into(), json!(count));
    }
    let noise_dropped = state.inner.recent.noise_dropped();
    Json(json!({"recent": recent, "totals": totals, "noise_dropped": noise_dropped}))
        .into_response()
}

/// The store's mode and its highest fence (the floor a restored coordinator reads with
/// `palisade restore --floor-from`).
async fn info(axum::extract::State(state): axum::extract::State<State>) -> Response {
    let inner = state.inner.clone();
    let highest = tokio::task::spawn_blocking(move || inner.store.highest_fence()).await;
    match highest {
        Ok(Ok(highest)) => Json(json!({
            "mode": state.inner.store.mode().as_str(),
            "highest_fence": palisade_core::json::value(highest),
            "restore_floor": palisade_core::json::value(state.inner.store.restore_floor()),
            "restore_required": state.inner.store.restore_required(),
            "trusted_keys": state.inner.keys.trusted_ids(),
        }))
        .into_response(),
        _ => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "storage",
            "cannot read the store's fences",
        )
        .into_response(),
    }
}

async fn metrics(axum::extract::State(state): axum::extract::State<State>) -> Response {
    use palisade_effects::Ledger as _;
    // The ledger's counts are read at scrape time (a scan of the ledger).
    if let Ok(stats) = state.inner.effects.ledger().stats().await {
        let now = palisade_effects::model::now_ms();
        state.inner.effects.metrics().set_stats(&stats, now);
    }
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.inner.metrics.render(),
    )
        .into_response()
}

async fn readyz(axum::extract::State(state): axum::extract::State<State>) -> Response {
    if state.inner.keys.ready() {
        "ready\n".into_response()
    } else {
        error(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            "no trusted coordinator key yet",
        )
        .into_response()
    }
}
