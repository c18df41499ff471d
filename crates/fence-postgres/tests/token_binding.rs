//! SQL-only writers bound to their lock and their token (migration 11), against a real
//! PostgreSQL: the statements the docs give a writer with no Palisade library pass the token,
//! and a table that requires tokens takes the lock and the epoch from it.

mod common;

use std::sync::Arc;

use palisade_core::{Epoch, HolderId, LockName, Principal, TokenSigner, TokenVerifier};
use palisade_fence::{FenceMode, Outcome, Verifier};
use palisade_fence_postgres::{GuardedTable, PostgresFence, RowLock};

/// The statement docs/enforcement.md gives SQL-only writers: $1 the token, $2 the payload,
/// $3 the row.
const TOKEN_UPDATE: &str = "UPDATE {t} SET payload = $2, last_fence = t.epoch \
     FROM palisade_present_token($1) AS t(epoch) \
     WHERE id = $3 AND last_fence OPERATOR(pg_catalog.<) t.epoch";

struct Fixture {
    fence: PostgresFence,
    table: GuardedTable,
    name: String,
    signer: TokenSigner,
}

impl Fixture {
    /// A table whose rows name their lock (`report/7-…` and `report/8-…`), guarded, requiring
    /// tokens when `require` says so, each lock's floor learned at 0.
    async fn new(case: &str, require: bool) -> Self {
        let signer = TokenSigner::from_secret_bytes(&[11; 32]);
        let verifier = Arc::new(Verifier::new(TokenVerifier::new([signer.verifying_key()])));
        let fence = PostgresFence::connect(&common::postgres_url(), 4, FenceMode::Strict, verifier)
            .await
            .unwrap()
            .with_floors(Arc::new(palisade_fence::StaticFloors::new()));
        let name = format!("bound_{case}_{}", std::process::id());
        let table =
            GuardedTable::new(&name, "id", "payload", RowLock::Column("lock".into())).unwrap();
        let fixture = Self {
            fence,
            table,
            name,
            signer,
        };
        let (seven, eight) = (fixture.lock(7), fixture.lock(8));
        fixture
            .sql(&format!(
                "DROP TABLE IF EXISTS {{t}};
                 CREATE TABLE {{t}} (id bigint PRIMARY KEY, lock text NOT NULL,
                                     payload text NOT NULL, last_fence bigint NOT NULL DEFAULT 0);
                 INSERT INTO {{t}} (id, lock, payload) VALUES (7, '{seven}', 'initial'),
                                                              (8, '{eight}', 'initial');
                 SELECT palisade_learn_floor('{seven}', 0);
                 SELECT palisade_learn_floor('{eight}', 0);"
            ))
            .await
            .unwrap();
        fixture
            .table
            .install_guard(&fixture.fence, false)
            .await
            .unwrap();
        fixture
            .table
            .require_token(&fixture.fence, require)
            .await
            .unwrap();
        fixture
    }

    fn lock(&self, n: u32) -> LockName {
        LockName::new(format!("report/{n}-{}", self.name)).unwrap()
    }

    fn token(&self, lock: &LockName, epoch: u64) -> String {
        self.signer.sign(
            lock,
            Epoch(epoch),
            &HolderId::new("worker").unwrap(),
            &Principal::anonymous(),
            0,
        )
    }

    async fn sql(&self, sql: &str) -> Result<(), tokio_postgres::Error> {
        let client = self.fence.pool().get().await.unwrap();
        client.batch_execute(&sql.replace("{t}", &self.name)).await
    }

    /// The documented statement with `token`: the rows it wrote.
    async fn token_update(&self, token: &str, id: i64) -> Result<u64, tokio_postgres::Error> {
        let client = self.fence.pool().get().await.unwrap();
        let sql = TOKEN_UPDATE.replace("{t}", &self.name);
        client.execute(&sql, &[&token, &"written", &id]).await
    }

    /// Drops the table with its binding and tombstones (a fence of 9e18 left in a shared
    /// database would be every later test's witness).
    async fn drop(self) {
        self.sql("BEGIN; SELECT palisade_drop_guard('{t}'); DROP TABLE {t}; COMMIT")
            .await
            .unwrap();
    }

    async fn fence_of(&self, id: i64) -> i64 {
        let client = self.fence.pool().get().await.unwrap();
        let sql = format!("SELECT last_fence FROM {} WHERE id = $1", self.name);
        client.query_one(&sql, &[&id]).await.unwrap().get(0)
    }
}

fn sqlstate(error: &tokio_postgres::Error) -> &str {
    error.code().map(|code| code.code()).unwrap_or("none")
}

#[tokio::test]
async fn p4_a_token_of_another_lock_is_refused_by_the_database() {
    let f = Fixture::new("wronglock", true).await;
    let eight = f.token(&f.lock(8), 50);
    let error = f.token_update(&eight, 7).await.unwrap_err();
    assert_eq!(sqlstate(&error), "P5011", "{error}");
    assert_eq!(f.fence_of(7).await, 0);
    // The same token on its own lock's row is written.
    assert_eq!(f.token_update(&eight, 8).await.unwrap(), 1);
    assert_eq!(f.fence_of(8).await, 50);
    f.drop().await;
}

#[tokio::test]
async fn p5_a_bare_or_mismatched_epoch_is_refused_by_the_database() {
    let f = Fixture::new("bare", true).await;
    let error = f
        .sql("UPDATE {t} SET payload = 'x', last_fence = 9000000000000000000 WHERE id = 7")
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&error), "P5010", "{error}");
    // A valid token presented, and another number written.
    let seven = f.token(&f.lock(7), 40);
    let error = f
        .sql(&format!(
            "UPDATE {{t}} SET payload = 'x', last_fence = 9000000000000000000 \
             FROM palisade_present_token('{seven}') AS t(epoch) WHERE id = 7"
        ))
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&error), "P5012", "{error}");
    // The transaction's memory of tokens set by hand, with no token behind it.
    let client = f.fence.pool().get().await.unwrap();
    let error = client
        .batch_execute(&format!(
            "BEGIN; SET LOCAL palisade.presented_tokens = '{{\"{}\": \"9000000000000000000\"}}';
             UPDATE {} SET payload = 'x', last_fence = 9000000000000000000 WHERE id = 7;",
            f.lock(7),
            f.name
        ))
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&error), "P5010", "{error}");
    client.batch_execute("ROLLBACK").await.unwrap();
    drop(client);
    // A real token's text with the unused bits of its last character set: the same bytes to
    // PostgreSQL's decoder, refused by Rust's.
    let real = f.token(&f.lock(7), 41);
    let last = real.chars().last().unwrap();
    let alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let value = alphabet.find(last).unwrap();
    let bits = match (real.len() - 4) % 4 {
        2 => 0b1111,
        3 => 0b11,
        _ => 0,
    };
    let altered = if bits == 0 {
        None
    } else {
        let other = alphabet.as_bytes()[value | bits] as char;
        Some(format!("{}{other}", &real[..real.len() - 1]))
    };
    let mut not_tokens = vec![
        "".to_owned(),
        "pt1.".into(),
        "pt1.AAAA".into(),
        "pf1.abcd".into(),
    ];
    not_tokens.extend(altered);
    for not_a_token in not_tokens.iter().map(String::as_str) {
        let error = f.token_update(not_a_token, 7).await.unwrap_err();
        assert_eq!(sqlstate(&error), "P5013", "{not_a_token:?}: {error}");
    }
    assert_eq!(f.fence_of(7).await, 0);
    f.drop().await;
}

#[tokio::test]
async fn p2_the_token_statement_writes_once_per_newer_owner_and_records_the_token() {
    let f = Fixture::new("statement", true).await;
    let lock = f.lock(7);
    let (older, newer) = (f.token(&lock, 30), f.token(&lock, 31));
    assert_eq!(f.token_update(&newer, 7).await.unwrap(), 1);
    let stale = f.token_update(&older, 7).await.unwrap_err();
    assert_eq!(sqlstate(&stale), "P5009", "a stale owner: {stale}");
    assert_eq!(
        f.token_update(&newer, 7).await.unwrap(),
        0,
        "one write per epoch"
    );
    assert_eq!(f.fence_of(7).await, 31);
    let client = f.fence.pool().get().await.unwrap();
    let row = client
        .query_one(
            "SELECT epoch, token FROM palisade_presented_tokens WHERE lock = $1",
            &[&lock.as_str()],
        )
        .await
        .unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, String>(1)), (31, newer));
    // The claims SQL reads are the ones the token states.
    let claims = client
        .query_one(
            "SELECT lock, epoch FROM palisade_token_claims($1)",
            &[&f.token(&lock, u64::from(u32::MAX) + 5)],
        )
        .await
        .unwrap();
    assert_eq!(claims.get::<_, String>(0), lock.as_str());
    assert_eq!(claims.get::<_, i64>(1), i64::from(u32::MAX) + 5);
    f.drop().await;
}

#[tokio::test]
async fn p5_before_a_table_requires_tokens_a_bare_epoch_of_another_lock_is_accepted() {
    // What the review found, kept as the reason tables are made to require tokens: the audit
    // reports such a table (`bare_epochs`).
    let f = Fixture::new("notrequired", false).await;
    f.sql("UPDATE {t} SET payload = 'x', last_fence = 9000000000000000000 WHERE id = 7")
        .await
        .unwrap();
    assert_eq!(f.fence_of(7).await, 9_000_000_000_000_000_000);
    f.drop().await;
}

#[tokio::test]
async fn p2_the_rust_adapter_writes_a_table_that_requires_tokens() {
    let f = Fixture::new("adapter", true).await;
    let lock = f.lock(7);
    let token = f.token(&lock, 12);
    let written = f
        .table
        .update(&f.fence, &lock, &7i64, &token, &"adapter")
        .await
        .unwrap();
    assert!(matches!(written, Outcome::Accepted { .. }), "{written:?}");
    let created = f
        .table
        .insert(&f.fence, &lock, &70i64, &token, &"created")
        .await
        .unwrap();
    assert!(matches!(created, Outcome::Accepted { .. }), "{created:?}");
    let later = f.token(&lock, 13);
    let deleted = f
        .table
        .delete(&f.fence, &lock, &70i64, &later)
        .await
        .unwrap();
    assert!(matches!(deleted, Outcome::Accepted { .. }), "{deleted:?}");
    assert_eq!(f.fence_of(7).await, 12);
    f.drop().await;
}

#[tokio::test]
async fn p4_a_row_fenced_by_a_forged_token_is_repaired_to_below_the_coordinators_floor() {
    let f = Fixture::new("repair", true).await;
    let lock = f.lock(7);
    let forger = TokenSigner::from_secret_bytes(&[99; 32]);
    let forged = forger.sign(
        &lock,
        Epoch(9_000_000_000_000_000_000),
        &HolderId::new("forger").unwrap(),
        &Principal::anonymous(),
        0,
    );
    // The database cannot check the signature: the forged token is written (the audit finds
    // it, crates/audit/tests/guard_mutants.rs), and blocks every owner after it.
    assert_eq!(f.token_update(&forged, 7).await.unwrap(), 1);
    let blocked = f.token_update(&f.token(&lock, 60), 7).await.unwrap_err();
    assert_eq!(sqlstate(&blocked), "P5009", "{blocked}");
    let client = f.fence.pool().get().await.unwrap();
    let repaired: i64 = client
        .query_one(
            "SELECT palisade_repair_fence($1::text::regclass, $2, 60)",
            &[&f.name, &lock.as_str()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(repaired, 1);
    assert_eq!(f.fence_of(7).await, 59);
    assert_eq!(f.fence_of(8).await, 0, "another lock's row is left alone");
    let recorded = client
        .query_opt(
            "SELECT epoch FROM palisade_presented_tokens WHERE lock = $1",
            &[&lock.as_str()],
        )
        .await
        .unwrap();
    assert!(recorded.is_none(), "the forged token is forgotten");
    // Every owner below the floor is still refused; the owner at it writes.
    assert_eq!(f.token_update(&f.token(&lock, 59), 7).await.unwrap(), 0);
    assert_eq!(f.token_update(&f.token(&lock, 60), 7).await.unwrap(), 1);
    // And the guard is back on, for everyone.
    let error = f
        .sql("UPDATE {t} SET payload = 'x', last_fence = 1 WHERE id = 7")
        .await
        .unwrap_err();
    assert!(sqlstate(&error).starts_with("P50"), "{error}");
    f.drop().await;
}

#[tokio::test]
async fn p2_a_superseded_owner_is_refused_on_rows_the_newer_owner_has_not_written() {
    let f = Fixture::new("superseded", true).await;
    let lock = f.lock(7);
    f.sql(
        "INSERT INTO {t} (id, lock, payload) VALUES (70, 'LOCK', 'initial')"
            .replace("LOCK", lock.as_str())
            .as_str(),
    )
    .await
    .unwrap();
    assert_eq!(f.token_update(&f.token(&lock, 25), 7).await.unwrap(), 1);
    // Row 70 is still at 0, but a token of 25 was presented for the lock: 12 is superseded.
    let stale = f.token_update(&f.token(&lock, 12), 70).await.unwrap_err();
    assert_eq!(sqlstate(&stale), "P5009", "{stale}");
    assert_eq!(stale.as_db_error().unwrap().detail(), Some("25"));
    assert_eq!(f.fence_of(70).await, 0);
    f.drop().await;
}

#[tokio::test]
async fn p5_a_role_that_may_not_present_tokens_cannot_record_one() {
    let f = Fixture::new("presenter", true).await;
    let role = format!("{}_reader", f.name);
    f.sql(&format!(
        "DROP ROLE IF EXISTS {role}; CREATE ROLE {role}; GRANT SELECT ON {{t}} TO {role}"
    ))
    .await
    .unwrap();
    let token = f.token(&f.lock(7), 90);
    let client = f.fence.pool().get().await.unwrap();
    let refused = client
        .batch_execute(&format!(
            "BEGIN; SET LOCAL ROLE {role}; SELECT palisade_present_token('{token}')"
        ))
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&refused), "42501", "{refused}");
    client.batch_execute("ROLLBACK").await.unwrap();
    drop(client);
    f.sql(&format!(
        "REVOKE ALL ON {{t}} FROM {role}; DROP ROLE {role}"
    ))
    .await
    .unwrap();
    f.drop().await;
}

#[tokio::test]
async fn p4_a_deleted_rows_forged_fence_is_repaired_in_its_tombstone() {
    let f = Fixture::new("tombstone", true).await;
    let lock = f.lock(7);
    let forged = TokenSigner::from_secret_bytes(&[98; 32]).sign(
        &lock,
        Epoch(9_000_000_000_000_000_000),
        &HolderId::new("forger").unwrap(),
        &Principal::anonymous(),
        0,
    );
    assert_eq!(f.token_update(&forged, 7).await.unwrap(), 1);
    f.sql("DELETE FROM {t} WHERE id = 7").await.unwrap();
    let client = f.fence.pool().get().await.unwrap();
    let tombstone = "SELECT fence, lock FROM palisade_row_fences \
                     WHERE tbl = $1::text::regclass AND id = '7'";
    let row = client.query_one(tombstone, &[&f.name]).await.unwrap();
    assert_eq!(
        (row.get::<_, i64>(0), row.get::<_, String>(1)),
        (9_000_000_000_000_000_000, lock.to_string())
    );
    client
        .query_one(
            "SELECT palisade_repair_fence($1::text::regclass, $2, 60)",
            &[&f.name, &lock.as_str()],
        )
        .await
        .unwrap();
    let row = client.query_one(tombstone, &[&f.name]).await.unwrap();
    assert_eq!(row.get::<_, i64>(0), 59);
    // The owner at the floor re-creates the row.
    let created = f
        .table
        .insert(&f.fence, &lock, &7i64, &f.token(&lock, 60), &"again")
        .await
        .unwrap();
    assert!(matches!(created, Outcome::Accepted { .. }), "{created:?}");
    drop(client);
    f.drop().await;
}
