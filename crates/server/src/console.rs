//! What operators read: the web console at `/ui/` (static files served from the binary), the
//! policy (`GET /v1/policy`), the audit (`GET /v1/audit`, `POST /v1/audit/probe`) and the
//! recent ownership transitions (`GET /v1/transitions`).
//!
//! The console's files carry no data: every number on the page comes from these routes, with
//! the caller's credentials (read on every lock for the audit and the policy; the feed shows
//! only the locks the caller may read).

use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use palisade_audit::assess::{boundaries, locks_to_ask};
use palisade_audit::observe::{self, http_client};
use palisade_audit::policy::{Boundary, PROBE_LOCK_PREFIX};
use palisade_audit::{LiveLock, Probe, Report};
use palisade_core::{AcquireRequest, HolderId, LockClass, LockName, Principal};
use serde::Deserialize;
use serde_json::json;

use crate::api::Api;
use crate::auth::{Caller, Right};
use crate::http_error::ApiError;
use palisade_coordinator::engine::MAX_LIST;

const INDEX_HTML: &str = include_str!("../ui/index.html");
const APP_JS: &str = include_str!("../ui/app.js");
const STYLE_CSS: &str = include_str!("../ui/style.css");

/// How long an audit without probes is served again instead of asking the boundaries anew:
/// several consoles polling one coordinator share it.
pub const AUDIT_REUSE: std::time::Duration = std::time::Duration::from_secs(2);

/// The console's and the audit's routes.
pub fn routes() -> Router<Api> {
    Router::new()
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route(
            "/ui/",
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/ui/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/ui/style.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE_CSS) }),
        )
        .route("/v1/policy", get(policy))
        .route("/v1/audit", get(audit))
        .route("/v1/audit/probe", post(audit_probe))
        .route("/v1/transitions", get(transitions))
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            // The page loads nothing from elsewhere and runs only its own script.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
            ),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

/// `GET /v1/policy` (read on every lock): the policy in force, passwords redacted.
async fn policy(
    State(api): State<Api>,
    caller: Caller,
) -> Result<Json<serde_json::Value>, ApiError> {
    caller.require(Right::Read, None)?;
    let policy = api.policy.current();
    Ok(Json(json!({
        "file": api.policy.file().map(|f| f.display().to_string()),
        "require_policy": api.policy.require(),
        "policy": policy.redacted(),
    })))
}

/// `GET /v1/audit` (read on every lock): the audit without probes.
async fn audit(State(api): State<Api>, caller: Caller) -> Result<Json<Report>, ApiError> {
    caller.require(Right::Read, None)?;
    Ok(Json(run(&api, false).await?))
}

/// `POST /v1/audit/probe` (admin): the audit, with a probe of every boundary that has one.
/// Only the leader can acquire the probe's lock.
async fn audit_probe(State(api): State<Api>, caller: Caller) -> Result<Json<Report>, ApiError> {
    caller.require(Right::Admin, None)?;
    if let Some(error) = api.coordinator.not_serving() {
        return Err(error.into());
    }
    Ok(Json(run(&api, true).await?))
}

#[derive(Deserialize)]
struct TransitionsQuery {
    after: Option<u64>,
}

/// `GET /v1/transitions?after=SEQ`: the transitions after `SEQ` of the locks the caller may
/// read, oldest first, the latest sequence number, and the feed's id (a new one after a
/// restart or on another member: its numbers start again). Only admins see which were the
/// audit's probe.
async fn transitions(
    State(api): State<Api>,
    caller: Caller,
    query: Result<Query<TransitionsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(format!("?after=N: {e}")))?;
    let (last, mut entries) = api.feed.since(query.after.unwrap_or(0), |lock| {
        LockName::new(lock).is_ok_and(|lock| caller.can(Right::Read, Some(&lock)))
    });
    // Which leases were the audit's probe is for those who may run it: a worker, or a boundary
    // with read credentials, must not tell the probe from real traffic.
    if !caller.can(Right::Admin, None) {
        for entry in &mut entries {
            entry.probe = false;
        }
    }
    Ok(Json(
        json!({"feed": api.feed.id(), "last": last, "transitions": entries}),
    ))
}

/// Runs the audit: the live locks, what each boundary reports for them, and (with `probe`)
/// a probe of each boundary.
pub async fn run(api: &Api, probe: bool) -> Result<Report, ApiError> {
    let mut last = api.audits.turn.lock().await;
    if let Some((at, report)) = last.as_ref() {
        if !probe && at.elapsed() < AUDIT_REUSE {
            return Ok(report.clone());
        }
    }
    let report = audit_now(api, probe).await?;
    if !probe {
        *last = Some((std::time::Instant::now(), report.clone()));
    }
    Ok(report)
}

async fn audit_now(api: &Api, probe: bool) -> Result<Report, ApiError> {
    let policy = api.policy.current();
    let locks = live_locks(api).await?;
    let http = http_client();
    let known = boundaries(&policy);
    let observing = known.iter().map(|(boundary, patterns)| {
        let asked = locks_to_ask(&policy, boundary, &locks);
        let (http, policy) = (&http, &policy);
        async move {
            let mut report = observe::observe(http, boundary, patterns.clone(), &asked).await;
            judge_floors(api, &mut report).await;
            if let Boundary::Postgres { table, .. } = boundary {
                // The database's tokens of locks another boundary fences are that one's.
                report.presented_tokens.retain(|token| {
                    policy
                        .rule_for(&token.lock)
                        .and_then(|r| r.boundary.as_ref())
                        == Some(boundary)
                });
                judge_fences(api, table, &mut report).await;
                observe::verify_refusals(&mut report, &verifier(api));
            }
            if probe {
                report.probe = Some(probe_boundary(api, http, policy, boundary, patterns).await);
            }
            report
        }
    });
    let observed = futures::future::join_all(observing).await;
    let mut report = palisade_audit::assess(
        &policy,
        api.policy.file().map(|f| f.display().to_string()),
        api.policy.require(),
        &locks,
        observed,
        now_ms(),
    );
    report.findings.extend(breaks(api));
    Ok(report)
}

/// The locks an admin broke (`palisade lock break`) among the feed's recent transitions, for
/// the record: who broke which lease, and when.
fn breaks(api: &Api) -> Vec<palisade_audit::Finding> {
    let (_, entries) = api.feed.since(0, |_| true);
    entries
        .into_iter()
        .filter(|entry| entry.kind == "broken")
        .map(|entry| palisade_audit::Finding {
            severity: palisade_audit::Severity::Info,
            code: "lock_broken".into(),
            message: format!(
                "{} broke the lease of {} at epoch {} at {}; its next owner got a higher epoch, \
                 so the old holder's writes are refused wherever the next owner wrote",
                entry.by.as_deref().unwrap_or("an admin"),
                entry.holder,
                entry.epoch,
                palisade_core::clock::display_ms(entry.at_ms),
            ),
            subject: entry.lock,
            proof: Some("GET /v1/transitions".into()),
        })
        .collect()
}

/// The floors a PostgreSQL boundary enforces, against this coordinator's floor for each lock
/// and its keys ([`palisade_audit::floors::judge`]): a forged or excessive one is poisoned.
async fn judge_floors(api: &Api, report: &mut palisade_audit::BoundaryReport) {
    if report.floors.is_empty() {
        return;
    }
    let mut coordinator = std::collections::BTreeMap::new();
    for stored in &report.floors {
        let Ok(lock) = LockName::new(stored.lock.clone()) else {
            continue;
        };
        if let Ok(floor) = api.coordinator.floor(lock).await {
            coordinator.insert(stored.lock.clone(), floor.0);
        }
    }
    let problems = palisade_audit::floors::judge(&report.floors, &coordinator, &verifier(api));
    report.problems.extend(problems);
}

/// This coordinator's public keys, as a verifier.
fn verifier(api: &Api) -> palisade_core::TokenVerifier {
    let keys = api
        .public_keys()
        .iter()
        .filter_map(|key| palisade_core::token::decode_public_key(&key.public_key).ok())
        .collect::<Vec<_>>();
    palisade_core::TokenVerifier::new(keys)
}

/// The fences of a PostgreSQL table, against this coordinator's floor for each lock and the
/// tokens the writers presented ([`palisade_audit::fences::judge`]): a fence no signed token
/// backs, above anything the coordinator issued for its lock, is poisoned.
async fn judge_fences(api: &Api, table: &str, report: &mut palisade_audit::BoundaryReport) {
    if report.fences.is_empty() {
        return;
    }
    let mut coordinator = std::collections::BTreeMap::new();
    for lock in report.fences.keys() {
        let Ok(name) = LockName::new(lock.clone()) else {
            continue;
        };
        if let Ok(floor) = api.coordinator.floor(name).await {
            coordinator.insert(lock.clone(), floor.0);
        }
    }
    let table = report
        .resolved_table
        .clone()
        .unwrap_or_else(|| table.to_owned());
    let (problems, poisoned) = palisade_audit::fences::judge(
        &table,
        &report.fences,
        &report.presented_tokens,
        &coordinator,
        &verifier(api),
    );
    report.problems.extend(problems);
    report.poisoned_fences = poisoned;
}

/// The held locks, less the audit's own probe locks.
async fn live_locks(api: &Api) -> Result<Vec<LiveLock>, ApiError> {
    Ok(api
        .coordinator
        .list(MAX_LIST)
        .await?
        .into_iter()
        .filter(|summary| !summary.lock.as_str().starts_with(PROBE_LOCK_PREFIX))
        .filter_map(|summary| {
            let lease = summary.lease?;
            Some(LiveLock {
                lock: summary.lock.to_string(),
                epoch: lease.epoch.0,
                holder: lease.holder.to_string(),
                class: lease.class,
                remaining_ms: summary.remaining_ms,
                granted_unix_ms: lease.granted_unix_ms,
                waiters: summary.waiters,
            })
        })
        .collect())
}

/// Probes `boundary` (whose locks match `patterns`): an obsolete epoch's write to a reference
/// store, the guard of a PostgreSQL table; an effects ledger has no probe.
async fn probe_boundary(
    api: &Api,
    http: &reqwest::Client,
    policy: &palisade_audit::Policy,
    boundary: &Boundary,
    patterns: &[String],
) -> Probe {
    match boundary {
        Boundary::Resource { url } => {
            let fenced_here = |lock: &str| {
                policy.rule_for(lock).and_then(|r| r.boundary.as_ref()) == Some(boundary)
            };
            // A lock shaped like the ones this store fences (the rule's own lock for an exact
            // name), that no store can predict; the tokens name a recent holder's name.
            let (_, transitions) = api.feed.since(0, fenced_here);
            let recent: Vec<String> = transitions.into_iter().map(|t| t.lock).collect();
            // An exact name is probed on itself only while nobody holds it (the probe would
            // wait for the owner): otherwise on the probe's own prefix.
            let mut pattern = patterns.first().map(String::as_str);
            if let Some(exact) = pattern.filter(|p| !p.contains('*')) {
                let held = match LockName::new(exact) {
                    Ok(lock) => api
                        .coordinator
                        .describe(lock)
                        .await
                        .map_or(true, |summary| summary.lease.is_some()),
                    Err(_) => true,
                };
                if held {
                    pattern = None;
                }
            }
            let lock = observe::probe_lock(pattern, &recent, fenced_here);
            let holder = recent_holder(api, fenced_here);
            match probe_tokens(api, &lock, holder).await {
                Ok((older, newer)) => {
                    let older = (older.0, older.1.as_str());
                    let newer = (newer.0, newer.1.as_str());
                    observe::probe_resource(http, url, &lock, older, newer).await
                }
                Err(detail) => Probe::Failed { detail },
            }
        }
        Boundary::Postgres { table, url, .. } => observe::probe_postgres(url, table).await,
        Boundary::Effects { .. } => Probe::NotSupported {
            detail: "an effects ledger has no probe: it would record an operation; its fence is \
                     checked by its conformance suite and `palisade drill effects`"
                .into(),
        },
    }
}

type ProbeToken = (u64, String);

/// The holder of the most recent transition on a lock that `fenced_here` says the probed
/// boundary fences: the probe's tokens then carry a holder like its real owners'.
fn recent_holder(api: &Api, fenced_here: impl Fn(&str) -> bool) -> Option<String> {
    let (_, entries) = api.feed.since(0, &fenced_here);
    entries
        .into_iter()
        .rev()
        .find(|entry| entry.kind != "missed")
        .map(|entry| entry.holder)
}

/// Two tokens of `lock` (the probe's), an older and a newer epoch, each released at once.
/// They name a principal that may acquire the lock ([`crate::auth::Auth::probe_principal`])
/// and `holder` (else a random one), so that nothing in them tells a boundary it is probed.
async fn probe_tokens(
    api: &Api,
    lock: &str,
    holder: Option<String>,
) -> Result<(ProbeToken, ProbeToken), String> {
    let mut tokens = Vec::with_capacity(2);
    let lock = LockName::new(lock).map_err(|e| e.0)?;
    let holder = holder.unwrap_or_else(|| format!("h-{}", observe::unpredictable()));
    // Nobody may acquire the lock: no real token names an owner, so any name will do.
    let principal = match api.auth.probe_principal(&lock) {
        Some(principal) => principal,
        None => Principal::new("palisade-audit").map_err(|e| e.0)?,
    };
    for _ in 0..2 {
        let request = AcquireRequest {
            lock: lock.clone(),
            holder: HolderId::new(holder.as_str()).map_err(|e| e.0)?,
            principal: principal.clone(),
            ttl_ms: 10_000,
            wait_ms: 5_000,
            class: LockClass::Critical,
            request_id: None,
        };
        let lease = api
            .coordinator
            .acquire(request)
            .await
            .map_err(|e| format!("cannot acquire {lock}: {e}"))?;
        api.feed.mark_probe(lock.as_str(), lease.epoch.0);
        let token = api.sign(&lease);
        if let Err(error) = api.coordinator.release(lease.id, None).await {
            tracing::warn!(%error, "the audit probe's lease was not released; it expires");
        }
        tokens.push((lease.epoch.0, token));
    }
    let newer = tokens.pop().expect("two tokens");
    let older = tokens.pop().expect("two tokens");
    Ok((older, newer))
}

use palisade_core::clock::now_ms;
