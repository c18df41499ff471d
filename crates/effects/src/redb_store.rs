//! [`RedbStore`]: the embedded ledger's storage. One redb file holds every lock's ledger
//! fence and every operation's record. Each transaction is one redb write transaction (they
//! exclude each other: P3) committed with `Durability::Immediate` before it answers (P8).
//!
//! With a witness (a file beside the data directory, [`palisade_core::witness`]), a ledger
//! copied back or restored from an older copy is detected when it opens: it would have
//! forgotten attempts that were sent, and an owner would send them again. Such a ledger serves
//! reads and refuses every change ([`LedgerError::RestoreRequired`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use palisade_core::witness::{judge, Verdict, WitnessRecord};

use redb::{Database, ReadableDatabase as _, ReadableTable as _};

use crate::ledger::{LedgerError, ListFilter, Stats, Store};
use crate::model::{OpId, Record};

// Tables: lock name → the ledger's fence for it; (lock, op) → the record as JSON; `id` (the
// ledger's random id) and `seq` (committed changes, as text).
use crate::redb_writer::{self as writer, decode, storage, FENCES, META, OPS};
/// The kind of store the ledger's witness speaks of.
pub const WITNESS_KIND: &str = "effects-ledger";
/// How often the witness catches up with the committed changes (it may lag by this much).
pub const WITNESS_INTERVAL: Duration = palisade_core::witness::FOLLOW_INTERVAL;

/// The embedded ledger's storage (one process opens the file at a time; other processes reach
/// it through the reference store's HTTP routes, see `palisade resource serve`).
#[derive(Clone)]
pub struct RedbStore {
    shared: Arc<Shared>,
}

struct Shared {
    db: Arc<Database>,
    /// The writer thread's queue (taken on drop, which stops the thread).
    jobs: Option<tokio::sync::mpsc::Sender<writer::Job>>,
    /// The writer thread, joined on drop so the file is closed when the store is.
    writer: Option<std::thread::JoinHandle<()>>,
    /// Committed changes so far.
    seq: Arc<AtomicU64>,
    /// Set when the ledger was found behind its witness: why it changes nothing.
    behind: Option<String>,
}

impl RedbStore {
    /// Opens (or creates) the ledger file at `path`, without a witness.
    pub fn open(path: &Path) -> Result<Self, LedgerError> {
        Self::open_with(path, None)
    }

    /// Opens (or creates) the ledger file at `path`, judged against (and then followed by) the
    /// witness file at `witness`.
    pub fn open_with(path: &Path, witness: Option<&Path>) -> Result<Self, LedgerError> {
        let (db, id, seq) = open_file(path)?;
        let current = WitnessRecord {
            kind: WITNESS_KIND.into(),
            store: id,
            mark: seq,
        };
        let behind = match witness {
            Some(witness) => check_witness(witness, &current)?,
            None => None,
        };
        let db = Arc::new(db);
        let seq = Arc::new(AtomicU64::new(seq));
        let (jobs, queue) = tokio::sync::mpsc::channel(writer::QUEUE_CAPACITY);
        let writer = {
            let (db, seq) = (db.clone(), seq.clone());
            std::thread::Builder::new()
                .name("palisade-effects-writer".into())
                .spawn(move || writer::run(db, seq, queue))
                .map_err(storage)?
        };
        let shared = Arc::new(Shared {
            db,
            jobs: Some(jobs),
            writer: Some(writer),
            seq,
            behind,
        });
        if let (Some(witness), None) = (witness, &shared.behind) {
            follow_witness(Arc::downgrade(&shared), witness.to_owned(), current);
        }
        Ok(Self { shared })
    }

    /// Why the ledger changes nothing (it was found behind its witness), if it does not.
    pub fn restore_required(&self) -> Option<&str> {
        self.shared.behind.as_deref()
    }

    fn read_all(&self, filter: &ListFilter) -> Result<Vec<Record>, LedgerError> {
        let txn = self.shared.db.begin_read().map_err(storage)?;
        let table = txn.open_table(OPS).map_err(storage)?;
        let mut records = Vec::new();
        let range = match filter.lock.as_deref() {
            Some(lock) => table.range((lock, "")..=(lock, "\u{10FFFF}")),
            None => table.range::<(&str, &str)>(..),
        }
        .map_err(storage)?;
        for entry in range {
            let (_, value) = entry.map_err(storage)?;
            let record = decode(value.value())?;
            if filter.admits(&record) {
                records.push(record);
            }
        }
        Ok(records)
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Queued transactions are committed and answered first; then the file closes.
        drop(self.jobs.take());
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

fn write_witness(path: &Path, record: &WitnessRecord) -> Result<(), LedgerError> {
    palisade_fence_redb::witness::record(path, record)
        .map_err(|e| LedgerError::Storage(e.to_string()))
}

/// Opens (or creates) the ledger's file with its tables; returns it with the ledger's id
/// (made at creation) and its change count. A new file's directory is fsynced: a power cut
/// must not make the new file vanish with the records it holds.
fn open_file(path: &Path) -> Result<(Database, String, u64), LedgerError> {
    let created = !path.exists();
    let db = Database::create(path).map_err(storage)?;
    let mut txn = db.begin_write().map_err(storage)?;
    txn.set_durability(redb::Durability::Immediate)
        .map_err(storage)?;
    txn.open_table(FENCES).map_err(storage)?;
    txn.open_table(OPS).map_err(storage)?;
    let (id, seq) = {
        let mut meta = txn.open_table(META).map_err(storage)?;
        let id = match meta.get("id").map_err(storage)? {
            Some(id) => id.value().to_owned(),
            None => {
                let mut bytes = [0u8; 16];
                getrandom::fill(&mut bytes).map_err(storage)?;
                crate::model::hex(&bytes)
            }
        };
        meta.insert("id", id.as_str()).map_err(storage)?;
        let seq = match meta.get("seq").map_err(storage)? {
            Some(seq) => seq
                .value()
                .parse::<u64>()
                .map_err(|e| LedgerError::Integrity(format!("unreadable change count: {e}")))?,
            None => 0,
        };
        (id, seq)
    };
    txn.commit().map_err(storage)?;
    if created {
        palisade_durable::sync_parent_dir(path).map_err(storage)?;
    }
    Ok((db, id, seq))
}

/// Weighs the ledger (`current`) against its witness: `Ok(Some(why))` when the ledger is
/// behind it (copied back: it then changes nothing), `Ok(None)` when current (the witness is
/// written when it has no record yet), an error for another store's witness.
fn check_witness(witness: &Path, current: &WitnessRecord) -> Result<Option<String>, LedgerError> {
    let found = palisade_fence_redb::witness::read(witness)
        .map_err(|e| LedgerError::Integrity(e.to_string()))?;
    match judge(found.as_ref(), current) {
        Verdict::Current => Ok(None),
        Verdict::Record => write_witness(witness, current).map(|()| None),
        Verdict::Behind { seen } => {
            let why = format!(
                "this effects ledger has recorded {} changes, but its witness {} saw {seen}: it \
                 was copied back or restored from an older copy, and has forgotten attempts that \
                 may have been sent — an owner would send them again. It changes nothing until \
                 the operations since the copy are reconciled by hand against each receiver's \
                 records (docs/effects.md, \"Restoring a ledger\")",
                current.mark,
                witness.display()
            );
            tracing::error!("{why}");
            Ok(Some(why))
        }
        Verdict::OtherKind(kind) => Err(LedgerError::Integrity(format!(
            "{} is the witness of a {kind}, not of an effects ledger",
            witness.display()
        ))),
    }
}

/// Keeps the witness up with the committed changes, every [`WITNESS_INTERVAL`], until the
/// store is dropped. It is written only after the changes it records are committed, so a
/// crash never leaves the ledger behind its witness.
fn follow_witness(shared: Weak<Shared>, path: PathBuf, mut seen: WitnessRecord) {
    let spawned = std::thread::Builder::new()
        .name("palisade-effects-witness".into())
        .spawn(move || loop {
            std::thread::sleep(WITNESS_INTERVAL);
            let Some(shared) = shared.upgrade() else {
                return;
            };
            let seq = shared.seq.load(Ordering::SeqCst);
            if seq > seen.mark {
                let record = WitnessRecord {
                    mark: seq,
                    ..seen.clone()
                };
                match write_witness(&path, &record) {
                    Ok(()) => seen = record,
                    Err(error) => tracing::warn!(%error, "effects ledger witness not written"),
                }
            }
        });
    if let Err(error) = spawned {
        tracing::error!(%error, "cannot start the effects ledger's witness thread");
    }
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, LedgerError> + Send + 'static,
) -> Result<T, LedgerError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| LedgerError::Storage(format!("ledger task failed: {e}")))?
}

impl Store for RedbStore {
    async fn transact<T: Send + 'static>(
        &self,
        id: &OpId,
        step: impl FnOnce(&mut u64, &mut Option<Record>) -> T + Send + 'static,
    ) -> Result<T, LedgerError> {
        if let Some(why) = &self.shared.behind {
            return Err(LedgerError::RestoreRequired(why.clone()));
        }
        let (answer, answered) = tokio::sync::oneshot::channel();
        let job = writer::job(id.clone(), step, answer);
        self.shared
            .jobs
            .as_ref()
            .expect("present until drop")
            .send(job)
            .await
            .map_err(|_| LedgerError::Storage("the ledger's writer has stopped".into()))?;
        answered
            .await
            .map_err(|_| LedgerError::Storage("the ledger's writer has stopped".into()))?
    }

    async fn get(&self, id: &OpId) -> Result<Option<Record>, LedgerError> {
        let shared = self.shared.clone();
        let id = id.clone();
        blocking(move || {
            let txn = shared.db.begin_read().map_err(storage)?;
            let table = txn.open_table(OPS).map_err(storage)?;
            let value = table
                .get((id.lock.as_str(), id.op.as_str()))
                .map_err(storage)?;
            value.map(|v| decode(v.value())).transpose()
        })
        .await
    }

    async fn scan(&self, filter: &ListFilter) -> Result<Vec<Record>, LedgerError> {
        let this = self.clone();
        let filter = filter.clone();
        blocking(move || {
            let mut records = this.read_all(&filter)?;
            records.sort_by_key(|r| r.updated_ms);
            records.truncate(filter.limit());
            Ok(records)
        })
        .await
    }

    async fn stats(&self, now_ms: u64) -> Result<Stats, LedgerError> {
        let this = self.clone();
        blocking(move || {
            let records = this.read_all(&ListFilter::default())?;
            Ok(Stats::of(&records, now_ms))
        })
        .await
    }
}
