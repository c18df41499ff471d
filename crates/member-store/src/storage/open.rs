//! Opening a member's store: its redb file and the Raft log files beside it, a log of an
//! earlier version moved into its file, a lost log file refused; and an offline read of its
//! epoch counter.

use std::path::Path;
use std::sync::{Arc, Mutex};

use openraft::{Entry, EntryPayload, LogId, StorageError};
use palisade_core::Epoch;
use redb::{Database, Durability, ReadableDatabase, ReadableTable};
use tokio::sync::watch;

use super::{
    from_json, load_state, meta_write, read_err, to_json, write_err, LogStore, Result, SmHeader,
    StateMachine, LOG, LOG_FILE, RAFT_META, SM_LEASES, SM_META, SNAPSHOT,
};
use crate::identity::Identity;
use crate::raft_log::{Entries, LogError, LogFile, RaftLog};
use crate::{ClusterError, Command, NodeId, TypeConfig};

/// Opens (or creates) the cluster's store at `path` (redb: the vote, the state machine, the
/// snapshot, the identity) and its Raft log beside it ([`log_paths`]): the log side and the
/// state machine side. Fails loudly on a file that is locked, unreadable or corrupt.
pub fn open(path: &Path) -> std::result::Result<(LogStore, StateMachine), ClusterError> {
    // Any file created here (the store, or the log files beside a store of an earlier
    // version) must have its name survive a power cut: the directory is fsynced below.
    let created = !path.exists() || log_paths(path).iter().any(|log| !log.exists());
    let db = Database::create(path)
        .map_err(|e| ClusterError::Store(format!("open {}: {e}", path.display())))?;
    // redb's lock on the store is held from here: no other process opens the log files.
    let [first, second] = log_paths(path);
    let open_log = |log: &Path| -> std::result::Result<Box<dyn LogFile>, ClusterError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(log)
            .map_err(|e| ClusterError::Store(format!("open {}: {e}", log.display())))?;
        Ok(Box::new(file))
    };
    let files = [open_log(&first)?, open_log(&second)?];
    if created {
        palisade_durable::sync_parent_dir(path).map_err(|e| {
            ClusterError::Store(format!("fsync the directory of {}: {e}", path.display()))
        })?;
    }
    open_database(db, files).map_err(|e| match e {
        ClusterError::Store(why) => ClusterError::Store(format!("{}: {why}", path.display())),
        other => other,
    })
}

/// The two Raft log files beside the store at `path`: `cluster.raftlog.0` and
/// `cluster.raftlog.1` for `cluster.redb` (one is in use, see [`crate::raft_log`]).
pub fn log_paths(path: &Path) -> [std::path::PathBuf; 2] {
    [0, 1].map(|n| path.with_extension(format!("raftlog.{n}")))
}

/// [`open`] over another redb backend and other log files (a simulation's crashable memory).
pub fn open_backend(
    backend: impl redb::StorageBackend,
    log_files: [Box<dyn LogFile>; 2],
) -> std::result::Result<(LogStore, StateMachine), ClusterError> {
    let db = Database::builder()
        .create_with_backend(backend)
        .map_err(|e| ClusterError::Store(format!("open the store: {e}")))?;
    open_database(db, log_files)
}

fn open_database(
    db: Database,
    log_files: [Box<dyn LogFile>; 2],
) -> std::result::Result<(LogStore, StateMachine), ClusterError> {
    let db = Arc::new(db);
    let txn = db.begin_write().map_err(|e| store_error(&e))?;
    for table in [RAFT_META, SM_META, SNAPSHOT, SM_LEASES] {
        txn.open_table(table).map_err(|e| store_error(&e))?;
    }
    txn.open_table(LOG).map_err(|e| store_error(&e))?;
    txn.commit().map_err(|e| store_error(&e))?;
    let state =
        load_state(&db).map_err(|e| ClusterError::Store(format!("corrupt state machine: {e}")))?;
    let log = open_log(&db, log_files)?;
    let (applied_tx, applied) = watch::channel(state.header.last_applied);
    let durable = Arc::new(watch::channel(state.header.last_applied).0);
    let state = Arc::new(Mutex::new(state));
    let identity = Identity::open(&db)?;
    identity.set_last_log(log.last());
    Ok((
        LogStore {
            db: db.clone(),
            blocks: log.blocks(),
            log: Arc::new(Mutex::new(log)),
            writer: Arc::new(tokio::sync::Mutex::new(())),
            applied,
            durable: durable.clone(),
            identity: identity.clone(),
        },
        StateMachine {
            db,
            state,
            identity,
            applied: Arc::new(applied_tx),
            durable,
            history: tokio::sync::broadcast::channel(super::HISTORY_BUFFER).0,
            snapshot_seq: 0,
        },
    ))
}

/// Reads the Raft log in the file the store names, after moving the entries of a store from
/// before the log file (kept in redb's `raft_log` table) into it.
fn open_log(
    db: &Database,
    files: [Box<dyn LogFile>; 2],
) -> std::result::Result<RaftLog, ClusterError> {
    let (named, purged, old) = read_log_meta(db).map_err(|e| store_error(&e))?;
    let active = named.unwrap_or(0).min(1);
    if old.is_empty() {
        open_named_log(db, files, named, active, purged)
    } else {
        move_old_log(db, files, active, purged, old)
    }
}

fn store_error(e: &dyn std::fmt::Display) -> ClusterError {
    ClusterError::Store(e.to_string())
}

/// What the store says of its log: the file it names (none before the first open of this
/// version), the last purged id, and the entries of a store from before the log file.
fn read_log_meta(db: &Database) -> Result<(Option<usize>, Option<LogId<NodeId>>, Entries)> {
    let txn = db.begin_read().map_err(read_err)?;
    let meta = txn.open_table(RAFT_META).map_err(read_err)?;
    let get = |key: &str| meta.get(key).map_err(read_err);
    let active: Option<usize> = match get(LOG_FILE)? {
        Some(v) => Some(from_json(v.value())?),
        None => None,
    };
    let purged: Option<LogId<NodeId>> = match get("last_purged")? {
        Some(v) => from_json(v.value())?,
        None => None,
    };
    let table = txn.open_table(LOG).map_err(read_err)?;
    let mut old = Vec::new();
    for row in table.iter().map_err(read_err)? {
        let (_, value) = row.map_err(read_err)?;
        let entry: Entry<TypeConfig> = from_json(value.value())?;
        old.push((entry.log_id, value.value().to_vec()));
    }
    Ok((active, purged, old))
}

/// Opens the log file in use; refuses a named file that is gone or empty, and names the file
/// at the first open, so that a lost one is noticed from then on.
fn open_named_log(
    db: &Database,
    files: [Box<dyn LogFile>; 2],
    named: Option<usize>,
    active: usize,
    purged: Option<LogId<NodeId>>,
) -> std::result::Result<RaftLog, ClusterError> {
    let length = files[active]
        .len()
        .map_err(|e| ClusterError::Store(format!("raft log: {e}")))?;
    if named.is_some() && length == 0 {
        // The store names its log file, and that file was written (a header at least)
        // before it was named: empty now, the log is gone, and with it every entry this
        // member acknowledged.
        return Err(ClusterError::DataDirectory(format!(
            "the Raft log file cluster.raftlog.{active} is missing or empty, but this \
             member's store (cluster.redb) keeps its log there: the entries it acknowledged \
             are gone (was cluster.redb copied or restored without the cluster.raftlog \
             files?). Put the whole data directory back, or remove this member and add it \
             back empty (palisade cluster remove N; restart it with --join on an empty data \
             directory; palisade cluster add N HOST:PORT)"
        )));
    }
    let log =
        RaftLog::open(files, active, purged, &mut |file| name_log_file(db, file)).map_err(|e| {
            ClusterError::Store(format!(
                "{e} (in cluster.raftlog.{active}, the file in use)"
            ))
        })?;
    if named.is_none() {
        name_log_file(db, log.active()).map_err(|e| store_error(&e))?;
    }
    Ok(log)
}

/// Records `file` as the Raft log file in use, durably (at the first open, or when an open
/// moved a log of format 1 into the other file).
fn name_log_file(db: &Database, file: usize) -> std::result::Result<(), LogError> {
    let to_log_error = |e: StorageError<NodeId>| LogError::Io(std::io::Error::other(e.to_string()));
    let txn = meta_write(db, LOG_FILE, &file, Durability::Immediate).map_err(to_log_error)?;
    txn.commit()
        .map_err(|e| LogError::Io(std::io::Error::other(e.to_string())))
}

/// A store of an earlier version: its entries go into the file not in use, which then
/// becomes the one in use in the same commit that empties the table (a crash before it
/// leaves the table as it was, and this runs again).
fn move_old_log(
    db: &Database,
    files: [Box<dyn LogFile>; 2],
    active: usize,
    purged: Option<LogId<NodeId>>,
    old: Entries,
) -> std::result::Result<RaftLog, ClusterError> {
    let target = 1 - active;
    files[target]
        .set_len(0)
        .map_err(|e| ClusterError::Store(format!("raft log: {e}")))?;
    let mut no_switch = |_| Ok(());
    let mut log =
        RaftLog::open(files, target, purged, &mut no_switch).map_err(|e| store_error(&e))?;
    log.append(&old, &mut no_switch)
        .map_err(|e| store_error(&e))?;
    let moved = || -> Result<()> {
        let mut txn = db.begin_write().map_err(write_err)?;
        txn.set_durability(Durability::Immediate)
            .map_err(write_err)?;
        {
            let mut table = txn.open_table(LOG).map_err(write_err)?;
            table.retain(|_, _| false).map_err(write_err)?;
            let mut meta = txn.open_table(RAFT_META).map_err(write_err)?;
            meta.insert(LOG_FILE, to_json(&target).as_slice())
                .map_err(write_err)?;
        }
        txn.commit().map_err(write_err)
    };
    moved().map_err(|e| store_error(&e))?;
    tracing::info!(
        entries = old.len(),
        "moved the raft log out of the store into its own file"
    );
    Ok(log)
}

/// The epoch counter of the (stopped) member store at `path`, read without writing (an
/// offline backup): the greatest of what its state machine applied and what any entry in its
/// Raft log carries. The applies are made durable only every 200 ms, so after a kill -9 the
/// log may hold grants the state machine on disk does not; counting an uncommitted entry too
/// only raises the counter, which is the safe side. `DatabaseAlreadyOpen` when a running
/// member holds it.
pub fn read_counter(path: &Path) -> std::result::Result<Epoch, redb::Error> {
    let db = Database::open(path)?;
    let txn = db.begin_read()?;
    let corrupt =
        |what: &str, e: &dyn std::fmt::Display| redb::Error::Corrupted(format!("{what}: {e}"));
    let meta = match txn.open_table(SM_META) {
        Ok(meta) => meta,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Epoch(0)),
        Err(e) => return Err(e.into()),
    };
    let header: SmHeader = match meta.get("header")? {
        Some(bytes) => serde_json::from_slice(bytes.value())
            .map_err(|e| corrupt("the state machine header does not parse", &e))?,
        None => SmHeader::default(),
    };
    let mut entries: Vec<Vec<u8>> = Vec::new();
    if let Ok(table) = txn.open_table(LOG) {
        for row in table.iter()? {
            entries.push(row?.1.value().to_vec());
        }
    }
    let active: usize = match txn.open_table(RAFT_META)?.get(LOG_FILE)? {
        Some(v) => serde_json::from_slice(v.value())
            .map_err(|e| corrupt("the raft log file in use does not parse", &e))?,
        None => 0,
    };
    let log_path = &log_paths(path)[active.min(1)];
    let mut counter = header.last_epoch;
    let mut unparsed = None;
    let mut count = |json: &[u8]| match entry_epoch(json) {
        Ok(epoch) => counter = counter.max(epoch),
        Err(e) => {
            unparsed.get_or_insert(e);
        }
    };
    for json in &entries {
        count(json);
    }
    match std::fs::File::open(log_path) {
        Ok(file) => crate::raft_log::visit_payloads(&file, &mut count)
            .map_err(|e| corrupt(&log_path.display().to_string(), &e))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(redb::Error::Io(e)),
    }
    match unparsed {
        Some(e) => Err(corrupt("a raft log entry does not parse", &e)),
        None => Ok(counter),
    }
}

/// The epoch an entry's JSON carries (0 for an entry that carries none).
fn entry_epoch(json: &[u8]) -> std::result::Result<Epoch, serde_json::Error> {
    let entry: Entry<TypeConfig> = serde_json::from_slice(json)?;
    Ok(match entry.payload {
        EntryPayload::Normal(
            Command::Apply {
                last_epoch: epoch, ..
            }
            | Command::LeaderStart { floor: epoch, .. },
        ) => epoch,
        _ => Epoch(0),
    })
}
