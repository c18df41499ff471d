//! P4/P6: a floor nobody signed, recorded in a PostgreSQL boundary — one call of
//! `palisade_learn_floor` by a role that may record floors, or a man in the middle's 2^63-1 —
//! refuses the lock's owner for good. `palisade audit` reports it as critical
//! (`poisoned_floor`), as it does a recorded statement that does not verify;
//! `palisade resource forget-floor` repairs it, and a floor recorded with the coordinator's
//! own statement is not reported.

use crate::common;

use common::ServerProcess;
use serde_json::Value;

/// The audit's findings of `code` whose message names `lock`.
pub(crate) fn findings(server: &ServerProcess, code: &str, lock: &str) -> Vec<String> {
    // The coordinator answers an audit asked within AUDIT_REUSE of the last with that one.
    std::thread::sleep(
        palisade_server::console::AUDIT_REUSE + std::time::Duration::from_millis(100),
    );
    let out = server.cli(&["audit", "--json"]);
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
    report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["code"] == code && f["message"].as_str().unwrap_or("").contains(lock))
        .map(|f| format!("{}: {}", f["severity"], f["message"]))
        .collect()
}

/// A coordinator whose policy names `table` at `url` as the boundary of `poisoned/*`.
pub(crate) fn serve_with_policy(dir: &std::path::Path, table: &str, url: &str) -> ServerProcess {
    let policy = dir.join("policy.toml");
    std::fs::write(
        &policy,
        format!(
            "[[lock]]\npattern = \"poisoned/*\"\nclass = \"critical\"\n\
             boundary = {{ kind = \"postgres\", table = \"{table}\", url = \"{url}\" }}\n"
        ),
    )
    .unwrap();
    ServerProcess::start_with_policy(&policy, &dir.join("data"))
}

#[test]
fn p4_p6_a_floor_nobody_signed_is_poisoned_and_forget_floor_repairs_it() {
    let url = std::env::var("PALISADE_TEST_POSTGRES_URL")
        .expect("PALISADE_TEST_POSTGRES_URL is not set: run ./scripts/test");
    let id = std::process::id();
    let (table, lock, other) = (
        format!("poisoned_{id}"),
        format!("poisoned/{id}"),
        format!("poisoned/{id}-other"),
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (client, connection) = runtime
        .block_on(tokio_postgres::connect(&url, tokio_postgres::NoTls))
        .unwrap();
    runtime.spawn(connection);
    let sql = |statement: &str| runtime.block_on(client.batch_execute(statement)).unwrap();
    sql(&format!(
        "CREATE TABLE {table} (id bigint PRIMARY KEY, payload text NOT NULL, \
         last_fence bigint NOT NULL DEFAULT 0)"
    ));
    let guard = std::process::Command::new(common::BINARY)
        .args(["resource", "guard", "--postgres", &url, "--table", &table])
        .args(["--lock", &lock])
        .output()
        .unwrap();
    assert!(guard.status.success(), "{guard:?}");
    let dir = tempfile::tempdir().unwrap();
    let server = serve_with_policy(dir.path(), &table, &url);
    let acquired = server.cli(&["lock", "acquire", &lock, "--ttl", "60s", "--json"]);
    assert!(acquired.status.success(), "{acquired:?}");

    // A floor nobody signed, far above anything the coordinator issued.
    sql(&format!(
        "SELECT palisade_learn_floor('{lock}', 9223372036854775807)"
    ));
    let poisoned = findings(&server, "poisoned_floor", &lock);
    assert!(
        poisoned.len() == 1 && poisoned[0].starts_with("\"critical\""),
        "{poisoned:?}"
    );
    assert!(poisoned[0].contains("forget-floor"), "{poisoned:?}");
    let repaired = std::process::Command::new(common::BINARY)
        .args([
            "resource",
            "forget-floor",
            "--postgres",
            &url,
            "--lock",
            &lock,
        ])
        .output()
        .unwrap();
    assert!(repaired.status.success(), "{repaired:?}");
    assert!(String::from_utf8_lossy(&repaired.stdout).contains("forgot floor"));
    assert!(findings(&server, "poisoned_floor", &lock).is_empty());

    // The coordinator's own statement, recorded with its floor: not reported. Another lock's
    // statement replayed for this one: poisoned.
    let answer = |name: &str| -> (i64, String) {
        let path = format!("/v1/locks/{}/floor", name.replace('/', "%2F"));
        let (code, body) = server.http("GET", &path, None, "");
        assert_eq!(code, 200, "{body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        let floor = palisade_core::json::read(&body["floor"]).unwrap();
        (floor as i64, body["statement"].as_str().unwrap().to_owned())
    };
    let (floor, statement) = answer(&lock);
    sql(&format!(
        "SELECT palisade_learn_floor('{lock}', {floor}, '{statement}')"
    ));
    assert!(findings(&server, "poisoned_floor", &lock).is_empty());
    let (_, replayed) = answer(&other);
    sql(&format!(
        "DELETE FROM palisade_lock_floors WHERE lock = '{lock}'; \
         SELECT palisade_learn_floor('{lock}', {floor}, '{replayed}')"
    ));
    let poisoned = findings(&server, "poisoned_floor", &lock);
    assert!(
        poisoned.len() == 1 && poisoned[0].contains("does not verify"),
        "{poisoned:?}"
    );
    sql(&format!(
        "DELETE FROM palisade_lock_floors WHERE lock = '{lock}'; \
         SELECT palisade_drop_guard('{table}'); DROP TABLE {table}"
    ));
}
