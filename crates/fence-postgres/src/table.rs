//! Fencing a user's own table: the seed statement, and the bypass guard (P5).

use std::sync::Arc;

use palisade_core::{Epoch, LockName, TokenError};
use palisade_fence::{FenceError, Outcome, Rejection};
use tokio::sync::OnceCell;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use crate::{from_bigint, storage, to_bigint, PostgresFence};

/// SQLSTATE raised by the guard when an UPDATE does not raise `last_fence`.
pub const GUARD_UPDATE_SQLSTATE: &str = "P5001";
/// SQLSTATE raised by the opt-in guard on INSERT/DELETE outside the fenced path.
pub const GUARD_ROWS_SQLSTATE: &str = "P5002";
/// SQLSTATE raised when a deleted row is re-created without a last_fence above its tombstone.
pub const GUARD_TOMBSTONE_SQLSTATE: &str = "P5003";
/// SQLSTATE raised on TRUNCATE of a guarded table (it would forget every row's fence).
pub const GUARD_TRUNCATE_SQLSTATE: &str = "P5004";
/// SQLSTATE raised when an UPDATE changes the lock that guards a row.
pub const GUARD_LOCK_SQLSTATE: &str = "P5005";

/// SQLSTATE raised when a table that requires tokens is written with no token presented.
pub const NO_TOKEN_SQLSTATE: &str = "P5010";
/// SQLSTATE raised when the tokens presented are for other locks than the row's.
pub const TOKEN_LOCK_SQLSTATE: &str = "P5011";
/// SQLSTATE raised when `last_fence` is not the presented token's epoch.
pub const TOKEN_EPOCH_SQLSTATE: &str = "P5012";
/// SQLSTATE raised by `palisade_present_token` for text that is not a token.
pub const NOT_A_TOKEN_SQLSTATE: &str = "P5013";

/// True when `error` is the bypass guard refusing a write.
pub fn is_guard_violation(error: &tokio_postgres::Error) -> bool {
    error.code().is_some_and(|code| {
        *code == SqlState::from_code(GUARD_UPDATE_SQLSTATE)
            || *code == SqlState::from_code(GUARD_ROWS_SQLSTATE)
            || *code == SqlState::from_code(GUARD_TOMBSTONE_SQLSTATE)
            || *code == SqlState::from_code(GUARD_TRUNCATE_SQLSTATE)
            || *code == SqlState::from_code(GUARD_LOCK_SQLSTATE)
            || *code == SqlState::from_code(NO_TOKEN_SQLSTATE)
            || *code == SqlState::from_code(TOKEN_LOCK_SQLSTATE)
            || *code == SqlState::from_code(TOKEN_EPOCH_SQLSTATE)
            || *code == SqlState::from_code(NOT_A_TOKEN_SQLSTATE)
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

/// Which lock guards the rows of a [`GuardedTable`]. Epochs come from one counter for all
/// locks, so a row must know its lock: a valid token of another lock would otherwise write it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowLock {
    /// One lock guards every row of the table.
    Table(LockName),
    /// Each row names the lock that guards it in this column (`text NOT NULL`): set when the
    /// row is created (through the fence), never changed by an UPDATE (the guard refuses).
    Column(String),
}

/// A user's table fenced per row, in strict mode: it must have a `last_fence bigint NOT NULL`
/// column (0 for rows never written under a fence), and is bound to the lock(s) that guard it
/// ([`RowLock`]). A row's fence outlives the row: a delete leaves a tombstone
/// (`palisade_row_fences`) and re-creating the row needs a higher epoch.
#[derive(Debug, Clone)]
pub struct GuardedTable {
    table: String,
    id_column: String,
    lock: RowLock,
    update: String,
    read_fence: String,
    insert: String,
    raise_fence: String,
    delete: String,
    /// Set once this table's binding was found registered, as `lock`, in the database.
    registered: Arc<OnceCell<()>>,
}

/// Quotes `schema.table` or `column`, accepting only plain SQL identifiers.
pub fn quote_identifier(name: &str) -> Result<String, FenceError> {
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
    /// The table `table` (optionally `schema.table`), its key column, its payload column and
    /// the lock(s) that guard its rows.
    pub fn new(
        table: &str,
        id_column: &str,
        payload_column: &str,
        lock: RowLock,
    ) -> Result<Self, FenceError> {
        let t = quote_identifier(table)?;
        let id = quote_identifier(id_column)?;
        let payload = quote_identifier(payload_column)?;
        // With a lock column, every statement names the row's lock ($4 or $3): a row of
        // another lock is not matched, in the same statement that compares the fence.
        let (row_lock, lock_select) = match &lock {
            RowLock::Table(_) => (String::new(), "NULL::text".to_owned()),
            RowLock::Column(column) => {
                let c = quote_identifier(column)?;
                (c.clone(), format!("r.{c}"))
            }
        };
        let matches_lock = |n: usize| {
            if row_lock.is_empty() {
                String::new()
            } else {
                format!(" AND {row_lock} = ${n}")
            }
        };
        Ok(Self {
            // The seed statement, exactly: zero rows is a rejection, never success. The
            // token ($4) is presented to the database, which binds the row to its lock and
            // epoch on a table that requires tokens (migration 11); $2 is the epoch this
            // adapter verified from it.
            update: format!(
                "UPDATE {t} SET {payload} = $3, last_fence = palisade_present_token($4) \
                 WHERE {id} = $1 AND last_fence < $2{} RETURNING {id}",
                matches_lock(5)
            ),
            // The row's fence, its lock and its tombstone's fence, in one statement. Fences
            // only rise (the guard sees to it), so they are at least whatever refused a write.
            read_fence: format!(
                "SELECT r.last_fence, {lock_select}, d.fence \
                 FROM (SELECT 1) AS one \
                 LEFT JOIN {t} AS r ON r.{id} = $1 \
                 LEFT JOIN palisade_row_fences AS d \
                   ON d.tbl = $2::text::regclass::oid AND d.id = $1::text"
            ),
            insert: if row_lock.is_empty() {
                format!(
                    "INSERT INTO {t} ({id}, {payload}, last_fence) \
                     VALUES ($1, $2, palisade_present_token($3))"
                )
            } else {
                format!(
                    "INSERT INTO {t} ({id}, {payload}, last_fence, {row_lock}) \
                     VALUES ($1, $2, palisade_present_token($3), $4)"
                )
            },
            // A fenced delete is a write at its epoch: the row's fence is raised to it (under the
            // row lock), then the row goes and its tombstone keeps that fence.
            raise_fence: format!(
                "UPDATE {t} SET last_fence = palisade_present_token($3) \
                 WHERE {id} = $1 AND last_fence < $2{} RETURNING {id}",
                matches_lock(4)
            ),
            delete: format!("DELETE FROM {t} WHERE {id} = $1"),
            table: t,
            id_column: id_column.to_owned(),
            lock,
            registered: Arc::new(OnceCell::new()),
        })
    }

    /// The lock(s) guarding this table's rows.
    pub fn row_lock(&self) -> &RowLock {
        &self.lock
    }

    /// `(table_lock, lock_column)` as `palisade_guarded_tables` stores them.
    fn binding(&self) -> (Option<&str>, Option<&str>) {
        match &self.lock {
            RowLock::Table(lock) => (Some(lock.as_str()), None),
            RowLock::Column(column) => (None, Some(column.as_str())),
        }
    }

    /// Installs the bypass guard (P5) and records the table's lock binding: any UPDATE that
    /// does not strictly raise `last_fence` (or changes a row's lock) fails in the database; a
    /// DELETE leaves the row's fence behind and an INSERT of that key needs a higher
    /// `last_fence` (P2); TRUNCATE fails; with `guard_rows`, any INSERT or DELETE outside
    /// [`Self::insert`] / [`Self::delete`] fails too. Every trigger fires ALWAYS (also under
    /// `session_replication_role = replica`). Idempotent; a table bound to another lock is
    /// refused. Run it as the table's owner.
    pub async fn install_guard(
        &self,
        fence: &PostgresFence,
        guard_rows: bool,
    ) -> Result<(), FenceError> {
        let client = fence.client().await?;
        let (table_lock, lock_column) = self.binding();
        client
            .execute(
                "SELECT palisade_install_guard($1::text::regclass, $2, $3, $4, $5)",
                &[
                    &self.table,
                    &self.id_column,
                    &guard_rows,
                    &table_lock,
                    &lock_column,
                ],
            )
            .await
            .map_err(storage)?;
        // A table guarded after a restore gets the restore floor too.
        client
            .execute(
                "SELECT palisade_install_floor() WHERE EXISTS (SELECT 1 FROM palisade_restore_floor)",
                &[],
            )
            .await
            .map_err(storage)?;
        Ok(())
    }

    /// Makes the table require a token for every fenced write (migration 11), or not: a row
    /// is then written only with `last_fence` = the epoch of a token presented in the same
    /// transaction for the row's own lock (`palisade_present_token`), so a SQL writer's bare
    /// epoch, or another lock's token, is refused inside the database (SQLSTATEs
    /// [`NO_TOKEN_SQLSTATE`], [`TOKEN_LOCK_SQLSTATE`], [`TOKEN_EPOCH_SQLSTATE`]). This adapter
    /// presents its tokens on every write, so it works either way. Run it as the table's
    /// owner, after [`Self::install_guard`].
    pub async fn require_token(
        &self,
        fence: &PostgresFence,
        required: bool,
    ) -> Result<(), FenceError> {
        let client = fence.client().await?;
        client
            .execute(
                "SELECT palisade_require_token($1::text::regclass, $2)",
                &[&self.table, &required],
            )
            .await
            .map_err(storage)?;
        Ok(())
    }

    /// What would let the PostgreSQL role `role` write this table without the fence (none:
    /// the guard holds against it). Give your application's role an empty list: see the
    /// roles in `docs/enforcement.md`.
    pub async fn guard_findings(
        &self,
        fence: &PostgresFence,
        role: &str,
    ) -> Result<Vec<String>, FenceError> {
        let client = fence.client().await?;
        let rows = client
            .query(
                "SELECT palisade_guard_findings($1::text::regclass, $2::text::name)",
                &[&self.table, &role],
            )
            .await
            .map_err(storage)?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }

    /// Checks, once per instance, that the database binds this table to the same lock(s)
    /// (`install_guard` recorded it): two adapters must not disagree on who guards a row.
    async fn check_registered(&self, client: &deadpool_postgres::Client) -> Result<(), FenceError> {
        self.registered
            .get_or_try_init(|| async {
                let row = client
                    .query_opt(
                        "SELECT key_column, table_lock, lock_column FROM palisade_guarded_tables \
                         WHERE tbl = $1::text::regclass::oid",
                        &[&self.table],
                    )
                    .await
                    .map_err(storage)?;
                let Some(row) = row else {
                    return Err(FenceError::Integrity(format!(
                        "{} has no guard bound to a lock: run install_guard (migration 6 binds \
                         every guarded table to its lock)",
                        self.table
                    )));
                };
                let stored: (String, Option<String>, Option<String>) =
                    (row.get(0), row.get(1), row.get(2));
                let (table_lock, lock_column) = self.binding();
                let mine = (self.id_column.as_str(), table_lock, lock_column);
                if (stored.0.as_str(), stored.1.as_deref(), stored.2.as_deref()) != mine {
                    return Err(FenceError::Integrity(format!(
                        "{} is guarded with key {:?}, table lock {:?}, lock column {:?}; this \
                         adapter was configured with {:?}",
                        self.table, stored.0, stored.1, stored.2, mine
                    )));
                }
                Ok(())
            })
            .await
            .map(|_| ())
    }

    /// Verifies `token` for `lock` (P4) and that `lock` may guard rows of this table: the
    /// table's lock, or any lock with a lock column (the statements then match the row's).
    fn verified_epoch(
        &self,
        fence: &PostgresFence,
        lock: &LockName,
        token: &str,
    ) -> Result<i64, Rejection> {
        if let RowLock::Table(table_lock) = &self.lock {
            if table_lock != lock {
                return Err(Rejection::InvalidToken(TokenError::WrongLock {
                    expected: table_lock.clone(),
                    actual: lock.clone(),
                }));
            }
        }
        verified_epoch(fence, lock, token)
    }

    /// The fenced update of row `id` to `payload` under `lock` (strict: accepted iff the
    /// token's epoch is above the row's `last_fence`, and `lock` guards the row). One
    /// statement: the comparison and the write are atomic; the rejection's fence is read right
    /// after, and is at least the epoch that beat this write (fences only rise — the guard sees
    /// to it).
    pub async fn update(
        &self,
        fence: &PostgresFence,
        lock: &LockName,
        id: &(dyn ToSql + Sync),
        token: &str,
        payload: &(dyn ToSql + Sync),
    ) -> Result<Outcome, FenceError> {
        let outcome = fence
            .with_floor(lock, || self.update_once(fence, lock, id, token, payload))
            .await;
        fence.recorded(token, outcome).await
    }

    async fn update_once(
        &self,
        fence: &PostgresFence,
        lock: &LockName,
        id: &(dyn ToSql + Sync),
        token: &str,
        payload: &(dyn ToSql + Sync),
    ) -> Result<Outcome, FenceError> {
        let epoch = match self.verified_epoch(fence, lock, token) {
            Ok(epoch) => epoch,
            Err(rejection) => return Ok(Outcome::Rejected(rejection)),
        };
        let client = fence.client().await?;
        self.check_registered(&client).await?;
        let statement = client.prepare_cached(&self.update).await.map_err(storage)?;
        let lock_name = lock.as_str();
        let params: [&(dyn ToSql + Sync); 5] = [id, &epoch, payload, &token, &lock_name];
        let updated = match client
            .query_opt(&statement, &params[..self.params(4)])
            .await
        {
            Ok(updated) => updated,
            Err(error) => return floor_or_failure(error),
        };
        if updated.is_some() {
            return Ok(Outcome::Accepted {
                epoch: Epoch(from_bigint(epoch)?),
                seq: None,
            });
        }
        self.rejection(&client, lock, id, epoch).await
    }

    /// How many of `base + 1` parameters a statement takes: the last is the row's lock, only
    /// with a lock column.
    fn params(&self, base: usize) -> usize {
        match self.lock {
            RowLock::Table(_) => base,
            RowLock::Column(_) => base + 1,
        }
    }

    /// Row `id` as one statement sees it: its fence, the lock named in its lock column, and
    /// its tombstone's fence.
    async fn row_state(
        &self,
        client: &deadpool_postgres::Client,
        id: &(dyn ToSql + Sync),
    ) -> Result<(Option<i64>, Option<String>, Option<i64>), FenceError> {
        let statement = client
            .prepare_cached(&self.read_fence)
            .await
            .map_err(storage)?;
        let row = client
            .query_one(&statement, &[id, &self.table])
            .await
            .map_err(storage)?;
        Ok((row.get(0), row.get(1), row.get(2)))
    }

    /// A `WrongLock` rejection when the row names a lock other than `lock`.
    fn wrong_lock(
        lock: &LockName,
        row_lock: Option<String>,
    ) -> Result<Option<Outcome>, FenceError> {
        let Some(row_lock) = row_lock.filter(|l| l != lock.as_str()) else {
            return Ok(None);
        };
        let expected = LockName::new(row_lock.clone()).map_err(|_| {
            FenceError::Integrity(format!("row guarded by an invalid lock name {row_lock:?}"))
        })?;
        Ok(Some(Outcome::Rejected(Rejection::InvalidToken(
            TokenError::WrongLock {
                expected,
                actual: lock.clone(),
            },
        ))))
    }

    /// Why a fenced write of row `id` at `epoch` under `lock` was refused, read in one
    /// statement: the row's fence (or its tombstone's when the row is gone) and its lock.
    async fn rejection(
        &self,
        client: &deadpool_postgres::Client,
        lock: &LockName,
        id: &(dyn ToSql + Sync),
        epoch: i64,
    ) -> Result<Outcome, FenceError> {
        let (current, row_lock, tombstone) = self.row_state(client, id).await?;
        if let Some(wrong) = Self::wrong_lock(lock, row_lock)? {
            return Ok(wrong);
        }
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
    /// tombstone); with a lock column, the row is guarded by `lock` from now on. On the guarded
    /// path (allowed by the opt-in row guard). An existing row is an invalid request; a stale
    /// epoch a `StaleEpoch` rejection.
    pub async fn insert(
        &self,
        fence: &PostgresFence,
        lock: &LockName,
        id: &(dyn ToSql + Sync),
        token: &str,
        payload: &(dyn ToSql + Sync),
    ) -> Result<Outcome, FenceError> {
        let outcome = fence
            .with_floor(lock, || self.insert_once(fence, lock, id, token, payload))
            .await;
        fence.recorded(token, outcome).await
    }

    async fn insert_once(
        &self,
        fence: &PostgresFence,
        lock: &LockName,
        id: &(dyn ToSql + Sync),
        token: &str,
        payload: &(dyn ToSql + Sync),
    ) -> Result<Outcome, FenceError> {
        let epoch = match self.verified_epoch(fence, lock, token) {
            Ok(epoch) => epoch,
            Err(rejection) => return Ok(Outcome::Rejected(rejection)),
        };
        let mut client = fence.client().await?;
        self.check_registered(&client).await?;
        let txn = client.transaction().await.map_err(storage)?;
        txn.batch_execute("SET LOCAL palisade.fenced_path = 'on'")
            .await
            .map_err(storage)?;
        let lock_name = lock.as_str();
        let params: [&(dyn ToSql + Sync); 4] = [id, payload, &token, &lock_name];
        let inserted = txn.execute(&self.insert, &params[..self.params(3)]).await;
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
            Some(code) if *code == SqlState::UNIQUE_VIOLATION => {
                let (_, row_lock, _) = self.row_state(&client, id).await?;
                Ok(
                    Self::wrong_lock(lock, row_lock)?.unwrap_or(Outcome::Rejected(
                        Rejection::InvalidRequest("a row with that id exists".into()),
                    )),
                )
            }
            Some(code) if *code == SqlState::from_code(GUARD_TOMBSTONE_SQLSTATE) => {
                self.rejection(&client, lock, id, epoch).await
            }
            _ => floor_or_failure(error),
        }
    }

    /// Deletes row `id` iff `lock` guards it and the token's epoch is above its `last_fence`
    /// (fenced, on the guarded path); the row's tombstone keeps the deleting epoch as its fence.
    pub async fn delete(
        &self,
        fence: &PostgresFence,
        lock: &LockName,
        id: &(dyn ToSql + Sync),
        token: &str,
    ) -> Result<Outcome, FenceError> {
        let outcome = fence
            .with_floor(lock, || self.delete_once(fence, lock, id, token))
            .await;
        fence.recorded(token, outcome).await
    }

    async fn delete_once(
        &self,
        fence: &PostgresFence,
        lock: &LockName,
        id: &(dyn ToSql + Sync),
        token: &str,
    ) -> Result<Outcome, FenceError> {
        let epoch = match self.verified_epoch(fence, lock, token) {
            Ok(epoch) => epoch,
            Err(rejection) => return Ok(Outcome::Rejected(rejection)),
        };
        let mut client = fence.client().await?;
        self.check_registered(&client).await?;
        let txn = client.transaction().await.map_err(storage)?;
        txn.batch_execute("SET LOCAL palisade.fenced_path = 'on'")
            .await
            .map_err(storage)?;
        let lock_name = lock.as_str();
        let params: [&(dyn ToSql + Sync); 4] = [id, &epoch, &token, &lock_name];
        let raised = match txn
            .query_opt(&self.raise_fence, &params[..self.params(3)])
            .await
        {
            Ok(raised) => raised,
            Err(error) => {
                txn.rollback().await.map_err(storage)?;
                return floor_or_failure(error);
            }
        };
        if raised.is_none() {
            txn.rollback().await.map_err(storage)?;
            return self.rejection(&client, lock, id, epoch).await;
        }
        txn.execute(&self.delete, &[id]).await.map_err(storage)?;
        txn.commit().await.map_err(storage)?;
        Ok(Outcome::Accepted {
            epoch: Epoch(from_bigint(epoch)?),
            seq: None,
        })
    }
}

/// A write a floor refused (the restore floor, the lock's floor) is a stale-epoch rejection;
/// any other error a failure.
fn floor_or_failure(error: tokio_postgres::Error) -> Result<Outcome, FenceError> {
    match crate::below_restore_floor(&error) {
        Some(rejection) => Ok(Outcome::Rejected(rejection)),
        None => Err(storage(error)),
    }
}
