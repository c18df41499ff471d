//! openraft's storage (v2) over one redb file: the Raft log, the vote, and the replicated
//! state machine (epoch counter, live leases, token keys), plus the current snapshot.
//!
//! Durability contract (what openraft relies on, and what makes P1/P8 hold across crashes):
//! - `append` calls back only after the entries are committed with `Durability::Immediate`;
//! - `save_vote` returns only once the vote is on disk (a node never votes twice in a term);
//! - `apply` commits the state machine's rows and `last_applied` in one immediate transaction,
//!   so after a crash the state machine is exactly "every entry up to `last_applied`" and the
//!   log still holds every entry after it (purges only reach entries a snapshot covers).

// openraft's `StorageError` is large and its traits return it: nothing to box here.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io::Cursor;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::{Arc, Mutex};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    Entry, EntryPayload, LogId, RaftLogReader, RaftSnapshotBuilder, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership, Vote,
};
use palisade_core::{Epoch, Lease, LockName};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use super::identity::Identity;
use super::{Applied, Command, NodeId, TypeConfig};

/// Log index → JSON of the entry.
const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
/// `vote`, `committed`, `last_purged`: JSON.
const RAFT_META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");
/// Lock name → JSON of its live lease (the replicated state machine).
const SM_LEASES: TableDefinition<&str, &[u8]> = TableDefinition::new("sm_leases");
/// `header`: JSON of [`SmHeader`].
const SM_META: TableDefinition<&str, &[u8]> = TableDefinition::new("sm_meta");
/// `current`: JSON of [`StoredSnapshot`].
const SNAPSHOT: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_snapshot");

type Membership = StoredMembership<NodeId, openraft::BasicNode>;
type Result<T> = std::result::Result<T, StorageError<NodeId>>;

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
    meta: SnapshotMeta<NodeId, openraft::BasicNode>,
    data: Vec<u8>,
}

fn read_err(e: impl std::error::Error + 'static) -> StorageError<NodeId> {
    StorageIOError::read(&e).into()
}

fn write_err(e: impl std::error::Error + 'static) -> StorageError<NodeId> {
    StorageIOError::write(&e).into()
}

fn to_json<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("raft storage values always serialize")
}

fn from_json<T: for<'a> Deserialize<'a>>(bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(read_err)
}

/// Opens (or creates) the cluster's store at `path`: the log side and the state machine side.
/// Fails loudly on a file that is locked, unreadable or corrupt.
pub fn open(path: &Path) -> std::result::Result<(LogStore, StateMachine), String> {
    let db = Database::create(path).map_err(|e| format!("open {}: {e}", path.display()))?;
    open_database(db)
}

/// [`open`] over another redb backend (a simulation's crashable memory).
pub fn open_backend(
    backend: impl redb::StorageBackend,
) -> std::result::Result<(LogStore, StateMachine), String> {
    let db = Database::builder()
        .create_with_backend(backend)
        .map_err(|e| format!("open the store: {e}"))?;
    open_database(db)
}

fn open_database(db: Database) -> std::result::Result<(LogStore, StateMachine), String> {
    let db = Arc::new(db);
    let txn = db.begin_write().map_err(|e| e.to_string())?;
    for table in [RAFT_META, SM_META, SNAPSHOT, SM_LEASES] {
        txn.open_table(table).map_err(|e| e.to_string())?;
    }
    txn.open_table(LOG).map_err(|e| e.to_string())?;
    txn.commit().map_err(|e| e.to_string())?;
    let state = load_state(&db).map_err(|e| format!("corrupt state machine: {e}"))?;
    let state = Arc::new(Mutex::new(state));
    let identity = Identity::open(db.clone())?;
    Ok((
        LogStore { db: db.clone() },
        StateMachine {
            db,
            state,
            identity,
            snapshot_seq: 0,
        },
    ))
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

/// The log side of the store (also its reader: redb readers never block the writer).
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Database>,
}

impl LogStore {
    fn meta<T: for<'a> Deserialize<'a>>(&self, key: &str) -> Result<Option<T>> {
        let txn = self.db.begin_read().map_err(read_err)?;
        let table = txn.open_table(RAFT_META).map_err(read_err)?;
        let value = table.get(key).map_err(read_err)?;
        value.map(|v| from_json(v.value())).transpose()
    }

    fn put_meta<T: Serialize>(&self, key: &str, value: &T) -> Result<()> {
        let mut txn = self.db.begin_write().map_err(write_err)?;
        txn.set_durability(Durability::Immediate)
            .map_err(write_err)?;
        {
            let mut table = txn.open_table(RAFT_META).map_err(write_err)?;
            table
                .insert(key, to_json(value).as_slice())
                .map_err(write_err)?;
        }
        txn.commit().map_err(write_err)
    }

    /// Removes the log entries with an index in `range`, and records `purged` if given.
    fn remove(&self, range: (Bound<u64>, Bound<u64>), purged: Option<LogId<NodeId>>) -> Result<()> {
        let mut txn = self.db.begin_write().map_err(write_err)?;
        txn.set_durability(Durability::Immediate)
            .map_err(write_err)?;
        {
            let mut log = txn.open_table(LOG).map_err(write_err)?;
            let keys: Vec<u64> = log
                .range(range)
                .map_err(write_err)?
                .map(|row| row.map(|(k, _)| k.value()))
                .collect::<std::result::Result<_, _>>()
                .map_err(write_err)?;
            for key in keys {
                log.remove(key).map_err(write_err)?;
            }
            if let Some(purged) = purged {
                let mut meta = txn.open_table(RAFT_META).map_err(write_err)?;
                meta.insert("last_purged", to_json(&purged).as_slice())
                    .map_err(write_err)?;
            }
        }
        txn.commit().map_err(write_err)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>> {
        let txn = self.db.begin_read().map_err(read_err)?;
        let log = txn.open_table(LOG).map_err(read_err)?;
        let bounds = (range.start_bound().cloned(), range.end_bound().cloned());
        let mut entries = Vec::new();
        for row in log.range(bounds).map_err(read_err)? {
            let (_, value) = row.map_err(read_err)?;
            entries.push(from_json(value.value())?);
        }
        Ok(entries)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>> {
        let last_purged: Option<LogId<NodeId>> = self.meta("last_purged")?;
        let txn = self.db.begin_read().map_err(read_err)?;
        let log = txn.open_table(LOG).map_err(read_err)?;
        let last = match log.last().map_err(read_err)? {
            Some((_, value)) => Some(from_json::<Entry<TypeConfig>>(value.value())?.log_id),
            None => last_purged,
        };
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<()> {
        self.put_meta("vote", vote)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>> {
        self.meta("vote")
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> Result<()> {
        self.put_meta("committed", &committed)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>> {
        Ok(self.meta::<Option<LogId<NodeId>>>("committed")?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut txn = self.db.begin_write().map_err(write_err)?;
        txn.set_durability(Durability::Immediate)
            .map_err(write_err)?;
        {
            let mut log = txn.open_table(LOG).map_err(write_err)?;
            for entry in entries {
                log.insert(entry.log_id.index, to_json(&entry).as_slice())
                    .map_err(write_err)?;
            }
        }
        let result = txn.commit();
        // The callback says the entries are durable: only after the immediate commit.
        callback.log_io_completed(
            result
                .as_ref()
                .map(|_| ())
                .map_err(|e| std::io::Error::other(e.to_string())),
        );
        result.map_err(write_err)
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<()> {
        self.remove((Bound::Included(log_id.index), Bound::Unbounded), None)
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<()> {
        self.remove(
            (Bound::Unbounded, Bound::Included(log_id.index)),
            Some(log_id),
        )
    }
}

/// The state machine side of the store. Its in-memory mirror is shared with the node's
/// leader engine (which loads from it) and with `/v1/keys`.
pub struct StateMachine {
    db: Arc<Database>,
    state: Arc<Mutex<SmState>>,
    identity: Identity,
    snapshot_seq: u64,
}

impl StateMachine {
    /// The shared in-memory view of the applied state.
    pub fn shared(&self) -> Arc<Mutex<SmState>> {
        self.state.clone()
    }

    /// This store's identity (see [`super::identity`]).
    pub fn identity(&self) -> Identity {
        self.identity.clone()
    }

    /// After a membership is applied: peers no longer in it are forgotten.
    fn retain_members(&self, membership: &Membership) {
        let members: Vec<NodeId> = membership.nodes().map(|(id, _)| *id).collect();
        self.identity.retain_members(&members);
    }

    fn snapshot_now(&mut self) -> Result<Snapshot<TypeConfig>> {
        let state = self.state.lock().expect("not poisoned").clone();
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
        meta: &SnapshotMeta<NodeId, openraft::BasicNode>,
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
        txn.commit().map_err(write_err)
    }
}

/// Applies one command to the state; returns the locks whose rows changed.
fn apply_command(state: &mut SmState, command: Command, changed: &mut Vec<LockName>) {
    match command {
        Command::LeaderStart {
            key_id, public_key, ..
        } => {
            state.header.keys.insert(key_id, public_key);
            state.header.leader_starts += 1;
        }
        Command::Apply { last_epoch, locks } => {
            if last_epoch < state.header.last_epoch {
                // Cannot happen: a leader loads the state after every earlier entry applied.
                // Never let the counter go back (P1) even so.
                tracing::error!(
                    %last_epoch,
                    current = %state.header.last_epoch,
                    "a committed change carries a lower epoch counter; keeping the higher one"
                );
            }
            state.header.last_epoch = state.header.last_epoch.max(last_epoch);
            for (lock, lease) in locks {
                match lease {
                    Some(lease) => {
                        state.header.last_epoch = state.header.last_epoch.max(lease.epoch);
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
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>> {
        self.snapshot_now()
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(&mut self) -> Result<(Option<LogId<NodeId>>, Membership)> {
        let state = self.state.lock().expect("not poisoned");
        Ok((state.header.last_applied, state.header.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Applied>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut next = self.state.lock().expect("not poisoned").clone();
        let mut changed = Vec::new();
        let mut membership_changed = false;
        let mut replies = Vec::new();
        for entry in entries {
            next.header.last_applied = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Blank => {}
                EntryPayload::Normal(command) => apply_command(&mut next, command, &mut changed),
                EntryPayload::Membership(membership) => {
                    next.header.membership = StoredMembership::new(Some(entry.log_id), membership);
                    membership_changed = true;
                }
            }
            replies.push(Applied {
                last_epoch: next.header.last_epoch,
            });
        }
        let mut txn = self.db.begin_write().map_err(write_err)?;
        txn.set_durability(Durability::Immediate)
            .map_err(write_err)?;
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
        if membership_changed {
            self.retain_members(&next.header.membership);
        }
        *self.state.lock().expect("not poisoned") = next;
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        StateMachine {
            db: self.db.clone(),
            state: self.state.clone(),
            identity: self.identity.clone(),
            snapshot_seq: self.snapshot_seq + 1_000_000,
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, openraft::BasicNode>,
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
        self.retain_members(&data.header.membership);
        let mut state = self.state.lock().expect("not poisoned");
        state.header = data.header;
        state.leases = data
            .leases
            .into_iter()
            .map(|lease| (lease.lock.clone(), lease))
            .collect();
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
