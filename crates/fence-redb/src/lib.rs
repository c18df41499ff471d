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
mod writer;

use std::path::Path;
use std::sync::Arc;

use palisade_core::token::decode_unverified;
use palisade_core::{Epoch, LockName};
use palisade_fence::{
    precheck_activation, precheck_write, Activation, FenceError, FenceMode, FencedResource,
    Outcome, Stored, Verifier, Write,
};
use redb::{Database, ReadableDatabase as _};
use tokio::sync::{mpsc, oneshot};

use crate::records::{storage, FENCES, KV};
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
}

impl RedbFence {
    /// Opens (or creates) the store at `path` in `mode`. A store created in one mode refuses to
    /// open in another: the modes' fences mean different things.
    pub fn open(path: &Path, mode: FenceMode, verifier: Arc<Verifier>) -> Result<Self, FenceError> {
        let created = !path.exists();
        let db = Arc::new(Database::create(path).map_err(storage)?);
        if created {
            // A power cut must not make the new store vanish with the fences it accepted.
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::File::open(dir)
                    .and_then(|d| d.sync_all())
                    .map_err(|e| FenceError::Storage(Box::new(e)))?;
            }
        }
        records::initialize(&db, mode)?;
        let (jobs, queue) = mpsc::channel(QUEUE_CAPACITY);
        let writer = Writer::new(db.clone(), mode);
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
        })
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
    }
}

/// The epoch a token claims, without verifying it (for choosing keys to fetch; never for a
/// decision).
pub fn claimed_key_id(token: &str) -> Option<palisade_core::KeyId> {
    decode_unverified(token).ok().map(|claims| claims.key_id)
}
