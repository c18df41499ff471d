//! Durable state of the coordinator: the epoch counter and the live leases.
//!
//! [`LeaseStore`] is the boundary between the engine (which decides) and the disk (which
//! remembers). The engine batches every change of a group of concurrent requests into one
//! [`LeaseStore::commit`] — one fsync for the whole group (group commit) — and acknowledges
//! none of them before that commit returns.

use std::path::Path;

use palisade_core::{
    Changes, Epoch, HolderId, Lease, LeaseId, LockClass, LockName, Principal, RequestId,
};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

/// Lock name → the lock's live lease, as JSON (`LeaseRecord`).
const LEASES: TableDefinition<&str, &[u8]> = TableDefinition::new("leases");
/// Named counters: `last_epoch`, `format_version`.
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const LAST_EPOCH: &str = "last_epoch";
const FORMAT_VERSION_KEY: &str = "format_version";
/// Version of the on-disk layout; a data directory of another version is refused.
const FORMAT_VERSION: u64 = 1;

/// What a store failure looks like. Every variant is fatal to the engine: a coordinator that
/// cannot make its state durable must stop serving rather than acknowledge from memory.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The storage engine failed (I/O error, disk full, corruption, already open elsewhere).
    #[error("storage error: {0}")]
    Storage(#[from] redb::Error),
    /// The stored data does not decode or contradicts itself.
    #[error("corrupt data directory: {0}")]
    Corrupt(String),
    /// The lease log failed to read, write or sync.
    #[error("storage I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// Another process has the store open (a running coordinator, or an offline backup).
    #[error("storage in use: {0} is open in another process (a running coordinator?)")]
    InUse(String),
    /// Cluster mode: the change did not commit on a majority (leadership lost, no quorum,
    /// timed out). It may still commit later; it was not acknowledged.
    #[error("replication: {0}")]
    Replication(String),
    /// The disk is full (ENOSPC, or a quota): nothing was lost, but nothing more can be made
    /// durable until space is freed.
    #[error("the disk is full: {0}; free space, then restart (nothing acknowledged was lost)")]
    DiskFull(String),
    /// The wall clock went behind the epoch counter, while serving, by more than the engine
    /// waits (`palisade_core::clock::MAX_CLOCK_WAIT_MS`): issuing now could put an epoch above
    /// a later start's clock floor, so nothing is issued; the engine stops. Either this clock
    /// was stepped back, or it was stepped forward to the right time after a clock that ran
    /// ahead raised the counter: the message says both, and the way on.
    #[error("while serving, {}", counter_ahead_message(*.counter, *.now_ms))]
    ClockBehind {
        /// How far the clock must move before the counter's epochs may be issued.
        behind_ms: u64,
        /// The epoch counter.
        counter: u64,
        /// The clock's reading, ms since 1970.
        now_ms: u64,
    },
    /// At a start, the epoch counter is further ahead of the wall clock than the engine waits:
    /// a clock that ran ahead raised it (at an earlier start or commit), or this clock went
    /// back since. Nothing on this node can tell which; the operator can
    /// (`palisade serve --resume-counter-ahead`, docs/operations.md).
    #[error("{}", counter_ahead_message(*.counter, *.now_ms))]
    CounterAhead {
        /// The epoch counter.
        counter: u64,
        /// The clock's reading, ms since 1970.
        now_ms: u64,
    },
    /// The wall clock reads past the last millisecond whose clock floor is an epoch every
    /// resource can store (`palisade_core::clock::LAST_CLOCK_MS`, in the year 2248): a clock
    /// that is wrong, or a deployment older than anyone planned for.
    #[error("{0}")]
    Headroom(#[from] palisade_core::clock::HeadroomError),
}

/// The operator's flag that resumes a single node whose counter is ahead of its clock.
pub const RESUME_COUNTER_AHEAD_FLAG: &str = "--resume-counter-ahead";

/// What happened when the counter is ahead of the clock, and the ways on: never "check NTP"
/// alone, since the clock may be the one that is right now.
fn counter_ahead_message(counter: u64, now_ms: u64) -> String {
    use palisade_core::clock::{display_ms, epoch_time_ms};
    let counter_ms = epoch_time_ms(counter);
    let ahead_ms = counter_ms.saturating_sub(now_ms);
    format!(
        "the epoch counter {counter} is ahead of this clock: it was raised by a clock that \
         read {counter_at}, {ahead} ahead of this clock, which reads {now}. Either a clock \
         that ran ahead raised it (this node started or issued with a wrong clock, and its \
         clock is right now), or this clock went back since. If this clock is right, resume \
         now with `palisade serve {flag} {counter}` (docs/operations.md): epochs then rise \
         from the counter with no wait for the clock, and until the clock passes {counter_at} \
         a copy of this data directory put back is not caught by the clock floor (the \
         high-water file and the boundaries' fences still catch it). If this clock is wrong, \
         set it right. Otherwise this node issues again once its clock passes {counter_at} \
         (in {ahead})",
        counter_at = display_ms(counter_ms),
        ahead = display_duration_ms(ahead_ms),
        now = display_ms(now_ms),
        flag = RESUME_COUNTER_AHEAD_FLAG,
    )
}

/// `ms` as hours, minutes and seconds (`26h 3m 4.5s`).
fn display_duration_ms(ms: u64) -> String {
    let (hours, minutes) = (ms / 3_600_000, ms / 60_000 % 60);
    let seconds = ms % 60_000;
    let seconds = format!("{}.{:03}s", seconds / 1_000, seconds % 1_000);
    match (hours, minutes) {
        (0, 0) => seconds,
        (0, _) => format!("{minutes}m {seconds}"),
        _ => format!("{hours}h {minutes}m {seconds}"),
    }
}

impl StoreError {
    /// An I/O error as the store reports it: a full disk by name, anything else as I/O.
    pub fn from_io(error: std::io::Error) -> Self {
        if error.kind() == std::io::ErrorKind::StorageFull || error.raw_os_error() == Some(122) {
            StoreError::DiskFull(error.to_string())
        } else {
            StoreError::Io(error)
        }
    }
}

macro_rules! storage_error {
    ($($source:ty),*) => {
        $(impl From<$source> for StoreError {
            fn from(error: $source) -> Self {
                StoreError::Storage(error.into())
            }
        })*
    };
}
storage_error!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::SetDurabilityError
);

/// The durable state read at start-up.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DurableState {
    /// The greatest epoch ever granted (and acknowledged or not): the next grant is above it.
    pub last_epoch: Epoch,
    /// The leases that were live at the last commit; their expiry is restarted in full.
    pub leases: Vec<Lease>,
}

/// Durable storage of the lease table.
///
/// Contract for every implementation:
/// - `commit` returns only once every change in `changes` (and the epoch counter) is on
///   stable storage: a kill -9 or power loss after it returns loses none of it (P8);
/// - a `commit` that fails leaves the previous durable state intact (all or nothing);
/// - the epoch counter on disk never decreases (P1): `commit` refuses a lower one;
/// - `load` returns exactly the state of the last successful `commit`.
pub trait LeaseStore: Send + 'static {
    /// Reads the durable state.
    fn load(&self) -> Result<DurableState, StoreError>;
    /// Makes `changes` durable, atomically, before returning.
    fn commit(&mut self, changes: &Changes) -> Result<(), StoreError>;

    /// True when `commit` blocks on I/O, so the engine runs it on a blocking thread.
    fn commit_blocks(&self) -> bool {
        true
    }

    /// True when the engine should run on a thread of its own and call `commit` inline (a
    /// store that blocks on a local disk): one thread hop fewer per commit than running it on
    /// the blocking pool. False (the default) keeps the engine a task of the caller's runtime,
    /// as a deterministic simulation needs.
    fn dedicated_thread(&self) -> bool {
        false
    }

    /// For a store whose commit waits on other machines rather than on a local disk (a
    /// replicated store): the commit as a future the engine awaits on its own task, with no
    /// blocking thread. Same contract as [`commit`](Self::commit). `None`: use `commit`.
    fn commit_async(&mut self, _changes: &Changes) -> Option<PendingCommit> {
        None
    }

    /// For a store whose authority can pass to another process (a replicated store): confirms
    /// that this engine's decisions are still the latest, before it answers a batch that
    /// changed nothing (a describe, a list, a `Held` refusal, a watch's first state) — such a
    /// batch has no commit that would fail for a deposed leader. Resolves `Ok` only if nothing
    /// can have been committed elsewhere since the engine's last commit. `None`: a single
    /// node's store, always authoritative.
    fn confirm_async(&mut self) -> Option<PendingCommit> {
        None
    }
}

/// A commit under way (see [`LeaseStore::commit_async`]).
pub type PendingCommit =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), StoreError>> + Send>>;

/// A [`LeaseStore`] in memory, shared by clones: "durable" for as long as any clone lives.
///
/// For tests and simulations that isolate the engine's logic (a paused clock cannot be used
/// with real I/O on blocking threads) and model a restart by starting a new engine over a clone.
#[derive(Debug, Clone, Default)]
pub struct MemoryLeaseStore {
    state: std::sync::Arc<std::sync::Mutex<DurableState>>,
}

impl MemoryLeaseStore {
    /// A store of its own holding a copy of this one's state now: a snapshot of the volume,
    /// to be put back later (tests of rollback).
    pub fn snapshot(&self) -> Self {
        Self {
            state: std::sync::Arc::new(std::sync::Mutex::new(
                self.state.lock().expect("not poisoned").clone(),
            )),
        }
    }
}

impl LeaseStore for MemoryLeaseStore {
    fn load(&self) -> Result<DurableState, StoreError> {
        Ok(self.state.lock().expect("not poisoned").clone())
    }

    fn commit(&mut self, changes: &Changes) -> Result<(), StoreError> {
        let mut state = self.state.lock().expect("not poisoned");
        if changes.last_epoch < state.last_epoch {
            return Err(StoreError::Corrupt("epoch counter would go back".into()));
        }
        state.last_epoch = changes.last_epoch;
        for (lock, lease) in &changes.locks {
            state.leases.retain(|l| &l.lock != lock);
            state.leases.extend(lease.clone());
        }
        Ok(())
    }

    fn commit_blocks(&self) -> bool {
        false
    }
}

/// A redb store written in a format this build does not read.
fn unreadable_version(version: u64) -> StoreError {
    StoreError::Corrupt(format!(
        "data format version {version}; this build reads version {FORMAT_VERSION}"
    ))
}

/// The state a redb store's read transaction sees.
fn load_from(txn: &redb::ReadTransaction) -> Result<DurableState, StoreError> {
    let meta = txn.open_table(META)?;
    let last_epoch = Epoch(meta.get(LAST_EPOCH)?.map_or(0, |v| v.value()));
    let mut leases = Vec::new();
    match txn.open_table(LEASES) {
        Ok(table) => {
            for entry in table.iter()? {
                let (lock, record) = entry?;
                leases.push(decode_lease_bytes(lock.value(), record.value())?);
            }
        }
        Err(redb::TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(StoreError::Storage(e.into())),
    }
    Ok(DurableState { last_epoch, leases })
}

/// A lease as stored (JSON), in redb and in the lease log.
#[derive(Clone, Serialize, Deserialize)]
pub(crate) struct LeaseRecord {
    id: RecordId,
    holder: String,
    /// Absent in records written before principals existed: `anonymous`.
    #[serde(default)]
    principal: Principal,
    epoch: u64,
    ttl_ms: u64,
    class: LockClass,
    /// Absent in records written before request ids existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    request_id: Option<String>,
    /// When it was granted (ms since the Unix epoch); absent in records written before grant
    /// times were recorded (0: unknown).
    #[serde(default, skip_serializing_if = "is_zero")]
    granted_unix_ms: u64,
    /// When it was last renewed (0: never, or unknown).
    #[serde(default, skip_serializing_if = "is_zero")]
    renewed_unix_ms: u64,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// A lease id as stored: 32 hex digits, or (records written before ids were random) the
/// epoch's number. An old lease keeps its old id until it ends.
#[derive(Clone, Serialize, Deserialize)]
#[serde(untagged)]
enum RecordId {
    Random(LeaseId),
    Sequential(u64),
}

/// [`LeaseStore`] over a redb file with `Durability::Immediate` commits.
pub struct RedbLeaseStore {
    db: Database,
}

impl RedbLeaseStore {
    /// Opens (or creates) the store at `path`. Fails when another process has it open.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let created = !path.exists();
        let db = Database::create(path)?;
        if created {
            // The file's entry in its directory must survive a power cut too.
            palisade_durable::sync_parent_dir(path)
                .map_err(|e| StoreError::Storage(redb::StorageError::Io(e).into()))?;
        }
        let store = Self { db };
        store.check_format()?;
        Ok(store)
    }

    /// Reads the durable state of the store at `path` without writing anything (an offline
    /// backup of an earlier version's directory). [`StoreError::InUse`] when a process has it
    /// open.
    pub fn read(path: &Path) -> Result<DurableState, StoreError> {
        let db = redb::ReadOnlyDatabase::open(path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => {
                StoreError::InUse(path.display().to_string())
            }
            // Recovering it would write: the coordinator does that when it starts.
            redb::DatabaseError::RepairAborted => StoreError::Io(std::io::Error::other(format!(
                "{} was not closed cleanly and needs recovery, which a read does not do: \
                 start the coordinator on its directory once, stop it, and read it again",
                path.display()
            ))),
            other => StoreError::Storage(other.into()),
        })?;
        let txn = db.begin_read()?;
        match txn.open_table(META) {
            Ok(meta) => match meta.get(FORMAT_VERSION_KEY)?.map(|v| v.value()) {
                None | Some(FORMAT_VERSION) => {}
                Some(other) => return Err(unreadable_version(other)),
            },
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(DurableState::default()),
            Err(e) => return Err(StoreError::Storage(e.into())),
        }
        load_from(&txn)
    }

    fn check_format(&self) -> Result<(), StoreError> {
        let txn = self.db.begin_write()?;
        {
            let mut meta = txn.open_table(META)?;
            let version = meta.get(FORMAT_VERSION_KEY)?.map(|v| v.value());
            match version {
                None => {
                    meta.insert(FORMAT_VERSION_KEY, FORMAT_VERSION)?;
                }
                Some(FORMAT_VERSION) => {}
                Some(other) => return Err(unreadable_version(other)),
            }
            txn.open_table(LEASES)?;
        }
        txn.commit()?;
        Ok(())
    }
}

impl LeaseStore for RedbLeaseStore {
    fn load(&self) -> Result<DurableState, StoreError> {
        load_from(&self.db.begin_read()?)
    }

    fn commit(&mut self, changes: &Changes) -> Result<(), StoreError> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        {
            let mut meta = txn.open_table(META)?;
            let stored = meta.get(LAST_EPOCH)?.map_or(0, |v| v.value());
            if changes.last_epoch.0 < stored {
                // Refuse rather than lower the counter: a lower counter would reissue epochs.
                return Err(StoreError::Corrupt(format!(
                    "epoch counter would go back from {stored} to {}",
                    changes.last_epoch
                )));
            }
            meta.insert(LAST_EPOCH, changes.last_epoch.0)?;
            let mut table = txn.open_table(LEASES)?;
            for (lock, lease) in &changes.locks {
                match lease {
                    Some(lease) => {
                        table.insert(lock.as_str(), encode_lease(lease).as_slice())?;
                    }
                    None => {
                        table.remove(lock.as_str())?;
                    }
                }
            }
        }
        txn.commit()?;
        Ok(())
    }
}

fn encode_lease(lease: &Lease) -> Vec<u8> {
    serde_json::to_vec(&encode_record(lease)).expect("a lease record always serializes")
}

pub(crate) fn encode_record(lease: &Lease) -> LeaseRecord {
    LeaseRecord {
        id: RecordId::Random(lease.id),
        holder: lease.holder.as_str().to_owned(),
        principal: lease.principal.clone(),
        epoch: lease.epoch.0,
        ttl_ms: lease.ttl_ms,
        class: lease.class,
        request_id: lease.request_id.as_ref().map(|r| r.as_str().to_owned()),
        granted_unix_ms: lease.granted_unix_ms,
        renewed_unix_ms: lease.renewed_unix_ms,
    }
}

fn decode_lease_bytes(lock: &str, bytes: &[u8]) -> Result<Lease, StoreError> {
    let record: LeaseRecord = serde_json::from_slice(bytes)
        .map_err(|e| StoreError::Corrupt(format!("lease of lock {lock:?}: {e}")))?;
    decode_lease(lock, record)
}

pub(crate) fn decode_lease(lock: &str, record: LeaseRecord) -> Result<Lease, StoreError> {
    let corrupt = |what: String| StoreError::Corrupt(format!("lease of lock {lock:?}: {what}"));
    Ok(Lease {
        id: match record.id {
            RecordId::Random(id) => id,
            RecordId::Sequential(id) => LeaseId(u128::from(id)),
        },
        lock: LockName::new(lock).map_err(|e| corrupt(e.0))?,
        holder: HolderId::new(record.holder).map_err(|e| corrupt(e.0))?,
        principal: record.principal,
        epoch: Epoch(record.epoch),
        ttl_ms: record.ttl_ms,
        class: record.class,
        request_id: record
            .request_id
            .map(RequestId::new)
            .transpose()
            .map_err(|e| corrupt(e.0))?,
        expires_at: 0,
        granted_unix_ms: record.granted_unix_ms,
        renewed_unix_ms: record.renewed_unix_ms,
    })
}

#[cfg(test)]
mod conformance {
    use super::*;
    use crate::store_conformance::Harness;

    /// The redb store in a temporary directory; a restart drops it and opens the file again.
    struct Redb(tempfile::TempDir);

    impl Harness for Redb {
        type Store = RedbLeaseStore;
        async fn open(&mut self) -> RedbLeaseStore {
            RedbLeaseStore::open(&self.0.path().join("db")).unwrap()
        }
        async fn restart(&mut self, store: RedbLeaseStore) -> RedbLeaseStore {
            drop(store);
            self.open().await
        }
    }

    /// The in-memory store; a restart is a new store over the same shared state.
    struct Memory(MemoryLeaseStore);

    impl Harness for Memory {
        type Store = MemoryLeaseStore;
        async fn open(&mut self) -> MemoryLeaseStore {
            self.0.clone()
        }
        async fn restart(&mut self, store: MemoryLeaseStore) -> MemoryLeaseStore {
            drop(store);
            self.0.clone()
        }
    }

    fn run(case: impl std::future::Future<Output = ()>) {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(case);
    }

    mod redb_store {
        use super::*;
        crate::lease_store_suite!(Redb(tempfile::tempdir().unwrap()), run);
    }

    mod memory_store {
        use super::*;
        crate::lease_store_suite!(Memory(MemoryLeaseStore::default()), run);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(lock: &str, epoch: u64) -> Lease {
        Lease {
            id: LeaseId(u128::from(epoch)),
            principal: palisade_core::Principal::anonymous(),
            lock: LockName::new(lock).unwrap(),
            holder: HolderId::new("h").unwrap(),
            epoch: Epoch(epoch),
            ttl_ms: 1_000,
            class: LockClass::Efficiency,
            expires_at: 0,
            granted_unix_ms: 0,
            renewed_unix_ms: 0,
            request_id: None,
        }
    }

    #[test]
    fn p8_committed_changes_are_loaded_back_after_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        {
            let mut store = RedbLeaseStore::open(&path).unwrap();
            let changes = Changes {
                locks: vec![
                    (LockName::new("a").unwrap(), Some(lease("a", 3))),
                    (LockName::new("b").unwrap(), Some(lease("b", 4))),
                ],
                last_epoch: Epoch(4),
                endings: Vec::new(),
            };
            store.commit(&changes).unwrap();
            let release_b = Changes {
                locks: vec![(LockName::new("b").unwrap(), None)],
                last_epoch: Epoch(4),
                endings: Vec::new(),
            };
            store.commit(&release_b).unwrap();
        }
        let store = RedbLeaseStore::open(&path).unwrap();
        let state = store.load().unwrap();
        assert_eq!(state.last_epoch, Epoch(4));
        assert_eq!(state.leases, vec![lease("a", 3)]);
    }

    #[test]
    fn p1_the_epoch_counter_never_goes_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = RedbLeaseStore::open(&dir.path().join("db")).unwrap();
        let up = Changes {
            locks: vec![],
            last_epoch: Epoch(10),
            endings: Vec::new(),
        };
        store.commit(&up).unwrap();
        let down = Changes {
            locks: vec![],
            last_epoch: Epoch(9),
            endings: Vec::new(),
        };
        assert!(matches!(store.commit(&down), Err(StoreError::Corrupt(_))));
        assert_eq!(store.load().unwrap().last_epoch, Epoch(10));
    }

    #[test]
    fn a_second_process_cannot_open_the_same_store() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let _first = RedbLeaseStore::open(&path).unwrap();
        assert!(RedbLeaseStore::open(&path).is_err());
    }
}
