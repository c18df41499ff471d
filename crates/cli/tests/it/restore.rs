//! Restore safety (P6) with real processes: a single node's data directory copied back with
//! `cp -a` (or deleted) never issues an epoch twice, and `palisade restore` makes a data
//! directory whose epochs start above everything issued — the backup, the high-water file, the
//! fences of the resources named with `--floor-from`, the clock — so the next owner makes
//! progress at a resource that saw epochs issued after the backup, and an old owner's token is
//! refused there.
//!
//! Before: the copied-back directory issued epochs 4–6 a second time (and a third time after a
//! second copy-back), and the resource refused every one of them.

use crate::common;

use std::path::Path;
use std::process::{Command, Output};

use common::{cp_a, ResourceProcess, ServerProcess, BINARY};
use serde_json::Value;

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `lock acquire LOCK --json` then `lock release`; the grant.
fn cycle(server: &ServerProcess, lock: &str) -> Value {
    let out = server.cli(&["lock", "acquire", lock, "--ttl", "1m", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let grant: Value = serde_json::from_slice(&out.stdout).unwrap();
    let out = server.cli(&["lock", "release", grant["lease_id"].as_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    grant
}

/// A grant's epoch: a decimal string in JSON, since epochs pass 2^53 (`palisade_core::json`).
fn epoch(grant: &Value) -> u64 {
    grant["epoch"].as_str().unwrap().parse().unwrap()
}

#[test]
fn p6_a_data_directory_copied_back_or_deleted_never_issues_an_epoch_twice() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let copy = dir.path().join("copy");
    let mut issued = Vec::new();

    let mut server = ServerProcess::start(&data);
    issued.extend((0..3).map(|_| epoch(&cycle(&server, "restore/a"))));
    assert!(server.terminate().success());
    cp_a(&data, &copy); // the operator's "backup"

    let mut server = ServerProcess::start(&data);
    issued.extend((0..3).map(|_| epoch(&cycle(&server, "restore/a"))));
    assert!(server.terminate().success());

    // Copied back, twice over; then deleted outright (the signing key with it).
    for round in 0..3 {
        std::fs::remove_dir_all(&data).unwrap();
        if round < 2 {
            cp_a(&copy, &data);
        }
        let mut server = ServerProcess::start(&data);
        let next = epoch(&cycle(&server, "restore/a"));
        assert!(
            next > *issued.iter().max().unwrap(),
            "round {round}: epoch {next} was issued again or below {issued:?}"
        );
        issued.push(next);
        // A crash (no clean stop) keeps the bound too.
        server.kill9();
    }
    let mut sorted = issued.clone();
    sorted.dedup();
    assert_eq!(sorted, issued, "epochs strictly increase: {issued:?}");
    // The bound lives beside the data directory, not in it.
    assert!(dir.path().join("data.high-water").exists());
}

#[test]
fn p6_restore_starts_above_every_epoch_a_resource_saw_and_the_next_owner_writes() {
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("first");
    let mut coordinator = ServerProcess::start(&first);
    let port = coordinator.url.rsplit(':').next().unwrap().to_owned();
    let store = ResourceProcess::start(&dir.path().join("store"), "strict", &coordinator.url);
    let put =
        |token: &str, value: &str| store.cli(&["put", "orders/1", "k", value, "--token", token]);
    let early = cycle(&coordinator, "orders/1");
    assert!(put(early["token"].as_str().unwrap(), "early")
        .status
        .success());

    // An online backup, then more owners after it (the backup cannot know them).
    let backup = dir.path().join("backup");
    an_online_backup_holds_the_last_epoch(&coordinator, &backup, epoch(&early));
    let mut last = early.clone();
    for _ in 0..3 {
        last = cycle(&coordinator, "orders/1");
    }
    assert!(put(last["token"].as_str().unwrap(), "last")
        .status
        .success());
    assert!(coordinator.terminate().success());

    // The machine is lost: the data directory and its high-water file with it.
    std::fs::remove_dir_all(&first).unwrap();
    std::fs::remove_file(dir.path().join("first.high-water")).unwrap();

    let second = dir.path().join("second");
    a_tampered_backup_is_refused(dir.path(), &backup, epoch(&early), &second);

    // A floor source that cannot be read stops the restore.
    let out = restore(&backup, &second, &["--floor-from", "http://127.0.0.1:1"]);
    assert!(!out.status.success());
    assert!(!second.exists());

    let out = restore(&backup, &second, &["--floor-from", &store.url]);
    assert!(out.status.success(), "{}", stderr(&out));
    let record: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        palisade_core::json::read(&record["floor"]),
        Some(epoch(&last)),
        "{record}"
    );
    let counter = palisade_core::json::read(&record["counter"]).unwrap();
    assert!(counter > epoch(&last));

    // The restored coordinator (same address: the store trusts its keys from there) starts
    // above the floor, and the next owner writes at the store that saw the later epochs.
    let listen = format!("127.0.0.1:{port}");
    let coordinator = ServerProcess::start_with(&["serve", "--listen", &listen], &second);
    let next = cycle(&coordinator, "orders/1");
    assert!(epoch(&next) > counter);
    // The store learns the new signing key at once: a token with an unknown key waits for
    // the next fetch (at most one a second) instead of being refused.
    let out = put(next["token"].as_str().unwrap(), "next");
    assert!(out.status.success(), "{}", stderr(&out));
    // The last owner before the restore is refused (its key is gone, its epoch is lower).
    assert!(!put(last["token"].as_str().unwrap(), "stale")
        .status
        .success());

    // Restoring the same backup again is as safe as once: above what the first restore issued.
    let third = dir.path().join("third");
    let second_bound = dir.path().join("second.high-water");
    let out = restore(
        &backup,
        &third,
        &["--high-water-file", second_bound.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let again: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        palisade_core::json::read(&again["counter"]).unwrap() > epoch(&next),
        "{again}"
    );
    // And into a directory that holds a coordinator: refused.
    let out = restore(&backup, &second, &[]);
    assert!(stderr(&out).contains("already holds"), "{}", stderr(&out));
}

/// An online backup of `coordinator` into `backup` records `last` as its last epoch, as a
/// decimal string (which jq and JavaScript read exactly, as every epoch in JSON).
fn an_online_backup_holds_the_last_epoch(coordinator: &ServerProcess, backup: &Path, last: u64) {
    let out = coordinator.cli(&["backup", "--out", backup.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let taken: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(palisade_core::json::read(&taken["last_epoch"]), Some(last));
    assert!(taken["last_epoch"].is_string(), "{taken}");
}

/// `palisade restore --json --from FROM --data-dir DATA EXTRA…`.
fn restore(from: &Path, data: &Path, extra: &[&str]) -> Output {
    Command::new(BINARY)
        .args(["restore", "--json", "--from"])
        .arg(from)
        .arg("--data-dir")
        .arg(data)
        .args(extra)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

/// `backup` with its last epoch (`last`) raised by one in its text is refused for its checksum,
/// and nothing is created at `target`.
fn a_tampered_backup_is_refused(dir: &Path, backup: &Path, last: u64, target: &Path) {
    let tampered = dir.join("tampered");
    let text = std::fs::read_to_string(backup).unwrap();
    let epoch_line = format!("\"last_epoch\": \"{last}\"");
    let forged = format!("\"last_epoch\": \"{}\"", last + 1);
    assert_eq!(epoch_line.len(), forged.len());
    assert!(text.contains(&epoch_line), "{text}");
    std::fs::write(&tampered, text.replace(&epoch_line, &forged)).unwrap();
    let out = restore(&tampered, target, &[]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("checksum"), "{}", stderr(&out));
    assert!(!target.exists(), "nothing is created from a bad backup");
}

#[test]
fn an_offline_backup_needs_a_stopped_single_node() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = ServerProcess::start(&data);
    let granted = cycle(&server, "offline/1");
    let backup = |out: &str| {
        Command::new(BINARY)
            .args(["backup", "--json", "--data-dir"])
            .arg(&data)
            .args(["--out", out])
            .env("RUST_LOG", "warn")
            .output()
            .unwrap()
    };
    let file = dir.path().join("b");
    let out = backup(file.to_str().unwrap());
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--endpoint"), "{}", stderr(&out));
    assert!(server.terminate().success());
    let out = backup(file.to_str().unwrap());
    assert!(out.status.success(), "{}", stderr(&out));
    let taken: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        palisade_core::json::read(&taken["last_epoch"]),
        Some(epoch(&granted))
    );
    assert_eq!(taken["taken"], "offline");
}

/// P6 at the resource: a reference store whose directory is copied back (`cp -a`) forgot the
/// fence the next owner raised, so the old owner's token would be accepted again. Found
/// behind its witness, the store accepts no write (503 restore_required) until
/// `palisade resource restore` applies a floor the coordinator issues and signs; from then on
/// every token issued before the floor is refused, and the next owner writes.
#[test]
fn p6_a_copied_back_store_writes_nothing_until_resource_restore_then_refuses_old_owners() {
    let dir = tempfile::tempdir().unwrap();
    let coordinator = ServerProcess::start(&dir.path().join("coordinator"));
    let store_dir = dir.path().join("store");
    let copy = dir.path().join("store-copy");
    let put = |store: &ResourceProcess, grant: &Value, value: &str| {
        store.cli(&[
            "put",
            "ledger/1",
            "balance",
            value,
            "--token",
            grant["token"].as_str().unwrap(),
        ])
    };

    let mut store = ResourceProcess::start(&store_dir, "strict", &coordinator.url);
    let old = cycle(&coordinator, "ledger/1"); // the old owner, paused later
    assert!(put(&store, &old, "100").status.success());
    store.kill9();
    cp_a(&store_dir, &copy); // the operator's copy of the store

    let mut store = ResourceProcess::start(&store_dir, "strict", &coordinator.url);
    let new = cycle(&coordinator, "ledger/1");
    assert!(put(&store, &new, "90").status.success());
    let stale = put(&store, &old, "110");
    assert_eq!(stale.status.code(), Some(5), "{}", stderr(&stale));
    store.kill9();

    // Copied back: the fence of `new` is forgotten. Nothing is written, not even by `new`.
    std::fs::remove_dir_all(&store_dir).unwrap();
    cp_a(&copy, &store_dir);
    let mut store = ResourceProcess::start(&store_dir, "strict", &coordinator.url);
    for grant in [&old, &new] {
        let refused = put(&store, grant, "110");
        assert_eq!(refused.status.code(), Some(4), "{}", stderr(&refused));
        assert!(
            stderr(&refused).contains("restore_required"),
            "{}",
            stderr(&refused)
        );
    }
    // The restore needs the store stopped.
    let restore = || {
        Command::new(BINARY)
            .args(["resource", "restore", "--json", "--data-dir"])
            .arg(&store_dir)
            .args(["--endpoint", &coordinator.url])
            .env("RUST_LOG", "warn")
            .output()
            .unwrap()
    };
    let busy = restore();
    assert!(!busy.status.success());
    assert!(stderr(&busy).contains("stopped"), "{}", stderr(&busy));
    store.kill9();
    let out = restore();
    assert!(out.status.success(), "{}", stderr(&out));
    let applied: Value = serde_json::from_slice(&out.stdout).unwrap();
    let floor = palisade_core::json::read(&applied["floor"]).unwrap();
    assert!(floor > epoch(&new), "{applied}");
    assert_eq!(
        palisade_core::json::read(&applied["highest_before"]),
        Some(epoch(&old))
    );
    assert_eq!(
        palisade_core::json::read(&applied["witness_saw"]),
        Some(epoch(&new))
    );

    // Every token issued before the floor is refused; the next owner writes.
    let store = ResourceProcess::start(&store_dir, "strict", &coordinator.url);
    for grant in [&old, &new] {
        let refused = put(&store, grant, "110");
        assert_eq!(refused.status.code(), Some(5), "{}", stderr(&refused));
    }
    let next = cycle(&coordinator, "ledger/1");
    assert!(epoch(&next) > floor);
    let accepted = put(&store, &next, "90");
    assert!(accepted.status.success(), "{}", stderr(&accepted));
    let address = store.url.trim_start_matches("http://");
    let (status, body) = common::http_request(address, "GET", "/v1/info", None, "");
    assert_eq!(status, 200, "{body}");
    let info: Value = serde_json::from_str(body.rsplit("\r\n\r\n").next().unwrap()).unwrap();
    assert_eq!(
        palisade_core::json::read(&info["restore_floor"]),
        Some(floor)
    );
    assert!(info["restore_required"].is_null(), "{info}");
}

/// P6 at a PostgreSQL database restored from a backup: `palisade resource restore --postgres`
/// takes an epoch from the coordinator (signed, checked against its keys) as the floor, and
/// from then on a row written at or below it fails — here in plain SQL, as an old owner's
/// write would through any path.
#[test]
fn p6_resource_restore_postgres_floors_the_database_at_an_epoch_the_coordinator_issued() {
    let maintenance = std::env::var("PALISADE_TEST_POSTGRES_URL")
        .expect("PALISADE_TEST_POSTGRES_URL is not set: run ./scripts/test");
    let name = format!("cli_restore_{}", std::process::id());
    let (server, _) = maintenance.rsplit_once('/').unwrap();
    let url = format!("{server}/{name}");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let admin = |sql: String| {
        runtime.block_on(async {
            let client = common::pg_connect(&maintenance).await;
            client.batch_execute(&sql).await.unwrap();
        })
    };
    admin(format!("DROP DATABASE IF EXISTS {name}"));
    admin(format!("CREATE DATABASE {name}"));

    let dir = tempfile::tempdir().unwrap();
    let coordinator = ServerProcess::start(&dir.path().join("data"));
    let old = cycle(&coordinator, "ledger/pg");
    let out = coordinator.cli(&["resource", "restore", "--postgres", &url, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let applied: Value = serde_json::from_slice(&out.stdout).unwrap();
    let floor = palisade_core::json::read(&applied["floor"]).unwrap();
    assert!(floor > epoch(&old), "{applied}");
    assert!(
        !applied["postgres"].as_str().unwrap().contains('@'),
        "{applied}"
    );
    let next = cycle(&coordinator, "ledger/pg"); // the next owner, above the floor

    runtime.block_on(plain_sql_keeps_the_floor(
        &url,
        floor,
        epoch(&old),
        epoch(&next),
    ));
    // Again: harmless, the floor only rises.
    let out = coordinator.cli(&["resource", "restore", "--postgres", &url, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let again: Value = serde_json::from_slice(&out.stdout).unwrap();
    let floor = palisade_core::json::read(&again["floor"]).unwrap();
    assert!(floor > epoch(&next));
    // A database ahead of the coordinator (a coordinator restored without --floor-from it):
    // the floor would not cover what the database holds, so the restore is refused.
    runtime.block_on(async {
        let client = common::pg_connect(&url).await;
        let ahead = floor as i64 + 1_000;
        client
            .execute(
                "INSERT INTO palisade_kv (lock, key, value, epoch) VALUES ('ledger/pg', 'k2', \
                 '\\x00', $1)",
                &[&ahead],
            )
            .await
            .unwrap();
    });
    let out = coordinator.cli(&["resource", "restore", "--postgres", &url]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("behind the database"),
        "{}",
        stderr(&out)
    );
    drop(coordinator);
    admin(format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"
    ));
    admin(format!("DROP DATABASE IF EXISTS {name}"));
}

/// In plain SQL, the database at `url` holds `floor` as its restore floor, refuses a row at
/// the old owner's epoch (`old`, below it) with P5007, and takes one at the next owner's
/// (`next`, above it).
async fn plain_sql_keeps_the_floor(url: &str, floor: u64, old: u64, next: u64) {
    let client = common::pg_connect(url).await;
    let recorded: i64 = client
        .query_one("SELECT floor FROM palisade_restore_floor", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(recorded as u64, floor);
    let insert = "INSERT INTO palisade_kv (lock, key, value, epoch) VALUES ('ledger/pg', 'k', \
                  '\\x00', $1)";
    let error = client.execute(insert, &[&(old as i64)]).await.unwrap_err();
    assert_eq!(error.code().unwrap().code(), "P5007", "{error}");
    assert!(next > floor);
    // Plain SQL in a database whose lock floor is not known yet (migration 8): what the
    // coordinator would answer for the lock, its last owner's epoch, is recorded first.
    client
        .execute(
            "SELECT palisade_learn_floor('ledger/pg', $1)",
            &[&(next as i64)],
        )
        .await
        .unwrap();
    client.execute(insert, &[&(next as i64)]).await.unwrap();
}

/// A `palisade serve` that must refuse to start: its exit status and stderr.
fn serve_refused(data: &Path, cwd: &Path) -> String {
    let out = Command::new(BINARY)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data)
        .current_dir(cwd)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(!out.status.success(), "started: {}", stderr(&out));
    stderr(&out)
}

/// The whole volume — the data directory *and* every file beside it, the high-water bound
/// included — put back from a snapshot, as a VM, disk or Kubernetes volume snapshot restore
/// does. Nothing on the volume can tell what was issued after the snapshot; the clock floor
/// at every start can (P1, P6; `palisade_core::clock`).
///
/// Before: epochs 65538–65540 were granted a second time, to new owners, with no warning.
#[test]
fn p1_p6_a_whole_volume_put_back_from_a_snapshot_never_issues_an_epoch_twice() {
    let dir = tempfile::tempdir().unwrap();
    let volume = dir.path().join("volume");
    let snapshot = dir.path().join("snapshot");
    let data = volume.join("data");
    std::fs::create_dir_all(&volume).unwrap();
    let mut issued = Vec::new();
    let mut server = ServerProcess::start(&data);
    issued.push(epoch(&cycle(&server, "volume/a")));
    assert!(server.terminate().success());
    cp_a(&volume, &snapshot); // the snapshot: data and data.high-water together
    assert!(snapshot.join("data.high-water").exists());

    for round in 0..3 {
        let mut server = ServerProcess::start(&data);
        issued.extend((0..3).map(|_| epoch(&cycle(&server, "volume/a"))));
        // A clean stop, then a crash: neither may matter.
        if round % 2 == 0 {
            assert!(server.terminate().success());
        } else {
            server.kill9();
        }
        std::fs::remove_dir_all(&volume).unwrap();
        cp_a(&snapshot, &volume);
    }
    let mut server = ServerProcess::start(&data);
    let next = epoch(&cycle(&server, "volume/a"));
    assert!(
        next > *issued.iter().max().unwrap(),
        "{next} after {issued:?}"
    );
    issued.push(next);
    server.kill9();
    let mut sorted = issued.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted, issued, "epochs strictly increase: {issued:?}");
}

/// `--data-dir .` (or any directory that holds its own side files) would carry the
/// high-water bound inside the directory, so a copy-back would bring it back: refused with
/// the fix. Before: accepted silently.
#[test]
fn p6_a_data_directory_that_would_hold_its_own_side_files_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let error = serve_refused(Path::new("."), dir.path());
    assert!(error.contains("inside the data directory"), "{error}");
    assert!(error.contains("--data-dir ./palisade-data"), "{error}");
    // Nothing was created there.
    assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none());
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let error = serve_refused(Path::new("sub/.."), dir.path());
    assert!(error.contains("inside the data directory"), "{error}");
}

/// A lease log emptied in place (`truncate -s 0`) is refused like a removed one: starting
/// would issue from an empty state as if nothing had been granted. Before: it started with
/// no warning.
#[test]
fn p8_an_emptied_lease_log_is_refused_like_a_removed_one() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = ServerProcess::start(&data);
    cycle(&server, "emptied/a");
    assert!(server.terminate().success());
    let log = data.join("coordinator.log");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&log)
        .unwrap()
        .set_len(0)
        .unwrap();
    let error = serve_refused(&data, dir.path());
    assert!(error.contains("(emptied)"), "{error}");
    assert!(error.contains("palisade restore"), "{error}");
}

/// P8: a lease log cut short at an offset (here the middle of its records, with leases held)
/// is refused with what to do: the cut-off part may hold acknowledged leases, and another
/// owner could take a lock that was held. Before: it started, and held leases were dropped
/// silently (10, 1 or all 210 of 210, depending on the offset).
#[test]
fn p8_a_lease_log_cut_short_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = ServerProcess::start(&data);
    for i in 0..20 {
        hold(&server, &format!("cut/{i}"));
    }
    assert!(server.terminate().success());
    let log = data.join("coordinator.log");
    let records_end = std::fs::read(&log)
        .unwrap()
        .iter()
        .rposition(|&b| b != 0)
        .unwrap() as u64;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&log)
        .unwrap()
        .set_len(records_end / 2)
        .unwrap();
    let error = serve_refused(&data, dir.path());
    assert!(error.contains("cut short"), "{error}");
    assert!(error.contains("palisade restore"), "{error}");
}

/// `lock acquire LOCK --json` (held); the grant.
fn hold(server: &ServerProcess, lock: &str) -> Value {
    let out = server.cli(&["lock", "acquire", lock, "--ttl", "1m", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// P2, P6: the reference store's whole volume — its data directory *and* the witness beside
/// it — put back from a snapshot taken before a newer owner wrote. Its fence and its witness
/// both went back, so neither can tell; the coordinator's signed floor for the lock, asked
/// at the first write after the start, can: the superseded owner is refused, the current
/// owner goes on. Before: `/v1/info` showed `restore_required: null` and the old owner's
/// write was accepted (200).
#[test]
fn p2_p6_a_store_whose_whole_volume_was_put_back_refuses_the_superseded_owner() {
    let dir = tempfile::tempdir().unwrap();
    let coordinator = ServerProcess::start(&dir.path().join("coordinator"));
    let volume = dir.path().join("volume");
    let snapshot = dir.path().join("snapshot");
    let data = volume.join("store");
    std::fs::create_dir_all(&volume).unwrap();
    let put = |store: &ResourceProcess, token: &str, value: &str| {
        store.cli(&["put", "orders/9", "total", value, "--token", token])
    };
    let mut store = ResourceProcess::start(&data, "strict", &coordinator.url);
    let first = cycle(&coordinator, "orders/9");
    assert!(put(&store, first["token"].as_str().unwrap(), "first")
        .status
        .success());
    assert!(store.terminate().success());
    cp_a(&volume, &snapshot); // before A and B wrote
    let mut store = ResourceProcess::start(&data, "strict", &coordinator.url);
    let a = hold(&coordinator, "orders/9");
    let token_a = a["token"].as_str().unwrap();
    assert!(put(&store, token_a, "from A").status.success());
    let out = coordinator.cli(&["lock", "release", a["lease_id"].as_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let b = hold(&coordinator, "orders/9");
    let token_b = b["token"].as_str().unwrap();
    assert!(put(&store, token_b, "from B").status.success());
    assert_eq!(put(&store, token_a, "A again").status.code(), Some(5));
    assert!(store.terminate().success());

    // The whole volume goes back: fence and witness both from before A wrote.
    std::fs::remove_dir_all(&volume).unwrap();
    cp_a(&snapshot, &volume);
    let store = ResourceProcess::start(&data, "strict", &coordinator.url);
    let stale = put(&store, token_a, "A after the rollback");
    assert_eq!(stale.status.code(), Some(5), "{}", stderr(&stale));
    assert!(stderr(&stale).contains("stale"), "{}", stderr(&stale));
    // The current owner goes on; A stays refused; the value is B's.
    assert!(put(&store, token_b, "B after the rollback")
        .status
        .success());
    assert_eq!(put(&store, token_a, "A once more").status.code(), Some(5));
    let read = store.cli(&["get", "orders/9", "total"]);
    assert_eq!(
        String::from_utf8_lossy(&read.stdout),
        "B after the rollback"
    );
    // Its refusals are recorded like any stale write.
    let info = Command::new(BINARY)
        .args([
            "resource",
            "get",
            "orders/9",
            "total",
            "--json",
            "--resource",
            &store.url,
        ])
        .output()
        .unwrap();
    let shown: Value = serde_json::from_slice(&info.stdout).unwrap();
    assert_eq!(
        palisade_core::json::read(&shown["epoch"]),
        Some(epoch(&b)),
        "{shown}"
    );
}

/// P6: a store that cannot ask the coordinator for a lock's floor after a start refuses the
/// write (503 `floor_unavailable`, exit non-zero) rather than trust its own memory.
#[test]
fn p6_a_store_that_cannot_learn_a_floor_refuses_rather_than_guess() {
    let dir = tempfile::tempdir().unwrap();
    let mut coordinator = ServerProcess::start(&dir.path().join("coordinator"));
    let store = ResourceProcess::start(&dir.path().join("store"), "strict", &coordinator.url);
    let grant = hold(&coordinator, "orders/10");
    // Keys fetched (the store trusts the key), then the coordinator goes away.
    coordinator.kill9();
    let out = store.cli(&[
        "put",
        "orders/10",
        "k",
        "v",
        "--token",
        grant["token"].as_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("floor_unavailable"),
        "{}",
        stderr(&out)
    );
}

/// P6 (effects): the embedded effects ledger's whole volume — with the store's, and the
/// witnesses beside them — put back from a snapshot taken before two owners used it. The
/// ledger's fence for the lock went back, so on its own it would let the superseded owner A
/// begin an attempt again; the coordinator's signed floor, asked at the lock's first ledger
/// request after the start, refuses A and lets the current owner B go on. Before: A's
/// `begin` was recorded and its effect would have been sent.
#[test]
fn p6_an_effects_ledger_whose_whole_volume_was_put_back_refuses_the_superseded_owner() {
    use palisade_effects::ledger::{Begin, BeginRequest, Ledger as _};
    use palisade_effects::model::{Capability, LedgerRejection, OpId};
    let dir = tempfile::tempdir().unwrap();
    let coordinator = ServerProcess::start(&dir.path().join("coordinator"));
    let (volume, snapshot) = (dir.path().join("volume"), dir.path().join("snapshot"));
    let data = volume.join("store");
    std::fs::create_dir_all(&volume).unwrap();
    let mut store = ResourceProcess::start(&data, "strict", &coordinator.url);
    store.cli(&["get", "pay/7", "x"]); // serving (and its signal handlers installed)
    assert!(store.terminate().success());
    cp_a(&volume, &snapshot); // before A and B began anything
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let begin = |store: &ResourceProcess, token: &str, op: &str| {
        let ledger = palisade_effects::HttpLedger::new(&store.url, None).unwrap();
        let request = BeginRequest {
            id: OpId::new(palisade_core::LockName::new("pay/7").unwrap(), op).unwrap(),
            token: token.to_owned(),
            payload: b"charge".to_vec(),
            receiver: "bank".into(),
            capability: Capability::Idempotent,
            attempt_timeout_ms: 5_000,
        };
        runtime.block_on(ledger.begin(request)).unwrap()
    };
    let stale = |answer: &Begin| {
        matches!(
            answer,
            Begin::Rejected {
                rejection: LedgerRejection::StaleEpoch { .. }
            }
        )
    };
    let mut store = ResourceProcess::start(&data, "strict", &coordinator.url);
    let a = hold(&coordinator, "pay/7");
    let token_a = a["token"].as_str().unwrap();
    assert!(matches!(begin(&store, token_a, "a1"), Begin::Send { .. }));
    let out = coordinator.cli(&["lock", "release", a["lease_id"].as_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let b = hold(&coordinator, "pay/7");
    let token_b = b["token"].as_str().unwrap();
    assert!(matches!(begin(&store, token_b, "b1"), Begin::Send { .. }));
    assert!(
        stale(&begin(&store, token_a, "a2")),
        "the ledger's own fence"
    );
    assert!(store.terminate().success());

    std::fs::remove_dir_all(&volume).unwrap();
    cp_a(&snapshot, &volume);
    let store = ResourceProcess::start(&data, "strict", &coordinator.url);
    let answer = begin(&store, token_a, "a3");
    assert!(stale(&answer), "A after the rollback: {answer:?}");
    assert!(matches!(begin(&store, token_b, "b2"), Begin::Send { .. }));
    assert!(stale(&begin(&store, token_a, "a4")));
}
