//! P4: a PostgreSQL row fenced above anything the coordinator issued for its lock — a bare
//! `last_fence = 9e18` written by SQL before the table required tokens, or the epoch of a
//! forged token presented after — refuses the lock's owner for good. `palisade audit` reports
//! it as critical (`poisoned_fence`, not as a coordinator restore), `palisade resource
//! repair-fence` puts the row just below the coordinator's floor, and the owner writes again.

use crate::common;
use crate::poisoned_floor::{findings, serve_with_policy};

use palisade_core::{Epoch, HolderId, LockName, Principal, TokenSigner};
use serde_json::Value;

/// The statement the docs give SQL writers: the token, not a bare epoch.
const UPDATE: &str = "UPDATE {t} SET payload = 'x', last_fence = t.epoch \
     FROM palisade_present_token('{token}') AS t(epoch) \
     WHERE id = 1 AND last_fence OPERATOR(pg_catalog.<) t.epoch";

#[test]
fn p4_a_fence_no_signed_token_backs_is_poisoned_and_repair_fence_repairs_it() {
    let url = std::env::var("PALISADE_TEST_POSTGRES_URL")
        .expect("PALISADE_TEST_POSTGRES_URL is not set: run ./scripts/test");
    let id = std::process::id();
    let (table, lock) = (
        format!("poisoned_fence_{id}"),
        format!("poisoned/fence-{id}"),
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (client, connection) = runtime
        .block_on(tokio_postgres::connect(&url, tokio_postgres::NoTls))
        .unwrap();
    runtime.spawn(connection);
    let sql = |statement: &str| runtime.block_on(client.batch_execute(statement));
    let run = |args: &[&str]| {
        let out = std::process::Command::new(common::BINARY)
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    sql(&format!(
        "CREATE TABLE {table} (id bigint PRIMARY KEY, payload text NOT NULL, \
         last_fence bigint NOT NULL DEFAULT 0); INSERT INTO {table} VALUES (1, 'empty', 0)"
    ))
    .unwrap();
    let guard = ["resource", "guard", "--postgres", &url, "--table", &table];
    run(&[&guard[..], &["--lock", &lock, "--bare-epochs"]].concat());
    let dir = tempfile::tempdir().unwrap();
    let server = serve_with_policy(dir.path(), &table, &url);
    let acquired = server.cli(&["lock", "acquire", &lock, "--ttl", "60s", "--json"]);
    assert!(acquired.status.success(), "{acquired:?}");
    let acquired: Value = serde_json::from_slice(&acquired.stdout).unwrap();
    let token = acquired["token"].as_str().unwrap().to_owned();
    let epoch: u64 = palisade_core::json::read(&acquired["epoch"]).unwrap();
    let floor_of = format!("SELECT palisade_learn_floor('{lock}', 0)");
    sql(&floor_of).unwrap();

    // Before the table requires tokens: a bare number, far above anything issued.
    sql(&format!(
        "UPDATE {table} SET last_fence = 9000000000000000000 WHERE id = 1"
    ))
    .unwrap();
    let poisoned = findings(&server, "poisoned_fence", &lock);
    assert!(
        poisoned.len() == 1 && poisoned[0].starts_with("\"critical\""),
        "{poisoned:?}"
    );
    assert!(findings(&server, "fence_ahead", &lock).is_empty());
    assert!(!findings(&server, "bare_epochs", &table).is_empty());
    let repair = [
        "resource",
        "repair-fence",
        "--postgres",
        &url,
        "--table",
        &table,
        "--lock",
        &lock,
    ];
    let repaired = server.cli(&repair);
    let said = String::from_utf8_lossy(&repaired.stdout);
    assert!(said.starts_with("1 row(s)"), "{repaired:?}");
    assert!(findings(&server, "poisoned_fence", &lock).is_empty());
    let update = |token: &str| UPDATE.replace("{t}", &table).replace("{token}", token);
    sql(&update(&token)).unwrap();

    // Requiring tokens: the bare number is refused; a forged token cannot be told apart by
    // the database, and the audit finds what it fenced.
    run(&[&guard[..], &["--lock", &lock]].concat());
    assert!(findings(&server, "bare_epochs", &table).is_empty());
    let bare = sql(&format!(
        "UPDATE {table} SET last_fence = 9000000000000000000 WHERE id = 1"
    ))
    .unwrap_err();
    assert_eq!(bare.code().unwrap().code(), "P5010", "{bare}");
    let forged = TokenSigner::from_secret_bytes(&[66; 32]).sign(
        &LockName::new(lock.clone()).unwrap(),
        Epoch(epoch + 1_000_000),
        &HolderId::new("forger").unwrap(),
        &Principal::anonymous(),
        0,
    );
    sql(&update(&forged)).unwrap();
    let poisoned = findings(&server, "poisoned_fence", &lock);
    assert!(
        poisoned.len() == 1 && poisoned[0].contains("does not verify"),
        "{poisoned:?}"
    );
    assert!(server.cli(&repair).status.success());
    assert!(findings(&server, "poisoned_fence", &lock).is_empty());
    // The owner's own token writes again, and is not reported.
    sql(&update(&token)).unwrap();
    assert!(findings(&server, "poisoned_fence", &lock).is_empty());
    sql(&format!(
        "SELECT palisade_drop_guard('{table}'); DROP TABLE {table}"
    ))
    .unwrap();
}
