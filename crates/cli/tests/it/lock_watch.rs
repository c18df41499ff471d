//! `palisade lock watch NAME`: a lock's transitions as they happen, one JSON line each.

use crate::common;

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};

use common::ServerProcess;
use serde_json::Value;

/// `palisade lock watch NAME --count 4 --json` against `server`, and its output's lines.
/// Bounded: a watch that hears nothing is killed after 30 s, and the test fails.
fn watch_json(
    server: &ServerProcess,
    name: &str,
) -> (
    std::process::Child,
    std::io::Lines<BufReader<std::process::ChildStdout>>,
) {
    let mut watch = Command::new(common::BINARY)
        .args(["lock", "watch", name, "--count", "4", "--json"])
        .args(["--endpoint", &server.url])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = nix::unistd::Pid::from_raw(watch.id() as i32);
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(30));
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    });
    let lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    (watch, lines)
}

#[test]
fn lock_watch_prints_each_transition_as_it_happens() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path());
    let (mut watch, mut lines) = watch_json(&server, "watch/1");
    let mut next = || -> Value { serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap() };
    let now = next();
    assert_eq!(
        (now["event"].as_str(), now["held"].as_bool()),
        (Some("current"), Some(false))
    );
    let acquire = |ttl: &str| -> Value {
        let out = server.cli(&["lock", "acquire", "watch/1", "--ttl", ttl, "--json"]);
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let first = acquire("1m");
    let granted = next();
    assert_eq!(granted["event"], "granted");
    assert_eq!(granted["epoch"], first["epoch"]);
    let id = first["lease_id"].as_str().unwrap();
    assert!(server.cli(&["lock", "release", id]).status.success());
    assert_eq!(next()["event"], "released");
    let second = acquire("1m");
    let granted = next();
    assert_eq!(
        (&granted["event"], &granted["epoch"]),
        (&"granted".into(), &second["epoch"])
    );
    assert!(granted["at"].as_str().is_some());
    // --count ends the watch by itself.
    assert!(watch.wait().unwrap().success());
}

/// `palisade lock break NAME`: an admin ends a lease whose id its worker lost; nobody else may.
/// The next owner is granted at once, at a higher epoch (so fencing holds), and the break is
/// counted.
#[test]
fn p1_an_admin_breaks_a_lock_and_the_next_owner_gets_a_higher_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let mut auth = String::new();
    for principal in ["orders", "ops"] {
        let out = Command::new(common::BINARY)
            .args(["auth", "new", principal, "--secret-file"])
            .arg(dir.path().join(principal))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        auth.push_str(&String::from_utf8_lossy(&out.stdout));
    }
    std::fs::write(dir.path().join("auth"), auth).unwrap();
    std::fs::write(
        dir.path().join("acl"),
        "orders acquire work/\nops admin *\n",
    )
    .unwrap();
    let (auth, acl) = (dir.path().join("auth"), dir.path().join("acl"));
    let server = ServerProcess::start_with(
        &["serve", "--listen", "127.0.0.1:0"]
            .into_iter()
            .chain(["--auth-file", auth.to_str().unwrap()])
            .chain(["--acl-file", acl.to_str().unwrap()])
            .collect::<Vec<_>>(),
        &dir.path().join("data"),
    );
    let (orders, ops) = (dir.path().join("orders"), dir.path().join("ops"));
    let acquire = || -> Value {
        let out = server.cli_as(
            &orders,
            &["lock", "acquire", "work/1", "--ttl", "1h", "--json"],
        );
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let lost = acquire(); // its lease id is "lost": the worker never releases it
    let refused = server.cli_as(&orders, &["lock", "break", "work/1"]);
    assert!(
        !refused.status.success(),
        "only an admin breaks: {refused:?}"
    );
    // Naming another epoch than the holder's breaks nothing (the lock changed hands since the
    // operator looked).
    let held_epoch = palisade_core::json::read(&lost["epoch"]).unwrap();
    let other = (held_epoch - 1).to_string();
    let wrong = server.cli_as(&ops, &["lock", "break", "work/1", "--epoch", &other]);
    assert!(!wrong.status.success(), "{wrong:?}");
    assert!(
        String::from_utf8_lossy(&wrong.stderr).contains("epoch_changed")
            || String::from_utf8_lossy(&wrong.stderr).contains("not at the epoch named"),
        "{wrong:?}"
    );
    let held = held_epoch.to_string();
    let broke = server.cli_as(&ops, &["lock", "break", "work/1", "--epoch", &held]);
    assert!(broke.status.success(), "{broke:?}");
    assert!(String::from_utf8_lossy(&broke.stdout).starts_with("broke work/1"));
    let next = acquire();
    let epoch = |v: &Value| palisade_core::json::read(&v["epoch"]).unwrap();
    assert!(epoch(&next) > epoch(&lost), "{next} after {lost}");
    let again = server.cli_as(&ops, &["lock", "break", "nobody/holds"]);
    assert!(!again.status.success(), "a free lock has nothing to break");
    let ops_secret = std::fs::read_to_string(&ops).unwrap();
    let (_, metrics) = server.http("GET", "/metrics", Some(ops_secret.trim()), "");
    assert!(
        metrics.contains("palisade_leases_broken_total 1"),
        "{metrics}"
    );
    assert_break_recorded(&server, ops_secret.trim(), &lost);
}

/// The break is on the record: the feed names who broke which lease, and so does the audit.
fn assert_break_recorded(server: &ServerProcess, secret: &str, lost: &Value) {
    let (_, feed) = server.http("GET", "/v1/transitions", Some(secret), "");
    let feed: Value = serde_json::from_str(&feed).unwrap();
    let broken: Vec<&Value> = feed["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["kind"] == "broken")
        .collect();
    assert_eq!(broken.len(), 1, "{feed}");
    assert_eq!(
        (&broken[0]["lock"], &broken[0]["by"], &broken[0]["epoch"]),
        (&"work/1".into(), &"ops".into(), &lost["epoch"]),
        "{feed}"
    );
    let (_, audit) = server.http("GET", "/v1/audit", Some(secret), "");
    let audit: Value = serde_json::from_str(&audit).unwrap();
    let finding = audit["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["code"] == "lock_broken")
        .unwrap_or_else(|| panic!("no lock_broken finding: {audit}"));
    assert_eq!(finding["subject"], "work/1");
    assert!(
        finding["message"]
            .as_str()
            .unwrap()
            .starts_with("ops broke"),
        "{finding}"
    );
}

/// `palisade lock watch 'jobs/*'`: every lock under the prefix, starting with each held one's
/// state; a lock outside the prefix is not shown; a break shows as `broken`.
#[test]
fn lock_watch_follows_every_lock_under_a_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path());
    let acquire = |lock: &str| -> Value {
        let out = server.cli(&["lock", "acquire", lock, "--ttl", "1m", "--json"]);
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let held = acquire("jobs/a");
    let (mut watch, mut lines) = watch_json(&server, "jobs/*");
    let mut next = || -> Value { serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap() };
    let now = next();
    assert_eq!(
        (&now["event"], &now["lock"]),
        (&"current".into(), &"jobs/a".into())
    );
    assert_eq!(now["epoch"], held["epoch"]);
    acquire("other/x"); // outside the prefix: not shown
    let b = acquire("jobs/b");
    let granted = next();
    assert_eq!(
        (&granted["lock"], &granted["epoch"]),
        (&"jobs/b".into(), &b["epoch"])
    );
    let id = b["lease_id"].as_str().unwrap();
    assert!(server.cli(&["lock", "release", id]).status.success());
    let released = next();
    assert_eq!(
        (&released["event"], &released["lock"], &released["epoch"]),
        (&"released".into(), &"jobs/b".into(), &b["epoch"])
    );
    assert!(server.cli(&["lock", "break", "jobs/a"]).status.success());
    let broken = next();
    assert_eq!(
        (&broken["event"], &broken["lock"], &broken["epoch"]),
        (&"broken".into(), &"jobs/a".into(), &held["epoch"])
    );
    assert_eq!(broken["by"], "anonymous", "who broke it: {broken}");
    assert!(watch.wait().unwrap().success());
    let lone = server.cli(&["lock", "watch", "*"]);
    assert!(
        !lone.status.success(),
        "a prefix needs a character: {lone:?}"
    );
}
