//! [`perform`]: what an owner calls to cause an effect, and [`reconcile_once`]: what a
//! reconciler runs to resolve the operations left in doubt. Both follow the ledger: an effect is
//! sent only for an attempt the ledger recorded, and an attempt in doubt is resolved by the
//! receiver's capability, never by a timer alone.

use std::time::Duration;

use serde::Serialize;

use crate::ledger::{Answer, Attempt, Begin, BeginRequest, Ledger, LedgerError, ListFilter};
use crate::model::{
    now_ms, Capability, LedgerRejection, OpId, OpState, Record, SendResult, Settlement,
};
use crate::receiver::{Receiver, ReceiverError, Status};

/// Where an owner's run is, for tests and drills that stop or kill it there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The attempt is recorded, its deadline checked, and it is not sent yet.
    Recorded,
    /// The receiver answered and the answer is not recorded yet.
    Answered,
}

/// How an owner's run behaves.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// An attempt must be sent within this time of being recorded.
    pub attempt_timeout: Duration,
    /// Longest the run waits for an earlier attempt in doubt before it gives up (`InDoubt`).
    pub max_wait: Duration,
    /// Most rounds of begin/send/finish in one run.
    pub max_rounds: u32,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            attempt_timeout: Duration::from_millis(crate::ledger::DEFAULT_ATTEMPT_TIMEOUT_MS),
            max_wait: Duration::from_secs(5),
            max_rounds: 4,
        }
    }
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Done {
    /// The effect was performed (now or before).
    Performed(Record),
    /// The receiver refused it (or a person abandoned it): not performed.
    Failed(Record),
    /// A person must decide (receiver without deduplication or lookup).
    Review(Record),
    /// Still in doubt (a reconciler, or a later run, resolves it).
    InDoubt(Record),
}

impl Done {
    /// The record.
    pub fn record(&self) -> &Record {
        match self {
            Done::Performed(r) | Done::Failed(r) | Done::Review(r) | Done::InDoubt(r) => r,
        }
    }

    fn of(record: Record) -> Self {
        match record.state {
            OpState::Succeeded | OpState::Reconciled | OpState::Compensated => {
                Done::Performed(record)
            }
            OpState::Failed => Done::Failed(record),
            OpState::NeedsReview => Done::Review(record),
            _ => Done::InDoubt(record),
        }
    }
}

/// Why a run could not proceed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The ledger refused (stale owner, bad token, operation reused): nothing was sent.
    #[error("refused by the ledger: {0}")]
    Rejected(LedgerRejection),
    /// The ledger could not be reached: if an attempt was sent, it is in doubt.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// Causes the effect `payload` for operation `id`, under `token`, through `receiver`,
/// recording every attempt in `ledger` before it is sent. `hook` is called at each [`Step`]
/// (a drill stops or kills the process there; an application passes `|_, _| {}`).
pub async fn perform<L: Ledger, R: Receiver>(
    ledger: &L,
    receiver: &R,
    token: &str,
    id: &OpId,
    payload: &[u8],
    options: &RunOptions,
    hook: impl Fn(Step, &Attempt),
) -> Result<Done, RunError> {
    let mut last: Option<Record> = None;
    for _ in 0..options.max_rounds.max(1) {
        let begin = ledger
            .begin(BeginRequest {
                id: id.clone(),
                token: token.to_owned(),
                payload: payload.to_vec(),
                receiver: receiver.name().to_owned(),
                capability: receiver.capability(),
                attempt_timeout_ms: options.attempt_timeout.as_millis() as u64,
            })
            .await?;
        let round = match begin {
            Begin::Send { attempt } => {
                send_round(ledger, receiver, token, id, attempt, &hook).await?
            }
            Begin::Final { record } | Begin::Review { record } => Round::Done(Done::of(record)),
            Begin::Lookup { record } => lookup_round(ledger, receiver, token, id, record).await?,
            Begin::Wait { until_ms, record } => {
                let wait = until_ms.saturating_sub(now_ms());
                if wait > options.max_wait.as_millis() as u64 {
                    Round::Done(Done::InDoubt(record))
                } else {
                    tokio::time::sleep(Duration::from_millis(wait + 1)).await;
                    Round::Again(Some(record))
                }
            }
            Begin::Rejected { rejection } => return Err(RunError::Rejected(rejection)),
        };
        match round {
            Round::Done(done) => return Ok(done),
            Round::Again(record) => last = record,
        }
    }
    match last {
        Some(record) => Ok(Done::of(record)),
        None => Err(RunError::Ledger(LedgerError::Storage(
            "no answer from the ledger".into(),
        ))),
    }
}

/// What one round of [`perform`] came to.
enum Round {
    /// The operation's outcome, for the caller.
    Done(Done),
    /// Not settled yet: another round, with the record as last seen (if any).
    Again(Option<Record>),
}

/// Sends the recorded `attempt` (unless its deadline passed) and records the answer.
async fn send_round<L: Ledger, R: Receiver>(
    ledger: &L,
    receiver: &R,
    token: &str,
    id: &OpId,
    attempt: Attempt,
    hook: &impl Fn(Step, &Attempt),
) -> Result<Round, RunError> {
    let result = if now_ms() >= attempt.deadline_ms {
        SendResult::Expired {
            reason: "not sent: the attempt's deadline passed before sending".into(),
        }
    } else {
        // The window no check can close: a pause here sends the attempt late.
        hook(Step::Recorded, &attempt);
        receiver.send(&attempt).await
    };
    hook(Step::Answered, &attempt);
    match ledger.finish(token, id, attempt.n, result).await? {
        Answer::Recorded { record } | Answer::Superseded { record } => {
            if record.state.is_final() || record.state == OpState::NeedsReview {
                return Ok(Round::Done(Done::of(record)));
            }
            Ok(Round::Again(Some(record)))
        }
        Answer::Rejected { rejection } => Err(RunError::Rejected(rejection)),
    }
}

/// Asks the receiver whether the attempt in doubt was performed, and settles it by the answer
/// (no answer: the operation stays in doubt).
async fn lookup_round<L: Ledger, R: Receiver>(
    ledger: &L,
    receiver: &R,
    token: &str,
    id: &OpId,
    record: Record,
) -> Result<Round, RunError> {
    let status = match receiver.status(&record.key).await {
        Ok(status) => status,
        Err(_) => return Ok(Round::Done(Done::InDoubt(record))),
    };
    let settlement = match status {
        Status::Performed { reference } => Settlement::Performed { reference },
        Status::NotPerformed => Settlement::NotPerformed,
    };
    match ledger
        .settle(Some(token), id, record.attempt, settlement)
        .await?
    {
        Answer::Rejected { rejection } => Err(RunError::Rejected(rejection)),
        answer => Ok(Round::Again(answer.record().cloned())),
    }
}

/// What one reconciliation pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReconcileReport {
    /// Operations in doubt examined.
    pub examined: u64,
    /// In doubt, but their attempt may still be sent (before its deadline): left alone.
    pub not_due: u64,
    /// Established as performed (a lookup, or a deduplicated retry's answer).
    pub performed: u64,
    /// Established as not performed (lookup after the deadline): `pending` again.
    pub not_performed: u64,
    /// Retried through a deduplicating receiver.
    pub retried: u64,
    /// Refused by the receiver on a deduplicated retry: `failed`.
    pub refused: u64,
    /// Sent to review (no deduplication, no lookup).
    pub to_review: u64,
    /// Still in doubt after this pass (receiver unreachable, ambiguous retry).
    pub left: u64,
    /// For another receiver: skipped.
    pub skipped: u64,
}

async fn settle_into(
    ledger: &impl Ledger,
    record: &Record,
    attempt: u32,
    settlement: Settlement,
) -> Result<bool, LedgerError> {
    Ok(matches!(
        ledger.settle(None, &record.id, attempt, settlement).await?,
        Answer::Recorded { .. }
    ))
}

/// One reconciliation pass over at most `limit` operations in doubt for `receiver`.
///
/// - `idempotent`: an attempt past its deadline (or `unknown`) is retried with the same key
///   (the receiver deduplicates), and the answer settles it;
/// - `lookup`: past the deadline and the lookup margin, the key is looked up: performed →
///   `reconciled`, not found → `pending` (the next owner's run sends it); never a blind retry;
/// - `none`: past the deadline, `needs_review`; nothing is ever sent.
pub async fn reconcile_once<L: Ledger, R: Receiver>(
    ledger: &L,
    receiver: &R,
    attempt_timeout: Duration,
    limit: usize,
) -> Result<ReconcileReport, LedgerError> {
    let filter = ListFilter {
        states: vec![OpState::InFlight, OpState::Unknown],
        lock: None,
        limit: Some(limit),
    };
    let mut report = ReconcileReport::default();
    for record in ledger.list(&filter).await? {
        if record.receiver != receiver.name() || record.capability != receiver.capability() {
            // Another receiver's, or declared with another capability than this reconciler
            // was told: it is not this reconciler's to resolve.
            report.skipped += 1;
            continue;
        }
        report.examined += 1;
        let now = now_ms();
        let due = match record.capability {
            Capability::Lookup => now >= crate::model::lookup_after(&record),
            _ => record.state == OpState::Unknown || now >= record.deadline_ms,
        };
        if !due {
            report.not_due += 1;
            continue;
        }
        let resolved = match record.capability {
            Capability::Idempotent => {
                let resolved = reattempt(ledger, receiver, &record, attempt_timeout).await?;
                if resolved.is_some() {
                    report.retried += 1;
                }
                resolved.unwrap_or(Resolved::Left)
            }
            Capability::Lookup => look_up(ledger, receiver, &record).await?,
            Capability::None => to_review(ledger, &record).await?,
        };
        match resolved {
            Resolved::Performed => report.performed += 1,
            Resolved::Refused => report.refused += 1,
            Resolved::NotPerformed => report.not_performed += 1,
            Resolved::ToReview => report.to_review += 1,
            Resolved::Left => report.left += 1,
        }
    }
    Ok(report)
}

/// What the reconciler made of one operation.
enum Resolved {
    Performed,
    Refused,
    NotPerformed,
    ToReview,
    /// Left as it was (no answer, or the ledger no longer takes this attempt's settlement).
    Left,
}

/// Settles `record` at attempt `n` with `settlement`: `then` when the ledger took it, else
/// [`Resolved::Left`].
async fn settled<L: Ledger>(
    ledger: &L,
    record: &Record,
    n: u32,
    settlement: Settlement,
    then: Resolved,
) -> Result<Resolved, LedgerError> {
    Ok(match settle_into(ledger, record, n, settlement).await? {
        true => then,
        false => Resolved::Left,
    })
}

/// An idempotent receiver: the operation is sent again under a new attempt (same key). `None`
/// when the ledger hands out no new attempt.
async fn reattempt<L: Ledger, R: Receiver>(
    ledger: &L,
    receiver: &R,
    record: &Record,
    attempt_timeout: Duration,
) -> Result<Option<Resolved>, LedgerError> {
    let timeout_ms = attempt_timeout.as_millis() as u64;
    let answer = ledger
        .reattempt(&record.id, record.attempt, timeout_ms)
        .await?;
    let Answer::Recorded { record: retried } = answer else {
        return Ok(None);
    };
    let attempt = Attempt {
        id: retried.id.clone(),
        key: retried.key.clone(),
        n: retried.attempt,
        epoch: retried.epoch,
        deadline_ms: retried.deadline_ms,
        payload: retried.payload.clone(),
    };
    let (settlement, then) = match receiver.send(&attempt).await {
        SendResult::Performed { reference } => {
            (Settlement::Performed { reference }, Resolved::Performed)
        }
        SendResult::Refused { reason } => (Settlement::Refused { reason }, Resolved::Refused),
        SendResult::Ambiguous { .. } | SendResult::Expired { .. } => {
            return Ok(Some(Resolved::Left))
        }
    };
    settled(ledger, &retried, attempt.n, settlement, then)
        .await
        .map(Some)
}

/// A receiver that can be asked: its answer for the operation's key settles it.
async fn look_up<L: Ledger, R: Receiver>(
    ledger: &L,
    receiver: &R,
    record: &Record,
) -> Result<Resolved, LedgerError> {
    let (settlement, then) = match receiver.status(&record.key).await {
        Ok(Status::Performed { reference }) => {
            (Settlement::Performed { reference }, Resolved::Performed)
        }
        Ok(Status::NotPerformed) => (Settlement::NotPerformed, Resolved::NotPerformed),
        Err(ReceiverError::Unsupported(_)) | Err(ReceiverError::Unavailable(_)) => {
            return Ok(Resolved::Left)
        }
    };
    settled(ledger, record, record.attempt, settlement, then).await
}

/// A receiver that can neither deduplicate nor be asked: a person decides.
async fn to_review<L: Ledger>(ledger: &L, record: &Record) -> Result<Resolved, LedgerError> {
    let reason = format!(
        "attempt {} (epoch {}) got no answer before its deadline, and the receiver \
         can neither deduplicate nor be asked: check it, then resolve",
        record.attempt, record.epoch
    );
    let settlement = Settlement::Review { reason };
    settled(
        ledger,
        record,
        record.attempt,
        settlement,
        Resolved::ToReview,
    )
    .await
}
