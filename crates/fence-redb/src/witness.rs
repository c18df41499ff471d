//! The fenced store's witness ([`palisade_core::witness`]): a file beside the data directory
//! that follows the store's highest epoch, so that a store copied back or restored from an
//! older copy is detected at open and accepts nothing until a restore floor is applied (P6).

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use palisade_core::witness::{judge, Verdict, WitnessRecord};
use palisade_fence::FenceError;

/// The kind of store this witness speaks of.
pub const KIND: &str = "fenced-store";

/// Longest time the writer waits between two writes of the witness while the highest epoch
/// moves (the witness may lag by this much, and by what an idle writer has not recorded yet).
pub const INTERVAL: Duration = palisade_core::witness::FOLLOW_INTERVAL;

/// What opening found.
pub enum Opened {
    /// The store is current: its witness follows it.
    Current(StoreWitness),
    /// The store is behind its witness: why, for people.
    Behind(String),
}

/// The witness file of one store.
pub struct StoreWitness {
    path: PathBuf,
    seen: WitnessRecord,
    written: Option<Instant>,
}

impl StoreWitness {
    /// Judges the store `store_id` at `highest` against the witness at `path`; records it
    /// unless it is behind.
    pub fn open(path: &Path, store_id: &str, highest: u64) -> Result<Opened, FenceError> {
        let witness = Self {
            path: path.to_owned(),
            seen: WitnessRecord {
                kind: KIND.into(),
                store: store_id.to_owned(),
                mark: highest,
            },
            written: None,
        };
        match judge(read(path)?.as_ref(), &witness.seen) {
            Verdict::Current => Ok(Opened::Current(witness)),
            Verdict::Record => {
                witness.write().map_err(|e| witness_io(path, e))?;
                Ok(Opened::Current(witness))
            }
            Verdict::Behind { seen } => Ok(Opened::Behind(format!(
                "this store's highest epoch is {highest}, but it had accepted epoch {seen} \
                 (witness {}): it was restored from an older copy or copied back, and may \
                 accept tokens its newer fences refused. It accepts no write until a restore \
                 floor from the coordinator is applied: stop it and run `palisade resource \
                 restore` (see docs/operations.md)",
                path.display()
            ))),
            Verdict::OtherKind(kind) => Err(FenceError::Integrity(format!(
                "{} is the witness of a {kind}, not of a fenced store",
                path.display()
            ))),
        }
    }

    /// Records `highest` once it is committed: at most every [`INTERVAL`] unless `now`.
    pub fn follow(&mut self, highest: u64, now: bool) {
        if highest <= self.seen.mark {
            return;
        }
        if !now && self.written.is_some_and(|at| at.elapsed() < INTERVAL) {
            return;
        }
        let previous = self.seen.mark;
        self.seen.mark = highest;
        match self.write() {
            Ok(()) => self.written = Some(Instant::now()),
            Err(error) => {
                self.seen.mark = previous;
                tracing::warn!(witness = %self.path.display(), %error, "store witness not written");
            }
        }
    }

    fn write(&self) -> io::Result<()> {
        palisade_durable::write_file(&self.path, self.seen.render().as_bytes())
    }
}

/// The witness at `path`, if there is one.
pub fn read(path: &Path) -> Result<Option<WitnessRecord>, FenceError> {
    match std::fs::read_to_string(path) {
        Ok(text) => WitnessRecord::parse(&text).map(Some).ok_or_else(|| {
            FenceError::Integrity(format!(
                "{} is not a Palisade witness; it tells whether this store is older than what \
                 it accepted, so the store will not open without it: restore the file, or \
                 move it away if the store is known to be current",
                path.display()
            ))
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(witness_io(path, e)),
    }
}

/// Records `record` at `path` (after a restore).
pub fn record(path: &Path, record: &WitnessRecord) -> Result<(), FenceError> {
    palisade_durable::write_file(path, record.render().as_bytes()).map_err(|e| witness_io(path, e))
}

fn witness_io(path: &Path, error: io::Error) -> FenceError {
    FenceError::Storage(format!("store witness {}: {error}", path.display()).into())
}
