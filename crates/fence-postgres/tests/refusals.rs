//! Refused writes where the audit and the console read them (migration 12), against a real
//! PostgreSQL. A stale owner's write rolls back with anything it wrote; the writer records the
//! refusal afterwards with `palisade_record_refusal(token)`, which records only a token that is
//! stale when it runs. The Rust adapter does it on its own.

mod common;

use std::sync::Arc;

use palisade_core::{Epoch, HolderId, LockName, Principal, TokenSigner, TokenVerifier};
use palisade_fence::{FenceMode, FencedResource, Outcome, Rejection, Verifier, Write};
use palisade_fence_postgres::{GuardedTable, PostgresFence, RowLock};

const TOKEN_UPDATE: &str = "UPDATE {t} SET payload = $2, last_fence = t.epoch \
     FROM palisade_present_token($1) AS t(epoch) \
     WHERE id = $3 AND last_fence OPERATOR(pg_catalog.<) t.epoch";

struct Fixture {
    fence: PostgresFence,
    table: GuardedTable,
    name: String,
    lock: LockName,
    signer: TokenSigner,
}

impl Fixture {
    async fn new(case: &str) -> Self {
        let signer = TokenSigner::from_secret_bytes(&[12; 32]);
        let verifier = Arc::new(Verifier::new(TokenVerifier::new([signer.verifying_key()])));
        let fence = PostgresFence::connect(&common::postgres_url(), 4, FenceMode::Strict, verifier)
            .await
            .unwrap()
            .with_floors(Arc::new(palisade_fence::StaticFloors::new()));
        let name = format!("refused_{case}_{}", std::process::id());
        let lock = LockName::new(format!("report/{name}")).unwrap();
        let table =
            GuardedTable::new(&name, "id", "payload", RowLock::Column("lock".into())).unwrap();
        let f = Self {
            fence,
            table,
            name,
            lock,
            signer,
        };
        f.sql(&format!(
            "DROP TABLE IF EXISTS {{t}};
             CREATE TABLE {{t}} (id bigint PRIMARY KEY, lock text NOT NULL,
                                 payload text NOT NULL, last_fence bigint NOT NULL DEFAULT 0);
             INSERT INTO {{t}} (id, lock, payload) VALUES (7, '{0}', 'initial'), (8, '{0}', 'initial');
             SELECT palisade_learn_floor('{0}', 0);",
            f.lock
        ))
        .await;
        f.table.install_guard(&f.fence, false).await.unwrap();
        f.table.require_token(&f.fence, true).await.unwrap();
        f
    }

    fn token(&self, epoch: u64) -> String {
        let holder = HolderId::new(format!("worker-{epoch}")).unwrap();
        self.signer.sign(
            &self.lock,
            Epoch(epoch),
            &holder,
            &Principal::anonymous(),
            0,
        )
    }

    async fn sql(&self, sql: &str) {
        let client = self.fence.pool().get().await.unwrap();
        client
            .batch_execute(&sql.replace("{t}", &self.name))
            .await
            .unwrap();
    }

    /// The refusals recorded for this fixture's lock, newest first: (epoch, fence, reason).
    async fn refusals(&self) -> Vec<(i64, i64, String)> {
        let client = self.fence.pool().get().await.unwrap();
        client
            .query(
                "SELECT epoch, fence, reason FROM palisade_recent_refusals(1000) WHERE lock = $1",
                &[&self.lock.as_str()],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| (row.get(0), row.get(1), row.get(2)))
            .collect()
    }

    async fn drop(self) {
        self.sql("BEGIN; SELECT palisade_drop_guard('{t}'); DROP TABLE {t}; COMMIT")
            .await;
    }
}

/// A SQL-only writer's refused write, recorded after its rollback: only a token that is stale
/// is recorded, so a role that may record can make no refusal up.
#[tokio::test]
async fn p2_a_refused_stale_write_is_recorded_after_its_rollback_and_only_a_stale_one() {
    let f = Fixture::new("sql").await;
    let client = f.fence.pool().get().await.unwrap();
    let update = TOKEN_UPDATE.replace("{t}", &f.name);
    let (old, new) = (f.token(30), f.token(31));
    assert_eq!(
        client
            .execute(&update, &[&new, &"new", &7i64])
            .await
            .unwrap(),
        1
    );
    let refused = client
        .execute(&update, &[&old, &"stale", &8i64])
        .await
        .unwrap_err();
    assert_eq!(refused.code().unwrap().code(), "P5009", "{refused}");
    assert!(
        f.refusals().await.is_empty(),
        "the rollback took nothing with it to record"
    );
    let record = "SELECT palisade_record_refusal($1)";
    let recorded: bool = client.query_one(record, &[&old]).await.unwrap().get(0);
    assert!(recorded);
    assert_eq!(f.refusals().await, vec![(30, 31, "stale_epoch".to_owned())]);
    // The current owner's token, or a newer one, is no refusal: nothing is recorded.
    for token in [new, f.token(99)] {
        let recorded: bool = client.query_one(record, &[&token]).await.unwrap().get(0);
        assert!(!recorded);
    }
    let not_a_token = client.query_one(record, &[&"x.y"]).await.unwrap_err();
    assert_eq!(not_a_token.code().unwrap().code(), "P5013");
    assert_eq!(f.refusals().await.len(), 1);
    let total: i64 = client
        .query_one("SELECT palisade_refusal_count()", &[])
        .await
        .unwrap()
        .get(0);
    assert!(total >= 1);
    f.drop().await;
}

/// The Rust adapter records its refused stale writes on its own.
#[tokio::test]
async fn p2_the_rust_adapter_records_the_stale_writes_it_was_refused() {
    let f = Fixture::new("adapter").await;
    let (old, new) = (f.token(40), f.token(41));
    let written = f.table.update(&f.fence, &f.lock, &7i64, &new, &"new").await;
    assert!(
        matches!(written, Ok(Outcome::Accepted { .. })),
        "{written:?}"
    );
    let refused = f
        .table
        .update(&f.fence, &f.lock, &8i64, &old, &"stale")
        .await;
    assert!(
        matches!(refused, Ok(Outcome::Rejected(Rejection::StaleEpoch { .. }))),
        "{refused:?}"
    );
    assert_eq!(f.refusals().await, vec![(40, 41, "stale_epoch".to_owned())]);
    f.drop().await;
}

/// A role that was not given EXECUTE on palisade_record_refusal cannot record anything.
#[tokio::test]
async fn p5_recording_a_refusal_needs_its_grant() {
    let f = Fixture::new("grant").await;
    let role = format!("refusal_nobody_{}", std::process::id());
    f.sql(&format!("DROP ROLE IF EXISTS {role}; CREATE ROLE {role};"))
        .await;
    let client = f.fence.pool().get().await.unwrap();
    let denied = client
        .batch_execute(&format!(
            "BEGIN; SET LOCAL ROLE {role}; SELECT palisade_record_refusal('x.y'); COMMIT"
        ))
        .await
        .unwrap_err();
    assert_eq!(denied.code().unwrap().code(), "42501", "{denied}");
    client.batch_execute("ROLLBACK").await.unwrap();
    drop(client);
    f.sql(&format!("DROP ROLE {role}")).await;
    f.drop().await;
}

/// The adapter's own tables (`palisade_kv`, strict mode) have no presented token: the
/// database compares with the lock's greatest epoch there.
#[tokio::test]
async fn p2_the_rust_adapters_own_tables_record_their_refusals_too() {
    let f = Fixture::new("kv").await;
    let write = |token: String, value: &'static [u8]| {
        let fence = &f.fence;
        let lock = &f.lock;
        async move {
            fence
                .write(Write {
                    lock,
                    key: "k",
                    token: &token,
                    seq: None,
                    value,
                })
                .await
        }
    };
    let written = write(f.token(61), b"new").await;
    assert!(
        matches!(written, Ok(Outcome::Accepted { .. })),
        "{written:?}"
    );
    let refused = write(f.token(60), b"stale").await;
    assert!(
        matches!(refused, Ok(Outcome::Rejected(Rejection::StaleEpoch { .. }))),
        "{refused:?}"
    );
    assert_eq!(f.refusals().await, vec![(60, 61, "stale_epoch".to_owned())]);
    f.drop().await;
}

/// Bounded per lock (a writer flooding one lock pushes out only that lock's older refusals),
/// and never a wait: a recording left uncommitted in another session does not hold up the
/// next one.
#[tokio::test]
async fn p8_recording_is_bounded_per_lock_and_never_waits_for_another_recorder() {
    let f = Fixture::new("bound").await;
    let client = f.fence.pool().get().await.unwrap();
    let update = TOKEN_UPDATE.replace("{t}", &f.name);
    assert_eq!(
        client
            .execute(&update, &[&f.token(100), &"new", &7i64])
            .await
            .unwrap(),
        1
    );
    let record = "SELECT palisade_record_refusal($1)";
    for epoch in 1..=40 {
        client.query_one(record, &[&f.token(epoch)]).await.unwrap();
    }
    let kept = f.refusals().await;
    assert_eq!(kept.len(), 32, "{kept:?}");
    assert_eq!(kept.first().map(|r| r.0), Some(40), "the newest are kept");
    let open = f.fence.pool().get().await.unwrap();
    open.batch_execute("BEGIN").await.unwrap();
    open.query_one(record, &[&f.token(41)]).await.unwrap();
    let next = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        client.query_one(record, &[&f.token(42)]),
    )
    .await;
    assert!(
        matches!(next, Ok(Ok(_))),
        "a recorder waited for another: {next:?}"
    );
    open.batch_execute("ROLLBACK").await.unwrap();
    drop((open, client));
    f.drop().await;
}
