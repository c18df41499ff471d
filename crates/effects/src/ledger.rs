//! The [`Ledger`] trait, and [`LocalLedger`]: the one implementation of its rules over any
//! [`Store`] (embedded redb or PostgreSQL) that can run a read-modify-write of one lock's fence
//! and one operation's record as a single durable transaction.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use palisade_fence::Verifier;
use serde::{Deserialize, Serialize};

use crate::model::{
    apply_finish, apply_reattempt, apply_resolve, apply_settle, bounded_text, decide_begin, now_ms,
    start_attempt, Applied, BeginCheck, BeginDecision, Capability, InvalidOp, LedgerRejection,
    OpId, OpState, Record, Review, SendResult, Settlement, Verdict, MAX_PAYLOAD_BYTES,
};

/// How long an attempt may take, by default, before it must not be sent any more: 30 s.
pub const DEFAULT_ATTEMPT_TIMEOUT_MS: u64 = 30_000;
/// Longest attempt timeout: one hour (a lookup or a review waits this long at most).
pub const MAX_ATTEMPT_TIMEOUT_MS: u64 = 3_600_000;
/// Most records one `list` returns.
pub const MAX_LIST: usize = 10_000;

/// A failure to reach or use the ledger's storage. Whether the request was recorded is unknown
/// to the caller; it is never a rejection, and a caller that did not get `Send` sends nothing.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// Storage failed (I/O, database, connection, HTTP).
    #[error("ledger storage error: {0}")]
    Storage(String),
    /// The stored data is not readable.
    #[error("ledger integrity violation: {0}")]
    Integrity(String),
    /// The ledger was copied back or restored from an older copy: it serves reads and
    /// changes nothing (P6 for the ledger). Nothing was recorded.
    #[error("restore required: {0}")]
    RestoreRequired(String),
}

/// An owner's request to attempt an operation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BeginRequest {
    /// The operation.
    pub id: OpId,
    /// The owner's token for `id.lock`.
    pub token: String,
    /// The effect's payload (at most [`MAX_PAYLOAD_BYTES`]).
    #[serde(with = "crate::model::serde_b64")]
    pub payload: Vec<u8>,
    /// The receiver's name.
    pub receiver: String,
    /// Its capability.
    pub capability: Capability,
    /// How long the attempt may take before it must not be sent.
    pub attempt_timeout_ms: u64,
}

/// An attempt the ledger recorded: the caller may send it, once, before `deadline_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    /// The operation.
    pub id: OpId,
    /// Its idempotency key.
    pub key: String,
    /// The attempt's number.
    pub n: u32,
    /// The epoch it was recorded under.
    pub epoch: u64,
    /// Not to be sent after this (ms since the Unix epoch).
    pub deadline_ms: u64,
    /// The payload.
    #[serde(with = "crate::model::serde_b64")]
    pub payload: Vec<u8>,
}

impl Attempt {
    fn of(record: &Record) -> Self {
        Self {
            id: record.id.clone(),
            key: record.key.clone(),
            n: record.attempt,
            epoch: record.epoch,
            deadline_ms: record.deadline_ms,
            payload: record.payload.clone(),
        }
    }
}

/// What `begin` answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "begin", rename_all = "snake_case")]
pub enum Begin {
    /// Recorded durably: send this attempt.
    Send {
        /// The attempt.
        attempt: Attempt,
    },
    /// Final already: nothing to send.
    Final {
        /// The record.
        record: Record,
    },
    /// An earlier attempt is in doubt past its deadline: look its key up first.
    Lookup {
        /// The record.
        record: Record,
    },
    /// An earlier attempt is in doubt and may still be sent: come back after `until_ms`.
    Wait {
        /// ms since the Unix epoch.
        until_ms: u64,
        /// The record.
        record: Record,
    },
    /// In review: a person decides.
    Review {
        /// The record.
        record: Record,
    },
    /// Refused; nothing recorded, nothing to send.
    Rejected {
        /// Why.
        rejection: LedgerRejection,
    },
}

/// What a request about an existing attempt did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum Answer {
    /// Recorded durably.
    Recorded {
        /// The record now.
        record: Record,
    },
    /// Not recorded: the attempt is no longer current (see [`Applied::Superseded`]).
    Superseded {
        /// The record now.
        record: Record,
    },
    /// Refused.
    Rejected {
        /// Why.
        rejection: LedgerRejection,
    },
}

impl Answer {
    /// The record, when there is one.
    pub fn record(&self) -> Option<&Record> {
        match self {
            Answer::Recorded { record } | Answer::Superseded { record } => Some(record),
            Answer::Rejected { .. } => None,
        }
    }
}

/// Which records `list` returns.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ListFilter {
    /// Only these states (all when empty).
    #[serde(default)]
    pub states: Vec<OpState>,
    /// Only operations of this lock.
    #[serde(default)]
    pub lock: Option<String>,
    /// At most this many (capped at [`MAX_LIST`]).
    #[serde(default)]
    pub limit: Option<usize>,
}

impl ListFilter {
    /// True when `record` passes the filter.
    pub fn admits(&self, record: &Record) -> bool {
        (self.states.is_empty() || self.states.contains(&record.state))
            && self
                .lock
                .as_deref()
                .is_none_or(|lock| record.id.lock.as_str() == lock)
    }

    /// The effective limit.
    pub fn limit(&self) -> usize {
        self.limit.unwrap_or(MAX_LIST).min(MAX_LIST)
    }
}

/// Counts for metrics and `palisade effects list --stats`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Operations by state (every state present, zeros included).
    pub by_state: BTreeMap<String, u64>,
    /// When the oldest operation in doubt (`in_flight` past its deadline, or `unknown`) last
    /// changed (ms since the Unix epoch); `None` when there is none.
    pub oldest_in_doubt_ms: Option<u64>,
}

impl Stats {
    /// Counts `records`, as of `now_ms`.
    pub fn of<'a>(records: impl IntoIterator<Item = &'a Record>, now_ms: u64) -> Self {
        let mut stats = Stats {
            by_state: crate::model::ALL_STATES
                .iter()
                .map(|s| (s.as_str().to_owned(), 0))
                .collect(),
            oldest_in_doubt_ms: None,
        };
        for record in records {
            *stats
                .by_state
                .entry(record.state.as_str().to_owned())
                .or_default() += 1;
            let doubtful = record.state == OpState::Unknown
                || (record.state == OpState::InFlight && now_ms >= record.deadline_ms);
            if doubtful {
                let at = record.updated_ms;
                stats.oldest_in_doubt_ms = Some(stats.oldest_in_doubt_ms.map_or(at, |o| o.min(at)));
            }
        }
        stats
    }

    /// Operations waiting for a person.
    pub fn review_queue(&self) -> u64 {
        self.by_state.get("needs_review").copied().unwrap_or(0)
    }
}

/// The effects ledger (P7).
///
/// Contract for every implementation (checked by [`crate::conformance`]):
/// - `begin` verifies the token for the operation's lock (P4) and refuses an epoch below the
///   lock's ledger fence; a higher epoch raises the fence in the same transaction, so once a
///   newer owner has begun any attempt under the lock, no older owner can begin one (P7);
/// - `Begin::Send` is returned only after the attempt is durable (it survives kill -9 of every
///   process and, for PostgreSQL, a database crash — P8): an effect is never sent unrecorded;
/// - an attempt in doubt is handed out again only for an idempotent receiver; a lookup
///   receiver's is looked up after its deadline, a receiver without either goes to review;
/// - every other answer (`finish`, `settle`, `reattempt`, `resolve`) is durable when
///   `Recorded` is returned; an answer about an attempt that is no longer current changes
///   nothing (`Superseded`);
/// - storage failures are `Err`, never rejections.
pub trait Ledger: Send + Sync {
    /// Records a new attempt if the owner may make one now.
    fn begin(
        &self,
        request: BeginRequest,
    ) -> impl Future<Output = Result<Begin, LedgerError>> + Send;

    /// Records the receiver's answer to the owner's attempt `attempt` (its token).
    fn finish(
        &self,
        token: &str,
        id: &OpId,
        attempt: u32,
        result: SendResult,
    ) -> impl Future<Output = Result<Answer, LedgerError>> + Send;

    /// Records what reconciliation established about `attempt`: by an owner after a lookup
    /// (`token` is its token for the lock, verified), or by a reconciler trusted by the ledger
    /// (`None`; over HTTP, the ledger's admin secret).
    fn settle(
        &self,
        token: Option<&str>,
        id: &OpId,
        attempt: u32,
        settlement: Settlement,
    ) -> impl Future<Output = Result<Answer, LedgerError>> + Send;

    /// A reconciler's retry of an idempotent operation in doubt: records attempt `attempt + 1`.
    fn reattempt(
        &self,
        id: &OpId,
        attempt: u32,
        attempt_timeout_ms: u64,
    ) -> impl Future<Output = Result<Answer, LedgerError>> + Send;

    /// A person's verdict on an operation in review.
    fn resolve(
        &self,
        id: &OpId,
        verdict: Verdict,
        by: &str,
        why: &str,
    ) -> impl Future<Output = Result<Answer, LedgerError>> + Send;

    /// One record.
    fn get(&self, id: &OpId) -> impl Future<Output = Result<Option<Record>, LedgerError>> + Send;

    /// Records passing `filter`, oldest change first.
    fn list(
        &self,
        filter: &ListFilter,
    ) -> impl Future<Output = Result<Vec<Record>, LedgerError>> + Send;

    /// Counts by state.
    fn stats(&self) -> impl Future<Output = Result<Stats, LedgerError>> + Send;
}

/// What a transaction must write back after a step ([`apply_step`]).
#[derive(Debug, PartialEq)]
pub struct StepWrites {
    /// The lock's new fence, when it moved (only up).
    pub fence: Option<u64>,
    /// The operation's new record, when it changed.
    pub record: Option<Record>,
}

/// The fence rule of every ledger store, in one place: `step` runs on the lock's fence — raised
/// first to `floor`, the coordinator's floor when the store learns one (0 otherwise) — and the
/// operation's record; a fence that would move down is an integrity error (nothing is
/// written); the rest is what changed. Pure: the store reads `fence` and `record` and writes
/// [`StepWrites`] in one transaction.
pub fn apply_step<T>(
    lock: &str,
    fence: u64,
    floor: u64,
    record: Option<Record>,
    step: impl FnOnce(&mut u64, &mut Option<Record>) -> T,
) -> Result<(T, StepWrites), LedgerError> {
    let mut fence_after = fence.max(floor);
    let mut record_after = record.clone();
    let out = step(&mut fence_after, &mut record_after);
    if fence_after < fence {
        return Err(LedgerError::Integrity(format!(
            "the fence of {lock} would move down from {fence} to {fence_after}"
        )));
    }
    let writes = StepWrites {
        fence: (fence_after != fence).then_some(fence_after),
        record: record_after.filter(|after| Some(after) != record.as_ref()),
    };
    Ok((out, writes))
}

/// The storage under a [`LocalLedger`]: one lock's fence and one operation's record, read,
/// changed by `step` and written back in **one** durable transaction that excludes every other
/// transaction on the same lock (P3). `step` is pure; when it changes neither, nothing is
/// written.
pub trait Store: Send + Sync + 'static {
    /// Runs `step` atomically and durably.
    fn transact<T: Send + 'static>(
        &self,
        id: &OpId,
        step: impl FnOnce(&mut u64, &mut Option<Record>) -> T + Send + 'static,
    ) -> impl Future<Output = Result<T, LedgerError>> + Send;

    /// One record.
    fn get(&self, id: &OpId) -> impl Future<Output = Result<Option<Record>, LedgerError>> + Send;

    /// Every record passing `filter`, oldest change first, at most `filter.limit()`.
    fn scan(
        &self,
        filter: &ListFilter,
    ) -> impl Future<Output = Result<Vec<Record>, LedgerError>> + Send;

    /// Counts by state.
    fn stats(&self, now_ms: u64) -> impl Future<Output = Result<Stats, LedgerError>> + Send;
}

/// The ledger's rules over a [`Store`].
pub struct LocalLedger<S> {
    store: S,
    verifier: Arc<Verifier>,
}

impl<S: Store> LocalLedger<S> {
    /// A ledger on `store` that trusts the coordinator keys of `verifier`.
    pub fn new(store: S, verifier: Arc<Verifier>) -> Self {
        Self { store, verifier }
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }
}

fn invalid(message: impl Into<String>) -> LedgerRejection {
    LedgerRejection::Invalid {
        message: message.into(),
    }
}

fn validate_begin(request: &BeginRequest) -> Result<(), LedgerRejection> {
    if request.payload.len() > MAX_PAYLOAD_BYTES {
        return Err(invalid(format!(
            "payload is {} bytes; the ledger keeps at most {MAX_PAYLOAD_BYTES}",
            request.payload.len()
        )));
    }
    if request.receiver.is_empty() || request.receiver.len() > 128 {
        return Err(invalid("receiver name must be 1 to 128 bytes"));
    }
    if !(1..=MAX_ATTEMPT_TIMEOUT_MS).contains(&request.attempt_timeout_ms) {
        return Err(invalid(format!(
            "attempt timeout must be 1 ms to {MAX_ATTEMPT_TIMEOUT_MS} ms"
        )));
    }
    Ok(())
}

fn not_found(id: &OpId) -> LedgerRejection {
    LedgerRejection::NotFound { op: id.to_string() }
}

/// Turns an [`InvalidOp`] into a rejection.
impl From<InvalidOp> for LedgerRejection {
    fn from(error: InvalidOp) -> Self {
        invalid(error.0)
    }
}

impl<S: Store> LocalLedger<S> {
    async fn answer(
        &self,
        id: &OpId,
        step: impl FnOnce(&mut Record) -> Result<Applied, LedgerRejection> + Send + 'static,
    ) -> Result<Answer, LedgerError> {
        self.answer_fenced(id, None, step).await
    }

    /// [`Self::answer`], refused when `epoch` is below the lock's ledger fence.
    async fn answer_fenced(
        &self,
        id: &OpId,
        epoch: Option<u64>,
        step: impl FnOnce(&mut Record) -> Result<Applied, LedgerRejection> + Send + 'static,
    ) -> Result<Answer, LedgerError> {
        let missing = not_found(id);
        self.store
            .transact(id, move |fence, slot| {
                if let Some(epoch) = epoch {
                    if let Err(rejection) = crate::model::fence_check(*fence, epoch) {
                        return Answer::Rejected { rejection };
                    }
                }
                let Some(record) = slot.as_mut() else {
                    return Answer::Rejected { rejection: missing };
                };
                let before = record.clone();
                match step(record) {
                    Ok(Applied::Recorded) => Answer::Recorded {
                        record: record.clone(),
                    },
                    Ok(Applied::Superseded) => {
                        *record = before.clone();
                        Answer::Superseded { record: before }
                    }
                    Err(rejection) => {
                        *record = before;
                        Answer::Rejected { rejection }
                    }
                }
            })
            .await
    }
}

impl<S: Store> Ledger for LocalLedger<S> {
    async fn begin(&self, request: BeginRequest) -> Result<Begin, LedgerError> {
        if let Err(rejection) = validate_begin(&request) {
            return Ok(Begin::Rejected { rejection });
        }
        let claims = match self.verifier.verify(&request.token, &request.id.lock) {
            Ok(claims) => claims,
            Err(error) => {
                return Ok(Begin::Rejected {
                    rejection: LedgerRejection::InvalidToken {
                        message: error.to_string(),
                    },
                })
            }
        };
        let id = request.id.clone();
        self.store
            .transact(&id, move |fence, slot| {
                let check = BeginCheck {
                    id: &request.id,
                    epoch: claims.epoch,
                    payload: &request.payload,
                    receiver: &request.receiver,
                    capability: request.capability,
                    attempt_timeout_ms: request.attempt_timeout_ms,
                    now_ms: now_ms(),
                };
                match decide_begin(*fence, slot.as_ref(), &check) {
                    BeginDecision::Attempt { advance } => {
                        if advance {
                            *fence = claims.epoch.0;
                        }
                        let record = start_attempt(slot.take(), &check, "owner");
                        let attempt = Attempt::of(&record);
                        *slot = Some(record);
                        Begin::Send { attempt }
                    }
                    BeginDecision::Final => Begin::Final {
                        record: slot.clone().expect("final needs a record"),
                    },
                    BeginDecision::Lookup => Begin::Lookup {
                        record: slot.clone().expect("lookup needs a record"),
                    },
                    BeginDecision::Wait { until_ms } => Begin::Wait {
                        until_ms,
                        record: slot.clone().expect("wait needs a record"),
                    },
                    BeginDecision::Review {
                        move_to_review,
                        reason,
                    } => {
                        let record = slot.as_mut().expect("review needs a record");
                        if move_to_review {
                            record.state = OpState::NeedsReview;
                            record.detail = Some(bounded_text(&reason));
                            record.updated_ms = check.now_ms;
                        }
                        Begin::Review {
                            record: record.clone(),
                        }
                    }
                    BeginDecision::Reject(rejection) => Begin::Rejected { rejection },
                }
            })
            .await
    }

    async fn finish(
        &self,
        token: &str,
        id: &OpId,
        attempt: u32,
        result: SendResult,
    ) -> Result<Answer, LedgerError> {
        let epoch = match self.verifier.verify(token, &id.lock) {
            Ok(claims) => claims.epoch.0,
            Err(error) => {
                return Ok(Answer::Rejected {
                    rejection: LedgerRejection::InvalidToken {
                        message: error.to_string(),
                    },
                })
            }
        };
        self.answer(id, move |record| {
            let own = record
                .attempts
                .iter()
                .find(|a| a.n == attempt)
                .is_some_and(|a| a.epoch == epoch && a.by == "owner");
            if !own && record.attempt == attempt {
                return Err(invalid(format!(
                    "attempt {attempt} was not recorded under this token's epoch {epoch}"
                )));
            }
            Ok(apply_finish(record, attempt, &result, now_ms()))
        })
        .await
    }

    async fn settle(
        &self,
        token: Option<&str>,
        id: &OpId,
        attempt: u32,
        settlement: Settlement,
    ) -> Result<Answer, LedgerError> {
        // An owner settles only as the lock's current owner (its epoch at or above the
        // ledger's fence): a superseded owner's word about an attempt is not taken.
        let epoch = match token.map(|t| self.verifier.verify(t, &id.lock)) {
            None => None,
            Some(Ok(claims)) => Some(claims.epoch.0),
            Some(Err(error)) => {
                return Ok(Answer::Rejected {
                    rejection: LedgerRejection::InvalidToken {
                        message: error.to_string(),
                    },
                })
            }
        };
        self.answer_fenced(id, epoch, move |record| {
            apply_settle(record, attempt, &settlement, now_ms())
        })
        .await
    }

    async fn reattempt(
        &self,
        id: &OpId,
        attempt: u32,
        attempt_timeout_ms: u64,
    ) -> Result<Answer, LedgerError> {
        if !(1..=MAX_ATTEMPT_TIMEOUT_MS).contains(&attempt_timeout_ms) {
            return Ok(Answer::Rejected {
                rejection: invalid("attempt timeout out of range"),
            });
        }
        self.answer(id, move |record| {
            apply_reattempt(record, attempt, now_ms(), attempt_timeout_ms)
        })
        .await
    }

    async fn resolve(
        &self,
        id: &OpId,
        verdict: Verdict,
        by: &str,
        why: &str,
    ) -> Result<Answer, LedgerError> {
        let review = Review {
            verdict,
            by: by.to_owned(),
            why: why.to_owned(),
            at_ms: now_ms(),
        };
        self.answer(id, move |record| {
            apply_resolve(record, review).map(|()| Applied::Recorded)
        })
        .await
    }

    async fn get(&self, id: &OpId) -> Result<Option<Record>, LedgerError> {
        self.store.get(id).await
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>, LedgerError> {
        self.store.scan(filter).await
    }

    async fn stats(&self) -> Result<Stats, LedgerError> {
        self.store.stats(now_ms()).await
    }
}

#[cfg(test)]
mod apply_step_tests {
    use super::*;

    #[test]
    fn p7_a_fence_never_moves_down_in_any_store() {
        let down = apply_step("l", 5, 0, None, |fence, _| *fence = 3);
        assert!(matches!(down, Err(LedgerError::Integrity(_))), "{down:?}");
    }

    #[test]
    fn p6_the_floor_raises_the_fence_the_step_sees_and_is_written() {
        let (seen, writes) = apply_step("l", 5, 7, None, |fence, _| *fence).unwrap();
        assert_eq!(seen, 7);
        assert_eq!(
            writes,
            StepWrites {
                fence: Some(7),
                record: None
            }
        );
    }

    #[test]
    fn a_step_that_changes_nothing_writes_nothing() {
        let ((), writes) = apply_step("l", 5, 3, None, |_, _| ()).unwrap();
        assert_eq!(
            writes,
            StepWrites {
                fence: None,
                record: None
            }
        );
    }
}
