//! The epoch high-water mark: a bound kept ahead of issuance, in a file *outside* the data
//! directory, so that a data directory copied back from an older copy (`cp -a`), deleted, or
//! restored from a backup never makes the coordinator issue an epoch a second time (P6).
//!
//! Before a commit takes the epoch counter past the bound, the bound is raised to
//! `counter + RESERVATION` and made durable (write a temporary file, fsync, rename, fsync the
//! directory); a commit that would pass it waits for that. At start the counter is raised to
//! the bound. So every epoch ever issued is at most the bound, whatever the data directory
//! holds — the scheme CockroachDB uses for its clock (`persist_upper_bound_interval`). The cost:
//! one durable file write per [`RESERVATION`] epochs, and up to [`RESERVATION`] epochs skipped
//! per restart (2^64 / 2^16 = 2^48 restarts).
//!
//! The bound never goes down: a write keeps the greater of the file's value and the new one.
//! Where the file lives is the operator's choice (`--high-water-file`); by default it is the
//! data directory's sibling `DIR.high-water`, which a copy of the directory does not overwrite.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use palisade_core::{Changes, Epoch};

use crate::store::{DurableState, LeaseStore, PendingCommit, StoreError};

/// Epochs reserved ahead of issuance by one write of the bound.
pub const RESERVATION: u64 = 1 << 16;

/// The first line of the file (the format).
const MAGIC: &str = "palisade-high-water v1";

/// The default place of the bound for data directory `data_dir`: its sibling
/// `NAME.high-water`.
pub fn default_path(data_dir: &Path) -> PathBuf {
    sibling(data_dir, ".high-water")
}

/// The file beside data directory `data_dir` named after it with `suffix` (outside it, so a
/// copy of the directory does not carry it).
pub fn sibling(data_dir: &Path, suffix: &str) -> PathBuf {
    palisade_core::witness::beside(data_dir, suffix)
}

/// The bound and its file.
#[derive(Debug)]
pub struct HighWater {
    path: PathBuf,
    bound: u64,
    /// True when the file existed when opened.
    existed: bool,
}

impl HighWater {
    /// Reads the bound at `path` (0 when there is no file yet). A file that exists but does not
    /// hold a bound is an error: starting without it could reissue epochs.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let bound = match fs::read_to_string(path) {
            Ok(text) => parse(&text).ok_or_else(|| {
                StoreError::Corrupt(format!(
                    "{} is not a Palisade high-water file (expected \"{MAGIC} N\"); it bounds \
                     every epoch ever issued, so the coordinator will not start without it: \
                     restore the file, or move it away and run palisade restore",
                    path.display()
                ))
            })?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok(Self {
                    path: path.to_owned(),
                    bound: 0,
                    existed: false,
                })
            }
            Err(e) => return Err(io_error(path, e)),
        };
        Ok(Self {
            path: path.to_owned(),
            bound,
            existed: true,
        })
    }

    /// Every epoch issued so far is at most this.
    pub fn bound(&self) -> u64 {
        self.bound
    }

    /// True when the file existed when opened.
    pub fn existed(&self) -> bool {
        self.existed
    }

    /// Where the bound lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Raises the bound to at least `bound`, durably, before returning. Never lowers it.
    pub fn raise(&mut self, bound: u64) -> Result<(), StoreError> {
        if bound <= self.bound {
            return Ok(());
        }
        palisade_durable::write_file(&self.path, format!("{MAGIC} {bound}\n").as_bytes())
            .map_err(|e| io_error(&self.path, e))?;
        self.bound = bound;
        Ok(())
    }

    /// Makes sure epochs up to `epoch` are covered: raises the bound to `epoch + RESERVATION`
    /// when `epoch` passes it.
    pub fn cover(&mut self, epoch: u64) -> Result<(), StoreError> {
        if epoch > self.bound {
            self.raise(epoch.saturating_add(RESERVATION))?;
        }
        Ok(())
    }
}

fn parse(text: &str) -> Option<u64> {
    text.trim().strip_prefix(MAGIC)?.trim().parse().ok()
}

fn io_error(path: &Path, error: io::Error) -> StoreError {
    match StoreError::from_io(error) {
        StoreError::DiskFull(why) => {
            StoreError::DiskFull(format!("high-water file {}: {why}", path.display()))
        }
        StoreError::Io(error) => {
            StoreError::Corrupt(format!("high-water file {}: {error}", path.display()))
        }
        other => other,
    }
}

/// A [`LeaseStore`] whose epochs never pass the high-water bound: it covers each commit's
/// epoch counter before committing, and loads a counter raised to the bound.
pub struct Bounded<S> {
    inner: S,
    high_water: HighWater,
}

impl<S> Bounded<S> {
    /// `inner`, bounded by `high_water`.
    pub fn new(inner: S, high_water: HighWater) -> Self {
        Self { inner, high_water }
    }
}

impl<S: LeaseStore> LeaseStore for Bounded<S> {
    fn load(&self) -> Result<DurableState, StoreError> {
        let mut state = self.inner.load()?;
        let bound = Epoch(self.high_water.bound());
        if bound > state.last_epoch {
            // Epochs up to the bound may have been issued (reserved ahead, or by a copy of
            // this directory that ran on): start above all of them.
            state.last_epoch = bound;
        }
        Ok(state)
    }

    fn commit(&mut self, changes: &Changes) -> Result<(), StoreError> {
        self.high_water.cover(changes.last_epoch.0)?;
        self.inner.commit(changes)
    }

    fn commit_blocks(&self) -> bool {
        self.inner.commit_blocks()
    }

    fn dedicated_thread(&self) -> bool {
        self.inner.dedicated_thread()
    }

    /// Only local stores are bounded: their commit runs (on a blocking thread) through
    /// [`Self::commit`], which covers the epochs first.
    fn commit_async(&mut self, _changes: &Changes) -> Option<PendingCommit> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryLeaseStore;

    fn changes(last_epoch: u64) -> Changes {
        Changes {
            last_epoch: Epoch(last_epoch),
            locks: Default::default(),
            endings: Vec::new(),
        }
    }

    #[test]
    fn p6_the_bound_is_raised_ahead_of_issuance_durably_and_never_lowered() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data.high-water");
        let mut high_water = HighWater::open(&path).unwrap();
        assert_eq!((high_water.bound(), high_water.existed()), (0, false));
        high_water.cover(1).unwrap();
        assert_eq!(high_water.bound(), 1 + RESERVATION);
        // Within the reservation: no write.
        std::fs::remove_file(&path).unwrap();
        high_water.cover(RESERVATION).unwrap();
        assert!(!path.exists());
        high_water.cover(RESERVATION + 2).unwrap();
        let reopened = HighWater::open(&path).unwrap();
        assert_eq!(reopened.bound(), 2 * RESERVATION + 2);
        assert!(reopened.existed());
        // Never lowered.
        let mut reopened = reopened;
        reopened.raise(5).unwrap();
        assert_eq!(HighWater::open(&path).unwrap().bound(), 2 * RESERVATION + 2);
    }

    #[test]
    fn p6_a_store_older_than_the_bound_starts_above_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hw");
        let store = MemoryLeaseStore::default();
        let mut bounded = Bounded::new(store.clone(), HighWater::open(&path).unwrap());
        bounded.commit(&changes(10)).unwrap();
        // The directory is "copied back" to an older state (epoch 3): the bound still covers
        // epoch 10.
        let older = MemoryLeaseStore::default();
        let mut older_writer = older.clone();
        older_writer.commit(&changes(3)).unwrap();
        let restored = Bounded::new(older, HighWater::open(&path).unwrap());
        assert!(restored.load().unwrap().last_epoch > Epoch(10));
    }

    #[test]
    fn a_damaged_file_refuses_to_start_and_the_default_is_a_sibling() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hw");
        std::fs::write(&path, "12\n").unwrap();
        let error = HighWater::open(&path).unwrap_err().to_string();
        assert!(error.contains("palisade restore"), "{error}");
        assert_eq!(
            default_path(Path::new("./palisade-data")),
            PathBuf::from("./palisade-data.high-water")
        );
        assert_eq!(
            default_path(Path::new("/var/lib/palisade/")),
            PathBuf::from("/var/lib/palisade.high-water")
        );
        assert_eq!(
            default_path(Path::new("data")),
            PathBuf::from("data.high-water")
        );
    }
}
