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
