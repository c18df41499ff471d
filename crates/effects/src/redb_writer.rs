//! The embedded ledger's writer thread: group commit. Every queued transaction is applied in
//! order inside **one** redb write transaction (each sees the ones before it, so each is still
//! atomic with respect to every other: P3), committed with `Durability::Immediate`, and only
//! then answered (P8) — one commit, and its fsyncs, for a whole batch.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use redb::{Database, ReadableTable as _, Table, TableDefinition};
use tokio::sync::mpsc;

use crate::ledger::LedgerError;
use crate::model::{OpId, Record};

/// Transactions waiting for the writer; callers wait when it is full.
pub const QUEUE_CAPACITY: usize = 8_192;
/// Most transactions in one commit.
pub const MAX_BATCH: usize = 1_024;

pub(crate) const FENCES: TableDefinition<&str, u64> = TableDefinition::new("effect_fences");
pub(crate) const OPS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("effect_ops");
pub(crate) const META: TableDefinition<&str, &str> = TableDefinition::new("effect_meta");

/// The tables a transaction works on.
pub(crate) struct Tables<'t> {
    fences: Table<'t, &'static str, u64>,
    ops: Table<'t, (&'static str, &'static str), &'static [u8]>,
}

/// Answers a transaction once its batch's fate is known.
pub(crate) type Completion = Box<dyn FnOnce(Result<(), LedgerError>) + Send>;
/// One queued transaction: applies itself, says whether it changed anything, and how to
/// answer. An `Err` aborts the whole batch (nothing is committed).
pub(crate) type Job = Box<
    dyn FnOnce(&mut Tables<'_>) -> Result<(bool, Completion), (LedgerError, Completion)> + Send,
>;

pub(crate) fn storage(error: impl std::fmt::Display) -> LedgerError {
    LedgerError::Storage(error.to_string())
}

pub(crate) fn decode(bytes: &[u8]) -> Result<Record, LedgerError> {
    serde_json::from_slice(bytes)
        .map_err(|e| LedgerError::Integrity(format!("unreadable ledger record: {e}")))
}

/// Builds the job of one `transact`: `step` on the lock's fence and the operation's record,
/// written back when it changed them; `answer` gets `step`'s output after the commit.
pub(crate) fn job<T: Send + 'static>(
    id: OpId,
    step: impl FnOnce(&mut u64, &mut Option<Record>) -> T + Send + 'static,
    answer: tokio::sync::oneshot::Sender<Result<T, LedgerError>>,
) -> Job {
    Box::new(move |tables| {
        let applied = apply(tables, &id, step);
        match applied {
            Ok((out, changed)) => {
                let completion: Completion = Box::new(move |committed| {
                    let _ = answer.send(committed.map(|()| out));
                });
                Ok((changed, completion))
            }
            Err(error) => {
                let completion: Completion = Box::new(move |committed| {
                    let _ = answer.send(
                        committed.and(Err(LedgerError::Storage("the batch was aborted".into()))),
                    );
                });
                Err((error, completion))
            }
        }
    })
}

fn apply<T>(
    tables: &mut Tables<'_>,
    id: &OpId,
    step: impl FnOnce(&mut u64, &mut Option<Record>) -> T,
) -> Result<(T, bool), LedgerError> {
    let lock = id.lock.as_str();
    let fence_before = tables
        .fences
        .get(lock)
        .map_err(storage)?
        .map_or(0, |v| v.value());
    let record_before = match tables.ops.get((lock, id.op.as_str())).map_err(storage)? {
        Some(value) => Some(decode(value.value())?),
        None => None,
    };
    let (out, writes) = crate::ledger::apply_step(lock, fence_before, 0, record_before, step)?;
    let mut changed = false;
    if let Some(fence) = writes.fence {
        tables.fences.insert(lock, fence).map_err(storage)?;
        changed = true;
    }
    if let Some(record) = &writes.record {
        let bytes = serde_json::to_vec(record).map_err(storage)?;
        tables
            .ops
            .insert((lock, id.op.as_str()), bytes.as_slice())
            .map_err(storage)?;
        changed = true;
    }
    Ok((out, changed))
}

/// Runs batches until every sender is gone. `seq` counts committed changes (the witness
/// follows it).
pub(crate) fn run(db: Arc<Database>, seq: Arc<AtomicU64>, mut queue: mpsc::Receiver<Job>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while let Some(first) = queue.blocking_recv() {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        commit_batch(&db, &seq, &mut batch);
    }
}

fn commit_batch(db: &Database, seq: &AtomicU64, batch: &mut Vec<Job>) {
    let mut completions: Vec<Completion> = Vec::with_capacity(batch.len());
    let result = (|| {
        let mut txn = db.begin_write().map_err(storage)?;
        txn.set_durability(redb::Durability::Immediate)
            .map_err(storage)?;
        let mut changes = 0u64;
        let mut failure = None;
        {
            let mut tables = Tables {
                fences: txn.open_table(FENCES).map_err(storage)?,
                ops: txn.open_table(OPS).map_err(storage)?,
            };
            for job in batch.drain(..) {
                match job(&mut tables) {
                    Ok((changed, completion)) => {
                        changes += u64::from(changed);
                        completions.push(completion);
                    }
                    Err((error, completion)) => {
                        completions.push(completion);
                        failure.get_or_insert(error);
                    }
                }
            }
        }
        if let Some(error) = failure {
            txn.abort().map_err(storage)?;
            return Err(error);
        }
        if changes == 0 {
            txn.abort().map_err(storage)?;
            return Ok(());
        }
        let next = seq.load(Ordering::SeqCst) + changes;
        {
            let mut meta = txn.open_table(META).map_err(storage)?;
            meta.insert("seq", next.to_string().as_str())
                .map_err(storage)?;
        }
        txn.commit().map_err(storage)?;
        seq.store(next, Ordering::SeqCst);
        Ok(())
    })();
    // Jobs not reached (the transaction could not start) are answered too.
    for job in batch.drain(..) {
        drop(job);
    }
    for completion in completions {
        completion(match &result {
            Ok(()) => Ok(()),
            Err(error) => Err(LedgerError::Storage(error.to_string())),
        });
    }
}
