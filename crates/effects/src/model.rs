//! The ledger's rules, with no I/O: operation identity, states, and what each request does to
//! a record. Every ledger backend (embedded, PostgreSQL) loads the lock's fence and the
//! operation's record, calls one of the `decide_*` functions, and stores the result in the same
//! transaction, so the backends cannot disagree on P7.

use std::fmt;

use palisade_core::{Epoch, LockName};
use serde::{Deserialize, Serialize};
use sha2::Digest as _;

/// Longest operation id, in bytes (the application's name for one effect under a lock).
pub const MAX_OP_ID_BYTES: usize = 200;
/// Largest payload the ledger keeps for a retry through a deduplicating receiver: 64 KiB.
/// Bigger effects should send a reference to data stored elsewhere.
pub const MAX_PAYLOAD_BYTES: usize = 64 * 1024;
/// Attempts a record remembers (the newest; older ones are summarised by `attempt`).
pub const MAX_ATTEMPT_LOG: usize = 16;
/// How long after an attempt's deadline a lookup is trusted to be definitive: the largest
/// clock difference tolerated between the ledger's clients and a `lookup` receiver, which
/// compares the deadline with its own clock.
pub const LOOKUP_MARGIN_MS: u64 = 2_000;
/// Longest free text (reason, reviewer, note, receiver reference), in bytes.
pub const MAX_TEXT_BYTES: usize = 1_024;

/// Input that breaks one of the ledger's rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidOp(pub String);

/// What the receiver of an effect can do (declared by the application, per receiver).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Capability {
    /// Honours idempotency keys: a retry with the same key never performs the effect twice.
    Idempotent,
    /// Answers "was the effect with this key performed?" and refuses a request that arrives
    /// after the deadline it carries, so a lookup after the deadline is definitive.
    Lookup,
    /// Neither: an attempt whose outcome is unknown is never retried automatically; it goes to
    /// review.
    None,
}

impl Capability {
    /// The name on the command line and in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Capability::Idempotent => "idempotent",
            Capability::Lookup => "lookup",
            Capability::None => "none",
        }
    }

    /// Parses `idempotent`, `lookup` or `none`.
    pub fn parse(text: &str) -> Result<Self, InvalidOp> {
        match text {
            "idempotent" => Ok(Capability::Idempotent),
            "lookup" => Ok(Capability::Lookup),
            "none" => Ok(Capability::None),
            other => Err(InvalidOp(format!(
                "capability must be idempotent, lookup or none, not {other:?}"
            ))),
        }
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An operation's state (docs/effects.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpState {
    /// Known, and no attempt is outstanding: the next owner's run sends it.
    Pending,
    /// An attempt was recorded and may have been sent; its answer is not recorded yet.
    InFlight,
    /// The receiver answered that it performed the effect.
    Succeeded,
    /// The receiver answered that it refused the effect (nothing was performed).
    Failed,
    /// An attempt got no usable answer (timeout, lost answer, crash); only reconciliation
    /// resolves it.
    Unknown,
    /// Reconciliation established that the effect was performed.
    Reconciled,
    /// Nobody can tell automatically whether the effect was performed: a person decides.
    NeedsReview,
    /// A person recorded that the effect was compensated (undone by another effect).
    Compensated,
}

/// Every state, in display order.
pub const ALL_STATES: [OpState; 8] = [
    OpState::Pending,
    OpState::InFlight,
    OpState::Succeeded,
    OpState::Failed,
    OpState::Unknown,
    OpState::Reconciled,
    OpState::NeedsReview,
    OpState::Compensated,
];

impl OpState {
    /// The name in JSON and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            OpState::Pending => "pending",
            OpState::InFlight => "in_flight",
            OpState::Succeeded => "succeeded",
            OpState::Failed => "failed",
            OpState::Unknown => "unknown",
            OpState::Reconciled => "reconciled",
            OpState::NeedsReview => "needs_review",
            OpState::Compensated => "compensated",
        }
    }

    /// Parses a state name.
    pub fn parse(text: &str) -> Result<Self, InvalidOp> {
        ALL_STATES
            .into_iter()
            .find(|state| state.as_str() == text)
            .ok_or_else(|| {
                InvalidOp(format!(
                    "unknown state {text:?}; states are {}",
                    ALL_STATES.map(OpState::as_str).join(", ")
                ))
            })
    }

    /// True when nothing more will happen to the operation.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            OpState::Succeeded | OpState::Failed | OpState::Reconciled | OpState::Compensated
        )
    }

    /// True when an attempt is outstanding and its outcome is not known.
    pub fn is_in_doubt(self) -> bool {
        matches!(self, OpState::InFlight | OpState::Unknown)
    }
}

impl fmt::Display for OpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An operation's stable identity: the lock that authorises it and the application's id for
/// it (e.g. lock `invoice/7`, op `charge`; written `invoice/7:charge`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "RawOpId")]
pub struct OpId {
    /// The guarding lock.
    pub lock: LockName,
    /// The operation id: 1–200 bytes of `[A-Za-z0-9._/:-]`.
    pub op: String,
}

/// An [`OpId`] as it arrives, before validation (every deserialized id is validated).
#[derive(Deserialize)]
struct RawOpId {
    lock: LockName,
    op: String,
}

impl TryFrom<RawOpId> for OpId {
    type Error = InvalidOp;

    fn try_from(raw: RawOpId) -> Result<Self, InvalidOp> {
        OpId::new(raw.lock, raw.op)
    }
}

impl OpId {
    /// Validates the operation id.
    pub fn new(lock: LockName, op: impl Into<String>) -> Result<Self, InvalidOp> {
        let op = op.into();
        if op.is_empty() || op.len() > MAX_OP_ID_BYTES {
            return Err(InvalidOp(format!(
                "operation id must be 1 to {MAX_OP_ID_BYTES} bytes, not {}",
                op.len()
            )));
        }
        if let Some(bad) = op
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | ':' | '-')))
        {
            return Err(InvalidOp(format!(
                "operation id contains {bad:?}; allowed are A-Z a-z 0-9 . _ / : -"
            )));
        }
        Ok(Self { lock, op })
    }

    /// Parses `LOCK:OP` (lock names contain no `:`, so the first one separates them).
    pub fn parse(text: &str) -> Result<Self, InvalidOp> {
        let (lock, op) = text
            .split_once(':')
            .ok_or_else(|| InvalidOp(format!("{text:?} is not LOCK:OP (e.g. invoice/7:charge)")))?;
        let lock = LockName::new(lock).map_err(|e| InvalidOp(e.0))?;
        Self::new(lock, op)
    }

    /// The idempotency key every owner and every retry of this operation sends: derived from
    /// the identity alone (never from an epoch, an attempt or a clock), 44 characters.
    pub fn idempotency_key(&self) -> String {
        let mut hash = sha2::Sha256::new();
        hash.update(b"palisade-effect-v1\0");
        hash.update(self.lock.as_str().as_bytes());
        hash.update(b"\0");
        hash.update(self.op.as_bytes());
        format!("pal1-{}", &hex(&hash.finalize())[..39])
    }
}

impl fmt::Display for OpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.lock.as_str(), self.op)
    }
}

pub use palisade_core::hex;

/// SHA-256 of a payload, in hex: how the ledger tells a retry from a reuse of an operation id
/// for another effect.
pub fn payload_hash(payload: &[u8]) -> String {
    hex(&sha2::Sha256::digest(payload))
}

/// Caps free text at [`MAX_TEXT_BYTES`] (on a character boundary).
pub fn bounded_text(text: &str) -> String {
    let mut end = text.len().min(MAX_TEXT_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// One attempt, as the record remembers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptLog {
    /// 1, 2, …
    pub n: u32,
    /// The epoch of the owner that recorded it (for a reconciler's retry: the epoch of the
    /// attempt it retried). A decimal string in JSON ([`palisade_core::json`]).
    #[serde(with = "palisade_core::json::string")]
    pub epoch: u64,
    /// Who: `owner` or `reconciler`.
    pub by: String,
    /// When it was recorded (ms since the Unix epoch).
    pub started_ms: u64,
    /// What came of it, once known (`performed`, `refused: …`, `ambiguous: …`, …).
    pub result: Option<String>,
}

/// A person's verdict on an operation in review.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// The effect was performed: the operation is `reconciled`.
    Done,
    /// The effect was not performed: the operation is `pending` again and its next run sends
    /// it (the person takes responsibility for that retry).
    NotDone,
    /// The effect was performed and then undone: `compensated`.
    Compensated,
    /// Give up: `failed`, nothing more is sent.
    Abandon,
}

impl Verdict {
    /// Parses `done`, `not-done`, `compensated` or `abandon`.
    pub fn parse(text: &str) -> Result<Self, InvalidOp> {
        match text {
            "done" => Ok(Verdict::Done),
            "not-done" => Ok(Verdict::NotDone),
            "compensated" => Ok(Verdict::Compensated),
            "abandon" => Ok(Verdict::Abandon),
            other => Err(InvalidOp(format!(
                "verdict must be done, not-done, compensated or abandon, not {other:?}"
            ))),
        }
    }

    /// The name on the command line and in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Done => "done",
            Verdict::NotDone => "not-done",
            Verdict::Compensated => "compensated",
            Verdict::Abandon => "abandon",
        }
    }
}

/// A person's resolution of a review item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Review {
    /// The verdict.
    pub verdict: Verdict,
    /// Who decided.
    pub by: String,
    /// Why.
    pub why: String,
    /// When (ms since the Unix epoch).
    pub at_ms: u64,
}

/// The durable record of one operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The identity.
    pub id: OpId,
    /// Its idempotency key.
    pub key: String,
    /// SHA-256 of the payload (hex).
    pub payload_hash: String,
    /// The payload, kept for a reconciler's retry through a deduplicating receiver.
    #[serde(with = "serde_b64")]
    pub payload: Vec<u8>,
    /// The receiver's name (the application's label).
    pub receiver: String,
    /// What the receiver can do.
    pub capability: Capability,
    /// The state.
    pub state: OpState,
    /// The current attempt's number (0: never attempted).
    pub attempt: u32,
    /// The epoch of the current attempt.
    #[serde(with = "palisade_core::json::string")]
    pub epoch: u64,
    /// The current attempt must not be sent after this (ms since the Unix epoch); a `lookup`
    /// receiver refuses it after this.
    pub deadline_ms: u64,
    /// Created (ms since the Unix epoch).
    pub created_ms: u64,
    /// Last changed.
    pub updated_ms: u64,
    /// The receiver's reference for the performed effect (e.g. a charge id).
    pub reference: Option<String>,
    /// Why it is in its state (an error, a refusal, a review reason).
    pub detail: Option<String>,
    /// A person's resolution, if any.
    pub review: Option<Review>,
    /// The newest attempts.
    pub attempts: Vec<AttemptLog>,
}

pub mod serde_b64 {
    //! Bytes as base64 text in JSON.
    #![allow(missing_docs)]
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine as _;
    use serde::{Deserialize as _, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(deserializer)?;
        STANDARD.decode(text).map_err(serde::de::Error::custom)
    }
}

/// An owner's request to attempt an operation.
#[derive(Debug, Clone)]
pub struct BeginCheck<'a> {
    /// The identity.
    pub id: &'a OpId,
    /// The verified token's epoch.
    pub epoch: Epoch,
    /// The payload.
    pub payload: &'a [u8],
    /// The receiver's name.
    pub receiver: &'a str,
    /// Its capability.
    pub capability: Capability,
    /// How long the attempt may take before it must not be sent any more.
    pub attempt_timeout_ms: u64,
    /// Now (ms since the Unix epoch).
    pub now_ms: u64,
}

/// Why the ledger refused a request. Nothing was recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum LedgerRejection {
    /// A newer owner has begun an attempt under this lock: this owner may not start one.
    #[error("stale epoch {epoch}: the ledger's fence for the lock is at {fence}")]
    StaleEpoch {
        /// The request's epoch.
        #[serde(with = "palisade_core::json::string")]
        epoch: u64,
        /// The lock's fence in the ledger.
        #[serde(with = "palisade_core::json::string")]
        fence: u64,
    },
    /// The token is not valid for the lock (P4).
    #[error("invalid token: {message}")]
    InvalidToken {
        /// Why.
        message: String,
    },
    /// The operation id was used before for a different payload (or receiver).
    #[error("operation {op} was recorded with another {what}: an operation id names one effect")]
    Mismatch {
        /// The operation.
        op: String,
        /// `payload`, `receiver` or `capability`.
        what: String,
    },
    /// The request is not valid in the operation's state, or malformed.
    #[error("{message}")]
    Invalid {
        /// Why.
        message: String,
    },
    /// No such operation.
    #[error("no operation {op}")]
    NotFound {
        /// The operation.
        op: String,
    },
}

/// What `begin` decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BeginDecision {
    /// Record a new attempt (`in_flight`) and send it. `advance` raises the lock's fence to the
    /// epoch first.
    Attempt {
        /// The lock's fence moves to the request's epoch.
        advance: bool,
    },
    /// The operation is final; nothing is sent.
    Final,
    /// An earlier attempt is in doubt and its deadline has passed: look the key up at the
    /// receiver before anything else (`lookup` receivers).
    Lookup,
    /// An earlier attempt is in doubt and may still be sent; come back after this time.
    Wait {
        /// ms since the Unix epoch.
        until_ms: u64,
    },
    /// The operation needs a person (`move_to_review`: it goes to review now, with `reason`).
    Review {
        /// Move the record to `needs_review`.
        move_to_review: bool,
        /// Why.
        reason: String,
    },
    /// Refused.
    Reject(LedgerRejection),
}

/// The fence rule of the ledger: the activated-mode rule, with activation folded into the
/// first attempt. An epoch below the lock's fence is refused; a higher one advances it.
pub fn fence_check(fence: u64, epoch: u64) -> Result<bool, LedgerRejection> {
    if epoch == 0 || epoch < fence {
        Err(LedgerRejection::StaleEpoch { epoch, fence })
    } else {
        Ok(epoch > fence)
    }
}

/// `begin`: may this owner attempt this operation now?
pub fn decide_begin(
    fence: u64,
    existing: Option<&Record>,
    check: &BeginCheck<'_>,
) -> BeginDecision {
    let advance = match fence_check(fence, check.epoch.0) {
        Ok(advance) => advance,
        Err(rejection) => return BeginDecision::Reject(rejection),
    };
    let Some(record) = existing else {
        return BeginDecision::Attempt { advance };
    };
    let mismatch = if record.payload_hash != payload_hash(check.payload) {
        Some("payload")
    } else if record.receiver != check.receiver {
        Some("receiver")
    } else if record.capability != check.capability {
        Some("capability")
    } else {
        None
    };
    if let Some(what) = mismatch {
        return BeginDecision::Reject(LedgerRejection::Mismatch {
            op: record.id.to_string(),
            what: what.to_owned(),
        });
    }
    match record.state {
        state if state.is_final() => BeginDecision::Final,
        OpState::NeedsReview => BeginDecision::Review {
            move_to_review: false,
            reason: record.detail.clone().unwrap_or_default(),
        },
        OpState::Pending => BeginDecision::Attempt { advance },
        // In doubt: an earlier attempt (any owner's, this one's included) may have been sent.
        _ => match record.capability {
            // Same key, deduplicated by the receiver: a retry is safe at any time.
            Capability::Idempotent => BeginDecision::Attempt { advance },
            Capability::Lookup if check.now_ms < lookup_after(record) => BeginDecision::Wait {
                until_ms: lookup_after(record),
            },
            Capability::Lookup => BeginDecision::Lookup,
            Capability::None if check.now_ms < record.deadline_ms => BeginDecision::Wait {
                until_ms: record.deadline_ms,
            },
            Capability::None => BeginDecision::Review {
                move_to_review: true,
                reason: in_doubt_reason(record),
            },
        },
    }
}

/// When a lookup of the record's current attempt becomes definitive.
pub fn lookup_after(record: &Record) -> u64 {
    record.deadline_ms.saturating_add(LOOKUP_MARGIN_MS)
}

fn in_doubt_reason(record: &Record) -> String {
    format!(
        "attempt {} (epoch {}) may or may not have been performed, and the receiver can neither \
         deduplicate nor be asked: check it, then resolve{}",
        record.attempt,
        record.epoch,
        record
            .detail
            .as_deref()
            .map(|d| format!(" (last error: {d})"))
            .unwrap_or_default()
    )
}

/// Applies a `begin` that decided [`BeginDecision::Attempt`]: the new or updated record, now
/// `in_flight` with the next attempt number.
pub fn start_attempt(existing: Option<Record>, check: &BeginCheck<'_>, by: &str) -> Record {
    let mut record = existing.unwrap_or_else(|| Record {
        id: check.id.clone(),
        key: check.id.idempotency_key(),
        payload_hash: payload_hash(check.payload),
        payload: check.payload.to_vec(),
        receiver: check.receiver.to_owned(),
        capability: check.capability,
        state: OpState::Pending,
        attempt: 0,
        epoch: 0,
        deadline_ms: 0,
        created_ms: check.now_ms,
        updated_ms: check.now_ms,
        reference: None,
        detail: None,
        review: None,
        attempts: Vec::new(),
    });
    next_attempt(
        &mut record,
        check.epoch.0,
        by,
        check.now_ms,
        check.attempt_timeout_ms,
    );
    record
}

fn next_attempt(record: &mut Record, epoch: u64, by: &str, now_ms: u64, timeout_ms: u64) {
    record.attempt += 1;
    record.epoch = epoch;
    record.state = OpState::InFlight;
    record.deadline_ms = now_ms.saturating_add(timeout_ms);
    record.updated_ms = now_ms;
    // A person's verdict answered the previous attempt (it stays in that attempt's log).
    record.review = None;
    record.attempts.push(AttemptLog {
        n: record.attempt,
        epoch,
        by: by.to_owned(),
        started_ms: now_ms,
        result: None,
    });
    if record.attempts.len() > MAX_ATTEMPT_LOG {
        record.attempts.remove(0);
    }
}

/// What a receiver answered to one attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum SendResult {
    /// It performed the effect (or had performed it under this key before).
    Performed {
        /// Its reference for the effect.
        reference: Option<String>,
    },
    /// It refused: nothing was performed, and the same request would be refused again.
    Refused {
        /// Why.
        reason: String,
    },
    /// No usable answer: it may or may not have performed the effect.
    Ambiguous {
        /// What went wrong.
        reason: String,
    },
    /// Not performed, and it never will be: the attempt was not sent before its deadline, or
    /// the receiver refused it for arriving after its deadline. The operation is `pending`
    /// again (a new attempt sends it).
    Expired {
        /// What happened.
        reason: String,
    },
}

impl SendResult {
    fn summary(&self) -> String {
        match self {
            SendResult::Performed { .. } => "performed".to_owned(),
            SendResult::Refused { reason } => bounded_text(&format!("refused: {reason}")),
            SendResult::Ambiguous { reason } => bounded_text(&format!("ambiguous: {reason}")),
            SendResult::Expired { reason } => bounded_text(&format!("expired: {reason}")),
        }
    }
}

/// How the ledger answered a request about an existing attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// Recorded: the record changed.
    Recorded,
    /// Not recorded: the attempt is not the operation's current one, or the state no longer
    /// allows it (a newer attempt, a person's verdict, or a reconciliation came first).
    Superseded,
}

fn open_to_answers(record: &Record, attempt: u32) -> bool {
    record.attempt == attempt
        && (record.state.is_in_doubt()
            || (record.state == OpState::NeedsReview && record.review.is_none()))
}

fn log_result(record: &mut Record, attempt: u32, result: String) {
    if let Some(entry) = record.attempts.iter_mut().rev().find(|a| a.n == attempt) {
        entry.result = Some(result);
    }
}

/// `finish`: records the receiver's answer to `attempt`. Evidence from the attempt itself is
/// accepted while the operation is in doubt (even after it went to review without a verdict).
pub fn apply_finish(
    record: &mut Record,
    attempt: u32,
    result: &SendResult,
    now_ms: u64,
) -> Applied {
    if !open_to_answers(record, attempt) {
        return Applied::Superseded;
    }
    log_result(record, attempt, result.summary());
    record.updated_ms = now_ms;
    match result {
        SendResult::Performed { reference } => {
            record.state = OpState::Succeeded;
            record.reference = reference.as_deref().map(bounded_text);
            record.detail = None;
        }
        SendResult::Refused { reason } => {
            record.state = OpState::Failed;
            record.detail = Some(bounded_text(reason));
        }
        SendResult::Expired { reason } => {
            record.state = OpState::Pending;
            record.detail = Some(bounded_text(reason));
        }
        SendResult::Ambiguous { reason } => {
            record.detail = Some(bounded_text(reason));
            if record.state == OpState::InFlight {
                record.state = match record.capability {
                    Capability::None => OpState::NeedsReview,
                    _ => OpState::Unknown,
                };
                if record.state == OpState::NeedsReview {
                    record.detail = Some(in_doubt_reason(record));
                }
            }
        }
    }
    Applied::Recorded
}

/// What reconciliation established about an attempt in doubt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "settlement", rename_all = "snake_case")]
pub enum Settlement {
    /// The receiver performed it (a lookup found it, or a deduplicated retry answered).
    Performed {
        /// Its reference.
        reference: Option<String>,
    },
    /// A lookup after the attempt's deadline did not find it: it was not performed and can no
    /// longer be; the operation is `pending` again.
    NotPerformed,
    /// A deduplicated retry was refused: nothing was performed.
    Refused {
        /// Why.
        reason: String,
    },
    /// Undecidable automatically: `needs_review`.
    Review {
        /// Why.
        reason: String,
    },
}

/// `settle`: records what reconciliation established about `attempt`.
pub fn apply_settle(
    record: &mut Record,
    attempt: u32,
    settlement: &Settlement,
    now_ms: u64,
) -> Result<Applied, LedgerRejection> {
    if !open_to_answers(record, attempt) {
        return Ok(Applied::Superseded);
    }
    match settlement {
        Settlement::Performed { reference } => {
            log_result(record, attempt, "reconciled: performed".into());
            record.state = OpState::Reconciled;
            record.reference = reference.as_deref().map(bounded_text);
            record.detail = None;
        }
        Settlement::NotPerformed => {
            if record.capability != Capability::Lookup || now_ms < lookup_after(record) {
                return Err(LedgerRejection::Invalid {
                    message: "not_performed needs a lookup receiver and a passed deadline: before \
                              it, the attempt may still arrive"
                        .into(),
                });
            }
            log_result(record, attempt, "reconciled: not performed".into());
            record.state = OpState::Pending;
            record.detail = Some("a lookup after the deadline found no effect".into());
        }
        Settlement::Refused { reason } => {
            log_result(record, attempt, bounded_text(&format!("refused: {reason}")));
            record.state = OpState::Failed;
            record.detail = Some(bounded_text(reason));
        }
        Settlement::Review { reason } => {
            record.state = OpState::NeedsReview;
            record.detail = Some(bounded_text(reason));
        }
    }
    record.updated_ms = now_ms;
    Ok(Applied::Recorded)
}

/// `reattempt`: a reconciler's retry of an operation in doubt through a deduplicating
/// receiver (the only receivers to which anything but an owner's attempt is ever sent).
pub fn apply_reattempt(
    record: &mut Record,
    attempt: u32,
    now_ms: u64,
    timeout_ms: u64,
) -> Result<Applied, LedgerRejection> {
    if record.capability != Capability::Idempotent {
        return Err(LedgerRejection::Invalid {
            message: format!(
                "{} goes to a {} receiver: only an idempotent receiver is ever retried by a \
                 reconciler",
                record.id, record.capability
            ),
        });
    }
    if record.attempt != attempt || !record.state.is_in_doubt() {
        return Ok(Applied::Superseded);
    }
    let epoch = record.epoch;
    next_attempt(record, epoch, "reconciler", now_ms, timeout_ms);
    Ok(Applied::Recorded)
}

/// `resolve`: a person's verdict. Allowed while the operation is in review or in doubt past
/// its deadline; recorded with who and why.
pub fn apply_resolve(record: &mut Record, review: Review) -> Result<(), LedgerRejection> {
    let in_doubt_past_deadline = record.state.is_in_doubt() && review.at_ms >= record.deadline_ms;
    if record.state != OpState::NeedsReview && !in_doubt_past_deadline {
        return Err(LedgerRejection::Invalid {
            message: format!(
                "{} is {}: only an operation in review, or in doubt past its deadline, can be \
                 resolved",
                record.id, record.state
            ),
        });
    }
    if review.by.trim().is_empty() || review.why.trim().is_empty() {
        return Err(LedgerRejection::Invalid {
            message: "a resolution needs who (--by) and why (--why)".into(),
        });
    }
    record.state = match review.verdict {
        Verdict::Done => OpState::Reconciled,
        Verdict::NotDone => OpState::Pending,
        Verdict::Compensated => OpState::Compensated,
        Verdict::Abandon => OpState::Failed,
    };
    record.updated_ms = review.at_ms;
    record.detail = Some(format!(
        "resolved {} by {}: {}",
        review.verdict.as_str(),
        review.by,
        review.why
    ));
    let attempt = record.attempt;
    let summary = record.detail.clone().unwrap_or_default();
    log_result(record, attempt, bounded_text(&summary));
    record.review = Some(Review {
        by: bounded_text(&review.by),
        why: bounded_text(&review.why),
        ..review
    });
    Ok(())
}

pub use palisade_core::clock::now_ms;

#[cfg(test)]
#[path = "model_tests.rs"]
mod tests;
