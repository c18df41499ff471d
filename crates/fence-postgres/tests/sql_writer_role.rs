//! The SQL-only writer role of docs/enforcement.md ("Roles"), against a real PostgreSQL: a
//! login with exactly the documented grants, running the documented token statement with no
//! Palisade adapter (as a psql or psycopg script would). Its owner's token writes; a superseded,
//! bare, mismatched or other lock's write is refused by the database; and nothing else it can
//! run writes a guarded row or Palisade's tables. Before, such a user had to guess its grants.

mod common;

use std::sync::Arc;

use palisade_core::{Epoch, HolderId, LockName, Principal, TokenSigner, TokenVerifier};
use palisade_fence::{FenceMode, Verifier};
use palisade_fence_postgres::{GuardedTable, PostgresFence, RowLock};

/// docs/enforcement.md's token statement, exactly: $1 the token, $2 the payload, $3 the row.
const TOKEN_UPDATE: &str = "UPDATE {t} SET payload = $2, last_fence = t.epoch \
     FROM palisade_present_token($1) AS t(epoch) \
     WHERE id = $3 AND last_fence OPERATOR(pg_catalog.<) t.epoch \
     RETURNING id";

/// docs/enforcement.md, "Roles": the SQL-only writer's grants, exactly (`{t}` the table, `{r}`
/// the role).
const WRITER_GRANTS: [&str; 3] = [
    "GRANT SELECT (id, last_fence), UPDATE (payload, last_fence) ON {t} TO {r}",
    "GRANT EXECUTE ON FUNCTION palisade_present_token(text) TO {r}",
    "GRANT EXECUTE ON FUNCTION palisade_learn_floor(text, bigint, text) TO {r}",
];

/// A guarded table bound to one lock, requiring tokens, its lock's floor not learned yet (as
/// after a restart), and a login role with the writer's grants.
struct Fixture {
    fence: PostgresFence,
    table: GuardedTable,
    name: String,
    role: String,
    signer: TokenSigner,
    lock: LockName,
}

impl Fixture {
    async fn new(case: &str) -> Self {
        let signer = TokenSigner::from_secret_bytes(&[13; 32]);
        let verifier = Arc::new(Verifier::new(TokenVerifier::new([signer.verifying_key()])));
        let fence = PostgresFence::connect(&common::postgres_url(), 2, FenceMode::Strict, verifier)
            .await
            .unwrap()
            .with_floors(Arc::new(palisade_fence::StaticFloors::new()));
        let name = format!("sqlwriter_{case}_{}", std::process::id());
        // Per process: the database remembers the greatest token presented for each lock.
        let lock = LockName::new(format!("report/7-{name}")).unwrap();
        let table =
            GuardedTable::new(&name, "id", "payload", RowLock::Table(lock.clone())).unwrap();
        let f = Self {
            fence,
            table,
            role: format!("report_writer_{case}_{}", std::process::id()),
            name,
            signer,
            lock,
        };
        f.owner(
            "DROP TABLE IF EXISTS {t};
             CREATE TABLE {t} (id bigint PRIMARY KEY, payload text NOT NULL,
                               last_fence bigint NOT NULL DEFAULT 0);
             INSERT INTO {t} (id, payload) VALUES (1, 'initial');",
        )
        .await
        .unwrap();
        f.table.install_guard(&f.fence, false).await.unwrap();
        f.table.require_token(&f.fence, true).await.unwrap();
        let forget = format!("DELETE FROM palisade_lock_floors WHERE lock = '{}'", f.lock);
        f.owner(&forget).await.unwrap();
        f.owner("DROP ROLE IF EXISTS {r}").await.ok();
        f.owner("CREATE ROLE {r} LOGIN").await.unwrap();
        f.acl(&WRITER_GRANTS.join(";")).await;
        f
    }

    /// Runs grants or revokes as the owner, one test at a time: PostgreSQL fails concurrent
    /// changes of one function's privileges ("tuple concurrently updated").
    async fn acl(&self, sql: &str) {
        let serialized = format!(
            "BEGIN; SELECT pg_advisory_xact_lock(hashtext('palisade test grants')); {sql}; COMMIT"
        );
        self.owner(&serialized).await.unwrap();
    }

    fn sql(&self, sql: &str) -> String {
        sql.replace("{t}", &self.name).replace("{r}", &self.role)
    }

    /// Runs `sql` as the owner (the test server's superuser, which applied the migrations).
    async fn owner(&self, sql: &str) -> Result<(), tokio_postgres::Error> {
        let client = self.fence.pool().get().await.unwrap();
        client.batch_execute(&self.sql(sql)).await
    }

    /// A login as the writer role (the test server trusts loopback connections).
    async fn writer(&self) -> tokio_postgres::Client {
        let url = common::postgres_url().replacen(
            "postgres://postgres@",
            &format!("postgres://{}@", self.role),
            1,
        );
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        client
    }

    fn token(&self, lock: &LockName, epoch: u64) -> String {
        let holder = HolderId::new("script").unwrap();
        let principal = Principal::anonymous();
        self.signer.sign(lock, Epoch(epoch), &holder, &principal, 0)
    }

    /// The documented statement with `token`, as `writer`: the ids it wrote.
    async fn write(
        &self,
        writer: &tokio_postgres::Client,
        token: &str,
        payload: &str,
    ) -> Result<Vec<i64>, tokio_postgres::Error> {
        let rows = writer
            .query(&self.sql(TOKEN_UPDATE), &[&token, &payload, &1i64])
            .await?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }

    /// Row 1's payload and fence, read as the owner.
    async fn row(&self) -> (String, i64) {
        let client = self.fence.pool().get().await.unwrap();
        let sql = self.sql("SELECT payload, last_fence FROM {t} WHERE id = 1");
        let row = client.query_one(&sql, &[]).await.unwrap();
        (row.get(0), row.get(1))
    }

    /// The table with its binding and tombstones, and the role.
    async fn drop(self) {
        self.owner("BEGIN; SELECT palisade_drop_guard('{t}'); DROP TABLE {t}; COMMIT")
            .await
            .unwrap();
        self.acl("DROP OWNED BY {r}; DROP ROLE {r}").await;
    }
}

/// An error's SQLSTATE and DETAIL.
fn refusal(error: &tokio_postgres::Error) -> (String, Option<String>) {
    let db = error.as_db_error();
    let code = error
        .code()
        .map(|c| c.code().to_owned())
        .unwrap_or_default();
    (code, db.and_then(|d| d.detail().map(str::to_owned)))
}

#[tokio::test]
async fn p2_p4_the_sql_only_writer_role_the_docs_describe_writes_its_owners_token_and_no_other() {
    let f = Fixture::new("writes").await;
    let writer = f.writer().await;
    let lock = f.lock.as_str().to_owned();
    // The lock's floor is not known since the database started: P5008, then the writer learns
    // it with the coordinator's signed statement (its grant on palisade_learn_floor).
    let first = f.write(&writer, &f.token(&f.lock, 5), "by 5").await;
    assert_eq!(
        refusal(&first.unwrap_err()),
        ("P5008".into(), Some(lock.clone()))
    );
    let statement = f.signer.sign_floor(&f.lock, Epoch(4), 0);
    let learned: i64 = writer
        .query_one(
            "SELECT palisade_learn_floor($1, $2, $3)",
            &[&lock, &4i64, &statement],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(learned, 4);
    // (a) The current owner's token writes the row, at its epoch.
    assert_eq!(
        f.write(&writer, &f.token(&f.lock, 5), "by 5")
            .await
            .unwrap(),
        [1]
    );
    assert_eq!(f.row().await, ("by 5".to_owned(), 5));
    assert_eq!(
        f.write(&writer, &f.token(&f.lock, 6), "by 6")
            .await
            .unwrap(),
        [1]
    );
    // (b) A superseded owner: a token of epoch 6 was presented, so 5 is refused (DETAIL 6),
    // and the same epoch twice is zero rows (strict: one write per epoch and row).
    let stale = f.write(&writer, &f.token(&f.lock, 5), "stale").await;
    assert_eq!(
        refusal(&stale.unwrap_err()),
        ("P5009".into(), Some("6".into()))
    );
    assert!(f
        .write(&writer, &f.token(&f.lock, 6), "again")
        .await
        .unwrap()
        .is_empty());
    // (c) Another lock's token, a bare epoch, another number than the token's, not a token.
    let other = LockName::new(format!("report/8-{}", f.name)).unwrap();
    let wrong = f.write(&writer, &f.token(&other, 50), "other lock").await;
    assert_eq!(
        refusal(&wrong.unwrap_err()),
        ("P5011".into(), Some(lock.clone()))
    );
    let bare = writer
        .batch_execute(&f.sql("UPDATE {t} SET payload = 'bare', last_fence = 7 WHERE id = 1"))
        .await;
    assert_eq!(
        refusal(&bare.unwrap_err()),
        ("P5010".into(), Some(lock.clone()))
    );
    let mismatched = writer
        .query(
            &f.sql(
                "UPDATE {t} SET payload = 'mismatch', last_fence = t.epoch + 1000 \
                 FROM palisade_present_token($1) AS t(epoch) WHERE id = 1",
            ),
            &[&f.token(&f.lock, 7)],
        )
        .await;
    assert_eq!(
        refusal(&mismatched.unwrap_err()),
        ("P5012".into(), Some("7".into()))
    );
    let garbage = f.write(&writer, "pt1.AAAA", "not a token").await;
    assert_eq!(refusal(&garbage.unwrap_err()).0, "P5013");
    assert_eq!(f.row().await, ("by 6".to_owned(), 6));
    // The next owner still writes.
    assert_eq!(
        f.write(&writer, &f.token(&f.lock, 8), "by 8")
            .await
            .unwrap(),
        [1]
    );
    drop(writer);
    f.drop().await;
}

/// What the writer role may not do, each with the SQLSTATE it gets: `42501` (permission
/// denied) for what its grants leave out, a guard error for what the triggers refuse.
const BYPASSES: [(&str, &str); 19] = [
    (
        "UPDATE {t} SET last_fence = 9223372036854775807 WHERE id = 1",
        "P5010",
    ),
    (
        "UPDATE {t} SET payload = 'admin script' WHERE id = 1",
        "P5010",
    ),
    (
        "INSERT INTO {t} (id, payload, last_fence) VALUES (9, 'x', 0)",
        "42501",
    ),
    ("DELETE FROM {t} WHERE id = 1", "42501"),
    ("TRUNCATE {t}", "42501"),
    ("ALTER TABLE {t} DISABLE TRIGGER ALL", "42501"),
    ("SET session_replication_role = replica", "42501"),
    ("UPDATE palisade_presented_tokens SET epoch = 0", "42501"),
    ("DELETE FROM palisade_presented_tokens", "42501"),
    (
        "INSERT INTO palisade_presented_tokens (lock, epoch, token) VALUES ('x', 1, 'y')",
        "42501",
    ),
    ("DELETE FROM palisade_lock_floors", "42501"),
    ("DELETE FROM palisade_row_fences", "42501"),
    ("SELECT secret FROM palisade_token_secret", "42501"),
    (
        "SELECT palisade_learn_floor('report/7', 9223372036854775807)",
        "42501",
    ),
    ("SELECT palisade_presented_mac('report/7', 9)", "42501"),
    ("SELECT palisade_require_token('{t}', false)", "42501"),
    (
        "SELECT palisade_repair_fence('{t}', 'report/7', 1)",
        "42501",
    ),
    (
        "SELECT palisade_install_guard('{t}', 'id', false, 'other', NULL)",
        "42501",
    ),
    // The transaction's record of presented tokens set by hand: no MAC, no token.
    (
        "BEGIN; SELECT set_config('palisade.presented_tokens', '{\"LOCK\": \"9:00\"}', true);
         UPDATE {t} SET payload = 'forged', last_fence = 9 WHERE id = 1",
        "P5010",
    ),
];

#[tokio::test]
async fn p5_the_sql_only_writer_role_the_docs_describe_cannot_bypass_the_guard() {
    let f = Fixture::new("bypass").await;
    f.owner(&format!("SELECT palisade_learn_floor('{}', 0)", f.lock))
        .await
        .unwrap();
    let writer = f.writer().await;
    assert_eq!(
        f.write(&writer, &f.token(&f.lock, 5), "by 5")
            .await
            .unwrap(),
        [1]
    );
    for (bypass, expected) in BYPASSES {
        let sql = f.sql(bypass).replace("LOCK", f.lock.as_str());
        let error = writer.batch_execute(&sql).await.expect_err(&sql);
        assert_eq!(refusal(&error).0, expected, "{sql}: {error:?}");
        writer.batch_execute("ROLLBACK").await.unwrap();
    }
    assert_eq!(f.row().await, ("by 5".to_owned(), 5));
    // (e) What palisade_guard_findings reports for it, as the docs say: nothing. It lists
    // table-wide write privileges; the writer's are on columns, and every write through them
    // meets the triggers above.
    let findings = f.table.guard_findings(&f.fence, &f.role).await.unwrap();
    assert_eq!(findings, Vec::<String>::new());
    // Granted UPDATE on the whole table, it is reported.
    f.acl("GRANT UPDATE ON {t} TO {r}").await;
    let findings = f.table.guard_findings(&f.fence, &f.role).await.unwrap();
    assert!(
        findings.iter().any(|x| x.contains("UPDATE")),
        "{findings:?}"
    );
    drop(writer);
    f.drop().await;
}

/// Each of the writer's grants, and what fails with SQLSTATE 42501 without it.
const EACH_GRANT: [(&str, &str); 6] = [
    ("SELECT (id)", "the statement's WHERE"),
    ("SELECT (last_fence)", "the statement's WHERE"),
    ("UPDATE (payload)", "the statement's SET"),
    ("UPDATE (last_fence)", "the statement's SET"),
    (
        "EXECUTE ON FUNCTION palisade_present_token(text)",
        "the statement's FROM",
    ),
    (
        "EXECUTE ON FUNCTION palisade_learn_floor(text, bigint, text)",
        "learning the floor",
    ),
];

#[tokio::test]
async fn the_sql_only_writer_role_the_docs_describe_needs_each_of_its_grants() {
    let f = Fixture::new("minimal").await;
    let writer = f.writer().await;
    let lock = f.lock.as_str().to_owned();
    let statement = f.signer.sign_floor(&f.lock, Epoch(0), 0);
    let learn = "SELECT palisade_learn_floor($1, 0, $2)";
    for (epoch, (grant, needed_by)) in (1..).zip(EACH_GRANT) {
        let on = if grant.starts_with("EXECUTE") {
            ""
        } else {
            " ON {t}"
        };
        f.acl(&format!("REVOKE {grant}{on} FROM {{r}}")).await;
        let error = if needed_by == "learning the floor" {
            writer.query(learn, &[&lock, &statement]).await.unwrap_err()
        } else {
            let token = f.token(&f.lock, epoch);
            f.write(&writer, &token, "x").await.unwrap_err()
        };
        assert_eq!(
            refusal(&error).0,
            "42501",
            "without {grant}: {needed_by}: {error}"
        );
        f.acl(&format!("GRANT {grant}{on} TO {{r}}")).await;
        writer.query(learn, &[&lock, &statement]).await.unwrap();
        let written = f
            .write(&writer, &f.token(&f.lock, epoch), "x")
            .await
            .unwrap();
        assert_eq!(written, [1], "with {grant} again");
    }
    drop(writer);
    f.drop().await;
}
