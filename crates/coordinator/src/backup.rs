//! Backups of a coordinator, and restores that never issue an epoch twice (P6).
//!
//! A backup records the epoch counter — the only state a restore needs. Leases are not
//! revived by a restore: their holders may have moved on since the backup (and their tokens
//! were signed with a key the restored coordinator does not have), so every lock is free after
//! a restore and its next owner starts above everything issued before.
//!
//! The restored counter is the greatest of these, so that no single forgotten input makes it
//! unsafe:
//! 1. the backup's counter;
//! 2. the high-water bound ([`crate::high_water`]), which lives outside the data directory and
//!    is kept ahead of issuance: it covers epochs issued *after* the backup was taken;
//! 3. the highest fence of every resource named with `--floor-from` (a reference store, a
//!    PostgreSQL database with Palisade's tables or guarded tables): what the resources that
//!    enforce the locks have seen, whoever issued it;
//! 4. the clock floor: the wall clock in milliseconds × 2^[`CLOCK_SHIFT`] — a coordinator
//!    would have to issue over a million epochs per millisecond between two restores from the
//!    same backup to reach it, so restoring twice is as safe as once even when 2 and 3 are
//!    lost;
//!
//! and then [`RESTORE_MARGIN`] above the greatest of 1–3. One restore consumes about
//! 2^32 epochs beyond the floor; the clock floor reaches the end of the epochs' headroom
//! (`palisade_core::clock::MAX_EPOCH`, 2^63 − 1: PostgreSQL's bigint) in 2248.

use std::fmt;
use std::path::{Path, PathBuf};

use palisade_core::{Changes, Epoch};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::high_water::HighWater;
use crate::store::{LeaseStore, StoreError};

/// The backup file format.
pub const FORMAT: u32 = 1;
/// The first word of a backup file.
const MAGIC: &str = "palisade-backup";
use palisade_core::restore::{restored_counter, DecidedBy};
pub use palisade_core::restore::{CLOCK_SHIFT, RESTORE_MARGIN};
/// The record a restore leaves in the data directory (read and logged at start).
pub const RESTORE_RECORD: &str = "restore.json";
/// Longest backup file read.
pub const MAX_BACKUP_BYTES: u64 = 1 << 20;

/// What a backup holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backup {
    /// [`FORMAT`].
    pub format: u32,
    /// `single` or `cluster`.
    pub mode: String,
    /// The epoch counter: every epoch issued before the backup is at most this (a decimal
    /// string, as every epoch in JSON; a number is read too).
    #[serde(with = "palisade_core::json::string")]
    pub last_epoch: u64,
    /// When it was taken, ms since the Unix epoch.
    pub taken_at_ms: u64,
    /// `online` (from a running coordinator) or `offline` (from a data directory).
    pub taken: String,
}

/// Why a backup or a restore failed.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The file is not a valid backup.
    #[error("not a valid Palisade backup: {0}")]
    Invalid(String),
    /// The data directory cannot be backed up or restored into as it is.
    #[error("{0}")]
    Refused(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BackupError + '_ {
    move |source| BackupError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The bytes of a backup file: a header line (format, SHA-256 and length of the body) and the
/// body, JSON.
pub fn encode(backup: &Backup) -> Vec<u8> {
    frame(&serde_json::to_vec_pretty(backup).expect("a backup serializes"))
}

/// `body` behind the header line that names its format, SHA-256 and length.
fn frame(body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "{MAGIC} v{FORMAT} sha256={} bytes={}\n",
        palisade_core::hex(&Sha256::digest(body)),
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out.push(b'\n');
    out
}

/// Reads and verifies a backup file's bytes.
pub fn decode(bytes: &[u8]) -> Result<Backup, BackupError> {
    let invalid = |why: &str| BackupError::Invalid(why.to_owned());
    let newline = bytes
        .iter()
        .position(|b| *b == b'\n')
        .ok_or_else(|| invalid("no header line"))?;
    let header = std::str::from_utf8(&bytes[..newline]).map_err(|_| invalid("header"))?;
    let mut words = header.split(' ');
    if words.next() != Some(MAGIC) {
        return Err(invalid("it does not start with palisade-backup"));
    }
    if words.next() != Some(&format!("v{FORMAT}")) {
        return Err(invalid(&format!(
            "unknown format (this version reads v{FORMAT})"
        )));
    }
    let digest = words
        .next()
        .and_then(|w| w.strip_prefix("sha256="))
        .ok_or_else(|| invalid("no sha256 in the header"))?;
    let length: usize = words
        .next()
        .and_then(|w| w.strip_prefix("bytes="))
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| invalid("no length in the header"))?;
    let rest = &bytes[newline + 1..];
    let body = rest
        .get(..length)
        .ok_or_else(|| invalid("the body is shorter than the header says (truncated?)"))?;
    if rest[length..].iter().any(|b| !b.is_ascii_whitespace()) {
        return Err(invalid("bytes after the body"));
    }
    if palisade_core::hex(&Sha256::digest(body)) != digest {
        return Err(invalid(
            "the checksum does not match: the file was changed or damaged",
        ));
    }
    let backup: Backup =
        serde_json::from_slice(body).map_err(|e| invalid(&format!("body: {e}")))?;
    if backup.format != FORMAT || !matches!(backup.mode.as_str(), "single" | "cluster") {
        return Err(invalid("unknown format or mode in the body"));
    }
    Ok(backup)
}

/// Reads a backup file (at most [`MAX_BACKUP_BYTES`]) and verifies it.
pub fn read(path: &Path) -> Result<Backup, BackupError> {
    let length = std::fs::metadata(path).map_err(io(path))?.len();
    if length > MAX_BACKUP_BYTES {
        return Err(BackupError::Invalid(format!(
            "{} is {length} bytes; a backup is at most {MAX_BACKUP_BYTES}",
            path.display()
        )));
    }
    decode(&std::fs::read(path).map_err(io(path))?)
}

/// Writes `backup` to `path` durably (a temporary file, fsync, rename, fsync of the directory):
/// an interrupted backup never leaves a half-written file under the name.
pub fn write(backup: &Backup, path: &Path) -> Result<(), BackupError> {
    palisade_durable::write_file(path, &encode(backup)).map_err(io(path))
}

pub use palisade_core::clock::now_ms;

/// A floor from one source, with the reason it counts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Floor {
    /// Where it was read (a URL without credentials, a path, or `backup`/`clock`).
    pub source: String,
    /// Every epoch this source knows of is at most this.
    #[serde(with = "palisade_core::json::string")]
    pub epoch: u64,
}

/// What a restore did, kept in the data directory ([`RESTORE_RECORD`]) and printed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreRecord {
    /// When, ms since the Unix epoch.
    pub restored_at_ms: u64,
    /// The backup restored.
    pub backup: Backup,
    /// Every floor considered: the backup, the high-water bound, each resource, the clock.
    pub floors: Vec<Floor>,
    /// The greatest epoch known to be issued (backup, high water, resources).
    #[serde(with = "palisade_core::json::string")]
    pub floor: u64,
    /// The epoch counter the restored coordinator starts from: the next epoch is above it.
    #[serde(with = "palisade_core::json::string")]
    pub counter: u64,
    /// Which floor decided the counter.
    pub decided_by: String,
    /// What the directory was restored as: a single node, or the founding member of a new
    /// cluster.
    #[serde(default)]
    pub target: Target,
}

/// What a restore makes of its data directory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// A single node (`coordinator.log` starting at the counter; the high-water bound raised).
    #[default]
    Single,
    /// The founding member of a new cluster: its store is created at its first start, and its
    /// first entry as leader raises the replicated counter to the restored one. It founds the
    /// cluster alone; the other members join it empty.
    ClusterFounder,
}

impl fmt::Display for RestoreRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "restored a backup of epoch {} (taken {}, {})",
            self.backup.last_epoch, self.backup.taken_at_ms, self.backup.taken
        )?;
        for floor in &self.floors {
            writeln!(f, "  floor {:>20}  from {}", floor.epoch, floor.source)?;
        }
        write!(
            f,
            "epochs start above {} (decided by {}; every epoch known to be issued is at most {})",
            self.counter, self.decided_by, self.floor
        )
    }
}

/// Turns `backup` (of a single node or a cluster) into a fresh data directory `data_dir` for
/// `target` whose first epoch is above every floor (see the module's documentation), raising
/// the high-water bound at `high_water` to it (a cluster keeps none: `None`). `resources`:
/// floors read from the resources. Refuses a directory that already holds a coordinator.
pub fn restore(
    backup: &Backup,
    data_dir: &Path,
    high_water: Option<&Path>,
    resources: Vec<Floor>,
    now_ms: u64,
    target: Target,
) -> Result<RestoreRecord, BackupError> {
    refuse_a_coordinator_in(data_dir)?;
    let mut floors = vec![Floor {
        source: format!("backup ({}, {})", backup.mode, backup.taken),
        epoch: backup.last_epoch,
    }];
    let mut bound = match high_water {
        Some(path) => {
            let bound = HighWater::open(path)?;
            floors.push(Floor {
                source: format!(
                    "high-water file {}{}",
                    path.display(),
                    if bound.existed() { "" } else { " (absent)" }
                ),
                epoch: bound.bound(),
            });
            Some(bound)
        }
        None => None,
    };
    floors.extend(resources);
    let (known, known_source) = floors
        .iter()
        .map(|f| (f.epoch, f.source.clone()))
        .max_by_key(|(epoch, _)| *epoch)
        .expect("the backup is a floor");
    floors.push(Floor {
        source: format!("clock ({now_ms} ms × 2^{CLOCK_SHIFT})"),
        epoch: now_ms.saturating_mul(1 << CLOCK_SHIFT),
    });
    let (counter, decided_by) = counter_above(known, &known_source, now_ms)?;
    crate::keys::create_data_dir(data_dir).map_err(io(data_dir))?;
    // The bound first: once it is raised, no copy of any data directory can issue below it.
    if let Some(bound) = &mut bound {
        bound.raise(counter)?;
    }
    if target == Target::Single {
        let mut store = crate::log_store::open_in(data_dir)?;
        store.commit(&Changes {
            locks: Vec::new(),
            last_epoch: Epoch(counter),
            endings: Vec::new(),
        })?;
    }
    let record = RestoreRecord {
        restored_at_ms: now_ms,
        backup: backup.clone(),
        floors,
        floor: known,
        counter,
        decided_by,
        target,
    };
    let path = data_dir.join(RESTORE_RECORD);
    let json = serde_json::to_vec_pretty(&record).expect("a record serializes");
    palisade_durable::write_file(&path, &json).map_err(io(&path))?;
    Ok(record)
}

/// Refuses a data directory that already holds a coordinator's store or signing key.
fn refuse_a_coordinator_in(data_dir: &Path) -> Result<(), BackupError> {
    for existing in [
        crate::STORE_FILE,
        crate::LEGACY_STORE_FILE,
        crate::CLUSTER_STORE_FILE,
        crate::keys::SIGNING_KEY_FILE,
    ] {
        if data_dir.join(existing).exists() {
            return Err(BackupError::Refused(format!(
                "{} already holds a coordinator ({existing}): restore into a new directory \
                 (move this one aside first)",
                data_dir.display()
            )));
        }
    }
    Ok(())
}

/// The restored counter above the greatest known epoch `known` (from `known_source`) and the
/// clock floor at `now_ms`, with what decided it; refused when no room is left at or below
/// [`palisade_core::clock::MAX_EPOCH`].
fn counter_above(
    known: u64,
    known_source: &str,
    now_ms: u64,
) -> Result<(u64, String), BackupError> {
    let (counter, decided) = restored_counter(known, now_ms).ok_or_else(|| {
        BackupError::Refused(format!(
            "the floor {known} leaves no room for epochs above it (u64)"
        ))
    })?;
    let decided_by = match decided {
        DecidedBy::Clock => "the clock".to_owned(),
        DecidedBy::Floor => format!("{known_source} + 2^32"),
    };
    if counter >= palisade_core::clock::MAX_EPOCH {
        return Err(BackupError::Refused(format!(
            "the restored counter {counter} leaves no epoch at or below 2^63 - 1, the end of \
             the epochs' headroom (PostgreSQL resources store no greater fence)"
        )));
    }
    Ok((counter, decided_by))
}

/// The restore record of `data_dir`, if it was made by `palisade restore`.
pub fn restore_record(data_dir: &Path) -> Option<RestoreRecord> {
    let bytes = std::fs::read(data_dir.join(RESTORE_RECORD)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(last_epoch: u64) -> Backup {
        Backup {
            format: FORMAT,
            mode: "single".into(),
            last_epoch,
            taken_at_ms: 1,
            taken: "offline".into(),
        }
    }

    #[test]
    fn a_backup_file_round_trips_and_any_change_is_refused() {
        let bytes = encode(&sample(42));
        assert_eq!(decode(&bytes).unwrap(), sample(42));
        let text = String::from_utf8(bytes.clone()).unwrap();
        let altered = text.replace("\"last_epoch\": \"42\"", "\"last_epoch\": \"41\"");
        assert_ne!(altered, text);
        assert!(decode(altered.as_bytes()).is_err());
        assert!(decode(&bytes[..bytes.len() - 5]).is_err());
        assert!(decode(b"").is_err());
        assert!(decode(b"palisade-backup v9 sha256=00 bytes=0\n").is_err());
        let mut extra = bytes.clone();
        extra.extend_from_slice(b"{}");
        assert!(decode(&extra).is_err());
    }

    /// Epochs above 2^53 (every epoch since the clock floor) stay exact for `jq`: the body and
    /// `restore.json` write them as decimal strings; a file written with numbers still loads.
    #[test]
    fn epochs_in_the_backup_and_the_restore_record_are_strings_and_numbers_still_load() {
        let epoch = 1_887_436_800_000_508_163;
        let bytes = encode(&sample(epoch));
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(
            text.contains("\"last_epoch\": \"1887436800000508163\""),
            "{text}"
        );
        assert_eq!(decode(&bytes).unwrap(), sample(epoch));
        let body = serde_json::to_vec_pretty(&serde_json::json!({
            "format": FORMAT, "mode": "single", "last_epoch": 42, "taken_at_ms": 1,
            "taken": "offline"
        }))
        .unwrap();
        assert_eq!(decode(&frame(&body)).unwrap(), sample(42));
        let record = RestoreRecord {
            restored_at_ms: 1,
            backup: sample(epoch),
            floors: vec![Floor {
                source: "backup".into(),
                epoch,
            }],
            floor: epoch,
            counter: epoch + 1,
            decided_by: "backup".into(),
            target: Target::Single,
        };
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(json["counter"], "1887436800000508164");
        assert_eq!(json["floors"][0]["epoch"], "1887436800000508163");
        let mut numbers = json.clone();
        numbers["counter"] = serde_json::json!(7);
        numbers["floor"] = serde_json::json!(6);
        let read: RestoreRecord = serde_json::from_value(numbers).unwrap();
        assert_eq!((read.floor, read.counter), (6, 7));
    }

    #[test]
    fn p6_a_restore_starts_above_every_floor_and_twice_is_as_safe_as_once() {
        let dir = tempfile::tempdir().unwrap();
        let high_water = dir.path().join("hw");
        let backup = sample(10);
        // A resource saw epoch 5_000_000_000 (issued after the backup); the clock is at 1 ms.
        let resources = vec![Floor {
            source: "store".into(),
            epoch: 5_000_000_000,
        }];
        let first = restore(
            &backup,
            &dir.path().join("a"),
            Some(&high_water),
            resources,
            1,
            Target::Single,
        )
        .unwrap();
        assert_eq!(first.floor, 5_000_000_000);
        assert_eq!(first.counter, 5_000_000_000 + RESTORE_MARGIN);
        assert!(first.decided_by.contains("store"), "{}", first.decided_by);
        // The directory starts above the counter.
        let store = crate::log_store::open_in(&dir.path().join("a")).unwrap();
        assert_eq!(store.load().unwrap().last_epoch, Epoch(first.counter));
        assert_eq!(
            restore_record(&dir.path().join("a")).unwrap(),
            first.clone()
        );
        // Restoring the same backup again with no resource named: the high-water bound the
        // first restore raised still puts it above.
        let second = restore(
            &backup,
            &dir.path().join("b"),
            Some(&high_water),
            Vec::new(),
            2,
            Target::Single,
        )
        .unwrap();
        assert!(second.counter > first.counter);
        // Even with the high-water file lost, the clock puts a later restore above.
        std::fs::remove_file(&high_water).unwrap();
        let now = now_ms();
        let third = restore(
            &backup,
            &dir.path().join("c"),
            Some(&high_water),
            Vec::new(),
            now,
            Target::Single,
        )
        .unwrap();
        assert_eq!(third.decided_by, "the clock");
        assert!(third.counter > second.counter);
        // A directory that holds a coordinator is refused.
        let error = restore(
            &backup,
            &dir.path().join("a"),
            Some(&high_water),
            Vec::new(),
            now,
            Target::Single,
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("already holds"), "{error}");
    }

    #[test]
    fn p6_a_cluster_restore_leaves_only_its_record_and_keeps_no_high_water() {
        let dir = tempfile::tempdir().unwrap();
        let member = dir.path().join("n1");
        let mut backup = sample(10);
        backup.mode = "cluster".into();
        let record = restore(
            &backup,
            &member,
            None,
            Vec::new(),
            1,
            Target::ClusterFounder,
        )
        .unwrap();
        assert_eq!(record.counter, 10 + RESTORE_MARGIN);
        assert_eq!(record.target, Target::ClusterFounder);
        assert_eq!(restore_record(&member).unwrap(), record);
        // The member creates its store at its first start (and its signing key then).
        assert!(!member.join(crate::STORE_FILE).exists());
        assert!(!member.join(crate::CLUSTER_STORE_FILE).exists());
        assert!(!crate::high_water::default_path(&member).exists());
    }
}
