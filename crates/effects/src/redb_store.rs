//! [`RedbStore`]: the embedded ledger's storage. One redb file holds every lock's ledger
//! fence and every operation's record. Each transaction is one redb write transaction (they
//! exclude each other: P3) committed with `Durability::Immediate` before it answers (P8).

use std::path::Path;
use std::sync::Arc;

use redb::{Database, ReadableDatabase as _, ReadableTable as _, TableDefinition};

use crate::ledger::{LedgerError, ListFilter, Stats, Store};
use crate::model::{OpId, Record};

/// Lock name → the ledger's fence for it.
const FENCES: TableDefinition<&str, u64> = TableDefinition::new("effect_fences");
/// (lock, op) → the record as JSON.
const OPS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("effect_ops");

/// The embedded ledger's storage (one process opens the file at a time; other processes reach
/// it through the reference store's HTTP routes, see `palisade resource serve`).
#[derive(Clone)]
pub struct RedbStore {
    db: Arc<Database>,
}

fn storage(error: impl std::fmt::Display) -> LedgerError {
    LedgerError::Storage(error.to_string())
}

fn decode(bytes: &[u8]) -> Result<Record, LedgerError> {
    serde_json::from_slice(bytes)
        .map_err(|e| LedgerError::Integrity(format!("unreadable ledger record: {e}")))
}

impl RedbStore {
    /// Opens (or creates) the ledger file at `path`.
    pub fn open(path: &Path) -> Result<Self, LedgerError> {
        let created = !path.exists();
        let db = Database::create(path).map_err(storage)?;
        let mut txn = db.begin_write().map_err(storage)?;
        txn.set_durability(redb::Durability::Immediate)
            .map_err(storage)?;
        txn.open_table(FENCES).map_err(storage)?;
        txn.open_table(OPS).map_err(storage)?;
        txn.commit().map_err(storage)?;
        if created {
            // A power cut must not make the new file vanish with the records it holds.
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::File::open(dir)
                    .and_then(|d| d.sync_all())
                    .map_err(storage)?;
            }
        }
        Ok(Self { db: Arc::new(db) })
    }

    fn read_all(&self, filter: &ListFilter) -> Result<Vec<Record>, LedgerError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let table = txn.open_table(OPS).map_err(storage)?;
        let mut records = Vec::new();
        let range = match filter.lock.as_deref() {
            Some(lock) => table.range((lock, "")..=(lock, "\u{10FFFF}")),
            None => table.range::<(&str, &str)>(..),
        }
        .map_err(storage)?;
        for entry in range {
            let (_, value) = entry.map_err(storage)?;
            let record = decode(value.value())?;
            if filter.admits(&record) {
                records.push(record);
            }
        }
        Ok(records)
    }
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, LedgerError> + Send + 'static,
) -> Result<T, LedgerError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| LedgerError::Storage(format!("ledger task failed: {e}")))?
}

impl Store for RedbStore {
    async fn transact<T: Send + 'static>(
        &self,
        id: &OpId,
        step: impl FnOnce(&mut u64, &mut Option<Record>) -> T + Send + 'static,
    ) -> Result<T, LedgerError> {
        let db = self.db.clone();
        let id = id.clone();
        blocking(move || {
            let mut txn = db.begin_write().map_err(storage)?;
            txn.set_durability(redb::Durability::Immediate)
                .map_err(storage)?;
            let out;
            let changed;
            {
                let mut fences = txn.open_table(FENCES).map_err(storage)?;
                let mut ops = txn.open_table(OPS).map_err(storage)?;
                let lock = id.lock.as_str();
                let fence_before = fences.get(lock).map_err(storage)?.map_or(0, |v| v.value());
                let record_before = match ops.get((lock, id.op.as_str())).map_err(storage)? {
                    Some(value) => Some(decode(value.value())?),
                    None => None,
                };
                let mut fence = fence_before;
                let mut record = record_before.clone();
                out = step(&mut fence, &mut record);
                if fence < fence_before {
                    return Err(LedgerError::Integrity(format!(
                        "the fence of {lock} would move down from {fence_before} to {fence}"
                    )));
                }
                changed = fence != fence_before || record != record_before;
                if fence != fence_before {
                    fences.insert(lock, fence).map_err(storage)?;
                }
                if record != record_before {
                    if let Some(record) = &record {
                        let bytes = serde_json::to_vec(record).map_err(storage)?;
                        ops.insert((lock, id.op.as_str()), bytes.as_slice())
                            .map_err(storage)?;
                    }
                }
            }
            if changed {
                txn.commit().map_err(storage)?;
            } else {
                txn.abort().map_err(storage)?;
            }
            Ok(out)
        })
        .await
    }

    async fn get(&self, id: &OpId) -> Result<Option<Record>, LedgerError> {
        let db = self.db.clone();
        let id = id.clone();
        blocking(move || {
            let txn = db.begin_read().map_err(storage)?;
            let table = txn.open_table(OPS).map_err(storage)?;
            let value = table
                .get((id.lock.as_str(), id.op.as_str()))
                .map_err(storage)?;
            value.map(|v| decode(v.value())).transpose()
        })
        .await
    }

    async fn scan(&self, filter: &ListFilter) -> Result<Vec<Record>, LedgerError> {
        let this = self.clone();
        let filter = filter.clone();
        blocking(move || {
            let mut records = this.read_all(&filter)?;
            records.sort_by_key(|r| r.updated_ms);
            records.truncate(filter.limit());
            Ok(records)
        })
        .await
    }

    async fn stats(&self, now_ms: u64) -> Result<Stats, LedgerError> {
        let this = self.clone();
        blocking(move || {
            let records = this.read_all(&ListFilter::default())?;
            Ok(Stats::of(&records, now_ms))
        })
        .await
    }
}
