//! On-disk layout of the embedded fenced store.
//!
//! | table | key | value |
//! |---|---|---|
//! | `meta` | `"mode"`, `"format_version"`, `"store_id"` (random), `"highest"` (greatest epoch accepted, activated or floored), `"restore_floor"`, `"restore"` (JSON of the last restore) | text |
//! | `kv` | `(lock, key)` | `epoch:u64 ‖ has_seq:u8 ‖ seq:u64 ‖ value` (big-endian) |
//! | `fences` | `lock` | activated: the activated epoch; other modes: the greatest accepted epoch |
//! | `ledger` | `(lock, key, epoch, seq)` | SHA-256 of the applied value (sequenced mode) |

use palisade_core::Epoch;
use palisade_fence::{FenceError, FenceMode, Stored};
use redb::{Database, ReadableDatabase as _, ReadableTable, TableDefinition};

pub const META: TableDefinition<&str, &str> = TableDefinition::new("meta");
pub const KV: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("kv");
pub const FENCES: TableDefinition<&str, u64> = TableDefinition::new("fences");
pub const LEDGER: TableDefinition<(&str, &str, u64, u64), &[u8]> = TableDefinition::new("ledger");

const FORMAT_VERSION: &str = "1";

/// `meta` key: the store's random id (a witness tells a copied-back store from a new one).
pub const STORE_ID: &str = "store_id";
/// `meta` key: the greatest epoch accepted, activated or floored, kept by every batch.
pub const HIGHEST: &str = "highest";
/// `meta` key: the restore floor: no epoch at or below it is accepted (P6).
pub const RESTORE_FLOOR: &str = "restore_floor";
/// `meta` key: what the last restore applied (JSON), for people.
pub const RESTORE_RECORD: &str = "restore";

/// The store-wide state a writer starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    /// The store's random id.
    pub store_id: String,
    /// The greatest epoch accepted, activated or floored.
    pub highest: u64,
    /// No epoch at or below it is accepted.
    pub floor: u64,
}
const HEADER_BYTES: usize = 17;

/// Wraps any storage-engine error.
pub fn storage(error: impl Into<redb::Error>) -> FenceError {
    FenceError::Storage(Box::new(error.into()))
}

/// Creates the tables and records the mode, or checks that the stored mode is `mode`; gives
/// the store-wide state (creating the store id, and the highest epoch of a store written
/// before it was kept).
pub fn initialize(db: &Database, mode: FenceMode) -> Result<Meta, FenceError> {
    let txn = db.begin_write().map_err(storage)?;
    let meta_state = {
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
        let kv = txn.open_table(KV).map_err(storage)?;
        let fences = txn.open_table(FENCES).map_err(storage)?;
        txn.open_table(LEDGER).map_err(storage)?;
        let existing = meta
            .get(STORE_ID)
            .map_err(storage)?
            .map(|id| id.value().to_owned());
        let store_id = match existing {
            Some(id) => id,
            None => {
                let id = new_store_id()?;
                meta.insert(STORE_ID, id.as_str()).map_err(storage)?;
                id
            }
        };
        let floor = meta_u64(&meta, RESTORE_FLOOR)?.unwrap_or(0);
        let highest = match meta_u64(&meta, HIGHEST)? {
            Some(highest) => highest,
            None => {
                let scanned = scan_highest(&kv, &fences)?.max(floor);
                meta.insert(HIGHEST, scanned.to_string().as_str())
                    .map_err(storage)?;
                scanned
            }
        };
        Meta {
            store_id,
            highest,
            floor,
        }
    };
    txn.commit().map_err(storage)?;
    Ok(meta_state)
}

fn new_store_id() -> Result<String, FenceError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| FenceError::Storage(e.to_string().into()))?;
    Ok(palisade_core::hex(&bytes))
}

/// A number kept in `meta`.
pub fn meta_u64(
    meta: &impl redb::ReadableTable<&'static str, &'static str>,
    key: &str,
) -> Result<Option<u64>, FenceError> {
    match meta.get(key).map_err(storage)? {
        Some(text) => text.value().parse().map(Some).map_err(|_| {
            FenceError::Integrity(format!("meta {key} is not a number: {:?}", text.value()))
        }),
        None => Ok(None),
    }
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

/// The greatest epoch among the fences and the stored rows (a full scan).
fn scan_highest(
    kv: &impl ReadableTable<(&'static str, &'static str), &'static [u8]>,
    fences: &impl ReadableTable<&'static str, u64>,
) -> Result<u64, FenceError> {
    let mut highest = 0;
    for entry in fences.iter().map_err(storage)? {
        let (_, fence) = entry.map_err(storage)?;
        highest = highest.max(fence.value());
    }
    for entry in kv.iter().map_err(storage)? {
        let (_, value) = entry.map_err(storage)?;
        highest = highest.max(decode_value(value.value())?.epoch.0);
    }
    Ok(highest)
}

/// The greatest epoch the store accepted, activated or was floored at.
pub fn highest_fence(db: &Database) -> Result<u64, FenceError> {
    let txn = db.begin_read().map_err(storage)?;
    let meta = txn.open_table(META).map_err(storage)?;
    Ok(meta_u64(&meta, HIGHEST)?.unwrap_or(0))
}
