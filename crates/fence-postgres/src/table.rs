//! Fencing a user's own table: the seed statement, and the bypass guard (P5).

use palisade_core::{Epoch, LockName};
use palisade_fence::{FenceError, Outcome, Rejection};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use crate::{from_bigint, storage, to_bigint, PostgresFence};

/// SQLSTATE raised by the guard when an UPDATE does not raise `last_fence`.
pub const GUARD_UPDATE_SQLSTATE: &str = "P5001";
/// SQLSTATE raised by the opt-in guard on INSERT/DELETE outside the fenced path.
pub const GUARD_ROWS_SQLSTATE: &str = "P5002";
/// SQLSTATE raised when a deleted row is re-created without a last_fence above its tombstone.
pub const GUARD_TOMBSTONE_SQLSTATE: &str = "P5003";

/// True when `error` is the bypass guard refusing a write.
pub fn is_guard_violation(error: &tokio_postgres::Error) -> bool {
    error.code().is_some_and(|code| {
        *code == SqlState::from_code(GUARD_UPDATE_SQLSTATE)
            || *code == SqlState::from_code(GUARD_ROWS_SQLSTATE)
            || *code == SqlState::from_code(GUARD_TOMBSTONE_SQLSTATE)
    })
}

/// The token's epoch as a PostgreSQL integer, after verifying the token for `lock` (P4).
fn verified_epoch(fence: &PostgresFence, lock: &LockName, token: &str) -> Result<i64, Rejection> {
    let claims = fence
        .verifier()
        .verify(token, lock)
        .map_err(Rejection::InvalidToken)?;
    to_bigint(claims.epoch.0, "epoch")
}

/// A user's table fenced per row, in strict mode: it must have a `last_fence bigint NOT NULL`
/// column (0 for rows never written under a fence). A row's fence outlives the row: a delete
/// leaves a tombstone (`palisade_row_fences`) and re-creating the row needs a higher epoch.
#[derive(Debug, Clone)]
pub struct GuardedTable {
    table: String,
    id_column: String,
    update: String,
    read_fence: String,
    insert: String,
    raise_fence: String,
    delete: String,
}

/// Quotes `schema.table` or `column`, accepting only plain SQL identifiers.
fn quote_identifier(name: &str) -> Result<String, FenceError> {
    let parts: Vec<&str> = name.split('.').collect();
    let valid = |part: &str| {
        !part.is_empty()
            && part.len() <= 63
            && part
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    if parts.len() > 2 || !parts.iter().all(|p| valid(p)) {
        return Err(FenceError::Integrity(format!(
            "{name:?} is not a plain identifier ([A-Za-z_][A-Za-z0-9_]*, optionally schema.)"
        )));
    }
    Ok(parts
        .iter()
        .map(|p| format!("\"{p}\""))
        .collect::<Vec<_>>()
        .join("."))
}

impl GuardedTable {
    /// The table `table` (optionally `schema.table`), its key column and its payload column.
    pub fn new(table: &str, id_column: &str, payload_column: &str) -> Result<Self, FenceError> {
        let t = quote_identifier(table)?;
        let id = quote_identifier(id_column)?;
        let payload = quote_identifier(payload_column)?;
        Ok(Self {
            // The seed statement, exactly: zero rows is a rejection, never success.
            update: format!(
                "UPDATE {t} SET {payload} = $3, last_fence = $2 \
                 WHERE {id} = $1 AND last_fence < $2 RETURNING {id}"
            ),
            // The row's fence and its tombstone's, in one statement. Both only rise (the guard
            // sees to it), so they are at least whatever refused a write.
            read_fence: format!(
                "SELECT (SELECT last_fence FROM {t} WHERE {id} = $1), \
                        (SELECT fence FROM palisade_row_fences \
                         WHERE tbl = $2::text::regclass::oid AND id = $1::text)"
            ),
            insert: format!("INSERT INTO {t} ({id}, {payload}, last_fence) VALUES ($1, $2, $3)"),
            // A fenced delete is a write at its epoch: the row's fence is raised to it (under the
            // row lock), then the row goes and its tombstone keeps that fence.
            raise_fence: format!(
                "UPDATE {t} SET last_fence = $2 WHERE {id} = $1 AND last_fence < $2 RETURNING {id}"
            ),
            delete: format!("DELETE FROM {t} WHERE {id} = $1"),
            table: t,
            id_column: id_column.to_owned(),
        })
    }

    /// Installs the bypass guard (P5): any UPDATE that does not strictly raise `last_fence`
    /// fails in the database; a DELETE leaves the row's fence behind and an INSERT of that key
    /// needs a higher `last_fence` (P2); with `guard_rows`, any INSERT or DELETE outside
    /// [`Self::insert`] / [`Self::delete`] fails too. Idempotent.
    pub async fn install_guard(
        &self,
        fence: &PostgresFence,
        guard_rows: bool,
    ) -> Result<(), FenceError> {
        let client = fence.client().await?;
        client
            .execute(
                "SELECT palisade_install_guard($1::text::regclass, $2, $3)",
                &[&self.table, &self.id_column, &guard_rows],
            )
            .await
            .map_err(storage)?;
        Ok(())
    }

    /// The fenced update of row `id` to `payload` under `lock` (strict: accepted iff the
    /// token's epoch is above the row's `last_fence`). One statement: the comparison and the
    /// write are atomic; the rejection's fence is read right after, and is at least the epoch
    /// that beat this write (fences only rise — the guard sees to it).
    pub async fn update(
        &self,
        fence: &PostgresFence,
        lock: &LockName,
        id: &(dyn ToSql + Sync),
        token: &str,
        payload: &(dyn ToSql + Sync),
    ) -> Result<Outcome, FenceError> {
        let epoch = match verified_epoch(fence, lock, token) {
            Ok(epoch) => epoch,
            Err(rejection) => return Ok(Outcome::Rejected(rejection)),
        };
        let client = fence.client().await?;
        let statement = client.prepare_cached(&self.update).await.map_err(storage)?;
        let updated = client
            .query_opt(&statement, &[id, &epoch, payload])
            .await
            .map_err(storage)?;
        if updated.is_some() {
            return Ok(Outcome::Accepted {
                epoch: Epoch(from_bigint(epoch)?),
                seq: None,
            });
        }
        self.rejection(&client, id, epoch).await
    }

    /// Why a fenced write of row `id` at `epoch` was refused, read in one statement: the row's
    /// fence, or its tombstone's when the row is gone.
    async fn rejection(
        &self,
        client: &deadpool_postgres::Client,
        id: &(dyn ToSql + Sync),
        epoch: i64,
    ) -> Result<Outcome, FenceError> {
        let statement = client
            .prepare_cached(&self.read_fence)
            .await
            .map_err(storage)?;
        let row = client
            .query_one(&statement, &[id, &self.table])
            .await
            .map_err(storage)?;
        let (current, tombstone): (Option<i64>, Option<i64>) = (row.get(0), row.get(1));
        let Some(fence) = current.max(tombstone) else {
            return Ok(Outcome::Rejected(Rejection::InvalidRequest(
                "no row with that id".into(),
            )));
        };
        if fence < epoch {
            if current.is_none() {
                return Ok(Outcome::Rejected(Rejection::InvalidRequest(format!(
                    "no row with that id (deleted at fence {fence}; insert it to re-create it)"
                ))));
            }
            return Err(FenceError::Integrity(format!(
                "write at {epoch} rejected but last_fence is {fence}"
            )));
        }
        Ok(Outcome::Rejected(Rejection::StaleEpoch {
            fence: Epoch(from_bigint(fence)?),
            fence_seq: None,
        }))
    }

    /// Creates row `id` with `payload` under `lock`, fenced (P2): the row starts at the
    /// token's epoch, which must be above the fence of any earlier row with that key (its
    /// tombstone). On the guarded path (allowed by the opt-in row guard). An existing row is an
    /// invalid request; a stale epoch a `StaleEpoch` rejection.
    pub async fn insert(
        &self,
        fence: &PostgresFence,
        lock: &LockName,
        id: &(dyn ToSql + Sync),
        token: &str,
        payload: &(dyn ToSql + Sync),
    ) -> Result<Outcome, FenceError> {
        let epoch = match verified_epoch(fence, lock, token) {
            Ok(epoch) => epoch,
            Err(rejection) => return Ok(Outcome::Rejected(rejection)),
        };
        let mut client = fence.client().await?;
        let txn = client.transaction().await.map_err(storage)?;
        txn.batch_execute("SET LOCAL palisade.fenced_path = 'on'")
            .await
            .map_err(storage)?;
        let inserted = txn.execute(&self.insert, &[id, payload, &epoch]).await;
        let error = match inserted {
            Ok(_) => {
                txn.commit().await.map_err(storage)?;
                return Ok(Outcome::Accepted {
                    epoch: Epoch(from_bigint(epoch)?),
                    seq: None,
                });
            }
            Err(error) => error,
        };
        txn.rollback().await.map_err(storage)?;
        match error.code() {
            Some(code) if *code == SqlState::UNIQUE_VIOLATION => Ok(Outcome::Rejected(
                Rejection::InvalidRequest("a row with that id exists".into()),
            )),
            Some(code) if *code == SqlState::from_code(GUARD_TOMBSTONE_SQLSTATE) => {
                self.rejection(&client, id, epoch).await
            }
            _ => Err(storage(error)),
        }
    }

    /// Deletes row `id` iff the token's epoch is above its `last_fence` (fenced, on the guarded
    /// path); the row's tombstone keeps the deleting epoch as its fence.
    pub async fn delete(
        &self,
        fence: &PostgresFence,
        lock: &LockName,
        id: &(dyn ToSql + Sync),
        token: &str,
    ) -> Result<Outcome, FenceError> {
        let epoch = match verified_epoch(fence, lock, token) {
            Ok(epoch) => epoch,
            Err(rejection) => return Ok(Outcome::Rejected(rejection)),
        };
        let mut client = fence.client().await?;
        let txn = client.transaction().await.map_err(storage)?;
        txn.batch_execute("SET LOCAL palisade.fenced_path = 'on'")
            .await
            .map_err(storage)?;
        let raised = txn
            .query_opt(&self.raise_fence, &[id, &epoch])
            .await
            .map_err(storage)?;
        if raised.is_none() {
            txn.rollback().await.map_err(storage)?;
            return self.rejection(&client, id, epoch).await;
        }
        txn.execute(&self.delete, &[id]).await.map_err(storage)?;
        txn.commit().await.map_err(storage)?;
        Ok(Outcome::Accepted {
            epoch: Epoch(from_bigint(epoch)?),
            seq: None,
        })
    }
}
