//! openraft's storage (v2): the Raft log in an append-only file of its own ([`crate::raft_log`];
//! two files beside the redb file, one in use), and in one redb file the vote, the replicated
//! state machine (epoch counter, live leases, token keys), the current snapshot, and which log
//! file is in use with the last purged log id.
//!
//! Durability contract (what openraft relies on, and what makes P1/P8 hold across crashes):
//! - `append` calls back only after the entries' one write is fdatasynced;
//! - `save_vote` returns only once the vote is on disk (a node never votes twice in a term);
//! - `apply` commits the state machine's rows and `last_applied` in one transaction without an
//!   fsync (`Durability::None`): redb makes it durable with the store's next immediate commit
//!   (a vote, a purge, a snapshot, or [`SmSync::sync`], which a member runs every 200 ms and at
//!   a stop), and a crash before that rolls the state machine back to an earlier
//!   `last_applied`, still exactly "every entry up to it", whose later entries the log still
//!   holds (they are durable there, and purges only reach entries the state machine applied,
//!   made durable by the purge's own commit): openraft applies them again.
//!   Whatever must never get ahead of the disk (the member's witness) follows the *durable*
//!   `last_applied` ([`StateMachine::durable_applied_watch`]), raised after each immediate
//!   commit; `save_committed` is not fsynced either (openraft may lose it);
//! - a log read returns entries from the range's start without a gap, or nothing: a read that
//!   skipped a purged start made a deposed leader's replication task send a follower a log with
//!   a hole (see `try_get_log_entries`);
//! - `append` refuses entries that do not continue the log exactly (a gap is never written);
//! - `purge` never removes entries the state machine has not applied, and records the purge
//!   (durably, with every apply so far) before the log file forgets them: a follower that
//!   installs a snapshot is told to purge before its state machine has installed it, and a
//!   crash in between would leave a log purged past `last_applied` (see `purge`).

// openraft's `StorageError` is large and its traits return it: nothing to box here.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io::Cursor;
use std::ops::RangeBounds;

use std::sync::{Arc, Mutex};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    Entry, EntryPayload, LogId, RaftLogReader, RaftSnapshotBuilder, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership, Vote,
};
use palisade_core::{Epoch, Lease, LockName};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, watch};

use super::identity::Identity;
use super::raft_log::{LogError, RaftLog};
use super::{Applied, AppliedTransition, ClusterError, Command, NodeId, TypeConfig};

mod open;
pub use open::{log_paths, open, open_backend, read_counter};

/// Log index → JSON of the entry: the Raft log of a store from before the log file, moved into
/// the file at its first open (then empty).
const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
/// Which of the two Raft log files is in use (0 or 1; none: 0).
const LOG_FILE: &str = "log_file";
/// `vote`, `committed`, `last_purged`, [`LOG_FILE`]: JSON.
const RAFT_META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");
/// Lock name → JSON of its live lease (the replicated state machine).
const SM_LEASES: TableDefinition<&str, &[u8]> = TableDefinition::new("sm_leases");
/// `header`: JSON of [`SmHeader`].
const SM_META: TableDefinition<&str, &[u8]> = TableDefinition::new("sm_meta");
/// `current`: JSON of [`StoredSnapshot`].
const SNAPSHOT: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_snapshot");

type Membership = StoredMembership<NodeId, super::MemberNode>;
type Result<T> = std::result::Result<T, StorageError<NodeId>>;

/// Longest a purge waits for the state machine to apply (durably) what it purges. It only waits
/// on a follower installing a snapshot, for that install's own transaction; past this the
/// store reports an error (the member stops) rather than purge entries it has not applied.
pub const PURGE_WAIT_FOR_APPLY: std::time::Duration = std::time::Duration::from_secs(60);

/// The replicated state, small fields (the leases are rows of their own).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct SmHeader {
    /// The last log entry applied.
    pub last_applied: Option<LogId<NodeId>>,
    /// The last membership applied.
    pub membership: Membership,
    /// The greatest epoch any committed grant used: a leader grants only above it.
    pub last_epoch: Epoch,
    /// Token keys of every node that has led (key id → base64url public key): resources that
    /// fetch `/v1/keys` from any member trust tokens of every leader.
    pub keys: BTreeMap<String, String>,
    /// How many leader terms have started (`LeaderStart` entries applied).
    pub leader_starts: u64,
    /// Which node registered each key (key id → node; keys registered before this was kept
    /// have none).
    #[serde(default)]
    pub key_owners: BTreeMap<String, NodeId>,
    /// Keys retired by an operator: never published again.
    #[serde(default)]
    pub retired_keys: std::collections::BTreeSet<String>,
}

/// The replicated state machine in memory (mirrors the redb rows).
#[derive(Debug, Clone, Default)]
pub struct SmState {
    /// The small fields.
    pub header: SmHeader,
    /// Live leases by lock.
    pub leases: BTreeMap<LockName, Lease>,
}

#[derive(Serialize, Deserialize)]
struct SnapshotData {
    header: SmHeader,
    leases: Vec<Lease>,
}

#[derive(Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta<NodeId, super::MemberNode>,
    data: Vec<u8>,
}

fn read_err(e: impl std::error::Error + 'static) -> StorageError<NodeId> {
    StorageIOError::read(&e).into()
}

fn write_err(e: impl std::error::Error + 'static) -> StorageError<NodeId> {
    StorageIOError::write(&e).into()
}

/// A write refused because it would break an invariant of the log (never written).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct LogInvariant(pub String);

fn invariant_err(message: String) -> StorageError<NodeId> {
    StorageIOError::write_logs(&LogInvariant(message)).into()
}

/// Raises the durable watermark to `applied` (it never goes down).
fn mark_durable(durable: &watch::Sender<Option<LogId<NodeId>>>, applied: Option<LogId<NodeId>>) {
    durable.send_if_modified(|known| {
        let higher = applied > *known;
        if higher {
            *known = applied;
        }
        higher
    });
}

fn to_json<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("raft storage values always serialize")
}

fn from_json<T: for<'a> Deserialize<'a>>(bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(read_err)
}

fn load_state(db: &Database) -> Result<SmState> {
    let txn = db.begin_read().map_err(read_err)?;
    let meta = txn.open_table(SM_META).map_err(read_err)?;
    let header = match meta.get("header").map_err(read_err)? {
        Some(bytes) => from_json(bytes.value())?,
        None => SmHeader::default(),
    };
    let mut leases = BTreeMap::new();
    let table = txn.open_table(SM_LEASES).map_err(read_err)?;
    for row in table.iter().map_err(read_err)? {
        let (_, value) = row.map_err(read_err)?;
        let lease: Lease = from_json(value.value())?;
        leases.insert(lease.lock.clone(), lease);
    }
    Ok(SmState { header, leases })
}

/// The applied state, locked. Every change of it replaces whole values built beforehand (an
/// apply builds the next state on a copy; an install assigns what it read), so a panic while
/// the lock was held cannot have left it half-changed: a poisoned lock is taken as it is,
/// instead of making every later reader (the leader engine, `/v1/keys`, the status) panic.
pub fn lock_state(state: &Mutex<SmState>) -> std::sync::MutexGuard<'_, SmState> {
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The log side of the store (also its reader).
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Database>,
    /// The entries (an append-only file of their own), locked only to read or change the
    /// index: their writes and fsyncs run without the lock ([`crate::raft_log::staged`]).
    log: Arc<Mutex<RaftLog>>,
    /// Held by a change of the log (append, truncate, purge) from its plan to its publication:
    /// one at a time, whoever calls.
    writer: Arc<tokio::sync::Mutex<()>>,
    /// A real disk is behind the log: its I/O runs on tokio's blocking pool (see
    /// [`LogStore::io`]).
    blocks: bool,
    /// The state machine's `last_applied` (a purge waits for it; the purge's own immediate
    /// commit makes it durable).
    applied: watch::Receiver<Option<LogId<NodeId>>>,
    /// The `last_applied` known to be on disk (see [`mark_durable`]).
    durable: Arc<watch::Sender<Option<LogId<NodeId>>>>,
    /// Told where the log ends, for the census of a restarted peer (`identity` rule 4).
    identity: Identity,
}

impl LogStore {
    fn meta<T: for<'a> Deserialize<'a>>(&self, key: &str) -> Result<Option<T>> {
        let txn = self.db.begin_read().map_err(read_err)?;
        let table = txn.open_table(RAFT_META).map_err(read_err)?;
        let value = table.get(key).map_err(read_err)?;
        value.map(|v| from_json(v.value())).transpose()
    }

    fn put_meta<T: Serialize>(&self, key: &str, value: &T) -> Result<()> {
        let txn = meta_write(&self.db, key, value, Durability::Immediate)?;
        commit_durably(txn, &self.applied.borrow(), &self.durable)
    }

    /// The log, locked to read or change its index. A panic of an earlier call while it
    /// held the lock may have left the index half-changed, and a failed staged write may have
    /// left it ahead of the file: every later call fails with that cause (the member's Raft
    /// stops, and its supervisor exits with it) instead of panicking in turn.
    fn log(&self) -> Result<std::sync::MutexGuard<'_, RaftLog>> {
        let log = self.log.lock().map_err(|_| {
            write_err(LogInvariant(
                "a panic in an earlier call left the raft log's index in an unknown state; \
                 restart the member (its log is read again from the file)"
                    .into(),
            ))
        })?;
        if let Some(cause) = log.failed() {
            return Err(write_err(LogInvariant(format!(
                "an earlier write of the raft log failed ({cause}); restart the member (its \
                 log is read again from the file)"
            ))));
        }
        Ok(log)
    }

    /// Runs `io` (a write, an fsync, a compaction's copy) without the log's lock and off the
    /// async runtime's threads: on tokio's blocking pool for a real disk, inline for a
    /// simulated one (whose calls return at once, in the order a seed gives them). Nothing
    /// runs once the log failed, and a failure fails it (see [`Self::log`]).
    async fn io<T: Send + 'static>(
        &self,
        io: impl FnOnce() -> std::result::Result<T, LogError> + Send + 'static,
    ) -> Result<T> {
        drop(self.log()?);
        let result = if self.blocks {
            tokio::task::spawn_blocking(io)
                .await
                .unwrap_or_else(|join| {
                    Err(LogError::Io(std::io::Error::other(format!(
                        "the raft log's I/O task failed: {join}"
                    ))))
                })
        } else {
            io()
        };
        result.map_err(|error| {
            if let Ok(mut log) = self.log.lock() {
                log.fail(&error.to_string());
            }
            log_err(error)
        })
    }

    /// [`Self::put_meta`] as the log's I/O reports it.
    fn put_meta_io<T: Serialize>(&self, key: &str, value: &T) -> std::result::Result<(), LogError> {
        self.put_meta(key, value)
            .map_err(|e| LogError::Io(std::io::Error::other(e.to_string())))
    }

    /// Records `file` as the Raft log file in use (a compaction's switch), durably.
    fn switch_to(&self, file: usize) -> std::result::Result<(), LogError> {
        self.put_meta_io(LOG_FILE, &file)
    }

    /// Appends `entries` durably (one write, one fdatasync, without the log's lock), refusing
    /// any that would not continue the log exactly; returns the last one's id (`None`: there
    /// were none).
    async fn write_entries(
        &self,
        entries: impl IntoIterator<Item = Entry<TypeConfig>>,
    ) -> Result<Option<LogId<NodeId>>> {
        let entries: Vec<(LogId<NodeId>, Vec<u8>)> = entries
            .into_iter()
            .map(|entry| (entry.log_id, to_json(&entry)))
            .collect();
        let Some((first, last)) = entries.first().zip(entries.last()) else {
            return Ok(None);
        };
        let (first, last) = (first.0.index, last.0);
        let _writer = self.writer.lock().await;
        let mut append = self.log()?.plan_append(&entries).map_err(log_err)?;
        if self.log()?.append_compacts_first(first) {
            self.compact().await?;
            append = self.log()?.plan_append(&entries).map_err(log_err)?;
        }
        let Some(append) = append else {
            return Ok(None);
        };
        let append = self.io(move || append.write().map(|()| append)).await?;
        self.log()?.publish_append(append);
        Ok(Some(last))
    }

    /// Copies the live entries into the other log file and switches to it (the caller holds
    /// the writer): the copy, the switch's commit and emptying the old file run without the
    /// log's lock, readers reading the file in use meanwhile.
    async fn compact(&self) -> Result<()> {
        let plan = self.log()?.plan_compaction();
        let store = self.clone();
        let compacted = self
            .io(move || {
                let compacted = plan.copy()?;
                store.switch_to(compacted.file())?;
                Ok(compacted)
            })
            .await?;
        let old = self.log()?.publish_compaction(compacted);
        self.io(move || old.set_len(0).map_err(LogError::from))
            .await
    }
}

/// A write transaction of `durability` that sets `key` to `value`, not yet committed.
fn meta_write<T: Serialize>(
    db: &Database,
    key: &str,
    value: &T,
    durability: Durability,
) -> Result<redb::WriteTransaction> {
    let mut txn = db.begin_write().map_err(write_err)?;
    txn.set_durability(durability).map_err(write_err)?;
    {
        let mut table = txn.open_table(RAFT_META).map_err(write_err)?;
        table
            .insert(key, to_json(value).as_slice())
            .map_err(write_err)?;
    }
    Ok(txn)
}

/// Commits `txn` (an immediate one) and records that every apply committed before it is now
/// durable too: redb makes earlier non-durable commits durable with it. `applied` is read
/// while `txn` holds the writer: every value published so far comes from an apply whose
/// commit finished before this transaction began.
fn commit_durably(
    txn: redb::WriteTransaction,
    applied: &Option<LogId<NodeId>>,
    durable: &watch::Sender<Option<LogId<NodeId>>>,
) -> Result<()> {
    let applied = *applied;
    txn.commit().map_err(write_err)?;
    mark_durable(durable, applied);
    Ok(())
}

fn log_err(error: LogError) -> StorageError<NodeId> {
    match error {
        LogError::Refused(message) => invariant_err(message),
        LogError::Io(e) => write_err(e),
        LogError::Damaged(message) => write_err(LogInvariant(message)),
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>> {
        // Only a run that starts at the range's start and has no gap is returned. A caller
        // sends what it reads after its `prev_log_id` (the entry before the range): entries
        // that skip a purged or missing index would be a log with a hole at the follower.
        // Nothing is safe (openraft sends a heartbeat and looks again).
        let bounds = (range.start_bound().cloned(), range.end_bound().cloned());
        let raw = self
            .log()?
            .read(bounds)
            .map_err(|e| read_err(LogInvariant(e.to_string())))?;
        raw.iter().map(|json| from_json(json)).collect()
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>> {
        let (last_purged, last) = {
            let log = self.log()?;
            (log.purged(), log.last())
        };
        self.identity.set_last_log(last);
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<()> {
        // An immediate commit (an fsync): off the runtime's threads as the log's writes.
        let (store, vote) = (self.clone(), *vote);
        self.io(move || store.put_meta_io("vote", &vote)).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>> {
        // Read as not committed: openraft restores a member whose committed vote names itself
        // as the leader of that term at once, with the log it finds. If the disk went back in
        // time (a whole-volume snapshot put back), that log may lack entries it appended as
        // leader in the same term, and its next entries would reuse their log ids with other
        // content (`identity` rule 5). Not committed, the vote still refuses every other
        // candidate of its term and yields to that term's leader; the member campaigns in a
        // later term.
        Ok(self
            .meta::<Vote<NodeId>>("vote")?
            .map(|vote| Vote::new(vote.leader_id.term, vote.leader_id.node_id)))
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> Result<()> {
        // A hint openraft may lose (it learns the commit index from the leader again): not
        // fsynced, made durable by the next immediate commit.
        meta_write(&self.db, "committed", &committed, Durability::None)?
            .commit()
            .map_err(write_err)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>> {
        Ok(self.meta::<Option<LogId<NodeId>>>("committed")?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let result = self.write_entries(entries).await.map(|last| {
            if last.is_some() {
                self.identity.set_last_log(last);
            }
        });
        // The callback says the entries are durable: only after the immediate commit.
        callback.log_io_completed(
            result
                .as_ref()
                .map(|_| ())
                .map_err(|e| std::io::Error::other(e.to_string())),
        );
        result
    }

    /// Removes the entries from `log_id` on: a leader's log conflicts with them. In Raft
    /// only entries that were never committed conflict, so none of them can have been
    /// applied. A truncation that reaches an applied (or known committed) entry means the
    /// members that elected this leader lost entries a majority had acknowledged — their
    /// volumes went back in time together (a snapshot put back on a majority, or a member put
    /// back forming a majority with a lagging one). This member holds the history they lost:
    /// it refuses to discard it and its Raft stops with that error (openraft 0.9 would
    /// otherwise panic applying a range that ends before its last applied entry).
    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<()> {
        let applied = *self.applied.borrow();
        let committed = self.read_committed().await?;
        let kept = [applied, committed]
            .into_iter()
            .flatten()
            .filter(|known| known.index >= log_id.index)
            .max_by_key(|known| known.index);
        if let Some(kept) = kept {
            tracing::error!(
                truncate_from = %log_id,
                applied_or_committed = %kept,
                "refusing to discard committed entries: the members that elected the current \
                 leader lost entries a majority had acknowledged (their volumes went back in \
                 time together?); this member keeps that history and stops following"
            );
            return Err(invariant_err(format!(
                "refused to truncate the log from {log_id}: entry {kept} was committed \
                 (applied or known committed here) and a leader's log no longer has it — a \
                 majority of members went back in time (volume snapshots put back?). This \
                 member holds the lost history: take an offline backup of its data directory \
                 (palisade backup --data-dir) and restore the cluster from it (palisade restore \
                 --cluster), or compare before deciding"
            )));
        }
        let _writer = self.writer.lock().await;
        let (cut, last) = {
            let mut log = self.log()?;
            (log.plan_truncate(log_id.index), log.last())
        };
        if let Some(cut) = cut {
            self.io(move || cut.write()).await?;
        }
        self.identity.set_last_log(last);
        Ok(())
    }

    /// Purges the log up to `log_id`, once the state machine has durably applied it.
    ///
    /// A follower installing a snapshot is told to purge the entries the snapshot covers while
    /// its state machine is still installing it (on another task). Purged first and crashed
    /// then, the member would restart with its log purged past `last_applied` and no way to
    /// apply the entries in between. So a purge waits for the install: the rows go only after
    /// the state machine has them (no append can slip in meanwhile: openraft appends from the
    /// same task that called this).
    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<()> {
        let mut applied = self.applied.clone();
        let applied = tokio::time::timeout(
            PURGE_WAIT_FOR_APPLY,
            applied.wait_for(|applied| applied.is_some_and(|a| a.index >= log_id.index)),
        )
        .await
        .map(|waited| waited.map(|_| ()));
        match applied {
            Ok(Ok(_)) => {}
            Ok(Err(_closed)) => {
                return Err(invariant_err(format!(
                    "refused to purge the log to {log_id}: the state machine is gone"
                )))
            }
            Err(_elapsed) => {
                return Err(invariant_err(format!(
                    "refused to purge the log to {log_id}: the state machine has not applied \
                     it within {PURGE_WAIT_FOR_APPLY:?}"
                )))
            }
        }
        let _writer = self.writer.lock().await;
        // The purged id first, durably (this commit also makes every apply so far durable):
        // a crash after it leaves records at or below it in the file, which are skipped.
        let store = self.clone();
        self.io(move || store.put_meta_io("last_purged", &log_id))
            .await?;
        let (compact, last) = {
            let mut log = self.log()?;
            (log.forget_purged(log_id), log.last())
        };
        if compact {
            self.compact().await?;
        }
        // A purge past the last entry (a snapshot installed over a shorter log) moves where
        // the log ends: a census must hear it (`identity` rule 4).
        self.identity.set_last_log(last);
        Ok(())
    }
}

/// The state machine side of the store. Its in-memory mirror is shared with the node's
/// leader engine (which loads from it) and with `/v1/keys`.
pub struct StateMachine {
    db: Arc<Database>,
    state: Arc<Mutex<SmState>>,
    identity: Identity,
    /// Publishes `last_applied` once applied and committed, durably or not (the log's purge
    /// waits for it).
    applied: Arc<watch::Sender<Option<LogId<NodeId>>>>,
    /// The `last_applied` known to be on disk (see [`mark_durable`]).
    durable: Arc<watch::Sender<Option<LogId<NodeId>>>>,
    /// The ownership transitions applied, after their commit ([`AppliedTransition`]).
    history: broadcast::Sender<AppliedTransition>,
    snapshot_seq: u64,
}

/// Applied transitions a slow reader of [`StateMachine::history`] may fall behind by.
pub const HISTORY_BUFFER: usize = 1_024;

impl StateMachine {
    /// The shared in-memory view of the applied state.
    pub fn shared(&self) -> Arc<Mutex<SmState>> {
        self.state.clone()
    }

    /// This store's identity (see [`super::identity`]).
    pub fn identity(&self) -> Identity {
        self.identity.clone()
    }

    /// The ownership transitions this member applies from now on (the leader's and every
    /// follower's alike), after each apply's commit.
    pub fn history(&self) -> broadcast::Sender<AppliedTransition> {
        self.history.clone()
    }

    /// The applied log id, as it changes (published after each apply's commit, which is not
    /// fsynced: what the disk holds is [`Self::durable_applied_watch`]).
    pub fn applied_watch(&self) -> watch::Receiver<Option<LogId<NodeId>>> {
        self.applied.subscribe()
    }

    /// The applied log id known to be on disk, as it changes: an apply commits without an
    /// fsync, and the next immediate commit of this store (a vote, a purge, a [`SmSync`], a
    /// snapshot) makes it durable. What the witness follows: it must never get ahead of the
    /// disk.
    pub fn durable_applied_watch(&self) -> watch::Receiver<Option<LogId<NodeId>>> {
        self.durable.subscribe()
    }

    /// What makes the applies durable between the store's other immediate commits.
    pub fn syncer(&self) -> SmSync {
        SmSync {
            db: self.db.clone(),
            applied: self.applied.subscribe(),
            durable: self.durable.clone(),
        }
    }

    fn snapshot_now(&mut self) -> Result<Snapshot<TypeConfig>> {
        let state = lock_state(&self.state).clone();
        self.snapshot_seq += 1;
        let data = to_json(&SnapshotData {
            header: state.header.clone(),
            leases: state.leases.into_values().collect(),
        });
        let last = state.header.last_applied;
        let meta = SnapshotMeta {
            last_log_id: last,
            last_membership: state.header.membership.clone(),
            snapshot_id: format!(
                "{}-{}-{}",
                last.map_or(0, |l| l.leader_id.term),
                last.map_or(0, |l| l.index),
                self.snapshot_seq
            ),
        };
        self.store_snapshot(&meta, &data)?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }

    fn store_snapshot(
        &self,
        meta: &SnapshotMeta<NodeId, super::MemberNode>,
        data: &[u8],
    ) -> Result<()> {
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data: data.to_vec(),
        };
        let mut txn = self.db.begin_write().map_err(write_err)?;
        txn.set_durability(Durability::Immediate)
            .map_err(write_err)?;
        {
            let mut table = txn.open_table(SNAPSHOT).map_err(write_err)?;
            table
                .insert("current", to_json(&stored).as_slice())
                .map_err(write_err)?;
        }
        let applied = *self.applied.borrow();
        txn.commit().map_err(write_err)?;
        mark_durable(&self.durable, applied);
        Ok(())
    }
}

/// Makes the state machine's applies durable. An apply commits without an fsync and the log
/// is a file of its own, so the applies become durable with the store's next immediate commit
/// (a vote, a purge, a snapshot) or with [`SmSync::sync`], which a member calls every
/// `palisade_core::witness::FOLLOW_INTERVAL` while it applies and once when it stops
/// (`palisade_cluster`): what its witness records follows.
#[derive(Clone)]
pub struct SmSync {
    db: Arc<Database>,
    applied: watch::Receiver<Option<LogId<NodeId>>>,
    durable: Arc<watch::Sender<Option<LogId<NodeId>>>>,
}

impl SmSync {
    /// One immediate commit when an apply is not durable yet (none otherwise).
    pub fn sync(&self) -> std::result::Result<(), ClusterError> {
        if *self.applied.borrow() <= *self.durable.borrow() {
            return Ok(());
        }
        let store_error = |e: StorageError<NodeId>| ClusterError::Store(e.to_string());
        let txn =
            meta_write(&self.db, "sm_synced", &true, Durability::Immediate).map_err(store_error)?;
        // Read while this transaction holds the writer (see `commit_durably`).
        let applied = *self.applied.borrow();
        commit_durably(txn, &applied, &self.durable).map_err(store_error)
    }
}

/// The transitions of one lock's change from `old` to `new`: the old lease ended (how, as
/// `ended` says), the new one was granted. A renewal (the same epoch) is none.
fn note_transitions(
    old: Option<&Lease>,
    new: Option<&Lease>,
    ended: &[palisade_core::Ended],
    history: &mut Vec<AppliedTransition>,
) {
    let (old_epoch, new_epoch) = (old.map(|l| l.epoch), new.map(|l| l.epoch));
    if old_epoch == new_epoch {
        return;
    }
    if let Some(old) = old {
        let how = ended
            .iter()
            .find(|e| e.lock == old.lock && e.epoch == old.epoch);
        history.push(AppliedTransition {
            kind: how.map_or_else(|| "ended".to_owned(), |e| e.kind.clone()),
            lease: old.clone(),
            by: how.and_then(|e| e.by.clone()),
        });
    }
    if let Some(new) = new {
        history.push(AppliedTransition {
            kind: "granted".to_owned(),
            lease: new.clone(),
            by: None,
        });
    }
}

/// A committed entry the state machine must not apply (it stops the member instead).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RefusedEntry(String);

/// Applies one command to the state, noting the locks whose rows changed.
///
/// Refuses (and so stops the member, before anything is written) a command that would move
/// the epoch counter back or carries a lease above its own counter: a leader loads the state
/// after every earlier entry is applied, so either means a broken leader or a corrupt log, and
/// applying it could let an epoch be issued twice (P1).
fn apply_command(
    state: &mut SmState,
    command: Command,
    changed: &mut Vec<LockName>,
    history: &mut Vec<AppliedTransition>,
) -> std::result::Result<(), RefusedEntry> {
    match command {
        Command::LeaderStart {
            node,
            key_id,
            public_key,
            floor,
        } => {
            // A retired key stays retired: that leader's tokens are refused by resources
            // (unavailable, never unsafe) until it runs with a new key.
            if !state.header.retired_keys.contains(&key_id) {
                state.header.key_owners.insert(key_id.clone(), node);
                state.header.keys.insert(key_id, public_key);
            }
            state.header.leader_starts += 1;
            // A restored member's floor (P6): nothing at or below it is issued from now on.
            state.header.last_epoch = state.header.last_epoch.max(floor);
        }
        Command::RetireKey { key_id } => {
            state.header.keys.remove(&key_id);
            state.header.key_owners.remove(&key_id);
            state.header.retired_keys.insert(key_id);
        }
        Command::Apply {
            last_epoch,
            locks,
            ended,
        } => {
            if last_epoch < state.header.last_epoch {
                return Err(RefusedEntry(format!(
                    "a committed change carries epoch counter {last_epoch}, below the applied \
                     counter {}",
                    state.header.last_epoch
                )));
            }
            if let Some((lock, lease)) = locks
                .iter()
                .filter_map(|(lock, lease)| Some((lock, lease.as_ref()?)))
                .find(|(_, lease)| lease.epoch > last_epoch)
            {
                return Err(RefusedEntry(format!(
                    "a committed change grants {lock} epoch {} above its own counter \
                     {last_epoch}",
                    lease.epoch
                )));
            }
            state.header.last_epoch = last_epoch;
            for (lock, lease) in locks {
                note_transitions(state.leases.get(&lock), lease.as_ref(), &ended, history);
                match lease {
                    Some(lease) => {
                        state.leases.insert(lock.clone(), lease);
                    }
                    None => {
                        state.leases.remove(&lock);
                    }
                }
                changed.push(lock);
            }
        }
    }
    Ok(())
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>> {
        self.snapshot_now()
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(&mut self) -> Result<(Option<LogId<NodeId>>, Membership)> {
        let state = lock_state(&self.state);
        Ok((state.header.last_applied, state.header.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Applied>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut next = lock_state(&self.state).clone();
        let mut changed = Vec::new();
        let mut history = Vec::new();
        let mut replies = Vec::new();
        for entry in entries {
            next.header.last_applied = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Blank => {}
                EntryPayload::Normal(command) => {
                    apply_command(&mut next, command, &mut changed, &mut history).map_err(
                        |why| {
                            tracing::error!(entry = %entry.log_id, "refusing to apply: {why}");
                            invariant_err(format!("log entry {}: {why}", entry.log_id))
                        },
                    )?
                }
                EntryPayload::Membership(membership) => {
                    next.header.membership = StoredMembership::new(Some(entry.log_id), membership);
                }
            }
            replies.push(Applied {
                last_epoch: next.header.last_epoch,
            });
        }
        let mut txn = self.db.begin_write().map_err(write_err)?;
        // Not fsynced: the entries are durable in the log, and a crash re-applies them from
        // there; the next immediate commit of this store makes this one durable too.
        txn.set_durability(Durability::None).map_err(write_err)?;
        {
            let mut leases = txn.open_table(SM_LEASES).map_err(write_err)?;
            changed.sort();
            changed.dedup();
            for lock in &changed {
                match next.leases.get(lock) {
                    Some(lease) => {
                        leases
                            .insert(lock.as_str(), to_json(lease).as_slice())
                            .map_err(write_err)?;
                    }
                    None => {
                        leases.remove(lock.as_str()).map_err(write_err)?;
                    }
                }
            }
            let mut meta = txn.open_table(SM_META).map_err(write_err)?;
            meta.insert("header", to_json(&next.header).as_slice())
                .map_err(write_err)?;
        }
        txn.commit().map_err(write_err)?;
        let applied = next.header.last_applied;
        *lock_state(&self.state) = next;
        self.applied.send_replace(applied);
        for transition in history {
            let _ = self.history.send(transition); // nobody listening is fine
        }
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        StateMachine {
            db: self.db.clone(),
            state: self.state.clone(),
            identity: self.identity.clone(),
            applied: self.applied.clone(),
            durable: self.durable.clone(),
            history: self.history.clone(),
            snapshot_seq: self.snapshot_seq + 1_000_000,
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, super::MemberNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<()> {
        let bytes = snapshot.into_inner();
        let data: SnapshotData = from_json(&bytes)?;
        let mut txn = self.db.begin_write().map_err(write_err)?;
        txn.set_durability(Durability::Immediate)
            .map_err(write_err)?;
        {
            let mut leases = txn.open_table(SM_LEASES).map_err(write_err)?;
            let old: Vec<String> = leases
                .iter()
                .map_err(write_err)?
                .map(|row| row.map(|(k, _)| k.value().to_owned()))
                .collect::<std::result::Result<_, _>>()
                .map_err(write_err)?;
            for lock in old {
                leases.remove(lock.as_str()).map_err(write_err)?;
            }
            for lease in &data.leases {
                leases
                    .insert(lease.lock.as_str(), to_json(lease).as_slice())
                    .map_err(write_err)?;
            }
            let mut meta_table = txn.open_table(SM_META).map_err(write_err)?;
            meta_table
                .insert("header", to_json(&data.header).as_slice())
                .map_err(write_err)?;
            let mut snapshots = txn.open_table(SNAPSHOT).map_err(write_err)?;
            let stored = StoredSnapshot {
                meta: meta.clone(),
                data: bytes.clone(),
            };
            snapshots
                .insert("current", to_json(&stored).as_slice())
                .map_err(write_err)?;
        }
        txn.commit().map_err(write_err)?;
        let applied = data.header.last_applied;
        {
            let mut state = lock_state(&self.state);
            state.header = data.header;
            state.leases = data
                .leases
                .into_iter()
                .map(|lease| (lease.lock.clone(), lease))
                .collect();
        }
        self.applied.send_replace(applied);
        mark_durable(&self.durable, applied);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>> {
        let txn = self.db.begin_read().map_err(read_err)?;
        let table = txn.open_table(SNAPSHOT).map_err(read_err)?;
        let Some(value) = table.get("current").map_err(read_err)? else {
            return Ok(None);
        };
        let stored: StoredSnapshot = from_json(value.value())?;
        Ok(Some(Snapshot {
            meta: stored.meta,
            snapshot: Box::new(Cursor::new(stored.data)),
        }))
    }
}

#[cfg(test)]
#[path = "storage_tests.rs"]
mod tests;
