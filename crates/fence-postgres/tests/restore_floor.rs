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
use palisade_fence::{
    FenceError, FenceMode, FencedResource, Outcome, Rejection, StaticFloors, Verifier, Write,
};
use palisade_fence_postgres::{
    apply_restore_floor, highest_fence, GuardedTable, PostgresFence, RowLock,
};

/// The coordinator, as the database sees it: its signing key and each lock's floor.
struct Keys {
    signer: TokenSigner,
    verifier: Arc<Verifier>,
    floors: Arc<StaticFloors>,
}

impl Keys {
    fn new() -> Self {
        let signer = TokenSigner::from_secret_bytes(&[5; 32]);
        let verifier = Arc::new(Verifier::new(TokenVerifier::new([signer.verifying_key()])));
        Self {
            signer,
            verifier,
            floors: Arc::default(),
        }
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
        .unwrap()
        .with_floors(keys.floors.clone());
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
        disconnect(name).await;
    }
    admin(&format!(
        "DROP DATABASE IF EXISTS {live}; DROP DATABASE IF EXISTS {backup}; \
         DROP DATABASE IF EXISTS {restored}"
    ))
    .await;
}

/// Terminates every session of database `name`, so it can be dropped or renamed.
async fn disconnect(name: &str) {
    admin(&format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = '{name}' AND pid <> pg_backend_pid()"
    ))
    .await;
}

/// The SQLSTATE of a plain-SQL update of row 1 at `epoch`, the seed statement's way.
async fn plain_update(db: &Database, epoch: i64) -> Result<u64, String> {
    let client = db.fence.pool().get().await.unwrap();
    client
        .execute(
            "UPDATE accounts SET balance = 'plain', last_fence = $1 \
             WHERE id = 1 AND last_fence < $1",
            &[&epoch],
        )
        .await
        .map_err(|e| e.code().unwrap().code().to_owned())
}

/// P6/P8: a database put back from a snapshot of its volume — here a copy of the database
/// renamed into its place, as a restore would leave it — has forgotten the new owner's fence.
/// With no operator step, the first fenced write of each lock in the new incarnation learns
/// the lock's floor from the coordinator, and the superseded owner is refused: through the
/// adapter (an application started after the restore, and one that was running through it)
/// and in plain SQL. With the floors switched off, the same write is accepted: the hole.
#[tokio::test]
async fn p6_a_database_put_back_learns_each_locks_floor_with_no_operator_step() {
    let keys = Keys::new();
    let lock = LockName::new("accounts/put-back").unwrap();
    let suffix = std::process::id();
    let (live, snapshot) = (
        format!("put_back_{suffix}"),
        format!("put_back_snap_{suffix}"),
    );
    let running = snapshot_taken_before_the_new_owner_writes(&keys, &lock, &live, &snapshot).await;
    // The snapshot is put back in the live database's place.
    disconnect(&live).await;
    admin(&format!(
        "DROP DATABASE {live}; ALTER DATABASE {snapshot} RENAME TO {live}"
    ))
    .await;
    assert_eq!(highest_fence(&database_url(&live)).await.unwrap(), 3);

    let started = Database::open(&live, &keys, &lock).await;
    the_new_incarnation_learns_the_floor(&started, &keys, &lock).await;
    an_application_that_ran_through_refuses_the_superseded_owner(&running, &keys, &lock).await;
    let blind = an_adapter_with_no_floor_source_writes_nothing(&live, &keys).await;
    let owner = with_floors_off_the_superseded_owner_is_accepted(&live, &started).await;
    // The current owner goes on.
    assert_eq!(started.write(&keys, &lock, 7, "80").await, (true, true));

    drop((running, started, blind, owner));
    disconnect(&live).await;
    admin(&format!(
        "DROP DATABASE IF EXISTS {live}; DROP DATABASE IF EXISTS {snapshot}"
    ))
    .await;
}

/// Database `live` with a guarded table, owner 3's write, then a copy `snapshot`, then owner
/// 7 (who supersedes owner 5) writes. Returns the application that was running all along.
async fn snapshot_taken_before_the_new_owner_writes(
    keys: &Keys,
    lock: &LockName,
    live: &str,
    snapshot: &str,
) -> Database {
    admin(&format!(
        "DROP DATABASE IF EXISTS {live}; DROP DATABASE IF EXISTS {snapshot}; \
         CREATE DATABASE {live}"
    ))
    .await;
    let running = Database::open(live, keys, lock).await;
    let client = running.fence.pool().get().await.unwrap();
    client
        .batch_execute(
            "CREATE TABLE accounts (id bigint PRIMARY KEY, balance text NOT NULL,
                                    last_fence bigint NOT NULL DEFAULT 0);
             INSERT INTO accounts (id, balance) VALUES (1, '0')",
        )
        .await
        .unwrap();
    drop(client);
    running
        .table
        .install_guard(&running.fence, false)
        .await
        .unwrap();
    assert_eq!(running.write(keys, lock, 3, "100").await, (true, true));
    // The snapshot; then owner 5 is superseded by owner 7, who writes.
    disconnect(live).await;
    copy_database(live, snapshot).await;
    keys.floors.set(lock, Epoch(7));
    let after_snapshot = Database::open(live, keys, lock).await;
    assert_eq!(
        after_snapshot.write(keys, lock, 7, "90").await,
        (true, true)
    );
    assert_eq!(
        after_snapshot.write(keys, lock, 5, "110").await,
        (false, false)
    );
    drop(after_snapshot);

    running
}

/// In the put-back database's new incarnation, plain SQL meets a lock whose floor is not
/// learned (P5008); the adapter learns it and refuses the superseded owner on both tables;
/// then plain SQL meets the floor itself (P5009).
async fn the_new_incarnation_learns_the_floor(started: &Database, keys: &Keys, lock: &LockName) {
    // A plain-SQL writer meets a lock whose floor this incarnation has not learned.
    assert_eq!(plain_update(started, 5).await, Err("P5008".into()));
    // The adapter learns it and refuses the superseded owner, on both tables.
    let asked = keys.floors.asked();
    assert_eq!(started.write(keys, lock, 5, "110").await, (false, false));
    assert!(keys.floors.asked() > asked, "the floor was asked");
    let refused = started
        .table
        .update(&started.fence, lock, &1_i64, &keys.token(lock, 6), &"110")
        .await
        .unwrap();
    let floor = Rejection::StaleEpoch {
        fence: Epoch(7),
        fence_seq: None,
    };
    assert_eq!(refused, Outcome::Rejected(floor));
    // Plain SQL now meets the floor itself.
    assert_eq!(plain_update(started, 5).await, Err("P5009".into()));
}

/// The application that ran through the put-back: its old connections are gone, and its
/// superseded owner is refused.
async fn an_application_that_ran_through_refuses_the_superseded_owner(
    running: &Database,
    keys: &Keys,
    lock: &LockName,
) {
    let mut outcome = None;
    for _ in 0..3 {
        let token = keys.token(lock, 6);
        match running
            .table
            .update(&running.fence, lock, &1_i64, &token, &"110")
            .await
        {
            Ok(o) => {
                outcome = Some(o);
                break;
            }
            Err(_) => continue, // a connection the put-back closed
        }
    }
    assert!(
        matches!(
            outcome,
            Some(Outcome::Rejected(Rejection::StaleEpoch { .. }))
        ),
        "{outcome:?}"
    );
}

/// An adapter with no coordinator to ask writes nothing and says why.
async fn an_adapter_with_no_floor_source_writes_nothing(live: &str, keys: &Keys) -> PostgresFence {
    let blind = PostgresFence::connect(
        &database_url(live),
        1,
        FenceMode::Strict,
        keys.verifier.clone(),
    )
    .await
    .unwrap();
    let other = LockName::new("accounts/other").unwrap();
    let token = keys.token(&other, 9);
    let write = Write {
        lock: &other,
        key: "k",
        token: &token,
        seq: None,
        value: b"v",
    };
    let error = blind.write(write).await.unwrap_err();
    assert!(matches!(error, FenceError::Storage(_)), "{error:?}");
    assert!(
        error.to_string().contains("no coordinator to ask"),
        "{error}"
    );
    assert_eq!(blind.read(&other, "k").await.unwrap(), None);

    blind
}

/// The hole this closes: with the floors off, the superseded owner is accepted (then they are
/// switched back on). Returns the owner's connection.
async fn with_floors_off_the_superseded_owner_is_accepted(
    live: &str,
    started: &Database,
) -> tokio_postgres::Client {
    let owner = tokio_postgres::connect(&database_url(live), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(owner.1);
    owner
        .0
        .batch_execute("UPDATE palisade_floor_settings SET source = 'off'")
        .await
        .unwrap();
    assert_eq!(plain_update(started, 5).await, Ok(1));
    owner
        .0
        .batch_execute("UPDATE palisade_floor_settings SET source = 'coordinator'")
        .await
        .unwrap();
    owner.0
}
