//! The embedded ledger over HTTP: [`routes`] serves a [`LocalLedger`] (the reference store,
//! `palisade resource serve`, mounts them under `/v1/effects`), and [`HttpLedger`] is the
//! [`Ledger`] that reaches it from other processes.
//!
//! Owners authenticate with their token (in the request body, verified by the ledger). The
//! reconciler's and people's requests (`settle` without a token, `reattempt`, `resolve`)
//! need the ledger's admin secret in the [`ADMIN_HEADER`] header; without a configured secret
//! they are refused.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::ledger::{
    Answer, Begin, BeginRequest, Ledger, LedgerError, ListFilter, LocalLedger, Stats, Store,
};
use crate::metrics::EffectsMetrics;
use crate::model::{LedgerRejection, OpId, OpState, Record, SendResult, Settlement, Verdict};

/// Header carrying the ledger's admin secret.
pub const ADMIN_HEADER: &str = "palisade-effects-admin";
/// Largest request body: a payload (64 KiB) in base64 plus the rest.
pub const MAX_BODY_BYTES: usize = 128 * 1024;

#[derive(Serialize, Deserialize)]
struct FinishBody {
    token: String,
    id: OpId,
    attempt: u32,
    result: SendResult,
}

#[derive(Serialize, Deserialize)]
struct SettleBody {
    #[serde(default)]
    token: Option<String>,
    id: OpId,
    attempt: u32,
    settlement: Settlement,
}

#[derive(Serialize, Deserialize)]
struct ReattemptBody {
    id: OpId,
    attempt: u32,
    attempt_timeout_ms: u64,
}

#[derive(Serialize, Deserialize)]
struct ResolveBody {
    id: OpId,
    verdict: Verdict,
    by: String,
    why: String,
}

#[derive(Serialize, Deserialize)]
struct OpQuery {
    id: String,
}

#[derive(Serialize, Deserialize, Default)]
struct ListQuery {
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    lock: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
}

/// What the routes serve.
pub struct Served<S> {
    ledger: LocalLedger<S>,
    admin_secret: Option<String>,
    metrics: EffectsMetrics,
    host: Option<Arc<dyn Host>>,
}

/// What a host says of an owner's token before the ledger weighs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// The ledger decides.
    Admitted,
    /// The coordinator has superseded this owner: refused as a stale epoch at `floor`,
    /// whatever the ledger's own fence says (it may have gone back with the ledger's volume).
    Superseded {
        /// The token's epoch.
        epoch: u64,
        /// The lock's floor.
        floor: u64,
    },
    /// The host cannot tell yet (503 `floor_unavailable`; retry).
    Unavailable(String),
}

/// The process that serves the ledger (the reference store), asked about each owner's token
/// before the ledger verifies it.
pub trait Host: Send + Sync {
    /// Makes sure the key that signed `token` is known, if it can be (a host that fetches its
    /// trusted keys on demand learns a new coordinator key first).
    fn refresh_for<'a>(
        &'a self,
        token: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>>;

    /// Whether the owner of `token` may act (a host that learns each lock's floor from the
    /// coordinator refuses a superseded owner).
    fn admit<'a>(
        &'a self,
        token: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Admission> + Send + 'a>>;
}

impl<S> Served<S> {
    /// `ledger`, with the admin secret for reconcilers and people (`None`: their requests
    /// are refused).
    pub fn new(ledger: LocalLedger<S>, admin_secret: Option<String>) -> Arc<Self> {
        Arc::new(Self {
            ledger,
            admin_secret,
            metrics: EffectsMetrics::default(),
            host: None,
        })
    }

    /// [`Self::new`], served by `host`.
    pub fn with_host(
        ledger: LocalLedger<S>,
        admin_secret: Option<String>,
        host: Arc<dyn Host>,
    ) -> Arc<Self> {
        Arc::new(Self {
            ledger,
            admin_secret,
            metrics: EffectsMetrics::default(),
            host: Some(host),
        })
    }

    /// Asks the host about an owner's `token`: `Err` with the answer when it refuses
    /// (`rejected` turns a stale epoch into the endpoint's own answer).
    async fn admit(
        &self,
        token: &str,
        rejected: impl FnOnce(LedgerRejection) -> Response,
    ) -> Result<(), Response> {
        let Some(host) = &self.host else {
            return Ok(());
        };
        host.refresh_for(token).await;
        match host.admit(token).await {
            Admission::Admitted => Ok(()),
            Admission::Superseded { epoch, floor } => Err(rejected(LedgerRejection::StaleEpoch {
                epoch,
                fence: floor,
            })),
            Admission::Unavailable(why) => Err(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "floor_unavailable",
                &why,
            )),
        }
    }

    /// The metrics: reconciliation outcomes are counted as they are recorded; call
    /// [`EffectsMetrics::set_stats`] before rendering for the gauges.
    pub fn metrics(&self) -> &EffectsMetrics {
        &self.metrics
    }

    /// The ledger.
    pub fn ledger(&self) -> &LocalLedger<S> {
        &self.ledger
    }

    fn admin(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        let given = headers
            .get(ADMIN_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        match &self.admin_secret {
            None => Err(refusal(
                StatusCode::FORBIDDEN,
                "admin_disabled",
                "this ledger has no admin secret (--effects-admin-secret-file): reconcilers and \
                 resolutions cannot use it over HTTP",
            )),
            Some(secret) if constant_time_eq(secret.as_bytes(), given.as_bytes()) => Ok(()),
            Some(_) => Err(refusal(
                StatusCode::FORBIDDEN,
                "forbidden",
                "wrong or missing palisade-effects-admin header",
            )),
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// An error answer `{"error": CODE, "message": …}`, small enough to return in a `Result`.
pub struct Refusal {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let body = json!({"error": self.code, "message": self.message});
        (self.status, Json(body)).into_response()
    }
}

/// A refusal to return as the error of a handler (the fake receiver answers with these too).
pub fn refusal(status: StatusCode, code: &'static str, message: &str) -> Refusal {
    Refusal {
        status,
        code,
        message: message.to_owned(),
    }
}

/// An error answer, `{"error": CODE, "message": …}` with `status`.
pub fn error(status: StatusCode, code: &'static str, message: &str) -> Response {
    refusal(status, code, message).into_response()
}

fn failed(e: LedgerError) -> Response {
    let code = match e {
        LedgerError::Storage(_) => "storage_error",
        LedgerError::Integrity(_) => "integrity_violation",
        LedgerError::RestoreRequired(_) => "restore_required",
    };
    error(StatusCode::SERVICE_UNAVAILABLE, code, &e.to_string())
}

fn reply<T: Serialize>(result: Result<T, LedgerError>) -> Response {
    match result {
        Ok(value) => Json(value).into_response(),
        Err(e) => failed(e),
    }
}

/// The ledger's routes, to be nested under `/v1/effects`.
pub fn routes<S: Store>(served: Arc<Served<S>>) -> Router {
    Router::new()
        .route("/", get(list::<S>))
        .route("/op", get(show::<S>))
        .route("/stats", get(stats::<S>))
        .route("/begin", post(begin::<S>))
        .route("/finish", post(finish::<S>))
        .route("/settle", post(settle::<S>))
        .route("/reattempt", post(reattempt::<S>))
        .route("/resolve", post(resolve::<S>))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(served)
}

async fn begin<S: Store>(
    State(served): State<Arc<Served<S>>>,
    Json(body): Json<BeginRequest>,
) -> Response {
    let rejected = |rejection| Json(Begin::Rejected { rejection }).into_response();
    if let Err(refused) = served.admit(&body.token, rejected).await {
        return refused;
    }
    reply(served.ledger.begin(body).await)
}

/// An owner's request refused by the host: the ledger's own answer for a stale epoch.
fn answer_rejected(rejection: LedgerRejection) -> Response {
    Json(Answer::Rejected { rejection }).into_response()
}

async fn finish<S: Store>(
    State(served): State<Arc<Served<S>>>,
    Json(body): Json<FinishBody>,
) -> Response {
    if let Err(refused) = served.admit(&body.token, answer_rejected).await {
        return refused;
    }
    reply(
        served
            .ledger
            .finish(&body.token, &body.id, body.attempt, body.result)
            .await,
    )
}

async fn settle<S: Store>(
    State(served): State<Arc<Served<S>>>,
    headers: HeaderMap,
    Json(body): Json<SettleBody>,
) -> Response {
    match body.token.as_deref() {
        Some(token) => {
            if let Err(refused) = served.admit(token, answer_rejected).await {
                return refused;
            }
        }
        None => {
            if let Err(denied) = served.admin(&headers) {
                return denied.into_response();
            }
        }
    }
    let result = match &body.settlement {
        Settlement::Performed { .. } => "performed",
        Settlement::NotPerformed => "not_performed",
        Settlement::Refused { .. } => "refused",
        Settlement::Review { .. } => "to_review",
    };
    let answer = served
        .ledger
        .settle(
            body.token.as_deref(),
            &body.id,
            body.attempt,
            body.settlement,
        )
        .await;
    if let Ok(Answer::Recorded { .. }) = answer {
        served.metrics.count(result);
    }
    reply(answer)
}

async fn reattempt<S: Store>(
    State(served): State<Arc<Served<S>>>,
    headers: HeaderMap,
    Json(body): Json<ReattemptBody>,
) -> Response {
    if let Err(denied) = served.admin(&headers) {
        return denied.into_response();
    }
    let answer = served
        .ledger
        .reattempt(&body.id, body.attempt, body.attempt_timeout_ms)
        .await;
    if let Ok(Answer::Recorded { .. }) = answer {
        served.metrics.count("retried");
    }
    reply(answer)
}

async fn resolve<S: Store>(
    State(served): State<Arc<Served<S>>>,
    headers: HeaderMap,
    Json(body): Json<ResolveBody>,
) -> Response {
    if let Err(denied) = served.admin(&headers) {
        return denied.into_response();
    }
    let answer = served
        .ledger
        .resolve(&body.id, body.verdict, &body.by, &body.why)
        .await;
    if let Ok(Answer::Recorded { .. }) = answer {
        served.metrics.count(match body.verdict {
            Verdict::Done => "resolved_done",
            Verdict::NotDone => "resolved_not_done",
            Verdict::Compensated => "resolved_compensated",
            Verdict::Abandon => "resolved_abandon",
        });
    }
    reply(answer)
}

async fn show<S: Store>(
    State(served): State<Arc<Served<S>>>,
    Query(query): Query<OpQuery>,
) -> Response {
    let id = match OpId::parse(&query.id) {
        Ok(id) => id,
        Err(e) => return error(StatusCode::BAD_REQUEST, "invalid_request", &e.0),
    };
    match served.ledger.get(&id).await {
        Ok(Some(record)) => Json(record).into_response(),
        Ok(None) => error(
            StatusCode::NOT_FOUND,
            "not_found",
            &format!("no operation {id}"),
        ),
        Err(e) => failed(e),
    }
}

fn parse_filter(query: ListQuery) -> Result<ListFilter, String> {
    let states = match query.state.as_deref() {
        None | Some("") => Vec::new(),
        Some(text) => text
            .split(',')
            .map(|s| OpState::parse(s.trim()).map_err(|e| e.0))
            .collect::<Result<_, _>>()?,
    };
    Ok(ListFilter {
        states,
        lock: query.lock,
        limit: query.limit,
    })
}

async fn list<S: Store>(
    State(served): State<Arc<Served<S>>>,
    Query(query): Query<ListQuery>,
) -> Response {
    match parse_filter(query) {
        Ok(filter) => reply(served.ledger.list(&filter).await),
        Err(message) => error(StatusCode::BAD_REQUEST, "invalid_request", &message),
    }
}

async fn stats<S: Store>(State(served): State<Arc<Served<S>>>) -> Response {
    reply(served.ledger.stats().await)
}

/// A [`Ledger`] served by another process (see [`routes`]).
#[derive(Clone)]
pub struct HttpLedger {
    base: String,
    admin_secret: Option<String>,
    http: reqwest::Client,
}

impl HttpLedger {
    /// The ledger at `base` (e.g. `http://127.0.0.1:7300`), with the admin secret when this
    /// client reconciles or resolves.
    pub fn new(base: &str, admin_secret: Option<String>) -> Result<Self, LedgerError> {
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(10))
            .pool_max_idle_per_host(64)
            .build()
            .map_err(|e| LedgerError::Storage(e.to_string()))?;
        Ok(Self {
            base: format!("{}/v1/effects", base.trim_end_matches('/')),
            admin_secret,
            http,
        })
    }

    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<Option<T>, LedgerError> {
        let request = match &self.admin_secret {
            Some(secret) => request.header(ADMIN_HEADER, secret),
            None => request,
        };
        let response = request
            .send()
            .await
            .map_err(|e| LedgerError::Storage(format!("ledger unreachable: {e}")))?;
        let status = response.status();
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            let text = response.text().await.unwrap_or_default();
            let body: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            let message = body["message"].as_str().unwrap_or(&text).to_owned();
            return Err(match body["error"].as_str() {
                Some("restore_required") => LedgerError::RestoreRequired(message),
                Some("admin_disabled" | "forbidden") => LedgerError::Storage(format!(
                    "the ledger refused ({status}): {message}; reconcilers and people pass the \
                     ledger's admin secret with --admin-secret-file"
                )),
                _ => LedgerError::Storage(format!("ledger answered {status}: {message}")),
            });
        }
        response
            .json()
            .await
            .map(Some)
            .map_err(|e| LedgerError::Storage(format!("unreadable ledger answer: {e}")))
    }

    async fn post<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> Result<T, LedgerError> {
        self.call(self.http.post(format!("{}/{path}", self.base)).json(body))
            .await?
            .ok_or_else(|| LedgerError::Storage(format!("no ledger at {}", self.base)))
    }
}

impl Ledger for HttpLedger {
    async fn begin(&self, request: BeginRequest) -> Result<Begin, LedgerError> {
        self.post("begin", &request).await
    }

    async fn finish(
        &self,
        token: &str,
        id: &OpId,
        attempt: u32,
        result: SendResult,
    ) -> Result<Answer, LedgerError> {
        let body = FinishBody {
            token: token.to_owned(),
            id: id.clone(),
            attempt,
            result,
        };
        self.post("finish", &body).await
    }

    async fn settle(
        &self,
        token: Option<&str>,
        id: &OpId,
        attempt: u32,
        settlement: Settlement,
    ) -> Result<Answer, LedgerError> {
        let body = SettleBody {
            token: token.map(str::to_owned),
            id: id.clone(),
            attempt,
            settlement,
        };
        self.post("settle", &body).await
    }

    async fn reattempt(
        &self,
        id: &OpId,
        attempt: u32,
        attempt_timeout_ms: u64,
    ) -> Result<Answer, LedgerError> {
        let body = ReattemptBody {
            id: id.clone(),
            attempt,
            attempt_timeout_ms,
        };
        self.post("reattempt", &body).await
    }

    async fn resolve(
        &self,
        id: &OpId,
        verdict: Verdict,
        by: &str,
        why: &str,
    ) -> Result<Answer, LedgerError> {
        let body = ResolveBody {
            id: id.clone(),
            verdict,
            by: by.to_owned(),
            why: why.to_owned(),
        };
        self.post("resolve", &body).await
    }

    async fn get(&self, id: &OpId) -> Result<Option<Record>, LedgerError> {
        let query = OpQuery { id: id.to_string() };
        self.call(self.http.get(format!("{}/op", self.base)).query(&query))
            .await
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>, LedgerError> {
        let states: Vec<&str> = filter.states.iter().map(|s| s.as_str()).collect();
        let query = ListQuery {
            state: (!states.is_empty()).then(|| states.join(",")),
            lock: filter.lock.clone(),
            limit: filter.limit,
        };
        Ok(self
            .call(self.http.get(&self.base).query(&query))
            .await?
            .unwrap_or_default())
    }

    async fn stats(&self) -> Result<Stats, LedgerError> {
        self.call(self.http.get(format!("{}/stats", self.base)))
            .await?
            .ok_or_else(|| LedgerError::Storage(format!("no ledger at {}", self.base)))
    }
}
