//! On-disk layout of the embedded fenced store.
//!
//! | table | key | value |
//! |---|---|---|
//! | `meta` | `"mode"`, `"format_version"` | text |
//! | `kv` | `(lock, key)` | `epoch:u64 ‖ has_seq:u8 ‖ seq:u64 ‖ value` (big-endian) |
//! | `fences` | `lock` | activated: the activated epoch; other modes: the greatest accepted epoch |
//! | `ledger` | `(lock, key, epoch, seq)` | SHA-256 of the applied value (sequenced mode) |

use palisade_core::Epoch;
use palisade_fence::{FenceError, FenceMode, Stored};
use redb::{Database, ReadableDatabase as _, ReadableTable as _, TableDefinition};

pub const META: TableDefinition<&str, &str> = TableDefinition::new("meta");
pub const KV: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("kv");
pub const FENCES: TableDefinition<&str, u64> = TableDefinition::new("fences");
pub const LEDGER: TableDefinition<(&str, &str, u64, u64), &[u8]> = TableDefinition::new("ledger");

const FORMAT_VERSION: &str = "1";
const HEADER_BYTES: usize = 17;

/// Wraps any storage-engine error.
pub fn storage(error: impl Into<redb::Error>) -> FenceError {
    FenceError::Storage(Box::new(error.into()))
}

/// Creates the tables and records the mode, or checks that the stored mode is `mode`.
pub fn initialize(db: &Database, mode: FenceMode) -> Result<(), FenceError> {
    let txn = db.begin_write().map_err(storage)?;
    {
        let mut meta = txn.open_table(META).map_err(storage)?;
        let stored_mode = meta
            .get("mode")
            .map_err(storage)?
            .map(|m| m.value().to_owned());
        match stored_mode {
            None => {
                meta.insert("mode", mode.as_str()).map_err(storage)?;
                meta.insert("format_version", FORMAT_VERSION)
                    .map_err(storage)?;
            }
            Some(stored) if stored == mode.as_str() => {}
            Some(stored) => {
                return Err(FenceError::Integrity(format!(
                    "this store was created in {stored} mode; it cannot be opened in {mode} mode"
                )))
            }
        }
        let version = meta
            .get("format_version")
            .map_err(storage)?
            .map(|v| v.value().to_owned());
        if version.as_deref() != Some(FORMAT_VERSION) {
            return Err(FenceError::Integrity(format!(
                "store format version {version:?}; this build reads {FORMAT_VERSION}"
            )));
        }
        txn.open_table(KV).map_err(storage)?;
        txn.open_table(FENCES).map_err(storage)?;
        txn.open_table(LEDGER).map_err(storage)?;
    }
    txn.commit().map_err(storage)
}

pub fn encode_value(epoch: Epoch, seq: Option<u64>, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES + value.len());
    out.extend_from_slice(&epoch.0.to_be_bytes());
    out.push(u8::from(seq.is_some()));
    out.extend_from_slice(&seq.unwrap_or(0).to_be_bytes());
    out.extend_from_slice(value);
    out
}

pub fn decode_value(bytes: &[u8]) -> Result<Stored, FenceError> {
    if bytes.len() < HEADER_BYTES {
        return Err(FenceError::Integrity("a stored record is truncated".into()));
    }
    let epoch = Epoch(u64::from_be_bytes(bytes[..8].try_into().expect("8 bytes")));
    let seq = u64::from_be_bytes(bytes[9..17].try_into().expect("8 bytes"));
    Ok(Stored {
        value: bytes[HEADER_BYTES..].to_vec(),
        epoch,
        seq: (bytes[8] == 1).then_some(seq),
    })
}

/// Only the header of a stored record: `(epoch, seq)`.
pub fn decode_pair(bytes: &[u8]) -> Result<(Epoch, Option<u64>), FenceError> {
    if bytes.len() < HEADER_BYTES {
        return Err(FenceError::Integrity("a stored record is truncated".into()));
    }
    let epoch = Epoch(u64::from_be_bytes(bytes[..8].try_into().expect("8 bytes")));
    let seq = u64::from_be_bytes(bytes[9..17].try_into().expect("8 bytes"));
    Ok((epoch, (bytes[8] == 1).then_some(seq)))
}

/// The greatest epoch among the fences and the stored rows.
pub fn highest_fence(db: &Database) -> Result<u64, FenceError> {
    let txn = db.begin_read().map_err(storage)?;
    let mut highest = 0;
    let fences = txn.open_table(FENCES).map_err(storage)?;
    for entry in fences.iter().map_err(storage)? {
        let (_, fence) = entry.map_err(storage)?;
        highest = highest.max(fence.value());
    }
    let rows = txn.open_table(KV).map_err(storage)?;
    for entry in rows.iter().map_err(storage)? {
        let (_, value) = entry.map_err(storage)?;
        highest = highest.max(decode_value(value.value())?.epoch.0);
    }
    Ok(highest)
}
