//! The writer thread: applies queued jobs in order inside one write transaction per batch.

use std::sync::Arc;

use palisade_core::Epoch;
use palisade_fence::rules::{self, ActivationStep};
use palisade_fence::{value_digest, Activation, FenceError, FenceMode, Outcome, Rejection};
use redb::{Database, Durability, ReadableTable, Table, WriteTransaction};
use tokio::sync::{mpsc, oneshot};

use crate::records::{decode_pair, encode_value, storage, Meta, FENCES, HIGHEST, KV, LEDGER, META};
use crate::witness::StoreWitness;

/// Most jobs applied in one transaction.
pub const MAX_BATCH: usize = 1_024;

/// A verified write or activation, waiting for the writer.
pub enum Job {
    Write {
        lock: String,
        key: String,
        epoch: Epoch,
        seq: Option<u64>,
        value: Vec<u8>,
        reply: oneshot::Sender<Result<Outcome, FenceError>>,
    },
    Activate {
        lock: String,
        epoch: Epoch,
        reply: oneshot::Sender<Result<Activation, FenceError>>,
    },
}

/// The rejection of an epoch at or below the restore floor.
fn below_floor(floor: Epoch) -> Rejection {
    Rejection::StaleEpoch {
        fence: floor,
        fence_seq: None,
    }
}

/// An answer held until the batch's commit.
enum Answer {
    Write(oneshot::Sender<Result<Outcome, FenceError>>, Outcome),
    Activate(oneshot::Sender<Result<Activation, FenceError>>, Activation),
}

impl Answer {
    /// The epoch this answer applied (0 when it applied nothing).
    fn epoch_applied(&self) -> u64 {
        match self {
            Answer::Write(_, Outcome::Accepted { epoch, .. }) => epoch.0,
            Answer::Activate(_, Activation::Activated { fence }) => fence.0,
            _ => 0,
        }
    }

    fn send(self, failure: Option<&str>) {
        let error = |message: &str| FenceError::Storage(message.to_owned().into());
        match self {
            Answer::Write(reply, outcome) => {
                let _ = reply.send(failure.map_or(Ok(outcome), |m| Err(error(m))));
            }
            Answer::Activate(reply, activation) => {
                let _ = reply.send(failure.map_or(Ok(activation), |m| Err(error(m))));
            }
        }
    }
}

pub struct Writer {
    db: Arc<Database>,
    mode: FenceMode,
    /// No epoch at or below it is accepted (set offline by a restore; P6).
    floor: Epoch,
    /// The greatest epoch accepted, activated or floored, as committed.
    highest: u64,
    /// Follows `highest` beside the data directory, when the store keeps a witness.
    witness: Option<StoreWitness>,
}

struct Tables<'txn> {
    kv: Table<'txn, (&'static str, &'static str), &'static [u8]>,
    fences: Table<'txn, &'static str, u64>,
    ledger: Table<'txn, (&'static str, &'static str, u64, u64), &'static [u8]>,
}

impl Writer {
    pub fn new(
        db: Arc<Database>,
        mode: FenceMode,
        meta: &Meta,
        witness: Option<StoreWitness>,
    ) -> Self {
        Self {
            db,
            mode,
            floor: Epoch(meta.floor),
            highest: meta.highest,
            witness,
        }
    }

    /// Runs until every sender is gone and the queue is drained.
    pub fn run(mut self, mut queue: mpsc::Receiver<Job>) {
        while let Some(first) = queue.blocking_recv() {
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match queue.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            self.commit_batch(batch);
        }
        // A clean stop records where the store got to.
        if let Some(witness) = &mut self.witness {
            witness.follow(self.highest, true);
        }
    }

    fn commit_batch(&mut self, batch: Vec<Job>) {
        let mut answers = Vec::with_capacity(batch.len());
        let mut pending = Vec::new();
        let result = self.apply_all(batch, &mut answers, &mut pending);
        match result {
            Ok(highest) => {
                self.highest = highest;
                answers.into_iter().for_each(|a| a.send(None));
                // After the commit: the witness never runs ahead of the store.
                if let Some(witness) = &mut self.witness {
                    witness.follow(highest, false);
                }
            }
            Err(error) => {
                tracing::error!(%error, "fenced store commit failed; the batch is not applied");
                let message = format!("commit failed: {error}");
                answers.into_iter().for_each(|a| a.send(Some(&message)));
                // Jobs not reached before the failure get the same answer.
                for job in pending {
                    match job {
                        Job::Write { reply, .. } => {
                            let _ = reply.send(Err(FenceError::Storage(message.clone().into())));
                        }
                        Job::Activate { reply, .. } => {
                            let _ = reply.send(Err(FenceError::Storage(message.clone().into())));
                        }
                    }
                }
            }
        }
    }

    fn apply_all(
        &self,
        batch: Vec<Job>,
        answers: &mut Vec<Answer>,
        pending: &mut Vec<Job>,
    ) -> Result<u64, FenceError> {
        let mut txn: WriteTransaction = match self.db.begin_write() {
            Ok(txn) => txn,
            Err(error) => {
                pending.extend(batch);
                return Err(storage(error));
            }
        };
        txn.set_durability(Durability::Immediate).map_err(storage)?;
        let mut highest = self.highest;
        {
            let mut tables = Tables {
                kv: txn.open_table(KV).map_err(storage)?,
                fences: txn.open_table(FENCES).map_err(storage)?,
                ledger: txn.open_table(LEDGER).map_err(storage)?,
            };
            let mut jobs = batch.into_iter();
            while let Some(job) = jobs.next() {
                let applied = match job {
                    Job::Write {
                        lock,
                        key,
                        epoch,
                        seq,
                        value,
                        reply,
                    } => self
                        .write(&mut tables, &lock, &key, epoch, seq, &value)
                        .map(|outcome| Answer::Write(reply, outcome)),
                    Job::Activate { lock, epoch, reply } => {
                        if epoch <= self.floor {
                            Ok(Answer::Activate(
                                reply,
                                Activation::Rejected(below_floor(self.floor)),
                            ))
                        } else {
                            activate(&mut tables, &lock, epoch).map(|a| Answer::Activate(reply, a))
                        }
                    }
                };
                match applied {
                    Ok(answer) => {
                        highest = highest.max(answer.epoch_applied());
                        answers.push(answer);
                    }
                    Err(error) => {
                        pending.extend(jobs);
                        return Err(error);
                    }
                }
            }
        }
        if highest > self.highest {
            let mut meta = txn.open_table(META).map_err(storage)?;
            meta.insert(HIGHEST, highest.to_string().as_str())
                .map_err(storage)?;
        }
        txn.commit().map_err(storage)?;
        Ok(highest)
    }

    fn write(
        &self,
        tables: &mut Tables<'_>,
        lock: &str,
        key: &str,
        epoch: Epoch,
        seq: Option<u64>,
        value: &[u8],
    ) -> Result<Outcome, FenceError> {
        if epoch <= self.floor {
            // Issued before the store was restored: nothing proves it newer than what the
            // store accepted since its backup (P6).
            return Ok(Outcome::Rejected(below_floor(self.floor)));
        }
        let stored = match tables.kv.get((lock, key)).map_err(storage)? {
            Some(record) => Some(decode_pair(record.value())?),
            None => None,
        };
        let decision = match self.mode {
            FenceMode::Strict => {
                let lock_fence = fence_of(tables, lock)?;
                rules::strict(stored.map(|(e, _)| e), lock_fence, epoch)
            }
            FenceMode::Activated => {
                let fence = fence_of(tables, lock)?;
                rules::activated_write(fence, epoch)
            }
            FenceMode::Sequenced => {
                let seq = seq.expect("prechecked: sequenced writes carry a seq");
                if let Some(recorded) = replay(tables, lock, key, epoch, seq, value)? {
                    return Ok(recorded);
                }
                let stored = stored.map(|(e, s)| (e, s.unwrap_or(0)));
                rules::sequenced(stored, epoch, seq)
            }
        };
        if let Err(rejection) = decision {
            return Ok(Outcome::Rejected(rejection));
        }
        tables
            .kv
            .insert((lock, key), encode_value(epoch, seq, value).as_slice())
            .map_err(storage)?;
        if self.mode != FenceMode::Activated {
            let fence = fence_of(tables, lock)?.0;
            if epoch.0 > fence {
                tables.fences.insert(lock, epoch.0).map_err(storage)?;
            }
        }
        if let (FenceMode::Sequenced, Some(seq)) = (self.mode, seq) {
            record_in_ledger(tables, lock, key, epoch, seq, value)?;
        }
        Ok(Outcome::Accepted { epoch, seq })
    }
}

/// A recorded outcome for an already-applied `(epoch, seq)`, if there is one.
fn replay(
    tables: &mut Tables<'_>,
    lock: &str,
    key: &str,
    epoch: Epoch,
    seq: u64,
    value: &[u8],
) -> Result<Option<Outcome>, FenceError> {
    let Some(digest) = tables
        .ledger
        .get((lock, key, epoch.0, seq))
        .map_err(storage)?
    else {
        return Ok(None);
    };
    if digest.value() == value_digest(value).as_slice() {
        Ok(Some(Outcome::Replayed { epoch, seq }))
    } else {
        Ok(Some(Outcome::Rejected(Rejection::ReplayMismatch {
            epoch,
            seq,
        })))
    }
}

/// Records an applied pair, and forgets the pairs of older epochs of the key: a replay from an
/// older epoch is then rejected as stale — it applies nothing either way — and the ledger stays
/// bounded by one owner's writes.
fn record_in_ledger(
    tables: &mut Tables<'_>,
    lock: &str,
    key: &str,
    epoch: Epoch,
    seq: u64,
    value: &[u8],
) -> Result<(), FenceError> {
    let older: Vec<(u64, u64)> = tables
        .ledger
        .range((lock, key, 0, 0)..(lock, key, epoch.0, 0))
        .map_err(storage)?
        .map(|entry| entry.map(|(k, _)| (k.value().2, k.value().3)))
        .collect::<Result<_, _>>()
        .map_err(storage)?;
    for (old_epoch, old_seq) in older {
        tables
            .ledger
            .remove((lock, key, old_epoch, old_seq))
            .map_err(storage)?;
    }
    let digest = value_digest(value);
    tables
        .ledger
        .insert((lock, key, epoch.0, seq), digest.as_slice())
        .map_err(storage)?;
    Ok(())
}

/// The lock's fence (0 when it has none).
fn fence_of(tables: &Tables<'_>, lock: &str) -> Result<Epoch, FenceError> {
    let fence = tables.fences.get(lock).map_err(storage)?;
    Ok(Epoch(fence.map_or(0, |f| f.value())))
}

fn activate(tables: &mut Tables<'_>, lock: &str, epoch: Epoch) -> Result<Activation, FenceError> {
    let fence = fence_of(tables, lock)?;
    match rules::activate(fence, epoch) {
        Ok(ActivationStep::Advance) => {
            tables.fences.insert(lock, epoch.0).map_err(storage)?;
            Ok(Activation::Activated { fence: epoch })
        }
        Ok(ActivationStep::AlreadyActive) => Ok(Activation::Activated { fence }),
        Err(rejection) => Ok(Activation::Rejected(rejection)),
    }
}

#[cfg(test)]
mod tests {
    //! Batches built on purpose: the writer takes every queued job into one transaction, so a
    //! check that read the store instead of the batch's own earlier writes shows up every time
    //! (the drills met two same-epoch writes of one key in one batch only by chance).

    use super::*;

    /// Queues `writes` (lock, key, epoch, seq) before the writer starts, so they form one
    /// batch, and returns each write's outcome.
    fn one_batch(mode: FenceMode, writes: &[(&str, &str, u64, Option<u64>)]) -> Vec<Outcome> {
        let dir = tempfile::tempdir().unwrap();
        let db = Arc::new(Database::create(dir.path().join("fence.redb")).unwrap());
        let meta = crate::records::initialize(&db, mode).unwrap();
        let (queue, jobs) = mpsc::channel(MAX_BATCH);
        let mut answers = Vec::new();
        for (i, (lock, key, epoch, seq)) in writes.iter().enumerate() {
            let (reply, answer) = oneshot::channel();
            queue
                .try_send(Job::Write {
                    lock: (*lock).to_owned(),
                    key: (*key).to_owned(),
                    epoch: Epoch(*epoch),
                    seq: *seq,
                    value: format!("write {i}").into_bytes(),
                    reply,
                })
                .unwrap();
            answers.push(answer);
        }
        drop(queue);
        Writer::new(db, mode, &meta, None).run(jobs);
        answers
            .into_iter()
            .map(|answer| answer.blocking_recv().unwrap().unwrap())
            .collect()
    }

    fn accepted(outcome: &Outcome) -> bool {
        matches!(outcome, Outcome::Accepted { .. })
    }

    #[test]
    fn p2_p3_two_same_epoch_writes_of_one_key_in_one_batch_accept_only_the_first() {
        let outcomes = one_batch(
            FenceMode::Strict,
            &[
                ("l", "k", 5, None),
                ("l", "k", 5, None),
                ("l", "k", 4, None),
            ],
        );
        let accepted: Vec<bool> = outcomes.iter().map(accepted).collect();
        assert_eq!(accepted, [true, false, false], "{outcomes:?}");
    }

    #[test]
    fn p2_a_lower_epoch_after_a_higher_one_in_the_same_batch_is_refused_on_a_new_key() {
        let outcomes = one_batch(
            FenceMode::Strict,
            &[
                ("l", "a", 42, None),
                ("l", "b", 41, None),
                ("l", "b", 42, None),
            ],
        );
        let accepted: Vec<bool> = outcomes.iter().map(accepted).collect();
        assert_eq!(accepted, [true, false, true], "{outcomes:?}");
    }

    #[test]
    fn p2_sequenced_pairs_in_one_batch_apply_once_and_replay() {
        let outcomes = one_batch(
            FenceMode::Sequenced,
            &[
                ("l", "k", 3, Some(1)),
                ("l", "k", 3, Some(1)),
                ("l", "k", 3, Some(0)),
                ("l", "k", 3, Some(2)),
            ],
        );
        assert!(accepted(&outcomes[0]), "{outcomes:?}");
        assert!(
            matches!(
                outcomes[1],
                Outcome::Rejected(Rejection::ReplayMismatch { .. })
            ),
            "a replay of (3, 1) with another value: {outcomes:?}"
        );
        assert!(
            matches!(outcomes[2], Outcome::Rejected(Rejection::StaleEpoch { .. })),
            "{outcomes:?}"
        );
        assert!(accepted(&outcomes[3]), "{outcomes:?}");
    }
}
