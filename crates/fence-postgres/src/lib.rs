//! [`PostgresFence`]: resource-side enforcement in PostgreSQL.
//!
//! - For **your own table** with a `last_fence bigint NOT NULL` column, [`GuardedTable`] runs the
//!   seed statement `UPDATE t SET payload = $3, last_fence = $2 WHERE id = $1 AND last_fence <
//!   $2 RETURNING id` (strict mode, fence per row) and installs the **bypass guard** trigger
//!   that makes any other UPDATE that does not raise `last_fence` fail in the database (P5).
//! - For Palisade's own tables (`palisade_kv`, `palisade_fences`, `palisade_ledger`) it
//!   implements [`FencedResource`] in all three modes, and passes the shared conformance suite.
//!
//! Schema changes are versioned migrations ([`migrations`]) applied on [`PostgresFence::connect`].
//! Every accepted write is committed (PostgreSQL's own durability: the WAL is flushed before
//! the commit returns) before `Accepted` is returned. Every connection of the adapter's pool
//! starts with `synchronous_commit` raised to `on` when the server, the database or the role
//! turned it `off` ([`durable_pool`]); the audit reports a database where it is off.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod migrations;
mod sql;
mod table;

use std::str::FromStr as _;
use std::sync::Arc;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use palisade_core::{Epoch, LockName};
use palisade_fence::{
    precheck_activation, precheck_write, value_digest, Activation, FenceError, FenceMode,
    FencedResource, FloorSource, Outcome, Rejection, Stored, Verifier, Write,
};
use tokio_postgres::NoTls;

pub use table::{is_guard_violation, quote_identifier, GuardedTable, RowLock};

/// Connections in the pool by default. Each is a PostgreSQL backend; the server's default
/// `max_connections` is 100.
pub const DEFAULT_POOL_SIZE: usize = 16;
/// Locks whose mode an adapter remembers having checked (a full set is emptied and refilled:
/// one extra statement per lock in use).
pub const CHECKED_LOCK_CACHE: usize = 65_536;

/// The PostgreSQL fence adapter.
#[derive(Clone)]
pub struct PostgresFence {
    pool: Pool,
    mode: FenceMode,
    verifier: Arc<Verifier>,
    /// Locks already found fenced in this adapter's mode (`palisade_lock_modes`).
    checked_locks: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
    /// Where a lock's floor is learned when the database does not know it in its current
    /// incarnation (migration 8); `None`: such a write fails, saying so.
    floors: Option<Arc<dyn FloorSource>>,
    /// One floor learner per lock, and a bounded herd of requests to the coordinator after a
    /// restart (when every lock's next write needs its floor at once).
    flights: Arc<palisade_fence::FloorFlights>,
}

/// Wraps a driver or pool error. PostgreSQL's own message and SQLSTATE are kept in the text
/// (the driver's `Display` says only "db error").
/// Run on every new connection of Palisade's pools: `synchronous_commit = off` (set in
/// `postgresql.conf`, `ALTER DATABASE` or `ALTER ROLE`) would acknowledge a commit whose WAL a
/// crash can lose — a fence that goes back, an obsolete owner accepted again (P5, P8). It is
/// raised to `on` for the session; every other value (`local`, `remote_write`, `on`,
/// `remote_apply`) flushes the local WAL before COMMIT returns and is kept as the operator
/// chose it. A statement of yours on [`PostgresFence::pool`] must not turn it off again.
pub const DURABLE_SESSION: &str = "SELECT set_config('synchronous_commit', 'on', false) \
    WHERE current_setting('synchronous_commit') = 'off'";

/// Run on every new connection of Palisade's pools after [`DURABLE_SESSION`]: the session's
/// search_path becomes Palisade's schema (where `palisade_schema_migrations` resolves, else
/// the current schema), then `pg_catalog`, then the role's own path. A DBA's
/// `ALTER ROLE … SET search_path = shadowops, pg_catalog, …`, with a shadow `<` on bigint in
/// `shadowops`, turned the adapter's own `… WHERE epoch < EXCLUDED.epoch` around: a stale write
/// to `palisade_kv` was accepted (its tables have no raise trigger). Now PostgreSQL's operators
/// come before any schema but Palisade's own, which must be its owner's alone (the audit's
/// `guard_schema_writable`); tables resolve as before. The statement itself names every
/// operator and function it uses with its schema.
pub const PINNED_SESSION: &str = "SELECT pg_catalog.set_config('search_path', \
    pg_catalog.quote_ident(palisade.schema) OPERATOR(pg_catalog.||) ', pg_catalog, ' \
    OPERATOR(pg_catalog.||) pg_catalog.current_setting('search_path'), false) \
    FROM (SELECT coalesce( \
            (SELECT n.nspname FROM pg_catalog.pg_class c \
             JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace \
             WHERE c.oid OPERATOR(pg_catalog.=) \
                   pg_catalog.to_regclass('palisade_schema_migrations')::pg_catalog.oid), \
            pg_catalog.current_schema()) AS schema) AS palisade \
    WHERE palisade.schema IS NOT NULL";

/// A connection pool of `size` to `url` whose every connection runs [`DURABLE_SESSION`] and
/// [`PINNED_SESSION`] before its first use (the fence adapter's and the effects ledger's).
pub fn durable_pool(url: &str, size: usize) -> Result<Pool, String> {
    let config = tokio_postgres::Config::from_str(url).map_err(|e| e.to_string())?;
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size)
        .post_create(deadpool_postgres::Hook::async_fn(|client, _| {
            Box::pin(async move {
                client
                    .simple_query(DURABLE_SESSION)
                    .await
                    .map_err(deadpool_postgres::HookError::Backend)?;
                client
                    .simple_query(PINNED_SESSION)
                    .await
                    .map(drop)
                    .map_err(deadpool_postgres::HookError::Backend)
            })
        }))
        .build()
        .map_err(|e| e.to_string())
}

fn storage(error: impl std::error::Error + Send + Sync + 'static) -> FenceError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&error);
    while let Some(current) = source {
        if let Some(db) = current
            .downcast_ref::<tokio_postgres::Error>()
            .and_then(|e| e.as_db_error())
        {
            if db.code().code() == FLOOR_UNKNOWN_SQLSTATE {
                return FenceError::Storage(Box::new(FloorUnknown {
                    lock: db.detail().unwrap_or_default().to_owned(),
                }));
            }
            let text = format!("{} (SQLSTATE {})", db.message(), db.code().code());
            return FenceError::Storage(text.into());
        }
        source = current.source();
    }
    FenceError::Storage(Box::new(error))
}

/// How long a refused write's record may take ([`PostgresFence::record_refusal`]) before its
/// connection is dropped: recording is best effort and never delays the writers behind it.
pub const REFUSAL_RECORD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// SQLSTATE of a row written at or below the restore floor (migration 7; DETAIL: the floor).
pub const RESTORE_FLOOR_SQLSTATE: &str = "P5007";
/// SQLSTATE of a fenced row whose lock's floor the database has not learned in its current
/// incarnation (migration 8; DETAIL: the lock).
pub const FLOOR_UNKNOWN_SQLSTATE: &str = "P5008";
/// SQLSTATE of a fenced row below its lock's floor (migration 8; DETAIL: the floor).
pub const LOCK_FLOOR_SQLSTATE: &str = "P5009";

/// The database does not know a lock's floor in its current incarnation (it restarted, or was
/// restored, since the floor was learned): nothing was written. [`PostgresFence::with_floors`]
/// learns it and writes again.
#[derive(Debug)]
pub struct FloorUnknown {
    /// The lock, as the database named it.
    pub lock: String,
}

impl std::fmt::Display for FloorUnknown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the database does not know the floor of lock {} since it started or was restored, \
             and this adapter has no coordinator to ask (PostgresFence::with_floors); nothing \
             was written",
            self.lock
        )
    }
}

impl std::error::Error for FloorUnknown {}

/// The rejection of a write a floor refused — the restore floor (P6) or the lock's floor
/// learned from the coordinator (migration 8) — when that is what `error` is.
pub(crate) fn below_restore_floor(error: &tokio_postgres::Error) -> Option<Rejection> {
    let db = error.as_db_error()?;
    let code = db.code().code();
    if code != RESTORE_FLOOR_SQLSTATE && code != LOCK_FLOOR_SQLSTATE {
        return None;
    }
    let floor = db.detail()?.parse().ok()?;
    Some(Rejection::StaleEpoch {
        fence: Epoch(floor),
        fence_seq: None,
    })
}

/// PostgreSQL stores signed 64-bit integers; a larger epoch or sequence number is refused
/// rather than wrapped.
fn to_bigint(value: u64, what: &str) -> Result<i64, Rejection> {
    i64::try_from(value).map_err(|_| {
        Rejection::InvalidRequest(format!("{what} {value} is above PostgreSQL bigint"))
    })
}

fn from_bigint(value: i64) -> Result<u64, FenceError> {
    u64::try_from(value).map_err(|_| FenceError::Integrity(format!("negative epoch {value}")))
}

impl PostgresFence {
    /// Connects to `url` (e.g. `postgres://user@127.0.0.1:5432/db`), applies the migrations,
    /// and returns an adapter in `mode` that trusts `verifier`.
    pub async fn connect(
        url: &str,
        pool_size: usize,
        mode: FenceMode,
        verifier: Arc<Verifier>,
    ) -> Result<Self, FenceError> {
        let pool = durable_pool(url, pool_size).map_err(|e| FenceError::Storage(e.into()))?;
        let mut client = pool.get().await.map_err(storage)?;
        let applied = migrations::apply(&mut client).await.map_err(storage)?;
        if !applied.is_empty() {
            tracing::info!(?applied, "applied Palisade schema migrations");
        }
        Ok(Self {
            pool,
            mode,
            verifier,
            checked_locks: Arc::default(),
            floors: None,
            flights: Arc::default(),
        })
    }

    /// Learns each lock's floor from `floors` (the coordinator's, through
    /// `palisade_resource::KeyRing`) whenever the database does not know it in its
    /// current incarnation: at the first fenced write of each lock after the database started,
    /// was restored or failed over (P6, P8). Without it such a write fails with
    /// [`FloorUnknown`].
    pub fn with_floors(mut self, floors: Arc<dyn FloorSource>) -> Self {
        self.floors = Some(floors);
        self
    }

    /// Runs `attempt`; when the database did not know the floor of the lock it wrote, learns
    /// it from the floor source, records it (`palisade_learn_floor`) and runs `attempt` once
    /// more. An attempt refused by a floor wrote nothing, so running it again is safe.
    pub(crate) async fn with_floor<T, F, Fut>(
        &self,
        lock: &LockName,
        mut attempt: F,
    ) -> Result<T, FenceError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, FenceError>>,
    {
        let first = attempt().await;
        let (Err(FenceError::Storage(error)), Some(floors)) = (&first, &self.floors) else {
            return first;
        };
        let Some(unknown) = error.downcast_ref::<FloorUnknown>() else {
            return first;
        };
        let unknown = LockName::new(unknown.lock.clone()).unwrap_or_else(|_| lock.clone());
        // One learner per lock: the writers that waited for it find the floor known.
        let _turn = self.flights.lock_turn(&unknown).await;
        let second = attempt().await;
        if !is_floor_unknown(&second) {
            return second;
        }
        let _permit = self.flights.permit().await;
        let floor = floors.floor_statement(&unknown).await.map_err(|why| {
            FenceError::Storage(
                format!("cannot learn the floor of lock {unknown}: {why}; nothing was written")
                    .into(),
            )
        })?;
        self.learn_floor(&unknown, floor).await?;
        attempt().await
    }

    /// Records `floor` as `lock`'s in the database's current incarnation (it never goes down),
    /// with the coordinator's statement of it when the source gave one (migration 10).
    async fn learn_floor(
        &self,
        lock: &LockName,
        (floor, statement): (Epoch, Option<String>),
    ) -> Result<(), FenceError> {
        let floor_sql = i64::try_from(floor.0).map_err(|_| {
            FenceError::Integrity(format!("floor {floor} is above PostgreSQL bigint"))
        })?;
        let client = self.client().await?;
        let row = match &statement {
            Some(statement) => {
                client
                    .query_one(
                        "SELECT palisade_learn_floor($1, $2, $3)",
                        &[&lock.as_str(), &floor_sql, statement],
                    )
                    .await
            }
            None => {
                client
                    .query_one(
                        "SELECT palisade_learn_floor($1, $2)",
                        &[&lock.as_str(), &floor_sql],
                    )
                    .await
            }
        };
        let now: i64 = row.map_err(storage)?.get(0);
        tracing::info!(%lock, floor = now, "learned the lock's floor in this database incarnation");
        Ok(())
    }

    /// Refuses a lock that another adapter fences in another mode (its fence would mean
    /// something else); the first adapter to fence a lock records its mode.
    async fn check_lock_mode(
        &self,
        client: &tokio_postgres::Client,
        lock: &str,
    ) -> Result<(), FenceError> {
        if self
            .checked_locks
            .lock()
            .expect("not poisoned")
            .contains(lock)
        {
            return Ok(());
        }
        let claimed = client
            .query_opt(sql::CLAIM_LOCK_MODE, &[&lock, &self.mode.as_str()])
            .await
            .map_err(storage)?;
        let row = match claimed {
            Some(row) => row,
            // Another adapter claimed the lock concurrently: the claim waited for it and did
            // nothing, but its snapshot predates that commit. A new statement sees it.
            None => client
                .query_one(sql::READ_LOCK_MODE, &[&lock])
                .await
                .map_err(storage)?,
        };
        let recorded: String = row.get(0);
        if recorded != self.mode.as_str() {
            return Err(FenceError::Integrity(format!(
                "lock {lock} is fenced in {recorded} mode in this database; this adapter is in \
                 {} mode and refuses it",
                self.mode
            )));
        }
        let mut checked = self.checked_locks.lock().expect("not poisoned");
        if checked.len() >= CHECKED_LOCK_CACHE {
            checked.clear();
        }
        checked.insert(lock.to_owned());
        Ok(())
    }

    /// The connection pool (for callers that run their own statements next to the fence).
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The trusted keys.
    pub fn verifier(&self) -> &Arc<Verifier> {
        &self.verifier
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, FenceError> {
        self.pool.get().await.map_err(storage)
    }

    /// `outcome`, after recording it where the audit reads it when it is a stale write's
    /// refusal ([`Self::record_refusal`]).
    pub(crate) async fn recorded(
        &self,
        token: &str,
        outcome: Result<Outcome, FenceError>,
    ) -> Result<Outcome, FenceError> {
        if let Ok(Outcome::Rejected(Rejection::StaleEpoch { .. })) = &outcome {
            self.record_refusal(token).await;
        }
        outcome
    }

    /// Records a stale write's refusal where the audit reads it (migration 12), in a statement
    /// of its own: the refused transaction rolled back with anything it wrote. The database
    /// records it only if the token is below what it holds for the lock. Best effort: the
    /// refusal stands whether or not it is recorded.
    async fn record_refusal(&self, token: &str) {
        let Ok(client) = self.client().await else {
            return;
        };
        let outcome = {
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&token];
            let record = client.query_one("SELECT palisade_record_refusal($1)", &params);
            tokio::time::timeout(REFUSAL_RECORD_TIMEOUT, record).await
        };
        match outcome {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => tracing::debug!(%error, "the refusal was not recorded"),
            Err(_) => {
                // The statement may still run on the server: this connection goes, rather
                // than back to the pool with a statement ahead of the next writer's.
                drop(deadpool_postgres::Object::take(client));
                tracing::debug!("the refusal was not recorded in time");
            }
        }
    }

    /// The shared prechecks (bounds, sequence number, token — P4), then the epoch and seq as
    /// PostgreSQL integers.
    fn precheck(&self, write: &Write<'_>) -> Result<(i64, Option<i64>), Rejection> {
        let epoch = precheck_write(&self.verifier, self.mode, write)?;
        let seq = write
            .seq
            .map(|seq| to_bigint(seq, "sequence number"))
            .transpose()?;
        Ok((to_bigint(epoch.0, "epoch")?, seq))
    }

    async fn rejected_write(
        &self,
        client: &tokio_postgres::Client,
        write: &Write<'_>,
        epoch: i64,
        seq: Option<i64>,
    ) -> Result<Outcome, FenceError> {
        let lock = write.lock.as_str();
        match self.mode {
            FenceMode::Activated => {
                let fence = read_fence(client, lock).await?;
                let rejection = if fence > epoch {
                    Rejection::StaleEpoch {
                        fence: Epoch(from_bigint(fence)?),
                        fence_seq: None,
                    }
                } else {
                    Rejection::NotActivated {
                        fence: Epoch(from_bigint(fence)?),
                    }
                };
                Ok(Outcome::Rejected(rejection))
            }
            FenceMode::Strict => strict_refusal(client, write, epoch).await,
            FenceMode::Sequenced => self.sequenced_refusal(client, write, epoch, seq).await,
        }
    }

    /// Why sequenced mode refused `write` at (`epoch`, `seq`): a replay of the recorded write
    /// (or a different value under its pair), or the stored pair that beat it.
    async fn sequenced_refusal(
        &self,
        client: &tokio_postgres::Client,
        write: &Write<'_>,
        epoch: i64,
        seq: Option<i64>,
    ) -> Result<Outcome, FenceError> {
        let lock = write.lock.as_str();
        if let Some(seq) = seq {
            let digest = value_digest(write.value).to_vec();
            let ledger = client
                .query_opt(sql::READ_LEDGER, &[&lock, &write.key, &epoch, &seq])
                .await
                .map_err(storage)?;
            if let Some(row) = ledger {
                let (epoch, seq) = (Epoch(from_bigint(epoch)?), from_bigint(seq)?);
                let recorded: Vec<u8> = row.get(0);
                return Ok(if recorded == digest {
                    Outcome::Replayed { epoch, seq }
                } else {
                    Outcome::Rejected(Rejection::ReplayMismatch { epoch, seq })
                });
            }
        }
        let row = client
            .query_opt(sql::READ_PAIR, &[&lock, &write.key])
            .await
            .map_err(storage)?
            .ok_or_else(|| FenceError::Integrity("a rejected write found no stored row".into()))?;
        let (fence, fence_seq): (i64, Option<i64>) = (row.get(0), row.get(1));
        // Fences only rise, so the row that beat this write carries an epoch (pair) at
        // least as high; anything else means the table was changed behind the fence.
        if (fence, fence_seq.unwrap_or(0)) < (epoch, seq.unwrap_or(0)) {
            return Err(FenceError::Integrity(format!(
                "write at {epoch} rejected but the stored epoch is {fence}"
            )));
        }
        Ok(Outcome::Rejected(Rejection::StaleEpoch {
            fence: Epoch(from_bigint(fence)?),
            fence_seq: fence_seq.map(from_bigint).transpose()?,
        }))
    }
}

async fn read_fence(client: &tokio_postgres::Client, lock: &str) -> Result<i64, FenceError> {
    let row = client
        .query_opt(sql::READ_FENCE, &[&lock])
        .await
        .map_err(storage)?;
    Ok(row.map_or(0, |r| r.get(0)))
}

impl FencedResource for PostgresFence {
    fn mode(&self) -> FenceMode {
        self.mode
    }

    async fn write<'a>(&'a self, write: Write<'a>) -> Result<Outcome, FenceError> {
        let token = write.token;
        let outcome = self.with_floor(write.lock, || self.write_once(write)).await;
        self.recorded(token, outcome).await
    }

    async fn activate<'a>(
        &'a self,
        lock: &'a LockName,
        token: &'a str,
    ) -> Result<Activation, FenceError> {
        self.with_floor(lock, || self.activate_once(lock, token))
            .await
    }

    async fn read<'a>(
        &'a self,
        lock: &'a LockName,
        key: &'a str,
    ) -> Result<Option<Stored>, FenceError> {
        if !palisade_fence::key_is_storable(key) {
            return Ok(None); // never written: every write of it is refused
        }
        let client = self.client().await?;
        let row = client
            .query_opt(sql::READ_VALUE, &[&lock.as_str(), &key])
            .await
            .map_err(storage)?;
        row.map(|row| {
            let (value, epoch, seq): (Vec<u8>, i64, Option<i64>) =
                (row.get(0), row.get(1), row.get(2));
            Ok(Stored {
                value,
                epoch: Epoch(from_bigint(epoch)?),
                seq: seq.map(from_bigint).transpose()?,
            })
        })
        .transpose()
    }

    async fn fence<'a>(&'a self, lock: &'a LockName) -> Result<Epoch, FenceError> {
        let client = self.client().await?;
        let fence = match self.mode {
            FenceMode::Activated => read_fence(&client, lock.as_str()).await?,
            FenceMode::Strict => client
                .query_opt(sql::READ_LOCK_EPOCH, &[&lock.as_str()])
                .await
                .map_err(storage)?
                .map_or(0, |row| row.get(0)),
            FenceMode::Sequenced => {
                let row = client
                    .query_one(sql::READ_MAX_EPOCH, &[&lock.as_str()])
                    .await
                    .map_err(storage)?;
                row.get::<_, Option<i64>>(0).unwrap_or(0)
            }
        };
        Ok(Epoch(from_bigint(fence)?))
    }
}

/// One attempt of each write, which [`PostgresFence::with_floor`] repeats once a lock's floor
/// was learned.
impl PostgresFence {
    async fn write_once(&self, write: Write<'_>) -> Result<Outcome, FenceError> {
        let (epoch, seq) = match self.precheck(&write) {
            Ok(checked) => checked,
            Err(rejection) => return Ok(Outcome::Rejected(rejection)),
        };
        let client = self.client().await?;
        let lock = write.lock.as_str();
        self.check_lock_mode(&client, lock).await?;
        let rows = match self.mode {
            FenceMode::Strict => {
                let statement = client
                    .prepare_cached(sql::STRICT_WRITE)
                    .await
                    .map_err(storage)?;
                client
                    .query(&statement, &[&lock, &write.key, &write.value, &epoch])
                    .await
            }
            FenceMode::Activated => {
                let statement = client
                    .prepare_cached(sql::ACTIVATED_WRITE)
                    .await
                    .map_err(storage)?;
                client
                    .query(&statement, &[&lock, &write.key, &write.value, &epoch])
                    .await
            }
            FenceMode::Sequenced => {
                let statement = client
                    .prepare_cached(sql::SEQUENCED_WRITE)
                    .await
                    .map_err(storage)?;
                let digest = value_digest(write.value).to_vec();
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] =
                    [&lock, &write.key, &write.value, &epoch, &seq, &digest];
                client.query(&statement, &params).await
            }
        };
        let rows = match rows {
            Ok(rows) => rows,
            Err(error) => {
                return match below_restore_floor(&error) {
                    Some(rejection) => Ok(Outcome::Rejected(rejection)),
                    None => Err(storage(error)),
                }
            }
        };
        if rows.is_empty() {
            return self.rejected_write(&client, &write, epoch, seq).await;
        }
        Ok(Outcome::Accepted {
            epoch: Epoch(from_bigint(epoch)?),
            seq: seq.map(from_bigint).transpose()?,
        })
    }

    async fn activate_once(&self, lock: &LockName, token: &str) -> Result<Activation, FenceError> {
        let epoch = precheck_activation(&self.verifier, self.mode, lock, token)
            .and_then(|epoch| to_bigint(epoch.0, "epoch"));
        let epoch = match epoch {
            Ok(epoch) => epoch,
            Err(rejection) => return Ok(Activation::Rejected(rejection)),
        };
        let client = self.client().await?;
        self.check_lock_mode(&client, lock.as_str()).await?;
        let statement = client
            .prepare_cached(sql::ACTIVATE)
            .await
            .map_err(storage)?;
        let advanced = match client
            .query_opt(&statement, &[&lock.as_str(), &epoch])
            .await
        {
            Ok(advanced) => advanced,
            Err(error) => {
                return match below_restore_floor(&error) {
                    Some(rejection) => Ok(Activation::Rejected(rejection)),
                    None => Err(storage(error)),
                }
            }
        };
        if advanced.is_some() {
            return Ok(Activation::Activated {
                fence: Epoch(from_bigint(epoch)?),
            });
        }
        let fence = read_fence(&client, lock.as_str()).await?;
        let fence_epoch = Epoch(from_bigint(fence)?);
        if fence == epoch {
            Ok(Activation::Activated { fence: fence_epoch })
        } else {
            Ok(Activation::Rejected(Rejection::StaleEpoch {
                fence: fence_epoch,
                fence_seq: None,
            }))
        }
    }
}

/// The greatest epoch this database has accepted or fenced at, for any lock: what a restored
/// coordinator must issue above (P6). Reads Palisade's tables (`palisade_fences`,
/// `palisade_kv`, `palisade_lock_epochs`, `palisade_row_fences`, `palisade_restore_floor`) and
/// the `last_fence` column of
/// every table carrying Palisade's guard trigger. Fences only rise, so reading them one at a
/// time gives a floor as good as one snapshot; a table dropped meanwhile is skipped. A database
/// without Palisade's tables has no fence: 0.
pub async fn highest_fence(url: &str) -> Result<u64, FenceError> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.map_err(storage)?;
    let connection = tokio::spawn(connection);
    let result = async {
        let mut tables: Vec<(String, &str)> = Vec::new();
        for (table, column) in [
            ("palisade_fences", "fence"),
            ("palisade_kv", "epoch"),
            ("palisade_lock_epochs", "epoch"),
            ("palisade_row_fences", "fence"),
            ("palisade_restore_floor", "floor"),
        ] {
            let exists: bool = client
                .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
                .await?
                .get(0);
            if exists {
                tables.push((table.to_owned(), column));
            }
        }
        let guarded = client
            .query(
                "SELECT DISTINCT tgrelid::regclass::text FROM pg_trigger \
                 WHERE tgname = 'palisade_guard_update'",
                &[],
            )
            .await?;
        tables.extend(
            guarded
                .iter()
                .map(|row| (row.get::<_, String>(0), "last_fence")),
        );
        let mut highest: i64 = 0;
        for (table, column) in tables {
            let sql = format!("SELECT coalesce(max({column}), 0)::bigint FROM {table}");
            match client.query_one(&sql, &[]).await {
                Ok(row) => highest = highest.max(row.get(0)),
                Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => {}
                Err(e) => return Err(e),
            }
        }
        Ok::<_, tokio_postgres::Error>(highest)
    }
    .await;
    drop(client);
    let _ = connection.await;
    let highest = result.map_err(storage)?;
    Ok(u64::try_from(highest).unwrap_or(0))
}

/// Most proofs [`fence_proofs`] reads of each kind (the highest first).
pub const MAX_FENCE_PROOFS: i64 = 1_000;

/// What in a database proves an epoch was issued by the coordinator: tokens and floor
/// statements it signed, as the database recorded them. The database cannot check them; the
/// coordinator can ([`highest_fence`] alone is any number a writer put in a fence column).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FenceProofs {
    /// The greatest token presented for each lock (`palisade_presented_tokens`, migration 11)
    /// and the restore floor's token.
    pub tokens: Vec<String>,
    /// Each lock's floor statement, `(lock, statement)` (`palisade_lock_floors`, migration 10).
    pub floors: Vec<(String, String)>,
}

/// The signed proofs recorded in the database at `url` (none before migrations 10 and 11).
pub async fn fence_proofs(url: &str) -> Result<FenceProofs, FenceError> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.map_err(storage)?;
    let connection = tokio::spawn(connection);
    let result = async {
        let mut proofs = FenceProofs::default();
        let sources = [
            "SELECT token, NULL::text FROM palisade_presented_tokens ORDER BY epoch DESC LIMIT $1",
            "SELECT token, NULL::text FROM palisade_restore_floor LIMIT $1",
            "SELECT statement, lock FROM palisade_lock_floors WHERE statement IS NOT NULL \
             ORDER BY floor DESC LIMIT $1",
        ];
        for sql in sources {
            let rows = match client.query(sql, &[&MAX_FENCE_PROOFS]).await {
                Ok(rows) => rows,
                Err(e)
                    if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE)
                        || e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_COLUMN) =>
                {
                    continue
                }
                Err(e) => return Err(e),
            };
            for row in rows {
                match row.get::<_, Option<String>>(1) {
                    None => proofs.tokens.push(row.get(0)),
                    Some(lock) => proofs.floors.push((lock, row.get(0))),
                }
            }
        }
        Ok::<_, tokio_postgres::Error>(proofs)
    }
    .await;
    drop(client);
    let _ = connection.await;
    result.map_err(storage)
}

/// What [`apply_restore_floor`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreApplied {
    /// The database's highest fence before ([`highest_fence`]).
    pub highest_before: u64,
    /// The floor now: no row is written at or below it.
    pub floor: u64,
}

/// Applies a restore floor to the database at `url`, restored from a backup (`palisade
/// resource restore --postgres`, P6): records `floor` — an epoch the coordinator issued after
/// the restore, with its `token` — and installs the floor trigger on Palisade's tables and on
/// every guarded table, so that every row written from now on at or below the floor fails, on
/// the adapter's path or in plain SQL. Refuses a floor not above the database's highest fence
/// (the coordinator would be behind the database: restore it first with `--floor-from`). The
/// floor never goes down; applying it twice is harmless. Run it as the tables' owner, before
/// writers come back (a statement already running when the floor commits is not stopped).
pub async fn apply_restore_floor(
    url: &str,
    floor: u64,
    token: &str,
) -> Result<RestoreApplied, FenceError> {
    let highest_before = highest_fence(url).await?;
    if floor <= highest_before {
        return Err(FenceError::Integrity(format!(
            "the coordinator's floor {floor} is not above epoch {highest_before}, which this \
             database holds: the coordinator is behind the database (was it restored without \
             --floor-from this database?). Restore the coordinator above it first"
        )));
    }
    let floor_sql = i64::try_from(floor)
        .map_err(|_| FenceError::Integrity(format!("floor {floor} is above PostgreSQL bigint")))?;
    let (mut client, connection) = tokio_postgres::connect(url, NoTls).await.map_err(storage)?;
    let connection = tokio::spawn(connection);
    let result = async {
        migrations::apply(&mut client).await?;
        let txn = client.transaction().await?;
        let row = txn
            .query_one(
                "INSERT INTO palisade_restore_floor AS f (floor, token) VALUES ($1, $2) \
                 ON CONFLICT (singleton) DO UPDATE \
                     SET floor = greatest(f.floor, EXCLUDED.floor), token = EXCLUDED.token, \
                         applied_at = now() \
                 RETURNING floor",
                &[&floor_sql, &token],
            )
            .await?;
        txn.execute("SELECT palisade_install_floor()", &[]).await?;
        txn.commit().await?;
        Ok::<i64, tokio_postgres::Error>(row.get(0))
    }
    .await;
    drop(client);
    let _ = connection.await;
    let applied = result.map_err(storage)?;
    Ok(RestoreApplied {
        highest_before,
        floor: from_bigint(applied)?,
    })
}

/// Why strict mode refused `write` at `epoch`: the lock's or the key's fence, re-read (both
/// only rise, so what refused it is still there).
async fn strict_refusal(
    client: &tokio_postgres::Client,
    write: &Write<'_>,
    epoch: i64,
) -> Result<Outcome, FenceError> {
    let lock = write.lock.as_str();
    let row = client
        .query_one(sql::READ_STRICT_FENCES, &[&lock, &write.key])
        .await
        .map_err(storage)?;
    let (lock_epoch, key_epoch): (Option<i64>, Option<i64>) = (row.get(0), row.get(1));
    let rule = palisade_fence::rules::strict(
        key_epoch.map(from_bigint).transpose()?.map(Epoch),
        Epoch(from_bigint(lock_epoch.unwrap_or(0))?),
        Epoch(from_bigint(epoch)?),
    );
    // Both fences only rise, so what refused this write is still there; a rule
    // that would accept now means the tables were changed behind the fence.
    match rule {
        Err(rejection) => Ok(Outcome::Rejected(rejection)),
        Ok(()) => Err(FenceError::Integrity(format!(
            "write at {epoch} rejected but the lock's epoch is {lock_epoch:?} and \
             the key's {key_epoch:?}"
        ))),
    }
}

/// True when `outcome` is a write the database refused for a floor it does not know.
fn is_floor_unknown<T>(outcome: &Result<T, FenceError>) -> bool {
    matches!(outcome, Err(FenceError::Storage(error)) if error.downcast_ref::<FloorUnknown>().is_some())
}
