//! The audit against a real PostgreSQL (P5): a guarded table reports its fence and refuses the
//! probe's bypass write; an unguarded one is reported, and the probe's write goes through
//! (rolled back: no row changes either way).

use std::sync::Arc;

use palisade_audit::observe::{observe, probe_postgres};
use palisade_audit::policy::Boundary;
use palisade_audit::Probe;
use palisade_core::{LockName, TokenVerifier};
use palisade_fence::{FenceMode, Verifier};
use palisade_fence_postgres::{GuardedTable, PostgresFence, RowLock};
use serde_json::Value;

fn postgres_url() -> String {
    std::env::var("PALISADE_TEST_POSTGRES_URL").expect(
        "PALISADE_TEST_POSTGRES_URL is not set: run ./scripts/test, which starts a throwaway \
         PostgreSQL on loopback and sets it",
    )
}

#[tokio::test]
async fn p5_the_audit_sees_a_guarded_tables_fence_and_an_unguarded_table() {
    let url = postgres_url();
    let verifier = Arc::new(Verifier::new(TokenVerifier::new([])));
    let fence = PostgresFence::connect(&url, 2, FenceMode::Strict, verifier)
        .await
        .unwrap()
        .with_floors(std::sync::Arc::new(palisade_fence::StaticFloors::new()));
    let id = std::process::id();
    let (guarded, bare) = (format!("audit_guarded_{id}"), format!("audit_bare_{id}"));
    let client = fence.pool().get().await.unwrap();
    client
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {guarded}; DROP TABLE IF EXISTS {bare};
             CREATE TABLE {guarded} (id bigint PRIMARY KEY, payload text NOT NULL,
                                     last_fence bigint NOT NULL DEFAULT 0);
             CREATE TABLE {bare} (LIKE {guarded});
             INSERT INTO {guarded} VALUES (1, 'a', 7), (2, 'b', 9);
             INSERT INTO {bare} VALUES (1, 'a', 3);"
        ))
        .await
        .unwrap();
    let lock = LockName::new(format!("report/{id}")).unwrap();
    GuardedTable::new(&guarded, "id", "payload", RowLock::Table(lock.clone()))
        .unwrap()
        .install_guard(&fence, false)
        .await
        .unwrap();

    let http = palisade_audit::observe::http_client();
    the_guarded_table_is_seen_and_its_probe_refused(&http, &client, &url, &guarded, &lock).await;
    the_bare_table_is_seen_and_its_probe_accepted(&http, &url, &bare, &lock).await;
    // Nothing changed: the probes' transactions were rolled back.
    let rows: Vec<(i64, String, i64)> = client
        .query(
            &format!("SELECT id, payload, last_fence FROM {guarded} ORDER BY id"),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(rows, vec![(1, "a".into(), 7), (2, "b".into(), 9)]);

    missing_tables_and_closed_databases_are_reported(&http, &url, &guarded).await;
    client
        .batch_execute(&format!("DROP TABLE {guarded}; DROP TABLE {bare};"))
        .await
        .unwrap();
}

/// The guarded table: installed, its highest row fence, the probe refused; with the update
/// trigger off (and no floor learned) the probe goes through.
async fn the_guarded_table_is_seen_and_its_probe_refused(
    http: &reqwest::Client,
    client: &tokio_postgres::Client,
    url: &str,
    guarded: &str,
    lock: &LockName,
) {
    let boundary = Boundary::Postgres {
        table: guarded.to_owned(),
        url: url.to_owned(),
        writers: Vec::new(),
    };
    let report = observe(
        http,
        &boundary,
        vec!["report/*".into()],
        &[lock.to_string()],
    )
    .await;
    assert!(report.reachable, "{report:?}");
    assert_eq!(report.guard_installed, Some(true));
    assert_eq!(
        report.fences.get(lock.as_str()),
        Some(&9),
        "the highest row fence"
    );
    let probe = probe_postgres(url, guarded).await;
    assert!(matches!(probe, Probe::Refused { .. }), "{probe:?}");
    // A floor this database has not learned refuses every fenced row too (P5008): that must
    // not pass for the guard. With the guard's update trigger off and no floor learned, the
    // probe still sees the update go through.
    client
        .batch_execute(&format!(
            "DELETE FROM palisade_lock_floors WHERE lock = '{lock}';
             ALTER TABLE {guarded} DISABLE TRIGGER palisade_guard_update"
        ))
        .await
        .unwrap();
    let probe = probe_postgres(url, guarded).await;
    assert!(matches!(probe, Probe::Accepted { .. }), "{probe:?}");
    client
        .batch_execute(&format!(
            "ALTER TABLE {guarded} ENABLE ALWAYS TRIGGER palisade_guard_update"
        ))
        .await
        .unwrap();
    let probe = probe_postgres(url, guarded).await;
    assert!(matches!(probe, Probe::Refused { .. }), "{probe:?}");
}

/// A table with no guard: seen as such, and the probe's write goes through.
async fn the_bare_table_is_seen_and_its_probe_accepted(
    http: &reqwest::Client,
    url: &str,
    bare: &str,
    lock: &LockName,
) {
    let report = observe(
        http,
        &Boundary::Postgres {
            table: bare.to_owned(),
            url: url.to_owned(),
            writers: Vec::new(),
        },
        vec![],
        &[lock.to_string()],
    )
    .await;
    assert!(report.reachable);
    assert_eq!(report.guard_installed, Some(false));
    let probe = probe_postgres(url, bare).await;
    assert!(matches!(probe, Probe::Accepted { .. }), "{probe:?}");
}

/// A table that does not exist, and a database that does not answer, are reported; the
/// password never shows.
async fn missing_tables_and_closed_databases_are_reported(
    http: &reqwest::Client,
    url: &str,
    guarded: &str,
) {
    let missing = observe(
        http,
        &Boundary::Postgres {
            table: "no_such_table".into(),
            url: url.to_owned(),
            writers: Vec::new(),
        },
        vec![],
        &[],
    )
    .await;
    assert!(!missing.reachable);
    assert!(missing.error.unwrap().contains("does not exist"));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let closed = observe(
        http,
        &Boundary::Postgres {
            table: guarded.to_owned(),
            url: format!(
                "postgres://nobody:secret@127.0.0.1:{port}/none?password=secret&sslpassword=secret"
            ),
            writers: Vec::new(),
        },
        vec![],
        &[],
    )
    .await;
    assert!(!closed.reachable);
    assert!(
        !closed.error.as_deref().unwrap().contains("secret"),
        "{closed:?}"
    );
}

/// The stale writes a PostgreSQL boundary refused, as its writers recorded them (migration
/// 12), reach the audit like a reference store's rejections: the console's "stale refused"
/// and its timeline read them.
#[tokio::test]
async fn p2_the_audit_reads_the_stale_writes_postgres_refused() {
    let url = postgres_url();
    let signer = palisade_core::TokenSigner::from_secret_bytes(&[13; 32]);
    let verifier = Arc::new(Verifier::new(TokenVerifier::new([signer.verifying_key()])));
    let fence = PostgresFence::connect(&url, 2, FenceMode::Strict, verifier)
        .await
        .unwrap()
        .with_floors(Arc::new(palisade_fence::StaticFloors::new()));
    let id = std::process::id();
    let table = format!("audit_refused_{id}");
    let lock = LockName::new(format!("refused/{id}")).unwrap();
    let client = fence.pool().get().await.unwrap();
    client
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {table};
             CREATE TABLE {table} (id bigint PRIMARY KEY, payload text NOT NULL,
                                   last_fence bigint NOT NULL DEFAULT 0);
             INSERT INTO {table} VALUES (1, 'a', 0), (2, 'b', 0);
             SELECT palisade_learn_floor('{lock}', 0);"
        ))
        .await
        .unwrap();
    let guarded = GuardedTable::new(&table, "id", "payload", RowLock::Table(lock.clone())).unwrap();
    guarded.install_guard(&fence, false).await.unwrap();
    let token = |epoch: u64| {
        let holder = palisade_core::HolderId::new(format!("w{epoch}")).unwrap();
        signer.sign(
            &lock,
            palisade_core::Epoch(epoch),
            &holder,
            &palisade_core::Principal::anonymous(),
            0,
        )
    };
    let (old, new) = (token(50), token(51));
    let written = guarded
        .update(&fence, &lock, &1i64, &new, &"new")
        .await
        .unwrap();
    assert!(
        matches!(written, palisade_fence::Outcome::Accepted { .. }),
        "{written:?}"
    );
    let refused = guarded
        .update(&fence, &lock, &2i64, &old, &"stale")
        .await
        .unwrap();
    assert!(
        matches!(refused, palisade_fence::Outcome::Rejected(_)),
        "{refused:?}"
    );

    let boundary = Boundary::Postgres {
        table: table.clone(),
        url: url.clone(),
        writers: Vec::new(),
    };
    let http = palisade_audit::observe::http_client();
    let keys = TokenVerifier::new([signer.verifying_key()]);
    let mut report = observe(
        &http,
        &boundary,
        vec!["refused/*".into()],
        &[lock.to_string()],
    )
    .await;
    // (Other tests' refusals in this shared database carry their own keys' tokens: unverified
    // here, they are dropped; this lock's is this key's.)
    palisade_audit::observe::verify_refusals(&mut report, &keys);
    let mine: Vec<_> = report
        .recent_rejections
        .iter()
        .filter(|r| r["lock"] == lock.as_str())
        .collect();
    assert_eq!(mine.len(), 1, "{:?}", report.recent_rejections);
    assert_eq!(
        (&mine[0]["epoch"], &mine[0]["fence"], &mine[0]["reason"]),
        (&"50".into(), &"51".into(), &"stale_epoch".into())
    );
    assert!(mine[0]["at_ms"].as_i64().is_some_and(|ms| ms > 0));
    assert!(report
        .rejection_totals
        .get("stale_epoch")
        .is_some_and(|n| *n >= 1));
    a_forged_refusal_is_not_shown(&client, &http, &boundary, &lock, &keys).await;
    client
        .batch_execute(&format!(
            "BEGIN; SELECT palisade_drop_guard('{table}'); DROP TABLE {table}; COMMIT"
        ))
        .await
        .unwrap();
}

/// A refusal recorded with a forged token (signed by no key the coordinator has) is not shown,
/// and is reported; no token is shown.
async fn a_forged_refusal_is_not_shown(
    client: &tokio_postgres::Client,
    http: &reqwest::Client,
    boundary: &Boundary,
    lock: &LockName,
    keys: &TokenVerifier,
) {
    let forger = palisade_core::TokenSigner::from_secret_bytes(&[14; 32]);
    let framed = palisade_core::HolderId::new("framed").unwrap();
    let forged = forger.sign(
        lock,
        palisade_core::Epoch(49),
        &framed,
        &palisade_core::Principal::anonymous(),
        0,
    );
    let recorded: bool = client
        .query_one("SELECT palisade_record_refusal($1)", &[&forged])
        .await
        .unwrap()
        .get(0);
    assert!(recorded, "the database cannot tell a forged token");
    let mut report = observe(
        http,
        boundary,
        vec!["refused/*".into()],
        &[lock.to_string()],
    )
    .await;
    palisade_audit::observe::verify_refusals(&mut report, keys);
    assert!(
        report.problems.iter().any(|p| p.code == "forged_refusal"),
        "{:?}",
        report.problems
    );
    assert!(report
        .rejection_totals
        .get("unverified")
        .is_some_and(|n| *n >= 1));
    let epochs: Vec<&Value> = report
        .recent_rejections
        .iter()
        .filter(|r| r["lock"] == lock.as_str())
        .map(|r| &r["epoch"])
        .collect();
    assert_eq!(epochs, vec!["50"], "only the genuine refusal is shown");
    assert!(report
        .recent_rejections
        .iter()
        .all(|r| r.get("token").is_none()));
}
