//! [`PostgresStore`]: the ledger's storage in PostgreSQL (`sql/001_effects.sql`, applied on
//! connect under an advisory lock). A transaction takes the lock's fence row `FOR UPDATE`
//! (every transaction on the lock waits for it: P3), reads the operation's row, and writes
//! both back before `COMMIT` returns, the WAL flushed first (P8): every connection starts with
//! `synchronous_commit` raised to `on` if the server, database or role turned it off
//! ([`palisade_fence_postgres::durable_pool`]).

use deadpool_postgres::Pool;

use crate::ledger::{LedgerError, ListFilter, Stats, Store};
use crate::model::{OpId, Record, ALL_STATES};

/// Advisory lock key serialising the ledger's schema migration ("paleffct" in ASCII).
const MIGRATION_LOCK: i64 = 0x7061_6c65_6666_6374;
/// Connections in the pool.
pub const POOL_SIZE: usize = 16;

/// The ledger's storage in PostgreSQL.
#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
    /// Where each lock's floor is learned after the database restarted or was restored
    /// (`palisade_lock_floors`, migration 8 of the fence adapter); `None`: no floor is weighed.
    floors: Option<std::sync::Arc<dyn palisade_fence::FloorSource>>,
}

fn storage(error: impl std::fmt::Display) -> LedgerError {
    LedgerError::Storage(error.to_string())
}

fn db(error: tokio_postgres::Error) -> LedgerError {
    match error.as_db_error() {
        Some(e) => LedgerError::Storage(format!("{} (SQLSTATE {})", e.message(), e.code().code())),
        None => storage(error),
    }
}

fn decode(text: &str) -> Result<Record, LedgerError> {
    serde_json::from_str(text)
        .map_err(|e| LedgerError::Integrity(format!("unreadable ledger record: {e}")))
}

impl PostgresStore {
    /// Connects to `url` and applies the ledger's schema.
    pub async fn connect(url: &str) -> Result<Self, LedgerError> {
        let pool = palisade_fence_postgres::durable_pool(url, POOL_SIZE).map_err(storage)?;
        let mut client = pool.get().await.map_err(storage)?;
        // DDL only when the schema is missing: a trigger's re-creation takes an exclusive lock
        // on the fences table, which would stall (or deadlock with) running ledgers.
        if !schema_applied(&client).await? {
            let txn = client.transaction().await.map_err(db)?;
            txn.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
                .await
                .map_err(db)?;
            txn.batch_execute(
                "CREATE TABLE IF NOT EXISTS palisade_effects_schema (
                     version    integer     PRIMARY KEY,
                     applied_at timestamptz NOT NULL DEFAULT now()
                 )",
            )
            .await
            .map_err(db)?;
            let done = txn
                .query_opt(
                    "SELECT 1 FROM palisade_effects_schema WHERE version = 1",
                    &[],
                )
                .await
                .map_err(db)?
                .is_some();
            if !done {
                txn.batch_execute(include_str!("../sql/001_effects.sql"))
                    .await
                    .map_err(db)?;
                txn.execute(
                    "INSERT INTO palisade_effects_schema (version) VALUES (1)",
                    &[],
                )
                .await
                .map_err(db)?;
            }
            txn.commit().await.map_err(db)?;
        }
        // The lock floors (palisade_known_floor, palisade_learn_floor) live in the fence
        // adapter's migrations.
        palisade_fence_postgres::migrations::apply(&mut client)
            .await
            .map_err(db)?;
        Ok(Self { pool, floors: None })
    }

    /// Weighs each lock's floor, learned from `floors` (the coordinator's) in each incarnation
    /// of the database: an owner the coordinator superseded is refused even when the ledger's
    /// fences went back with a restored database (P6, P8). Without it, a ledger whose keys
    /// come from a file weighs only its own fences.
    pub fn with_floors(mut self, floors: std::sync::Arc<dyn palisade_fence::FloorSource>) -> Self {
        self.floors = Some(floors);
        self
    }

    /// Learns `lock`'s floor from the floor source and records it in this incarnation.
    async fn learn_floor(&self, lock: &palisade_core::LockName) -> Result<(), LedgerError> {
        let Some(floors) = &self.floors else {
            return Ok(());
        };
        let (floor, statement) = floors.floor_statement(lock).await.map_err(|why| {
            LedgerError::Storage(format!(
                "cannot learn the floor of lock {lock}: {why}; nothing was recorded"
            ))
        })?;
        let floor = i64::try_from(floor.0)
            .map_err(|_| LedgerError::Integrity(format!("floor {floor} out of range")))?;
        let client = self.pool.get().await.map_err(storage)?;
        // With the coordinator's statement when the source gave one (migration 10).
        let learned = match &statement {
            Some(statement) => {
                client
                    .execute(
                        "SELECT palisade_learn_floor($1, $2, $3)",
                        &[&lock.as_str(), &floor, statement],
                    )
                    .await
            }
            None => {
                client
                    .execute(
                        "SELECT palisade_learn_floor($1, $2)",
                        &[&lock.as_str(), &floor],
                    )
                    .await
            }
        };
        learned.map_err(db)?;
        Ok(())
    }
}

/// Writes the operation's record (its state and time copied out for queries).
async fn write_record(
    txn: &tokio_postgres::Transaction<'_>,
    id: &OpId,
    record: &Record,
) -> Result<(), LedgerError> {
    let text = serde_json::to_string(record).map_err(storage)?;
    let updated = record.updated_ms as i64;
    txn.execute(
        "INSERT INTO palisade_effect_ops (lock, op, state, updated_ms, record) \
         VALUES ($1, $2, $3, $4, $5::text::jsonb) \
         ON CONFLICT (lock, op) DO UPDATE SET state = EXCLUDED.state, \
         updated_ms = EXCLUDED.updated_ms, record = EXCLUDED.record",
        &[
            &id.lock.as_str(),
            &id.op,
            &record.state.as_str(),
            &updated,
            &text,
        ],
    )
    .await
    .map_err(db)?;
    Ok(())
}

/// What a transaction found of the lock's floor.
enum Floor {
    /// Nothing to weigh (no floor source) or the floor learned in this incarnation.
    Known(u64),
    /// The database does not know it in this incarnation: learn it, then run again.
    Unknown,
}

async fn schema_applied(client: &tokio_postgres::Client) -> Result<bool, LedgerError> {
    let exists: bool = client
        .query_one(
            "SELECT to_regclass('palisade_effects_schema') IS NOT NULL",
            &[],
        )
        .await
        .map_err(db)?
        .get(0);
    if !exists {
        return Ok(false);
    }
    Ok(client
        .query_opt(
            "SELECT 1 FROM palisade_effects_schema WHERE version = 1",
            &[],
        )
        .await
        .map_err(db)?
        .is_some())
}

/// One transaction of [`Store::transact`]: `None` when the lock's floor must be learned first
/// (nothing was changed and `step` did not run).
impl PostgresStore {
    async fn transact_once<T, S>(
        &self,
        id: &OpId,
        step: &mut Option<S>,
    ) -> Result<Option<T>, LedgerError>
    where
        S: FnOnce(&mut u64, &mut Option<Record>) -> T,
    {
        let mut client = self.pool.get().await.map_err(storage)?;
        let txn = client.transaction().await.map_err(db)?;
        let lock = id.lock.as_str();
        txn.execute(
            "INSERT INTO palisade_effect_fences (lock, epoch) VALUES ($1, 0) \
             ON CONFLICT (lock) DO NOTHING",
            &[&lock],
        )
        .await
        .map_err(db)?;
        let fence_before: i64 = txn
            .query_one(
                "SELECT epoch FROM palisade_effect_fences WHERE lock = $1 FOR UPDATE",
                &[&lock],
            )
            .await
            .map_err(db)?
            .get(0);
        let row = txn
            .query_opt(
                "SELECT record::text FROM palisade_effect_ops WHERE lock = $1 AND op = $2",
                &[&lock, &id.op],
            )
            .await
            .map_err(db)?;
        let record_before = match row {
            Some(row) => Some(decode(row.get::<_, &str>(0))?),
            None => None,
        };
        let fence_before = u64::try_from(fence_before)
            .map_err(|_| LedgerError::Integrity(format!("negative fence for {lock}")))?;
        let floor = match self.known_floor(&txn, lock).await? {
            Floor::Known(floor) => floor,
            Floor::Unknown => return Ok(None), // rolled back as `txn` drops
        };
        let step = step.take().expect("a step runs once");
        // An owner below the coordinator's floor is superseded, whatever this table says.
        let (out, writes) =
            crate::ledger::apply_step(lock, fence_before, floor, record_before, step)?;
        if let Some(fence) = writes.fence {
            let epoch = i64::try_from(fence)
                .map_err(|_| LedgerError::Integrity(format!("fence {fence} out of range")))?;
            txn.execute(
                "UPDATE palisade_effect_fences SET epoch = $2 WHERE lock = $1",
                &[&lock, &epoch],
            )
            .await
            .map_err(db)?;
        }
        if let Some(record) = &writes.record {
            write_record(&txn, id, record).await?;
        }
        txn.commit().await.map_err(db)?;
        Ok(Some(out))
    }

    /// The lock's floor as this transaction sees it.
    async fn known_floor(
        &self,
        txn: &tokio_postgres::Transaction<'_>,
        lock: &str,
    ) -> Result<Floor, LedgerError> {
        if self.floors.is_none() {
            return Ok(Floor::Known(0));
        }
        let known: Option<i64> = txn
            .query_one("SELECT palisade_known_floor($1)", &[&lock])
            .await
            .map_err(db)?
            .get(0);
        match known {
            None => Ok(Floor::Unknown),
            Some(floor) => u64::try_from(floor)
                .map(Floor::Known)
                .map_err(|_| LedgerError::Integrity(format!("negative floor for {lock}"))),
        }
    }
}

impl Store for PostgresStore {
    async fn transact<T: Send + 'static>(
        &self,
        id: &OpId,
        step: impl FnOnce(&mut u64, &mut Option<Record>) -> T + Send + 'static,
    ) -> Result<T, LedgerError> {
        let mut step = Some(step);
        for _ in 0..2 {
            match self.transact_once(id, &mut step).await? {
                Some(out) => return Ok(out),
                None => self.learn_floor(&id.lock).await?,
            }
        }
        Err(LedgerError::Storage(format!(
            "the floor of lock {} changed twice under this request (was the database restored \
             again?); nothing was recorded, retry",
            id.lock
        )))
    }

    async fn get(&self, id: &OpId) -> Result<Option<Record>, LedgerError> {
        let client = self.pool.get().await.map_err(storage)?;
        let row = client
            .query_opt(
                "SELECT record::text FROM palisade_effect_ops WHERE lock = $1 AND op = $2",
                &[&id.lock.as_str(), &id.op],
            )
            .await
            .map_err(db)?;
        row.map(|row| decode(row.get::<_, &str>(0))).transpose()
    }

    async fn scan(&self, filter: &ListFilter) -> Result<Vec<Record>, LedgerError> {
        let client = self.pool.get().await.map_err(storage)?;
        let states: Vec<&str> = if filter.states.is_empty() {
            ALL_STATES.iter().map(|s| s.as_str()).collect()
        } else {
            filter.states.iter().map(|s| s.as_str()).collect()
        };
        let limit = filter.limit() as i64;
        let rows = client
            .query(
                "SELECT record::text FROM palisade_effect_ops \
                 WHERE state = ANY($1) AND ($2::text IS NULL OR lock = $2) \
                 ORDER BY updated_ms LIMIT $3",
                &[&states, &filter.lock, &limit],
            )
            .await
            .map_err(db)?;
        rows.iter()
            .map(|row| decode(row.get::<_, &str>(0)))
            .collect()
    }

    async fn stats(&self, now_ms: u64) -> Result<Stats, LedgerError> {
        let client = self.pool.get().await.map_err(storage)?;
        let mut stats = Stats::of(std::iter::empty(), now_ms);
        for row in client
            .query(
                "SELECT state, count(*) FROM palisade_effect_ops GROUP BY state",
                &[],
            )
            .await
            .map_err(db)?
        {
            let state: String = row.get(0);
            let count: i64 = row.get(1);
            stats.by_state.insert(state, count as u64);
        }
        let now = now_ms as i64;
        let oldest: Option<i64> = client
            .query_one(
                "SELECT min(updated_ms) FROM palisade_effect_ops WHERE state = 'unknown' OR \
                 (state = 'in_flight' AND (record->>'deadline_ms')::bigint <= $1)",
                &[&now],
            )
            .await
            .map_err(db)?
            .get(0);
        stats.oldest_in_doubt_ms = oldest.map(|o| o as u64);
        Ok(stats)
    }
}
