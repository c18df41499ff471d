//! A user's own table fenced with the seed statement, and the bypass guard (P5), against a
//! real PostgreSQL.

mod common;

use std::sync::Arc;

use palisade_core::{Epoch, HolderId, LockName, TokenSigner, TokenVerifier};
use palisade_fence::{FenceMode, Outcome, Rejection, Verifier};
use palisade_fence_postgres::{is_guard_violation, GuardedTable, PostgresFence, RowLock};
use tokio_postgres::error::SqlState;

struct Fixture {
    fence: PostgresFence,
    table: GuardedTable,
    name: String,
    signer: TokenSigner,
    lock: LockName,
}

impl Fixture {
    async fn new(case: &str, guard_rows: bool) -> Self {
        let signer = TokenSigner::from_secret_bytes(&[3; 32]);
        let verifier = Arc::new(Verifier::new(TokenVerifier::new([signer.verifying_key()])));
        let fence = PostgresFence::connect(&common::postgres_url(), 4, FenceMode::Strict, verifier)
            .await
            .unwrap()
            .with_floors(std::sync::Arc::new(palisade_fence::StaticFloors::new()));
        let name = format!("guarded_{case}_{}", std::process::id());
        let client = fence.pool().get().await.unwrap();
        client
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS {name};
                 CREATE TABLE {name} (id bigint PRIMARY KEY, payload text NOT NULL,
                                      last_fence bigint NOT NULL DEFAULT 0);
                 INSERT INTO {name} (id, payload) VALUES (1, 'initial');"
            ))
            .await
            .unwrap();
        let lock = LockName::new(format!("table/{name}")).unwrap();
        let table =
            GuardedTable::new(&name, "id", "payload", RowLock::Table(lock.clone())).unwrap();
        table.install_guard(&fence, guard_rows).await.unwrap();
        Self {
            fence,
            table,
            name,
            signer,
            lock,
        }
    }

    fn token(&self, epoch: u64) -> String {
        let holder = HolderId::new("test").unwrap();
        self.signer.sign(
            &self.lock,
            Epoch(epoch),
            &holder,
            &palisade_core::Principal::anonymous(),
            0,
        )
    }

    async fn update(&self, id: i64, epoch: u64, payload: &str) -> Outcome {
        let token = self.token(epoch);
        self.table
            .update(&self.fence, &self.lock, &id, &token, &payload)
            .await
            .unwrap()
    }

    async fn row(&self) -> (String, i64) {
        let client = self.fence.pool().get().await.unwrap();
        let row = client
            .query_one(
                &format!("SELECT payload, last_fence FROM {} WHERE id = 1", self.name),
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    }

    async fn raw(&self, sql: &str) -> Result<u64, tokio_postgres::Error> {
        let client = self.fence.pool().get().await.unwrap();
        client.execute(&sql.replace("{t}", &self.name), &[]).await
    }
}

#[tokio::test]
async fn p2_the_seed_statement_accepts_only_higher_epochs_and_reports_the_fence() {
    let f = Fixture::new("seed", false).await;
    assert_eq!(
        f.update(1, 7, "seven").await,
        Outcome::Accepted {
            epoch: Epoch(7),
            seq: None
        }
    );
    let stale = Outcome::Rejected(Rejection::StaleEpoch {
        fence: Epoch(7),
        fence_seq: None,
    });
    assert_eq!(f.update(1, 7, "again").await, stale);
    assert_eq!(f.update(1, 3, "older").await, stale);
    assert_eq!(f.row().await, ("seven".to_string(), 7));
    let missing = f.update(99, 8, "nobody").await;
    assert!(
        matches!(missing, Outcome::Rejected(Rejection::InvalidRequest(_))),
        "{missing:?}"
    );
}

#[tokio::test]
async fn p4_a_token_for_another_lock_cannot_update_the_table() {
    let f = Fixture::new("wronglock", false).await;
    let other = LockName::new("table/other").unwrap();
    let holder = HolderId::new("test").unwrap();
    let token = f.signer.sign(
        &other,
        Epoch(50),
        &holder,
        &palisade_core::Principal::anonymous(),
        0,
    );
    let outcome = f
        .table
        .update(&f.fence, &f.lock, &1i64, &token, &"evil")
        .await
        .unwrap();
    assert!(
        matches!(outcome, Outcome::Rejected(Rejection::InvalidToken(_))),
        "{outcome:?}"
    );
    assert_eq!(f.row().await, ("initial".to_string(), 0));
}

#[tokio::test]
async fn p5_an_update_that_skips_the_fence_fails_in_the_database() {
    let f = Fixture::new("bypass", false).await;
    assert!(matches!(
        f.update(1, 5, "fenced").await,
        Outcome::Accepted { .. }
    ));
    for bypass in [
        "UPDATE {t} SET payload = 'admin script' WHERE id = 1",
        "UPDATE {t} SET payload = 'lowered', last_fence = 2 WHERE id = 1",
        "UPDATE {t} SET payload = 'same', last_fence = last_fence WHERE id = 1",
        "UPDATE {t} SET payload = 'everyone'",
    ] {
        let error = f.raw(bypass).await.expect_err(bypass);
        assert!(is_guard_violation(&error), "{bypass}: {error}");
    }
    assert_eq!(f.row().await, ("fenced".to_string(), 5));
    // Inserts and deletes stay allowed unless the table opted in.
    assert_eq!(
        f.raw("INSERT INTO {t} (id, payload) VALUES (2, 'new')")
            .await
            .unwrap(),
        1
    );
    assert_eq!(f.raw("DELETE FROM {t} WHERE id = 2").await.unwrap(), 1);
}

#[tokio::test]
async fn p5_opted_in_tables_refuse_inserts_and_deletes_outside_the_fenced_path() {
    let f = Fixture::new("rows", true).await;
    for bypass in [
        "INSERT INTO {t} (id, payload) VALUES (3, 'sneaky')",
        "DELETE FROM {t} WHERE id = 1",
    ] {
        let error = f.raw(bypass).await.expect_err(bypass);
        assert!(is_guard_violation(&error), "{bypass}: {error}");
    }
    let inserted = f
        .table
        .insert(&f.fence, &f.lock, &3i64, &f.token(2), &"via the fence")
        .await
        .unwrap();
    assert!(matches!(inserted, Outcome::Accepted { .. }), "{inserted:?}");
    let stale = f
        .table
        .delete(&f.fence, &f.lock, &3i64, &f.token(2))
        .await
        .unwrap();
    assert!(
        matches!(stale, Outcome::Rejected(Rejection::StaleEpoch { .. })),
        "{stale:?}"
    );
    let deleted = f
        .table
        .delete(&f.fence, &f.lock, &3i64, &f.token(4))
        .await
        .unwrap();
    assert!(matches!(deleted, Outcome::Accepted { .. }), "{deleted:?}");
}

#[tokio::test]
async fn p2_a_deleted_row_keeps_its_fence_and_a_stale_owner_cannot_recreate_it() {
    // B (epoch 7) deletes row 1; stale A (epoch 5) re-creates it and writes. Before, the delete
    // took the row's fence with it: A's insert wrote last_fence 0 and its update at 5 > 0 was
    // accepted below a fence of 7.
    let f = Fixture::new("tombstone", false).await;
    assert!(matches!(
        f.update(1, 7, "by B").await,
        Outcome::Accepted { .. }
    ));
    let deleted = f
        .table
        .delete(&f.fence, &f.lock, &1i64, &f.token(8))
        .await
        .unwrap();
    assert!(matches!(deleted, Outcome::Accepted { .. }), "{deleted:?}");
    let stale_insert = f
        .table
        .insert(&f.fence, &f.lock, &1i64, &f.token(5), &"by stale A")
        .await
        .unwrap();
    assert_eq!(stale_insert, stale(8));
    assert_eq!(f.update(1, 5, "by stale A").await, stale(8));
    let equal = f
        .table
        .insert(&f.fence, &f.lock, &1i64, &f.token(8), &"same epoch")
        .await
        .unwrap();
    assert_eq!(equal, stale(8), "strict: one result per epoch and row");
    let recreated = f
        .table
        .insert(&f.fence, &f.lock, &1i64, &f.token(9), &"by C")
        .await
        .unwrap();
    assert!(
        matches!(recreated, Outcome::Accepted { .. }),
        "{recreated:?}"
    );
    assert_eq!(f.row().await, ("by C".to_owned(), 9));
    let exists = f
        .table
        .insert(&f.fence, &f.lock, &1i64, &f.token(10), &"again")
        .await
        .unwrap();
    assert!(
        matches!(exists, Outcome::Rejected(Rejection::InvalidRequest(_))),
        "{exists:?}"
    );
}

#[tokio::test]
async fn p2_p5_plain_sql_delete_and_insert_cannot_lower_a_fence() {
    // The row guard is off: an admin's DELETE and INSERT are allowed, but the INSERT cannot
    // bring the row back below the fence it had.
    let f = Fixture::new("plain_tombstone", false).await;
    assert!(matches!(
        f.update(1, 7, "by B").await,
        Outcome::Accepted { .. }
    ));
    f.raw("DELETE FROM {t} WHERE id = 1").await.unwrap();
    for insert in [
        "INSERT INTO {t} (id, payload) VALUES (1, 'reset')",
        "INSERT INTO {t} (id, payload, last_fence) VALUES (1, 'reset', 7)",
    ] {
        let error = f.raw(insert).await.expect_err(insert);
        assert!(is_guard_violation(&error), "{insert}: {error}");
    }
    assert_eq!(f.update(1, 5, "by stale A").await, stale(7));
    f.raw("INSERT INTO {t} (id, payload, last_fence) VALUES (1, 'restored', 8)")
        .await
        .unwrap();
    assert_eq!(f.update(1, 8, "equal").await, stale(8));
    assert!(matches!(
        f.update(1, 9, "next").await,
        Outcome::Accepted { .. }
    ));
}

fn stale(fence: u64) -> Outcome {
    Outcome::Rejected(Rejection::StaleEpoch {
        fence: Epoch(fence),
        fence_seq: None,
    })
}

#[tokio::test]
async fn installing_the_guard_needs_a_last_fence_column_and_is_idempotent() {
    let f = Fixture::new("idempotent", false).await;
    f.table.install_guard(&f.fence, false).await.unwrap();
    f.table.install_guard(&f.fence, true).await.unwrap();
    let client = f.fence.pool().get().await.unwrap();
    let bare = format!("bare_{}", std::process::id());
    client
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {bare}; CREATE TABLE {bare} (id bigint PRIMARY KEY, payload text)"
        ))
        .await
        .unwrap();
    let table = GuardedTable::new(&bare, "id", "payload", RowLock::Table(f.lock.clone())).unwrap();
    let error = table.install_guard(&f.fence, false).await.unwrap_err();
    assert!(error.to_string().contains("last_fence"), "{error}");
    assert!(GuardedTable::new(
        "t; DROP TABLE x",
        "id",
        "payload",
        RowLock::Table(f.lock.clone())
    )
    .is_err());
    assert!(GuardedTable::new(&bare, "id", "payload", RowLock::Column("lock; x".into())).is_err());
}

#[tokio::test]
async fn p2_p3_racing_writers_on_one_row_of_a_user_table() {
    let f = Arc::new(Fixture::new("race", false).await);
    let mut writers = Vec::new();
    for writer in 0..32u64 {
        let f = f.clone();
        writers.push(tokio::spawn(async move {
            let mut accepted = Vec::new();
            for n in 0..8u64 {
                let epoch = 1 + (writer * 7919 + n * 104_729) % 97;
                if let Outcome::Accepted { .. } = f.update(1, epoch, &format!("e{epoch}")).await {
                    accepted.push(epoch);
                }
            }
            accepted
        }));
    }
    let mut accepted = Vec::new();
    for writer in writers {
        accepted.extend(writer.await.unwrap());
    }
    let highest = *accepted.iter().max().unwrap();
    let mut unique = accepted.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(
        unique.len(),
        accepted.len(),
        "an epoch was accepted twice: {accepted:?}"
    );
    assert_eq!(f.row().await, (format!("e{highest}"), highest as i64));
}

#[tokio::test]
async fn migrations_are_recorded_once() {
    let f = Fixture::new("migrations", false).await;
    let client = f.fence.pool().get().await.unwrap();
    let rows = client
        .query(
            "SELECT version FROM palisade_schema_migrations ORDER BY version",
            &[],
        )
        .await
        .unwrap();
    let versions: Vec<i32> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(versions, (1..=12).collect::<Vec<i32>>());
}

#[tokio::test]
async fn an_unreachable_database_is_an_error_never_a_rejection() {
    let verifier = Arc::new(Verifier::default());
    let url = "postgres://postgres@127.0.0.1:1/postgres";
    let result = PostgresFence::connect(url, 1, FenceMode::Strict, verifier).await;
    assert!(matches!(
        result,
        Err(palisade_fence::FenceError::Storage(_))
    ));
}

#[tokio::test]
async fn p8_a_connection_killed_mid_write_is_an_error_with_no_partial_write() {
    let f = Fixture::new("killed", false).await;
    assert!(matches!(
        f.update(1, 5, "before").await,
        Outcome::Accepted { .. }
    ));
    // Another transaction holds the row, so the fenced UPDATE blocks inside PostgreSQL...
    let mut blocker = f.fence.pool().get().await.unwrap();
    let txn = blocker.transaction().await.unwrap();
    txn.query(
        &format!("SELECT 1 FROM {} WHERE id = 1 FOR UPDATE", f.name),
        &[],
    )
    .await
    .unwrap();
    let writer = {
        let (fence, table, lock, token) =
            (f.fence.clone(), f.table.clone(), f.lock.clone(), f.token(9));
        tokio::spawn(async move { table.update(&fence, &lock, &1i64, &token, &"during").await })
    };
    // ...until its backend is terminated, as a database restart or a network cut would do.
    let admin = f.fence.pool().get().await.unwrap();
    let mut blocked = None;
    for _ in 0..2_000 {
        let rows = admin
            .query(
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'UPDATE%'",
                &[],
            )
            .await
            .unwrap();
        if let Some(row) = rows.first() {
            blocked = Some(row.get::<_, i32>(0));
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let blocked = blocked.expect("the fenced UPDATE never blocked on the row lock");
    admin
        .execute("SELECT pg_terminate_backend($1)", &[&blocked])
        .await
        .unwrap();
    let result = writer.await.unwrap();
    assert!(
        matches!(result, Err(palisade_fence::FenceError::Storage(_))),
        "{result:?}"
    );
    txn.rollback().await.unwrap();
    drop(blocker);
    // A pooled connection whose backend died fails once (a storage error, never a rejection)
    // and is then discarded by the pool; drain such connections before checking the row.
    let mut healthy_in_a_row = 0;
    for _ in 0..50 {
        let client = f.fence.pool().get().await.unwrap();
        if client.simple_query("SELECT 1").await.is_ok() {
            healthy_in_a_row += 1;
            if healthy_in_a_row == 4 {
                break;
            }
        } else {
            healthy_in_a_row = 0;
        }
    }
    // Nothing of the killed write is visible, and the next write goes through.
    assert_eq!(f.row().await, ("before".to_string(), 5));
    assert!(matches!(
        f.update(1, 9, "after").await,
        Outcome::Accepted { .. }
    ));
    assert_eq!(f.row().await, ("after".to_string(), 9));
}

/// Connects to the test database as `role` (the test server trusts loopback connections).
async fn connect_as(role: &str) -> tokio_postgres::Client {
    let url =
        common::postgres_url().replacen("postgres://postgres@", &format!("postgres://{role}@"), 1);
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

fn is_denied(error: &tokio_postgres::Error) -> bool {
    error.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE)
}

#[tokio::test]
async fn p5_the_application_role_the_docs_describe_cannot_bypass_the_guard() {
    // docs/enforcement.md: the application's role may read a guarded table, nothing more; the
    // table and Palisade's tables belong to the owner role the adapter uses. Before migration
    // 6 (and with the application writing its own table), TRUNCATE forgot every fence, any
    // session could set the fenced-path marker, and `last_fence = i64::MAX` locked every real
    // owner out for ever.
    let f = Fixture::new("approle", true).await;
    assert!(matches!(
        f.update(1, 5, "fenced").await,
        Outcome::Accepted { .. }
    ));
    let role = format!("app_{}", std::process::id());
    f.raw(&format!("DROP ROLE IF EXISTS {role}")).await.ok();
    f.raw(&format!("CREATE ROLE {role} LOGIN")).await.unwrap();
    f.raw(&format!("GRANT SELECT ON {{t}} TO {role}"))
        .await
        .unwrap();
    assert_eq!(
        f.table.guard_findings(&f.fence, &role).await.unwrap(),
        Vec::<String>::new(),
        "the documented application role must leave nothing to bypass"
    );
    let app = connect_as(&role).await;
    let t = &f.name;
    let reads = app
        .query_one(&format!("SELECT payload FROM {t} WHERE id = 1"), &[])
        .await
        .unwrap();
    assert_eq!(reads.get::<_, String>(0), "fenced");
    for bypass in [
        format!("UPDATE {t} SET payload = 'admin script' WHERE id = 1"),
        format!("UPDATE {t} SET last_fence = 9223372036854775807"),
        format!("INSERT INTO {t} (id, payload, last_fence) VALUES (9, 'x', 100)"),
        format!("DELETE FROM {t} WHERE id = 1"),
        format!("TRUNCATE {t}"),
        format!("ALTER TABLE {t} DISABLE TRIGGER ALL"),
        format!("DROP TRIGGER palisade_guard_update ON {t}"),
        "SET session_replication_role = replica".to_owned(),
        "DELETE FROM palisade_row_fences".to_owned(),
        "UPDATE palisade_row_fences SET fence = 0".to_owned(),
        "DELETE FROM palisade_guarded_tables".to_owned(),
        format!("SELECT palisade_install_guard('{t}', 'id', false, 'other', NULL)"),
    ] {
        let error = app.batch_execute(&bypass).await.expect_err(&bypass);
        assert!(
            is_denied(&error) || is_guard_violation(&error),
            "{bypass}: {error:?}"
        );
    }
    // The marker is only a marker: setting it grants nothing.
    let marked = app
        .batch_execute(&format!(
            "BEGIN; SET LOCAL palisade.fenced_path = 'on';
             INSERT INTO {t} (id, payload, last_fence) VALUES (9, 'x', 100); COMMIT;"
        ))
        .await
        .expect_err("marker");
    assert!(is_denied(&marked), "{marked:?}");
    app.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(f.row().await, ("fenced".to_string(), 5));
    assert!(matches!(
        f.update(1, 6, "next owner").await,
        Outcome::Accepted { .. }
    ));

    // The check names what would let a role through.
    f.raw(&format!("GRANT UPDATE ON {{t}} TO {role}"))
        .await
        .unwrap();
    let findings = f.table.guard_findings(&f.fence, &role).await.unwrap();
    assert!(
        findings.iter().any(|x| x.contains("UPDATE")),
        "{findings:?}"
    );
    let superuser = f.table.guard_findings(&f.fence, "postgres").await.unwrap();
    assert!(
        superuser.iter().any(|x| x.contains("superuser")),
        "{superuser:?}"
    );
    drop(app);
    f.raw(&format!("REVOKE ALL ON {{t}} FROM {role}"))
        .await
        .unwrap();
    f.raw(&format!("DROP ROLE {role}")).await.unwrap();
}

#[tokio::test]
async fn p5_the_guard_holds_against_truncate_and_replica_mode_even_for_the_owner() {
    // Before migration 6: TRUNCATE fired no row trigger, and session_replication_role =
    // replica switched every trigger off.
    let f = Fixture::new("owner_bypass", false).await;
    assert!(matches!(
        f.update(1, 7, "fenced").await,
        Outcome::Accepted { .. }
    ));
    let error = f.raw("TRUNCATE {t}").await.expect_err("truncate");
    assert!(is_guard_violation(&error), "{error:?}");
    let client = f.fence.pool().get().await.unwrap();
    let t = &f.name;
    let replica = client
        .batch_execute(&format!(
            "BEGIN; SET LOCAL session_replication_role = replica;
             UPDATE {t} SET payload = 'replica', last_fence = 1 WHERE id = 1; COMMIT;"
        ))
        .await
        .expect_err("replica-mode update");
    assert!(is_guard_violation(&replica), "{replica:?}");
    client.batch_execute("ROLLBACK").await.unwrap();
    let replica_reinsert = client
        .batch_execute(&format!(
            "BEGIN; SET LOCAL session_replication_role = replica;
             DELETE FROM {t} WHERE id = 1;
             INSERT INTO {t} (id, payload, last_fence) VALUES (1, 'back', 2); COMMIT;"
        ))
        .await
        .expect_err("replica-mode re-insert");
    assert!(
        is_guard_violation(&replica_reinsert),
        "{replica_reinsert:?}"
    );
    client.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(f.row().await, ("fenced".to_string(), 7));
}

#[tokio::test]
async fn p2_p4_a_valid_token_of_another_lock_cannot_write_a_row_it_does_not_guard() {
    // Epochs come from one counter for all locks: before, the current owner of lock Y (epoch
    // 50) wrote row 1, which lock X guards, by naming lock Y.
    let f = Fixture::new("bound", false).await;
    let other = LockName::new("table/other").unwrap();
    let holder = HolderId::new("test").unwrap();
    let token = f.signer.sign(
        &other,
        Epoch(50),
        &holder,
        &palisade_core::Principal::anonymous(),
        0,
    );
    for outcome in [
        f.table
            .update(&f.fence, &other, &1i64, &token, &"evil")
            .await
            .unwrap(),
        f.table
            .insert(&f.fence, &other, &2i64, &token, &"evil")
            .await
            .unwrap(),
        f.table
            .delete(&f.fence, &other, &1i64, &token)
            .await
            .unwrap(),
    ] {
        assert!(
            matches!(
                outcome,
                Outcome::Rejected(Rejection::InvalidToken(
                    palisade_core::TokenError::WrongLock { .. }
                ))
            ),
            "{outcome:?}"
        );
    }
    assert_eq!(f.row().await, ("initial".to_string(), 0));

    // Another adapter may not re-bind the table, nor write it under another binding.
    let rebound =
        GuardedTable::new(&f.name, "id", "payload", RowLock::Table(other.clone())).unwrap();
    let error = rebound.install_guard(&f.fence, false).await.unwrap_err();
    assert!(error.to_string().contains("P5006"), "{error}");
    let error = rebound
        .update(&f.fence, &other, &1i64, &token, &"evil")
        .await
        .unwrap_err();
    assert!(
        matches!(error, palisade_fence::FenceError::Integrity(_)),
        "{error}"
    );
    assert_eq!(f.row().await, ("initial".to_string(), 0));
}

#[tokio::test]
async fn p2_p4_rows_that_name_their_lock_accept_only_that_locks_tokens() {
    let f = Fixture::new("lockcol", true).await;
    let name = format!("{}_rows", f.name);
    f.raw(&format!("DROP TABLE IF EXISTS {name}"))
        .await
        .unwrap();
    f.raw(&format!(
        "CREATE TABLE {name} (id bigint PRIMARY KEY, payload text NOT NULL, \
         lock text NOT NULL, last_fence bigint NOT NULL DEFAULT 0)"
    ))
    .await
    .unwrap();
    let table = GuardedTable::new(&name, "id", "payload", RowLock::Column("lock".into())).unwrap();
    table.install_guard(&f.fence, true).await.unwrap();
    let holder = HolderId::new("test").unwrap();
    // Locks of this run only: the database remembers the greatest token each lock presented.
    let lock = |name: &str| LockName::new(format!("rows/{name}-{}", std::process::id())).unwrap();
    let (x, y) = (lock("x"), lock("y"));
    let sign = |lock: &LockName, epoch: u64| {
        f.signer.sign(
            lock,
            Epoch(epoch),
            &holder,
            &palisade_core::Principal::anonymous(),
            0,
        )
    };
    let accepted = |o: &Outcome| matches!(o, Outcome::Accepted { .. });
    let wrong_lock = |o: &Outcome| {
        matches!(
            o,
            Outcome::Rejected(Rejection::InvalidToken(
                palisade_core::TokenError::WrongLock { .. }
            ))
        )
    };
    let created = table
        .insert(&f.fence, &x, &1i64, &sign(&x, 3), &"x")
        .await
        .unwrap();
    assert!(accepted(&created), "{created:?}");
    let created = table
        .insert(&f.fence, &y, &2i64, &sign(&y, 4), &"y")
        .await
        .unwrap();
    assert!(accepted(&created), "{created:?}");
    // Y's owner at 50 names lock Y and writes X's row: refused, the row keeps X's write.
    for outcome in [
        table
            .update(&f.fence, &y, &1i64, &sign(&y, 50), &"evil")
            .await
            .unwrap(),
        table
            .insert(&f.fence, &y, &1i64, &sign(&y, 50), &"evil")
            .await
            .unwrap(),
        table
            .delete(&f.fence, &y, &1i64, &sign(&y, 50))
            .await
            .unwrap(),
    ] {
        assert!(wrong_lock(&outcome), "{outcome:?}");
    }
    let repeat = table
        .update(&f.fence, &x, &1i64, &sign(&x, 3), &"again")
        .await
        .unwrap();
    assert_eq!(repeat, stale(3));
    let next = table
        .update(&f.fence, &x, &1i64, &sign(&x, 5), &"x5")
        .await
        .unwrap();
    assert!(accepted(&next), "{next:?}");
    // Plain SQL cannot move a row to another lock.
    let error = f
        .raw(&format!(
            "UPDATE {name} SET lock = '{y}', last_fence = 99 WHERE id = 1"
        ))
        .await
        .expect_err("re-lock");
    assert!(is_guard_violation(&error), "{error:?}");
    let client = f.fence.pool().get().await.unwrap();
    let row = client
        .query_one(
            &format!("SELECT payload, lock, last_fence FROM {name} WHERE id = 1"),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            row.get::<_, String>(0),
            row.get::<_, String>(1),
            row.get::<_, i64>(2)
        ),
        ("x5".to_owned(), x.to_string(), 5)
    );
}

#[tokio::test]
async fn a_table_whose_guard_was_never_bound_to_a_lock_is_refused() {
    let f = Fixture::new("unbound", false).await;
    f.raw("DELETE FROM palisade_guarded_tables WHERE tbl = '{t}'::regclass")
        .await
        .unwrap();
    let fresh =
        GuardedTable::new(&f.name, "id", "payload", RowLock::Table(f.lock.clone())).unwrap();
    let error = fresh
        .update(&f.fence, &f.lock, &1i64, &f.token(3), &"x")
        .await
        .unwrap_err();
    assert!(error.to_string().contains("install_guard"), "{error}");
}

#[tokio::test]
async fn the_fence_role_the_docs_describe_can_write_through_the_adapter_and_nothing_more() {
    // docs/enforcement.md, "Roles": the fence role's grants, exactly. The adapter connects as
    // it (migrations already applied by the owner), writes, creates and deletes rows; it may
    // not TRUNCATE.
    let f = Fixture::new("fencerole", true).await;
    let role = format!("fence_{}", std::process::id());
    f.raw(&format!("DROP ROLE IF EXISTS {role}")).await.ok();
    f.raw(&format!("CREATE ROLE {role} LOGIN")).await.unwrap();
    for grant in [
        format!("GRANT SELECT, INSERT, UPDATE, DELETE ON {{t}} TO {role}"),
        format!(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON palisade_kv, palisade_fences, \
             palisade_ledger, palisade_lock_epochs, palisade_lock_modes TO {role}"
        ),
        format!(
            "GRANT SELECT ON palisade_schema_migrations, palisade_guarded_tables, \
             palisade_row_fences TO {role}",
        ),
        format!("GRANT EXECUTE ON FUNCTION palisade_learn_floor(text, bigint) TO {role}"),
        format!("GRANT EXECUTE ON FUNCTION palisade_present_token(text) TO {role}"),
    ] {
        f.raw(&grant).await.unwrap();
    }
    // The lock's floor forgotten, as after a restart: the fence role learns it itself.
    let forget = format!("DELETE FROM palisade_lock_floors WHERE lock = '{}'", f.lock);
    f.raw(&forget).await.unwrap();
    let url =
        common::postgres_url().replacen("postgres://postgres@", &format!("postgres://{role}@"), 1);
    let verifier = Arc::new(Verifier::new(TokenVerifier::new([f
        .signer
        .verifying_key()])));
    let fence = PostgresFence::connect(&url, 2, FenceMode::Strict, verifier)
        .await
        .unwrap()
        .with_floors(std::sync::Arc::new(palisade_fence::StaticFloors::new()));
    let accepted = |o: &Outcome| matches!(o, Outcome::Accepted { .. });
    let updated = f
        .table
        .update(&fence, &f.lock, &1i64, &f.token(4), &"by the fence role")
        .await
        .unwrap();
    assert!(accepted(&updated), "{updated:?}");
    let inserted = f
        .table
        .insert(&fence, &f.lock, &2i64, &f.token(5), &"created")
        .await
        .unwrap();
    assert!(accepted(&inserted), "{inserted:?}");
    let deleted = f
        .table
        .delete(&fence, &f.lock, &2i64, &f.token(6))
        .await
        .unwrap();
    assert!(accepted(&deleted), "{deleted:?}");
    let refused = f
        .table
        .insert(&fence, &f.lock, &2i64, &f.token(5), &"stale")
        .await
        .unwrap();
    assert_eq!(refused, stale(6));
    // Palisade's own tables, through the trait (strict mode).
    let write = palisade_fence::Write {
        lock: &f.lock,
        key: "k",
        token: &f.token(7),
        seq: None,
        value: b"v",
    };
    let kv = palisade_fence::FencedResource::write(&fence, write)
        .await
        .unwrap();
    assert!(accepted(&kv), "{kv:?}");
    let client = fence.pool().get().await.unwrap();
    let truncate = client
        .batch_execute(&format!("TRUNCATE {}", f.name))
        .await
        .expect_err("truncate");
    assert!(is_denied(&truncate), "{truncate:?}");
    drop(client);
    drop(fence);
    f.raw(&format!("DROP OWNED BY {role}")).await.unwrap();
    f.raw(&format!("DROP ROLE {role}")).await.unwrap();
}

#[tokio::test]
async fn p6_the_highest_fence_covers_guarded_tables_for_a_restore_floor() {
    let f = Fixture::new("floor", true).await;
    // Above anything the other tests write: the floor must see this guarded row.
    let high: i64 = (1 << 61) + i64::from(std::process::id());
    let client = f.fence.pool().get().await.unwrap();
    // Plain SQL: the lock's floor is learned first (the clients do it on SQLSTATE P5008).
    client
        .execute("SELECT palisade_learn_floor($1, 0)", &[&f.lock.as_str()])
        .await
        .unwrap();
    client
        .execute(
            &format!("UPDATE {} SET last_fence = $1 WHERE id = 1", f.name),
            &[&high],
        )
        .await
        .unwrap();
    let floor = palisade_fence_postgres::highest_fence(&common::postgres_url())
        .await
        .unwrap();
    assert!(
        floor >= high as u64,
        "floor {floor} below the row's fence {high}"
    );
    client
        .batch_execute(&format!("DROP TABLE {}", f.name))
        .await
        .unwrap();
}
