//! The fake receiver (`palisade receiver serve`): a real process that performs "effects" and
//! keeps a durable record of every one (`DIR/effects.jsonl`, fsynced before it answers), with
//! the faults a real provider has — answers lost after the effect was committed, timeouts
//! before and after it, crashes right after it, duplicated deliveries — so tests and drills
//! count *real* duplicate effects from the receiver's own record, not assumed ones.
//!
//! It speaks the receiver protocol of [`palisade_effects::receiver`], with one of three
//! capabilities:
//! - `idempotent`: a key seen before is not performed again (its first answer is replayed; a
//!   different payload under the key is refused with 422);
//! - `lookup`: no deduplication, but `GET /v1/effects/{key}` answers, and a request that
//!   arrives after its `palisade-deadline` is refused (410) without effect;
//! - `none`: performs every request it gets; no lookup.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::collections::HashMap;
use std::io::{BufRead as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::json;

use palisade_effects::http::{error, refusal, Refusal};
use palisade_effects::model::{now_ms, payload_hash, Capability, MAX_PAYLOAD_BYTES};
use palisade_effects::receiver::{
    ATTEMPT_HEADER, DEADLINE_HEADER, EPOCH_HEADER, KEY_HEADER, OP_HEADER,
};

/// Longest idempotency key accepted, in bytes (Stripe's limit).
pub const MAX_KEY_BYTES: usize = 255;
/// Most events the record holds; past it the receiver refuses new effects (503).
pub const MAX_EVENTS: usize = 1_000_000;

/// Fault probabilities, each per request, in `[0, 1]`.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Perform and commit, then break the answer (the sender sees a reset connection).
    pub lose_answer: f64,
    /// Hang past the sender's timeout, then answer 503 without performing.
    pub timeout_before: f64,
    /// Perform and commit, then hang past the sender's timeout before answering.
    pub timeout_after: f64,
    /// Perform and commit, then abort the process (restart it to continue).
    pub crash: f64,
    /// Process the request twice, as a network that delivers it twice would.
    pub duplicate: f64,
    /// How long a timeout fault hangs.
    pub hang: Duration,
    /// Seed of the fault choices.
    pub seed: u64,
}

/// One line of the receiver's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// `performed`, `compensated`, `refused_late` (lookup: arrived after its deadline),
    /// `replayed` (idempotent: a key seen before, nothing performed) or `fault` (injected;
    /// `reference` names it).
    pub kind: String,
    /// The idempotency key.
    pub key: String,
    /// The operation, as the sender named it.
    pub op: String,
    /// The sender's epoch.
    pub epoch: u64,
    /// The sender's attempt number.
    pub attempt: u32,
    /// The receiver's reference.
    pub reference: String,
    /// SHA-256 of the payload.
    pub payload_hash: String,
    /// When (ms since the Unix epoch).
    pub at_ms: u64,
}

struct Book {
    file: std::fs::File,
    events: Vec<Event>,
    by_key: HashMap<String, Vec<usize>>,
}

impl Book {
    fn append(&mut self, event: Event) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(&event)?;
        line.push(b'\n');
        self.file.write_all(&line)?;
        self.file.sync_data()?;
        self.by_key
            .entry(event.key.clone())
            .or_default()
            .push(self.events.len());
        self.events.push(event);
        Ok(())
    }

    fn performed(&self, key: &str) -> Option<&Event> {
        self.by_key
            .get(key)?
            .iter()
            .map(|&i| &self.events[i])
            .find(|e| e.kind == "performed")
    }
}

/// The receiver's state.
pub struct Fake {
    capability: Capability,
    faults: Faults,
    book: Mutex<Book>,
    requests: AtomicU64,
}

impl Fake {
    /// Opens the record in `dir` (created when missing; a torn last line from a crash is
    /// dropped).
    pub fn open(dir: &Path, capability: Capability, faults: Faults) -> std::io::Result<Arc<Self>> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join("effects.jsonl");
        let (events, valid_len) = read_events(&path)?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)?;
        file.set_len(valid_len)?;
        file.sync_all()?;
        palisade_durable::sync_dir(dir)?;
        let mut by_key: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, event) in events.iter().enumerate() {
            by_key.entry(event.key.clone()).or_default().push(i);
        }
        let requests = AtomicU64::new(events.len() as u64);
        Ok(Arc::new(Self {
            capability,
            faults,
            book: Mutex::new(Book {
                file,
                events,
                by_key,
            }),
            requests,
        }))
    }

    /// Every event so far.
    pub fn events(&self) -> Vec<Event> {
        self.book.lock().expect("not poisoned").events.clone()
    }

    fn roll(&self, n: u64, salt: u64) -> f64 {
        let mut x = self.faults.seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ salt;
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^= x >> 31;
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Reads the record, returning its events and the length of its valid prefix.
fn read_events(path: &Path) -> std::io::Result<(Vec<Event>, u64)> {
    let mut events = Vec::new();
    let mut valid = 0u64;
    let Ok(file) = std::fs::File::open(path) else {
        return Ok((events, 0));
    };
    let mut reader = std::io::BufReader::new(file);
    let mut line = String::new();
    loop {
        line.clear();
        let read = reader.read_line(&mut line)?;
        if read == 0 || !line.ends_with('\n') {
            break;
        }
        match serde_json::from_str::<Event>(line.trim_end()) {
            Ok(event) => {
                events.push(event);
                valid += read as u64;
            }
            Err(_) => break,
        }
    }
    Ok((events, valid))
}

/// The record file of a receiver whose data directory is `dir`, read without the server (for
/// drills, after the receiver stopped).
pub fn read_record(dir: &Path) -> std::io::Result<Vec<Event>> {
    Ok(read_events(&dir.join("effects.jsonl"))?.0)
}

/// The record's path in `dir`.
pub fn record_path(dir: &Path) -> PathBuf {
    dir.join("effects.jsonl")
}

/// The receiver's routes.
pub fn router(fake: Arc<Fake>) -> Router {
    Router::new()
        .route("/v1/effects", post(perform))
        .route("/v1/effects/{key}", get(status))
        .route("/v1/effects/{key}/compensate", post(compensate))
        .route("/v1/record", get(record))
        .route("/healthz", get(|| async { "ok\n" }))
        .layer(DefaultBodyLimit::max(MAX_PAYLOAD_BYTES))
        .with_state(fake)
}

struct Request {
    key: String,
    op: String,
    epoch: u64,
    attempt: u32,
    deadline_ms: Option<u64>,
    hash: String,
}

fn parse(headers: &HeaderMap, body: &[u8]) -> Result<Request, Refusal> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let number = |name: &str| text(name).and_then(|v| v.parse::<u64>().ok());
    let key = text(KEY_HEADER).unwrap_or("");
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(refusal(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            &format!("an {KEY_HEADER} header of 1 to {MAX_KEY_BYTES} bytes is required"),
        ));
    }
    Ok(Request {
        key: key.to_owned(),
        op: text(OP_HEADER).unwrap_or("").chars().take(300).collect(),
        epoch: number(EPOCH_HEADER).unwrap_or(0),
        attempt: number(ATTEMPT_HEADER).unwrap_or(0) as u32,
        deadline_ms: number(DEADLINE_HEADER),
        hash: payload_hash(body),
    })
}

/// Performs (or refuses) one delivery of `request`; the answer's status and body.
fn deliver(fake: &Fake, request: &Request) -> Result<(StatusCode, serde_json::Value), Refusal> {
    let mut book = fake.book.lock().expect("not poisoned");
    let event = |kind: &str, reference: String| Event {
        kind: kind.to_owned(),
        key: request.key.clone(),
        op: request.op.clone(),
        epoch: request.epoch,
        attempt: request.attempt,
        reference,
        payload_hash: request.hash.clone(),
        at_ms: now_ms(),
    };
    let broken = |e: std::io::Error| {
        refusal(
            StatusCode::INTERNAL_SERVER_ERROR,
            "storage_error",
            &e.to_string(),
        )
    };
    if book.events.len() >= MAX_EVENTS {
        return Err(refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "full",
            "the record is full",
        ));
    }
    if fake.capability == Capability::Lookup {
        let deadline = request.deadline_ms.unwrap_or(0);
        if now_ms() > deadline {
            book.append(event("refused_late", String::new()))
                .map_err(broken)?;
            return Ok((
                StatusCode::GONE,
                json!({"error": "deadline_passed",
                       "message": format!("arrived after its deadline {deadline}: not performed")}),
            ));
        }
    }
    if fake.capability == Capability::Idempotent {
        if let Some(first) = book.performed(&request.key).cloned() {
            if first.payload_hash != request.hash {
                return Ok((
                    StatusCode::UNPROCESSABLE_ENTITY,
                    json!({"error": "payload_mismatch",
                           "message": "this idempotency key was used with another payload"}),
                ));
            }
            book.append(event("replayed", first.reference.clone()))
                .map_err(broken)?;
            return Ok((
                StatusCode::OK,
                json!({"reference": first.reference, "replayed": true}),
            ));
        }
    }
    let reference = format!("fx-{}", book.events.len() + 1);
    book.append(event("performed", reference.clone()))
        .map_err(broken)?;
    Ok((
        StatusCode::OK,
        json!({"reference": reference, "replayed": false}),
    ))
}

/// Records an injected fault (durably: a crash follows some).
async fn note_fault(fake: &Arc<Fake>, request: &Request, name: &'static str) {
    let fake = fake.clone();
    let event = Event {
        kind: "fault".into(),
        key: request.key.clone(),
        op: request.op.clone(),
        epoch: request.epoch,
        attempt: request.attempt,
        reference: name.into(),
        payload_hash: request.hash.clone(),
        at_ms: now_ms(),
    };
    let _ = tokio::task::spawn_blocking(move || {
        let _ = fake.book.lock().expect("not poisoned").append(event);
    })
    .await;
}

async fn perform(State(fake): State<Arc<Fake>>, headers: HeaderMap, body: Bytes) -> Response {
    let request = match parse(&headers, &body) {
        Ok(request) => request,
        Err(refusal) => return refusal.into_response(),
    };
    let n = fake.requests.fetch_add(1, Ordering::Relaxed);
    if fake.roll(n, 1) < fake.faults.timeout_before {
        note_fault(&fake, &request, "timeout_before").await;
        tokio::time::sleep(fake.faults.hang).await;
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "timeout",
            "timed out; nothing performed",
        );
    }
    let deliveries = if fake.roll(n, 2) < fake.faults.duplicate {
        note_fault(&fake, &request, "duplicate").await;
        2
    } else {
        1
    };
    let mut answer = None;
    for _ in 0..deliveries {
        let worker = fake.clone();
        let request = clone_request(&request);
        let delivered = tokio::task::spawn_blocking(move || deliver(&worker, &request))
            .await
            .expect("delivery does not panic");
        match delivered {
            Ok(done) => answer = Some(done),
            Err(refusal) => return refusal.into_response(),
        }
    }
    let (status, body) = answer.expect("at least one delivery");
    if fake.roll(n, 3) < fake.faults.crash {
        note_fault(&fake, &request, "crash").await;
        tracing::warn!("fault: crashing after the effect was committed");
        std::process::abort();
    }
    if fake.roll(n, 4) < fake.faults.timeout_after {
        note_fault(&fake, &request, "timeout_after").await;
        tokio::time::sleep(fake.faults.hang).await;
    }
    if fake.roll(n, 5) < fake.faults.lose_answer {
        note_fault(&fake, &request, "lose_answer").await;
        // The status line goes out, then the connection breaks before the body: the sender
        // cannot know what happened.
        let broken = futures::stream::iter([Err::<Bytes, _>(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "fault: answer lost",
        ))]);
        return (status, Body::from_stream(broken)).into_response();
    }
    (status, Json(body)).into_response()
}

fn clone_request(r: &Request) -> Request {
    Request {
        key: r.key.clone(),
        op: r.op.clone(),
        epoch: r.epoch,
        attempt: r.attempt,
        deadline_ms: r.deadline_ms,
        hash: r.hash.clone(),
    }
}

async fn status(State(fake): State<Arc<Fake>>, UrlPath(key): UrlPath<String>) -> Response {
    if fake.capability == Capability::None {
        return error(
            StatusCode::NOT_IMPLEMENTED,
            "unsupported",
            "this receiver has no lookup",
        );
    }
    let book = fake.book.lock().expect("not poisoned");
    match book.performed(&key) {
        Some(event) => {
            Json(json!({"reference": event.reference, "performed": true})).into_response()
        }
        None => error(
            StatusCode::NOT_FOUND,
            "not_performed",
            "no effect with this key",
        ),
    }
}

async fn compensate(State(fake): State<Arc<Fake>>, UrlPath(key): UrlPath<String>) -> Response {
    let worker = fake.clone();
    let done = tokio::task::spawn_blocking(move || {
        let mut book = worker.book.lock().expect("not poisoned");
        let Some(first) = book.performed(&key).cloned() else {
            return error(
                StatusCode::NOT_FOUND,
                "not_performed",
                "no effect with this key",
            );
        };
        let reference = format!("comp-{}", first.reference);
        let event = Event {
            kind: "compensated".into(),
            reference: reference.clone(),
            at_ms: now_ms(),
            ..first
        };
        match book.append(event) {
            Ok(()) => Json(json!({"reference": reference})).into_response(),
            Err(e) => error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "storage_error",
                &e.to_string(),
            ),
        }
    })
    .await;
    done.unwrap_or_else(|e| {
        error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            &e.to_string(),
        )
    })
}

async fn record(State(fake): State<Arc<Fake>>) -> Response {
    Json(fake.events()).into_response()
}
