//! `palisade lock watch NAME`: a lock's transitions as they happen, one JSON line each.

use crate::common;

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};

use common::ServerProcess;
use serde_json::Value;

#[test]
fn lock_watch_prints_each_transition_as_it_happens() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path());
    let mut watch = Command::new(common::BINARY)
        .args(["lock", "watch", "watch/1", "--count", "4", "--json"])
        .args(["--endpoint", &server.url])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Bounded: a watch that hears nothing is killed after 30 s, and the test fails.
    let pid = nix::unistd::Pid::from_raw(watch.id() as i32);
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(30));
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    });
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
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
