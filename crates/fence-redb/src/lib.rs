//! [`RedbFence`]: the embedded fenced store. One redb file holds the values, the per-lock
//! fences and the sequenced ledger.
//!
//! Writes and activations are verified (P4) on the caller's task, then applied by one writer
//! thread that takes every queued job, applies them in order inside **one** write transaction
//! (so each comparison and its mutation are atomic with respect to every other write — P3),
//! commits with `Durability::Immediate`, and only then answers them (P8). One fsync per batch:
//! group commit, as in the coordinator.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod records;
pub mod witness;
mod writer;

use std::path::Path;
use std::sync::Arc;

use palisade_core::token::decode_unverified;
use palisade_core::{Epoch, LockName};
use palisade_fence::{
    precheck_activation, precheck_write, Activation, FenceError, FenceMode, FencedResource,
    Outcome, Stored, Verifier, Write,
};
use redb::{Database, ReadableDatabase as _, ReadableTable as _};
use tokio::sync::{mpsc, oneshot};

use crate::records::{storage, FENCES, KV, META};
use crate::writer::{Job, Writer};

/// Jobs waiting for the writer thread; callers wait when it is full.
pub const QUEUE_CAPACITY: usize = 8_192;

/// The embedded fenced store.
pub struct RedbFence {
    mode: FenceMode,
    verifier: Arc<Verifier>,
    db: Arc<Database>,
    jobs: Option<mpsc::Sender<Job>>,
    writer: Option<std::thread::JoinHandle<()>>,
    /// No epoch at or below it is accepted (a restore's floor).
    floor: Epoch,
    /// Set when the store was found behind its witness: why no write is accepted.
    restore_required: Option<String>,
}

/// What `palisade resource restore` did ([`apply_restore_floor`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreApplied {
    /// The store's highest epoch before.
    pub highest_before: u64,
    /// The highest epoch its witness had seen (0: no witness).
    pub witness_seen: u64,
    /// The floor now: no epoch at or below it is accepted.
    pub floor: u64,
}

impl RedbFence {
    /// Opens (or creates) the store at `path` in `mode`. A store created in one mode refuses to
    /// open in another: the modes' fences mean different things.
    pub fn open(path: &Path, mode: FenceMode, verifier: Arc<Verifier>) -> Result<Self, FenceError> {
        Self::open_with(path, mode, verifier, None)
    }

    /// [`Self::open`], with a witness file at `witness` (outside the store's directory, see
    /// [`witness`]): a store found behind its witness — copied back, or restored from an older
    /// copy — opens, serves reads, and refuses every write and activation with
    /// [`FenceError::RestoreRequired`] until [`apply_restore_floor`] is run on it (P6).
    pub fn open_with(
        path: &Path,
        mode: FenceMode,
        verifier: Arc<Verifier>,
        witness: Option<&Path>,
    ) -> Result<Self, FenceError> {
        let created = !path.exists();
        let db = Arc::new(Database::create(path).map_err(storage)?);
        if created {
            // A power cut must not make the new store vanish with the fences it accepted.
            palisade_durable::sync_parent_dir(path)
                .map_err(|e| FenceError::Storage(Box::new(e)))?;
        }
        let meta = records::initialize(&db, mode)?;
        let (witness, restore_required) = match witness {
            Some(witness) => {
                match witness::StoreWitness::open(witness, &meta.store_id, meta.highest)? {
                    witness::Opened::Current(witness) => (Some(witness), None),
                    witness::Opened::Behind(why) => {
                        tracing::error!("{why}");
                        (None, Some(why))
                    }
                }
            }
            None => (None, None),
        };
        let (jobs, queue) = mpsc::channel(QUEUE_CAPACITY);
        let writer = Writer::new(db.clone(), mode, &meta, witness);
        let writer = std::thread::Builder::new()
            .name("palisade-fence-writer".into())
            .spawn(move || writer.run(queue))
            .map_err(|e| FenceError::Storage(Box::new(e)))?;
        Ok(Self {
            mode,
            verifier,
            db,
            jobs: Some(jobs),
            writer: Some(writer),
            floor: Epoch(meta.floor),
            restore_required,
        })
    }

    /// Why the store accepts no write (it was found behind its witness), if it does not.
    pub fn restore_required(&self) -> Option<&str> {
        self.restore_required.as_deref()
    }

    /// The restore floor: no epoch at or below it is accepted (0: never restored).
    pub fn restore_floor(&self) -> Epoch {
        self.floor
    }

    fn refuse_if_restore_required(&self) -> Result<(), FenceError> {
        match &self.restore_required {
            Some(why) => Err(FenceError::RestoreRequired(why.clone())),
            None => Ok(()),
        }
    }

    /// The greatest epoch this store has accepted or fenced at, for any lock (its fences and
    /// its rows, in one read snapshot): what a restored coordinator must issue above (P6).
    pub fn highest_fence(&self) -> Result<u64, FenceError> {
        records::highest_fence(&self.db)
    }

    /// The trusted keys (shared, so a server can refresh them).
    pub fn verifier(&self) -> &Arc<Verifier> {
        &self.verifier
    }

    async fn submit<T>(
        &self,
        job: impl FnOnce(oneshot::Sender<Result<T, FenceError>>) -> Job,
    ) -> Result<T, FenceError> {
        let (reply, answer) = oneshot::channel();
        let closed = || FenceError::Storage("the fenced store is closed".into());
        let jobs = self.jobs.as_ref().ok_or_else(closed)?;
        jobs.send(job(reply)).await.map_err(|_| closed())?;
        answer.await.map_err(|_| closed())?
    }

    async fn read_blocking<T: Send + 'static>(
        &self,
        read: impl FnOnce(&Database) -> Result<T, FenceError> + Send + 'static,
    ) -> Result<T, FenceError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || read(&db))
            .await
            .map_err(|e| FenceError::Storage(Box::new(e)))?
    }
}

impl Drop for RedbFence {
    fn drop(&mut self) {
        // Closing the queue lets the writer finish what is queued and exit; joining it releases
        // the database file before the caller can reopen it.
        self.jobs.take();
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

impl FencedResource for RedbFence {
    fn mode(&self) -> FenceMode {
        self.mode
    }

    async fn write<'a>(&'a self, write: Write<'a>) -> Result<Outcome, FenceError> {
        self.refuse_if_restore_required()?;
        let epoch = match precheck_write(&self.verifier, self.mode, &write) {
            Ok(epoch) => epoch,
            Err(rejection) => return Ok(Outcome::Rejected(rejection)),
        };
        let job = |reply| Job::Write {
            lock: write.lock.to_string(),
            key: write.key.to_owned(),
            epoch,
            seq: write.seq,
            value: write.value.to_vec(),
            reply,
        };
        self.submit(job).await
    }

    async fn activate<'a>(
        &'a self,
        lock: &'a LockName,
        token: &'a str,
    ) -> Result<Activation, FenceError> {
        self.refuse_if_restore_required()?;
        let epoch = match precheck_activation(&self.verifier, self.mode, lock, token) {
            Ok(epoch) => epoch,
            Err(rejection) => return Ok(Activation::Rejected(rejection)),
        };
        let lock = lock.to_string();
        self.submit(|reply| Job::Activate { lock, epoch, reply })
            .await
    }

    async fn read<'a>(
        &'a self,
        lock: &'a LockName,
        key: &'a str,
    ) -> Result<Option<Stored>, FenceError> {
        let (lock, key) = (lock.to_string(), key.to_owned());
        self.read_blocking(move |db| {
            let txn = db.begin_read().map_err(storage)?;
            let table = txn.open_table(KV).map_err(storage)?;
            let record = table.get((lock.as_str(), key.as_str())).map_err(storage)?;
            record.map(|r| records::decode_value(r.value())).transpose()
        })
        .await
    }

    async fn fence<'a>(&'a self, lock: &'a LockName) -> Result<Epoch, FenceError> {
        let lock = lock.to_string();
        self.read_blocking(move |db| {
            let txn = db.begin_read().map_err(storage)?;
            let table = txn.open_table(FENCES).map_err(storage)?;
            let fence = table.get(lock.as_str()).map_err(storage)?;
            Ok(Epoch(fence.map_or(0, |f| f.value())))
        })
        .await
        .map(|fence| fence.max(self.floor))
    }
}

/// The epoch a token claims, without verifying it (for choosing keys to fetch; never for a
/// decision).
pub fn claimed_key_id(token: &str) -> Option<palisade_core::KeyId> {
    decode_unverified(token).ok().map(|claims| claims.key_id)
}

/// Applies a restore floor to the stopped store at `path` (`palisade resource restore`, P6):
/// from now on no epoch at or below `floor` is accepted — every token issued before the floor
/// was taken from the coordinator — and the store's witness at `witness` is brought up to it,
/// so the store accepts writes again. `record` (JSON) is kept for people. Refuses a floor
/// below what the witness saw the store accept: the coordinator would be behind the store
/// (restore the coordinator first, with `--floor-from` this store). Raising the floor twice is
/// harmless: it never goes down.
pub fn apply_restore_floor(
    path: &Path,
    witness: Option<&Path>,
    floor: u64,
    record: &str,
) -> Result<RestoreApplied, FenceError> {
    if !path.exists() {
        return Err(FenceError::Integrity(format!(
            "{} does not exist: restore the store's files first",
            path.display()
        )));
    }
    let db = Database::open(path).map_err(storage)?;
    let mut txn = db.begin_write().map_err(storage)?;
    txn.set_durability(redb::Durability::Immediate)
        .map_err(storage)?;
    let (store_id, highest_before, old_floor) = restore_meta(&txn)?;
    let (Some(store_id), Some(highest_before)) = (store_id, highest_before) else {
        return Err(FenceError::Integrity(format!(
            "{} was never opened by this version of the store: start it once (it accepts no \
             write while it is behind its witness), stop it, and run the restore again",
            path.display()
        )));
    };
    let seen = witnessed_epoch(witness, &store_id)?;
    if floor <= seen {
        return Err(FenceError::Integrity(format!(
            "the coordinator's floor {floor} is not above epoch {seen}, which this store \
             accepted: the coordinator is behind the store (was it restored without \
             --floor-from this store?). Restore the coordinator above it first"
        )));
    }
    let new_floor = floor.max(old_floor);
    let highest = highest_before.max(new_floor);
    {
        let mut meta = txn.open_table(META).map_err(storage)?;
        meta.insert(records::RESTORE_FLOOR, new_floor.to_string().as_str())
            .map_err(storage)?;
        meta.insert(records::HIGHEST, highest.to_string().as_str())
            .map_err(storage)?;
        meta.insert(records::RESTORE_RECORD, record)
            .map_err(storage)?;
    }
    txn.commit().map_err(storage)?;
    if let Some(witness) = witness {
        witness::record(
            witness,
            &palisade_core::witness::WitnessRecord {
                kind: witness::KIND.into(),
                store: store_id,
                mark: highest,
            },
        )?;
    }
    Ok(RestoreApplied {
        highest_before,
        witness_seen: seen,
        floor: new_floor,
    })
}

/// The store's id, highest accepted epoch and restore floor, as its metadata holds them.
fn restore_meta(
    txn: &redb::WriteTransaction,
) -> Result<(Option<String>, Option<u64>, u64), FenceError> {
    let meta = txn.open_table(META).map_err(storage)?;
    let store_id = meta
        .get(records::STORE_ID)
        .map_err(storage)?
        .map(|v| v.value().to_owned());
    Ok((
        store_id,
        records::meta_u64(&meta, records::HIGHEST)?,
        records::meta_u64(&meta, records::RESTORE_FLOOR)?.unwrap_or(0),
    ))
}

/// The highest epoch `witness` saw this store (`store_id`) accept (0: no witness, or one of
/// another store).
fn witnessed_epoch(witness: Option<&Path>, store_id: &str) -> Result<u64, FenceError> {
    Ok(match witness {
        Some(witness) => witness::read(witness)?
            .filter(|w| w.store == store_id && w.kind == witness::KIND)
            .map_or(0, |w| w.mark),
        None => 0,
    })
}

/// The store id of the stopped store at `path` (`None`: never opened by this version).
pub fn store_id(path: &Path) -> Result<Option<String>, FenceError> {
    let db = Database::open(path).map_err(storage)?;
    let txn = db.begin_read().map_err(storage)?;
    let meta = txn.open_table(META).map_err(storage)?;
    let id = meta
        .get(records::STORE_ID)
        .map_err(storage)?
        .map(|v| v.value().to_owned());
    Ok(id)
}
