//! Versioned, idempotent schema migrations, applied by [`crate::PostgresFence::connect`].
//!
//! They run in one transaction under a transaction-level advisory lock, so several processes
//! starting at once apply each migration exactly once. The SQL is in
//! `sql/` beside this crate, for users who prefer to run it themselves.

use tokio_postgres::Client;

/// `(version, name, sql)`, in order.
pub const MIGRATIONS: &[(i32, &str, &str)] = &[
    (
        1,
        "fence tables",
        include_str!("../sql/001_fence_tables.sql"),
    ),
    (2, "bypass guard", include_str!("../sql/002_guard.sql")),
    (
        3,
        "strict lock epochs",
        include_str!("../sql/003_strict_lock_epochs.sql"),
    ),
    (
        4,
        "row tombstones",
        include_str!("../sql/004_row_tombstones.sql"),
    ),
    (5, "lock modes", include_str!("../sql/005_lock_modes.sql")),
    (
        6,
        "guard roles and locks",
        include_str!("../sql/006_guard_roles_and_locks.sql"),
    ),
    (
        7,
        "restore floor",
        include_str!("../sql/007_restore_floor.sql"),
    ),
    (8, "lock floors", include_str!("../sql/008_lock_floors.sql")),
    (
        9,
        "search_path immunity",
        include_str!("../sql/009_search_path_immunity.sql"),
    ),
    (
        10,
        "floor statements",
        include_str!("../sql/010_floor_statements.sql"),
    ),
    (
        11,
        "token binding",
        include_str!("../sql/011_token_binding.sql"),
    ),
    (12, "refusals", include_str!("../sql/012_refusals.sql")),
];

/// Advisory lock key serializing migrations ("palisade" in ASCII, as a bigint).
const MIGRATION_LOCK: i64 = 0x7061_6c69_7361_6465;

/// Applies every migration not yet recorded in `palisade_schema_migrations`, all in one
/// transaction that first takes the advisory lock (even the bookkeeping table's creation races
/// otherwise: concurrent `CREATE TABLE IF NOT EXISTS` can fail in PostgreSQL).
///
/// When every migration is already recorded it runs no DDL and takes no lock: a role with no
/// CREATE privilege (the fence role of `docs/enforcement.md`, which needs only SELECT on the
/// bookkeeping table) can connect after the owner applied them.
pub async fn apply(client: &mut Client) -> Result<Vec<i32>, tokio_postgres::Error> {
    if all_applied(client).await? {
        return Ok(Vec::new());
    }
    let txn = client.transaction().await?;
    txn.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    txn.batch_execute(
        "CREATE TABLE IF NOT EXISTS palisade_schema_migrations (
             version    integer     PRIMARY KEY,
             name       text        NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
    )
    .await?;
    let mut applied = Vec::new();
    for &(version, name, sql) in MIGRATIONS {
        let done = txn
            .query_opt(
                "SELECT 1 FROM palisade_schema_migrations WHERE version = $1",
                &[&version],
            )
            .await?
            .is_some();
        if !done {
            txn.batch_execute(sql).await?;
            txn.execute(
                "INSERT INTO palisade_schema_migrations (version, name) VALUES ($1, $2)",
                &[&version, &name],
            )
            .await?;
            applied.push(version);
        }
    }
    txn.commit().await?;
    Ok(applied)
}

/// True when `palisade_schema_migrations` exists and records every version in [`MIGRATIONS`].
async fn all_applied(client: &Client) -> Result<bool, tokio_postgres::Error> {
    let exists: bool = client
        .query_one(
            "SELECT to_regclass('palisade_schema_migrations') IS NOT NULL",
            &[],
        )
        .await?
        .get(0);
    if !exists {
        return Ok(false);
    }
    let versions: Vec<i32> = MIGRATIONS.iter().map(|(version, _, _)| *version).collect();
    let recorded: i64 = client
        .query_one(
            "SELECT count(*) FROM palisade_schema_migrations WHERE version = ANY($1)",
            &[&versions],
        )
        .await?
        .get(0);
    Ok(recorded == versions.len() as i64)
}
