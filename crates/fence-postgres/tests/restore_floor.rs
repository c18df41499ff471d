//! A PostgreSQL database restored from a backup (P6), against a real PostgreSQL: the backup is
//! a copy of the database taken with `CREATE DATABASE … TEMPLATE` (a snapshot of its files),
//! the restore is that copy brought back after the original moved on. The restored copy has
//! forgotten the new owner's fences and accepts the old owner again; once
//! `apply_restore_floor` records the coordinator's floor, every token issued before it is
//! refused — on Palisade's tables, on a guarded table, and in plain SQL — and the next owner
//! writes.

mod common;

use std::sync::Arc;

use palisade_core::{Epoch, HolderId, LockName, TokenSigner, TokenVerifier};
use palisade_fence::{FenceMode, FencedResource, Outcome, Rejection, Verifier, Write};
use palisade_fence_postgres::{
    apply_restore_floor, highest_fence, GuardedTable, PostgresFence, RowLock,
};

struct Keys {
    signer: TokenSigner,
    verifier: Arc<Verifier>,
}

impl Keys {
    fn new() -> Self {
        let signer = TokenSigner::from_secret_bytes(&[5; 32]);
        let verifier = Arc::new(Verifier::new(TokenVerifier::new([signer.verifying_key()])));
        Self { signer, verifier }
    }

    fn token(&self, lock: &LockName, epoch: u64) -> String {
        let holder = HolderId::new("test").unwrap();
        let anyone = palisade_core::Principal::anonymous();
        self.signer.sign(lock, Epoch(epoch), &holder, &anyone, 0)
    }
}

/// The URL of database `name` on the test server.
fn database_url(name: &str) -> String {
    let url = common::postgres_url();
    let (server, _) = url.rsplit_once('/').unwrap();
    format!("{server}/{name}")
}

/// Runs the statements of `sql` one by one (DROP DATABASE refuses a transaction block) on the
/// server's maintenance database.
async fn admin(sql: &str) {
    let (client, connection) =
        tokio_postgres::connect(&common::postgres_url(), tokio_postgres::NoTls)
            .await
            .unwrap();
    tokio::spawn(connection);
    for statement in sql.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        client.batch_execute(statement).await.unwrap();
    }
}

/// `CREATE DATABASE copy TEMPLATE source`, once nobody is connected to the source.
async fn copy_database(source: &str, copy: &str) {
    for attempt in 0..50 {
        admin(&format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = '{source}' AND pid <> pg_backend_pid()"
        ))
        .await;
        let (client, connection) =
            tokio_postgres::connect(&common::postgres_url(), tokio_postgres::NoTls)
                .await
                .unwrap();
        tokio::spawn(connection);
        match client
            .batch_execute(&format!("CREATE DATABASE {copy} TEMPLATE {source}"))
            .await
        {
            Ok(()) => return,
            Err(error) if attempt < 49 => {
                drop(error);
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            Err(error) => panic!("copy {source}: {error}"),
        }
    }
}

struct Database {
    fence: PostgresFence,
    table: GuardedTable,
}

impl Database {
    async fn open(name: &str, keys: &Keys, lock: &LockName) -> Self {
        let fence = PostgresFence::connect(
            &database_url(name),
            2,
            FenceMode::Strict,
            keys.verifier.clone(),
        )
        .await
        .unwrap();
        let table =
            GuardedTable::new("accounts", "id", "balance", RowLock::Table(lock.clone())).unwrap();
        Self { fence, table }
    }

    /// Writes `balance` at `epoch` to Palisade's kv and to the guarded row; whether each was
    /// accepted.
    async fn write(&self, keys: &Keys, lock: &LockName, epoch: u64, balance: &str) -> (bool, bool) {
        let token = keys.token(lock, epoch);
        let kv = self
            .fence
            .write(Write {
                lock,
                key: "balance",
                token: &token,
                seq: None,
                value: balance.as_bytes(),
            })
            .await
            .unwrap();
        let row = self
            .table
            .update(&self.fence, lock, &1_i64, &token, &balance)
            .await
            .unwrap();
        let accepted = |o: &Outcome| matches!(o, Outcome::Accepted { .. });
        (accepted(&kv), accepted(&row))
    }
}

#[tokio::test]
async fn p6_a_database_restored_from_a_copy_refuses_every_token_issued_before_the_floor() {
    let keys = Keys::new();
    let lock = LockName::new("accounts/restore").unwrap();
    let suffix = std::process::id();
    let (live, backup, restored) = (
        format!("restore_live_{suffix}"),
        format!("restore_backup_{suffix}"),
        format!("restore_restored_{suffix}"),
    );
    admin(&format!(
        "DROP DATABASE IF EXISTS {live}; DROP DATABASE IF EXISTS {backup}; \
         DROP DATABASE IF EXISTS {restored}; CREATE DATABASE {live}"
    ))
    .await;
    {
        let db = Database::open(&live, &keys, &lock).await;
        let client = db.fence.pool().get().await.unwrap();
        client
            .batch_execute(
                "CREATE TABLE accounts (id bigint PRIMARY KEY, balance text NOT NULL,
                                        last_fence bigint NOT NULL DEFAULT 0);
                 INSERT INTO accounts (id, balance) VALUES (1, '0')",
            )
            .await
            .unwrap();
        db.table.install_guard(&db.fence, false).await.unwrap();
        assert_eq!(db.write(&keys, &lock, 5, "100").await, (true, true));
    }
    copy_database(&live, &backup).await; // the operator's backup
    {
        let db = Database::open(&live, &keys, &lock).await;
        assert_eq!(db.write(&keys, &lock, 10, "90").await, (true, true));
        assert_eq!(db.write(&keys, &lock, 7, "110").await, (false, false));
    }
    // The live database is lost; the backup comes back. It forgot epoch 10.
    copy_database(&backup, &restored).await;
    let url = database_url(&restored);
    assert_eq!(highest_fence(&url).await.unwrap(), 5);
    {
        let db = Database::open(&restored, &keys, &lock).await;
        // The hole a floor closes: the old owner (7, fenced out by 10 before the loss).
        assert_eq!(db.write(&keys, &lock, 7, "110").await, (true, true));
    }

    // A floor not above what the database holds means a coordinator behind it: refused.
    let error = apply_restore_floor(&url, 7, "token").await.unwrap_err();
    assert!(error.to_string().contains("behind the database"), "{error}");
    // The coordinator's floor: an epoch it issued after the restore (12).
    let applied = apply_restore_floor(&url, 12, "token").await.unwrap();
    assert_eq!((applied.highest_before, applied.floor), (7, 12));
    let db = Database::open(&restored, &keys, &lock).await;
    for old in [8, 10, 12] {
        assert_eq!(
            db.write(&keys, &lock, old, "110").await,
            (false, false),
            "epoch {old}"
        );
    }
    let token = keys.token(&lock, 11);
    let refused = db
        .table
        .update(&db.fence, &lock, &1_i64, &token, &"110")
        .await
        .unwrap();
    assert_eq!(
        refused,
        Outcome::Rejected(Rejection::StaleEpoch {
            fence: Epoch(12),
            fence_seq: None
        })
    );
    // Plain SQL below the floor fails in the database too (SQLSTATE P5007).
    let client = db.fence.pool().get().await.unwrap();
    let error = client
        .execute(
            "UPDATE accounts SET balance = 'x', last_fence = 11 WHERE id = 1",
            &[],
        )
        .await
        .unwrap_err();
    assert_eq!(error.code().unwrap().code(), "P5007");
    drop(client);
    // The next owner writes; the floor never goes down.
    assert_eq!(db.write(&keys, &lock, 13, "80").await, (true, true));
    assert_eq!(highest_fence(&url).await.unwrap(), 13);
    let again = apply_restore_floor(&url, 14, "token").await.unwrap();
    assert_eq!(again.floor, 14);
    drop(db);
    for name in [&live, &backup, &restored] {
        admin(&format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = '{name}' AND pid <> pg_backend_pid()"
        ))
        .await;
    }
    admin(&format!(
        "DROP DATABASE IF EXISTS {live}; DROP DATABASE IF EXISTS {backup}; \
         DROP DATABASE IF EXISTS {restored}"
    ))
    .await;
}
