//! `palisade resource serve|put|get|activate` as processes: the stale owner is refused with
//! exit code 5, and an accepted write survives kill -9 of the store (P2, P8).

use crate::common;

use common::{ResourceProcess, ServerProcess};
use serde_json::Value;

fn acquire(coordinator: &ServerProcess, lock: &str) -> (u64, String, String) {
    let output = coordinator.cli(&["lock", "acquire", lock, "--ttl", "1m", "--json"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let grant: Value = serde_json::from_slice(&output.stdout).unwrap();
    let token = grant["token"].as_str().unwrap().to_owned();
    (
        palisade_core::json::read(&grant["epoch"]).unwrap(),
        token,
        grant["lease_id"].as_str().unwrap().to_owned(),
    )
}

#[test]
fn p2_p8_the_stale_owner_is_refused_and_accepted_writes_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let coordinator = ServerProcess::start(&dir.path().join("coordinator"));
    let store_dir = dir.path().join("store");
    let mut store = ResourceProcess::start(&store_dir, "activated", &coordinator.url);

    let (e1, old, lease) = acquire(&coordinator, "report/7");
    assert!(store
        .cli(&["activate", "report/7", "--token", &old])
        .status
        .success());
    let put = store.cli(&[
        "put", "report/7", "summary", "from A", "--token", &old, "--json",
    ]);
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
    assert!(coordinator
        .cli(&["lock", "release", &lease])
        .status
        .success());

    let (e2, new, _) = acquire(&coordinator, "report/7");
    assert!(e2 > e1);
    let activated = store.cli(&["activate", "report/7", "--token", &new, "--json"]);
    let fence: Value = serde_json::from_slice(&activated.stdout).unwrap();
    assert_eq!(palisade_core::json::read(&fence["fence"]), Some(e2));
    let stale = store.cli(&["put", "report/7", "summary", "late A", "--token", &old]);
    assert_eq!(stale.status.code(), Some(5));
    assert!(String::from_utf8_lossy(&stale.stderr).contains("stale_epoch"));
    assert!(store
        .cli(&["put", "report/7", "summary", "from B", "--token", &new])
        .status
        .success());

    store.kill9();
    let store = ResourceProcess::start(&store_dir, "activated", &coordinator.url);
    let read = store.cli(&["get", "report/7", "summary", "--json"]);
    let value: Value = serde_json::from_slice(&read.stdout).unwrap();
    assert_eq!(
        (
            value["value"].as_str(),
            palisade_core::json::read(&value["epoch"])
        ),
        (Some("from B"), Some(e2))
    );
    // The fence survived too: the old owner is still out.
    let stale = store.cli(&["put", "report/7", "summary", "later A", "--token", &old]);
    assert_eq!(stale.status.code(), Some(5));
    let forged = store.cli(&["put", "report/7", "summary", "x", "--token", "pt1.AAAA"]);
    assert_eq!(forged.status.code(), Some(5));
    assert!(String::from_utf8_lossy(&forged.stderr).contains("invalid_token"));
}

/// P5: `palisade resource guard` installs the bypass guard from the command line, for users
/// without Rust (the Python client's README points to it): afterwards an UPDATE that does not
/// raise `last_fence` fails in the database, TRUNCATE fails, and the fenced statement still
/// writes. Running it again changes nothing; without the lock it says what to give.
#[test]
fn p5_resource_guard_installs_the_bypass_guard_from_the_command_line() {
    let url = std::env::var("PALISADE_TEST_POSTGRES_URL")
        .expect("PALISADE_TEST_POSTGRES_URL is not set: run ./scripts/test");
    let table = format!("guard_cli_{}", std::process::id());
    // A lock of its own: another test's floor for a shared name would be known here.
    let lock = format!("report/guard-cli-{}", std::process::id());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (client, connection) = runtime
        .block_on(tokio_postgres::connect(&url, tokio_postgres::NoTls))
        .unwrap();
    runtime.spawn(connection);
    runtime
        .block_on(client.batch_execute(&format!(
            "CREATE TABLE {table} (id bigint PRIMARY KEY, payload text NOT NULL, \
             last_fence bigint NOT NULL DEFAULT 0); INSERT INTO {table} VALUES (7, 'empty', 0)"
        )))
        .unwrap();
    let guard = |extra: &[&str]| {
        std::process::Command::new(common::BINARY)
            .args(["resource", "guard", "--postgres", &url, "--table", &table])
            .args(extra)
            .output()
            .unwrap()
    };
    let refused = guard(&[]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--lock NAME"));
    for _ in 0..2 {
        let out = guard(&["--lock", &lock]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let sql = |statement: String| runtime.block_on(client.execute(&statement, &[]));
    let bypass = sql(format!("UPDATE {table} SET payload = 'x' WHERE id = 7")).unwrap_err();
    // Refused for its missing token (P5010) before its missing raise (P5001): the guard's
    // triggers run in name order.
    assert_eq!(bypass.code().unwrap().code(), "P5010", "{bypass}");
    assert!(sql(format!("TRUNCATE {table}")).is_err());
    // The guard includes the lock floor of migration 8: plain SQL meets it first.
    let unknown = sql(format!(
        "UPDATE {table} SET payload = 'y', last_fence = 5 WHERE id = 7 AND last_fence < 5"
    ))
    .unwrap_err();
    assert_eq!(unknown.code().unwrap().code(), "P5008", "{unknown}");
    sql(format!("SELECT palisade_learn_floor('{lock}', 5)")).unwrap();
    // The guard requires the token (migration 11): a bare epoch is refused, the token's
    // statement writes.
    let bare =
        format!("UPDATE {table} SET payload = 'y', last_fence = 5 WHERE id = 7 AND last_fence < 5");
    assert_eq!(sql(bare).unwrap_err().code().unwrap().code(), "P5010");
    let token = palisade_core::TokenSigner::from_secret_bytes(&[5; 32]).sign(
        &palisade_core::LockName::new(lock.clone()).unwrap(),
        palisade_core::Epoch(5),
        &palisade_core::HolderId::new("cli-test").unwrap(),
        &palisade_core::Principal::anonymous(),
        0,
    );
    let fenced = format!(
        "UPDATE {table} SET payload = 'y', last_fence = t.epoch \
         FROM palisade_present_token('{token}') AS t(epoch) \
         WHERE id = 7 AND last_fence OPERATOR(pg_catalog.<) t.epoch"
    );
    assert_eq!(sql(fenced).unwrap(), 1);
    runtime
        .block_on(client.batch_execute(&format!(
            "BEGIN; SELECT palisade_drop_guard('{table}'); DROP TABLE {table}; COMMIT"
        )))
        .unwrap();
}
