//! [`LogLeaseStore`]: the single node's lease store, an append-only checksummed log.
//!
//! The lease table is small and every commit changes a few leases, so a commit is one record
//! appended to a file whose blocks were written (as zeros) ahead of time, and one `fdatasync`:
//! no page of a B-tree, no allocator state, no file-size change in the common case. A B-tree
//! store (redb) spent about twice the fdatasync's time on each such commit.
//!
//! # Format
//! ```text
//! header   16 bytes  "palisade-leases\0"
//!           4 bytes  format version (u32 LE) = 1
//!           8 bytes  grown-to: the file's length, durable before it is written here (u64
//!                    LE; 0 in a log written before it existed, until its next open)
//!           4 bytes  zero
//! record    4 bytes  payload length (u32 LE), 1 ..= MAX_RECORD_BYTES
//!           8 bytes  sequence number (u64 LE): 1 for the file's first record, then +1
//!           8 bytes  the first 8 bytes of SHA-256(length ‖ sequence ‖ payload)
//!           payload  JSON {"epoch": N, "snapshot": bool, "locks": [[name, lease | null], …]}
//! …        zeros (written ahead of the records; the file grows by PREALLOCATE_BYTES)
//! ```
//! A snapshot record replaces the whole state; the others change the locks they name.
//!
//! # Crash safety (P1, P8)
//! A commit returns only after its record's `fdatasync`. A crash during a commit can leave a
//! torn record — not acknowledged — at the end of the log: loading stops at the first record
//! whose length, sequence or checksum is wrong, and zeroes what follows it. Records are
//! written in order into zeros, so only the last one can be torn: when a record that checks,
//! with the next sequence number, is found anywhere after the one that does not, the log was
//! damaged (not torn) and is refused as corrupt rather than read short. The epoch counter is
//! checked never to go back, record to record and commit to commit.
//!
//! A torn write never shortens the file: the zeros it lands in were written (and synced)
//! before it. So a file shorter than its header's grown-to length was cut (`truncate -s`, a
//! copy that stopped short), and the records past the cut may be acknowledged leases: it is
//! refused, whatever the cut leaves looking like a torn end. The grown-to length changes only
//! when the file grows (once per [`PREALLOCATE_BYTES`] of records): the zeros are synced
//! first, then the header names them, so a crash never leaves a header ahead of the file.
//!
//! # Compaction
//! When the log passes [`COMPACT_AT_BYTES`] (and holds four times more than the live state),
//! the state is written as one snapshot record into a new file (fsynced), which is renamed
//! over the log, and the directory is fsynced: a crash before the rename leaves the old log,
//! after it the new one. A leftover `.compact` file is removed at open.
//!
//! The file is locked (`flock`) while open, so two processes never write one log.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use palisade_core::{Changes, Epoch};
use palisade_durable::records;
use serde::{Deserialize, Serialize};

use crate::store::{
    decode_lease, encode_record, DurableState, LeaseRecord, LeaseStore, StoreError,
};

const MAGIC: &[u8; 16] = b"palisade-leases\0";
/// Version of the log's layout; a file of another version is refused.
pub const FORMAT_VERSION: u32 = 1;
/// The file's header: its format, written and synced when the file is created, and the
/// length the file was durably grown to.
pub const HEADER_BYTES: u64 = 32;
/// Where the header holds the grown-to length.
const GROWN_TO_AT: u64 = 20;
#[cfg(test)]
const RECORD_HEADER_BYTES: u64 = records::HEADER_BYTES as u64;
/// Greatest payload of one record (a commit of [`crate::engine::MAX_BATCH`] changes is far
/// below it; a snapshot of every live lease must fit too).
pub const MAX_RECORD_BYTES: u64 = 1 << 30;
/// Zeros written ahead of the records each time the file grows.
pub const PREALLOCATE_BYTES: u64 = 1 << 20;
/// Log size past which a commit is followed by a compaction.
pub const COMPACT_AT_BYTES: u64 = 8 << 20;
/// Largest log file read at open; a log past half of it is compacted whatever the live state's
/// size.
pub const MAX_FILE_BYTES: u64 = 4 << 30;

#[derive(Serialize, Deserialize)]
struct Payload {
    epoch: u64,
    snapshot: bool,
    locks: Vec<(String, Option<LeaseRecord>)>,
}

/// The lease store of a single node: see the module's documentation.
pub struct LogLeaseStore {
    file: Flock<File>,
    path: PathBuf,
    /// Where the next record goes.
    end: u64,
    /// Bytes of the file written (records and zeros ahead).
    capacity: u64,
    /// Sequence number of the next record.
    next_sequence: u64,
    last_epoch: u64,
    leases: BTreeMap<String, LeaseRecord>,
    /// Log size past which a commit is followed by a compaction ([`COMPACT_AT_BYTES`]).
    compact_at: u64,
    /// Counts every fdatasync/fsync made (the coordinator's `palisade_store_syncs_total`).
    syncs: Option<prometheus_client::metrics::counter::Counter>,
    /// Set when a write or sync failed: the file's state is unknown, so nothing more is
    /// written (the engine stops at the first failed commit anyway). Why, for the message.
    failed: Option<String>,
    /// Makes a rename durable (fsync of the log's directory); a test swaps in a failing one.
    sync_dir: fn(&Path) -> io::Result<()>,
}

fn io_error(error: io::Error) -> StoreError {
    StoreError::from_io(error)
}

fn corrupt(path: &Path, what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{}: {what}", path.display()))
}

impl LogLeaseStore {
    /// A store over the locked `file` at `path`, before its header is written or read.
    fn empty(file: Flock<File>, path: &Path) -> Self {
        Self {
            file,
            path: path.to_owned(),
            end: HEADER_BYTES,
            capacity: 0,
            next_sequence: 1,
            last_epoch: 0,
            leases: BTreeMap::new(),
            compact_at: COMPACT_AT_BYTES,
            syncs: None,
            failed: None,
            sync_dir: palisade_durable::sync_parent_dir,
        }
    }

    /// Opens (or creates) the log at `path`. Fails with [`StoreError::InUse`] when another
    /// process has it open, and [`StoreError::Corrupt`] when it is not a readable log.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let _ = std::fs::remove_file(compact_path(path));
        let created = !path.exists();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(io_error)?;
        let mut store = Self::empty(lock(file, path)?, path);
        let length = store.file.metadata().map_err(io_error)?.len();
        if created || length == 0 {
            store.initialise(&store.file, None)?;
            store.capacity = HEADER_BYTES + PREALLOCATE_BYTES;
            if created {
                palisade_durable::sync_parent_dir(path).map_err(io_error)?;
            }
        } else {
            store.replay(length, true)?;
            if grown_to(&store.file)? != store.capacity {
                // A log written before the mark existed, or grown by a commit that crashed
                // before naming it: make the length it has durable, then name it.
                store.file.sync_data().map_err(io_error)?;
                store
                    .file
                    .write_all_at(&store.capacity.to_le_bytes(), GROWN_TO_AT)
                    .map_err(io_error)?;
                store.file.sync_data().map_err(io_error)?;
            }
        }
        Ok(store)
    }

    /// Reads the durable state of the log at `path` without writing anything (an offline
    /// backup): a torn last record is skipped, not zeroed, and a compaction's leftover is left
    /// alone. [`StoreError::InUse`] when a process has the log open.
    pub fn read(path: &Path) -> Result<DurableState, StoreError> {
        let file = File::open(path).map_err(io_error)?;
        let mut store = Self::empty(lock(file, path)?, path);
        let length = store.file.metadata().map_err(io_error)?.len();
        store.replay(length, false)?;
        store.load()
    }

    /// Counts every fdatasync and fsync from now on in `counter`.
    pub fn count_syncs(&mut self, counter: prometheus_client::metrics::counter::Counter) {
        self.syncs = Some(counter);
    }

    fn synced(&self, n: u64) {
        if let Some(counter) = &self.syncs {
            counter.inc_by(n);
        }
    }

    /// Compacts past `bytes` instead of [`COMPACT_AT_BYTES`] (tests reach it quickly).
    #[cfg(test)]
    pub(crate) fn compact_at(&mut self, bytes: u64) {
        self.compact_at = bytes;
    }

    /// Writes a header (and `snapshot`, if any) into `file` followed by zeros, and syncs it.
    fn initialise(&self, file: &File, snapshot: Option<&[u8]>) -> Result<u64, StoreError> {
        let end = HEADER_BYTES + snapshot.map_or(0, |record| record.len() as u64);
        let mut header = Vec::with_capacity(end as usize);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        header.extend_from_slice(&(end + PREALLOCATE_BYTES).to_le_bytes());
        header.resize(HEADER_BYTES as usize, 0);
        if let Some(record) = snapshot {
            header.extend_from_slice(record);
        }
        // One sync for all: until it returns, the file is not the log (a new log is a new
        // file; a compaction renames it into place only after).
        file.write_all_at(&header, 0).map_err(io_error)?;
        write_zeros(file, end, PREALLOCATE_BYTES).map_err(io_error)?;
        file.sync_all().map_err(io_error)?;
        Ok(end)
    }

    /// Reads every record, stopping at the end of the log (see the module's documentation);
    /// with `repair`, zeroes a torn last record.
    fn replay(&mut self, length: u64, repair: bool) -> Result<(), StoreError> {
        if length > MAX_FILE_BYTES {
            return Err(corrupt(
                &self.path,
                format!("{length} bytes, more than a log holds"),
            ));
        }
        let mut bytes = vec![0u8; length as usize];
        self.file.read_exact_at(&mut bytes, 0).map_err(io_error)?;
        if length < HEADER_BYTES || &bytes[..16] != MAGIC {
            return Err(corrupt(&self.path, "not a Palisade lease log"));
        }
        check_header(&self.path, &bytes, length)?;
        let mut at = HEADER_BYTES as usize;
        while let Some((payload, next)) = record_at(&bytes, at, self.next_sequence) {
            let payload: Payload = serde_json::from_slice(payload)
                .map_err(|e| corrupt(&self.path, format!("record {}: {e}", self.next_sequence)))?;
            if payload.epoch < self.last_epoch {
                return Err(corrupt(
                    &self.path,
                    format!(
                        "record {} lowers the epoch counter from {} to {}",
                        self.next_sequence, self.last_epoch, payload.epoch
                    ),
                ));
            }
            self.apply(payload);
            self.next_sequence += 1;
            at = next;
        }
        // What follows the last record: zeros, or the remains of one torn write.
        let tail = &bytes[at..];
        let written = tail.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        if let Some((found, sequence)) =
            later_record(&bytes[..at + written], at, self.next_sequence)
        {
            return Err(corrupt(
                &self.path,
                format!(
                    "record {} at byte {at} does not check, and record {sequence} follows it at \
                     byte {found}: the log is damaged (not a torn write), so it is not read short",
                    self.next_sequence,
                ),
            ));
        }
        if written > 0 && repair {
            tracing::warn!(
                path = %self.path.display(),
                bytes = written,
                "the log ends in a torn write (a commit that was never acknowledged); zeroed"
            );
            write_zeros(&self.file, at as u64, written as u64).map_err(io_error)?;
            self.file.sync_data().map_err(io_error)?;
        }
        self.end = at as u64;
        self.capacity = length;
        Ok(())
    }

    fn apply(&mut self, payload: Payload) {
        if payload.snapshot {
            self.leases.clear();
        }
        self.last_epoch = payload.epoch;
        for (lock, lease) in payload.locks {
            match lease {
                Some(lease) => self.leases.insert(lock, lease),
                None => self.leases.remove(&lock),
            };
        }
    }

    fn snapshot_record(&self) -> Result<Vec<u8>, StoreError> {
        let payload = Payload {
            epoch: self.last_epoch,
            snapshot: true,
            locks: (self.leases.iter())
                .map(|(lock, lease)| (lock.clone(), Some(lease.clone())))
                .collect(),
        };
        Ok(frame(1, &encode(&payload, "a snapshot")?))
    }

    /// Rewrites the log as one snapshot record (see the module's documentation).
    fn compact(&mut self) -> Result<(), StoreError> {
        let snapshot = self.snapshot_record()?;
        let temporary = compact_path(&self.path);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&temporary)
            .map_err(io_error)?;
        let file = lock(file, &temporary)?;
        let end = self.initialise(&file, Some(&snapshot))?;
        std::fs::rename(&temporary, &self.path).map_err(io_error)?;
        // From here on the log's name is the new file: appending to the old one would
        // acknowledge commits into a file no name leads to. If the rename cannot be made
        // durable, which file a crash leaves under the name is unknown: nothing more is
        // acknowledged (both files hold every commit so far, so a restart finds them all).
        let durable = (self.sync_dir)(&self.path);
        self.file = file;
        if let Err(error) = durable {
            self.failed = Some(format!(
                "the directory could not be synced after a compaction ({error}): which log a \
                 crash would leave is unknown"
            ));
            return Err(io_error(error));
        }
        self.synced(2);
        self.end = end;
        self.capacity = end + PREALLOCATE_BYTES;
        self.next_sequence = 2;
        Ok(())
    }
}

impl LeaseStore for LogLeaseStore {
    fn dedicated_thread(&self) -> bool {
        true
    }

    fn load(&self) -> Result<DurableState, StoreError> {
        let leases = (self.leases.iter())
            .map(|(lock, record)| decode_lease(lock, record.clone()))
            .collect::<Result<_, _>>()?;
        Ok(DurableState {
            last_epoch: Epoch(self.last_epoch),
            leases,
        })
    }

    fn commit(&mut self, changes: &Changes) -> Result<(), StoreError> {
        if let Some(why) = &self.failed {
            return Err(StoreError::Corrupt(format!(
                "{}: {why}; nothing more is written: restart the coordinator",
                self.path.display()
            )));
        }
        if changes.last_epoch.0 < self.last_epoch {
            return Err(StoreError::Corrupt(format!(
                "epoch counter would go back from {} to {}",
                self.last_epoch, changes.last_epoch
            )));
        }
        let payload = Payload {
            epoch: changes.last_epoch.0,
            snapshot: false,
            locks: (changes.locks.iter())
                .map(|(lock, lease)| (lock.as_str().to_owned(), lease.as_ref().map(encode_record)))
                .collect(),
        };
        let record = frame(self.next_sequence, &encode(&payload, "a commit")?);
        let end = self.end + record.len() as u64;
        let grows = end > self.capacity;
        let written = (|| {
            if grows {
                // Grow ahead, make the new length durable, then name it in the header (the
                // record's fdatasync below makes that durable): the header is never ahead of
                // the file, whatever a crash leaves.
                let grow = (end - self.capacity).max(PREALLOCATE_BYTES);
                write_zeros(&self.file, self.capacity, grow)?;
                self.file.sync_data()?;
                self.capacity += grow;
                self.file
                    .write_all_at(&self.capacity.to_le_bytes(), GROWN_TO_AT)?;
            }
            self.file.write_all_at(&record, self.end)?;
            self.file.sync_data()
        })();
        self.synced(1 + u64::from(grows));
        if let Err(error) = written {
            self.failed = Some(format!("a commit failed to write or sync ({error})"));
            return Err(io_error(error));
        }
        self.end = end;
        self.next_sequence += 1;
        self.apply(payload);
        let live = 256 * (self.leases.len() as u64 + 1);
        if self.end > self.compact_at && (self.end > 4 * live || self.end > MAX_FILE_BYTES / 2) {
            if let Err(error) = self.compact() {
                // The commit is durable in the old log (and in the new one when the rename
                // happened). A failed compaction is retried at the next commit past the
                // threshold — unless it left the store failed, and the next commit refuses.
                if self.failed.is_some() {
                    tracing::error!(%error, "compacting the lease log failed after its rename; \
                        the store accepts no more commits");
                } else {
                    tracing::warn!(%error, "compacting the lease log failed");
                }
            }
        }
        Ok(())
    }
}

/// The durable state of the single node's store in data directory `dir`, read without
/// writing: from the log, or from the redb store of an earlier version (not migrated).
pub fn read_in(dir: &Path) -> Result<DurableState, StoreError> {
    let path = dir.join(crate::STORE_FILE);
    let legacy = dir.join(crate::LEGACY_STORE_FILE);
    if !path.exists() && legacy.exists() {
        return crate::store::RedbLeaseStore::read(&legacy);
    }
    LogLeaseStore::read(&path)
}

/// Opens the single node's store in data directory `dir`: the log [`crate::STORE_FILE`]. A
/// directory written by an earlier version holds a redb store ([`crate::LEGACY_STORE_FILE`]):
/// its state is copied into a new log, which is renamed into place and the directory fsynced
/// before the redb file is removed, so a crash at any point leaves one of the two whole.
pub fn open_in(dir: &Path) -> Result<LogLeaseStore, StoreError> {
    let path = dir.join(crate::STORE_FILE);
    let legacy = dir.join(crate::LEGACY_STORE_FILE);
    if !path.exists() && legacy.exists() {
        let state = {
            let old = crate::store::RedbLeaseStore::open(&legacy).map_err(|e| match e {
                StoreError::Storage(redb::Error::DatabaseAlreadyOpen) => {
                    StoreError::InUse(legacy.display().to_string())
                }
                other => other,
            })?;
            old.load()?
        };
        let mut migrating = path.as_os_str().to_owned();
        migrating.push(".migrating");
        let migrating = PathBuf::from(migrating);
        let _ = std::fs::remove_file(&migrating);
        {
            let mut log = LogLeaseStore::open(&migrating)?;
            log.commit(&Changes {
                locks: (state.leases.into_iter())
                    .map(|lease| (lease.lock.clone(), Some(lease)))
                    .collect(),
                last_epoch: state.last_epoch,
                endings: Vec::new(),
            })?;
        }
        std::fs::rename(&migrating, &path).map_err(io_error)?;
        palisade_durable::sync_parent_dir(&path).map_err(io_error)?;
        std::fs::remove_file(&legacy).map_err(io_error)?;
        palisade_durable::sync_parent_dir(&path).map_err(io_error)?;
        tracing::info!(
            from = %legacy.display(),
            to = %path.display(),
            epoch = %state.last_epoch,
            "moved the lease store from redb to the lease log"
        );
    }
    LogLeaseStore::open(&path)
}

/// True when data directory `dir` holds a single node's store (a log, or a redb store of an
/// earlier version).
pub fn exists_in(dir: &Path) -> bool {
    dir.join(crate::STORE_FILE).exists() || dir.join(crate::LEGACY_STORE_FILE).exists()
}

/// `payload` as a record's JSON, refused when larger than [`MAX_RECORD_BYTES`] (`what`: the
/// kind of record, for the message).
fn encode(payload: &Payload, what: &str) -> Result<Vec<u8>, StoreError> {
    let encoded = serde_json::to_vec(payload).expect("a payload serializes");
    if encoded.len() as u64 > MAX_RECORD_BYTES {
        return Err(StoreError::Corrupt(format!(
            "{what} of {} bytes is larger than a record ({MAX_RECORD_BYTES})",
            encoded.len()
        )));
    }
    Ok(encoded)
}

/// Refuses a log of another format version, or one shorter than the length its header says
/// it was durably grown to (`length`: the file's length; `bytes`: the file).
fn check_header(path: &Path, bytes: &[u8], length: u64) -> Result<(), StoreError> {
    let version = u32::from_le_bytes(bytes[16..20].try_into().expect("4 bytes"));
    if version != FORMAT_VERSION {
        return Err(corrupt(
            path,
            format!("lease log format {version}; this build reads format {FORMAT_VERSION}"),
        ));
    }
    let at = GROWN_TO_AT as usize;
    let grown_to = u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    if length < grown_to {
        return Err(corrupt(
            path,
            format!(
                "the log is {length} bytes but was grown to {grown_to}: it was cut short \
                     (truncated, or copied incompletely), and the part cut off may hold \
                     acknowledged leases. Put the whole file back; otherwise restore from a \
                     backup (palisade restore) or start over in an empty data directory: epochs \
                     stay above every one issued (the clock floor), but the leases held are \
                     forgotten, so let their TTLs pass before owners come back"
            ),
        ));
    }
    Ok(())
}

/// The record framed: length, sequence, checksum, payload (`palisade_durable::records`).
fn frame(sequence: u64, payload: &[u8]) -> Vec<u8> {
    records::frame(sequence, payload)
}

/// The payload of the record with sequence `sequence` at `at`, and where the next one starts;
/// `None` at the end of the log (zeros, or a record that does not check).
fn record_at(bytes: &[u8], at: usize, sequence: u64) -> Option<(&[u8], usize)> {
    records::record_at(bytes, at, MAX_RECORD_BYTES)
        .filter(|record| record.sequence == sequence)
        .map(|record| (record.payload, record.next))
}

/// A record that checks anywhere after `at` with a sequence number above `sequence`
/// ([`records::later_record`]).
fn later_record(bytes: &[u8], at: usize, sequence: u64) -> Option<(usize, u64)> {
    records::later_record(bytes, at, sequence, MAX_RECORD_BYTES)
}

/// The grown-to length `file`'s header names (0: none).
fn grown_to(file: &File) -> Result<u64, StoreError> {
    let mut bytes = [0u8; 8];
    file.read_exact_at(&mut bytes, GROWN_TO_AT)
        .map_err(io_error)?;
    Ok(u64::from_le_bytes(bytes))
}

fn write_zeros(file: &File, from: u64, length: u64) -> io::Result<()> {
    let chunk = vec![0u8; (64 << 10).min(length) as usize];
    let mut at = from;
    while at < from + length {
        let n = chunk.len().min((from + length - at) as usize);
        file.write_all_at(&chunk[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

fn lock(file: File, path: &Path) -> Result<Flock<File>, StoreError> {
    Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| {
        if errno == nix::errno::Errno::EWOULDBLOCK {
            StoreError::InUse(path.display().to_string())
        } else {
            StoreError::Io(errno.into())
        }
    })
}

fn compact_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".compact");
    PathBuf::from(name)
}

#[cfg(test)]
#[path = "log_store_tests.rs"]
mod tests;
