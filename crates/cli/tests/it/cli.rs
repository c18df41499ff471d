//! The `palisade` CLI as users script it: JSON fields, tables, exit codes, errors on stderr.

use crate::common;

use common::{ServerProcess, BINARY};
use serde_json::Value;

fn json_of(output: &std::process::Output) -> Value {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("stdout is one JSON document")
}

#[test]
fn acquire_renew_release_list_show() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(&dir.path().join("data"));
    let acquired = json_of(&server.cli(&[
        "lock", "acquire", "report/7", "--ttl", "30s", "--holder", "me", "--json",
    ]));
    for field in ["lock", "epoch", "lease_id", "ttl_ms", "holder", "token"] {
        assert!(!acquired[field].is_null(), "{field} missing: {acquired}");
    }
    assert_eq!(acquired["ttl_ms"], 30_000);
    let lease = acquired["lease_id"].as_str().unwrap().to_owned();

    // Held with no wait left: non-zero exit (3) and a message on stderr.
    let held = server.cli(&["lock", "acquire", "report/7"]);
    assert_eq!(held.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&held.stderr).contains("held"));

    let list = server.cli(&["lock", "list"]);
    let table = String::from_utf8_lossy(&list.stdout);
    assert!(table.starts_with("LOCK"), "{table}");
    assert!(
        table.contains("report/7") && table.contains(" me "),
        "{table}"
    );
    assert!(table.contains("HELD FOR"), "since when it is held: {table}");
    let shown = json_of(&server.cli(&["lock", "show", "report/7", "--json"]));
    assert_eq!(shown["epoch"], acquired["epoch"]);
    assert!(
        shown["held_since"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{shown}"
    );
    let text =
        String::from_utf8_lossy(&server.cli(&["lock", "show", "report/7"]).stdout).into_owned();
    assert!(
        text.contains("held_since") && text.contains(" ago)"),
        "{text}"
    );

    assert!(server.cli(&["lock", "renew", &lease]).status.success());
    assert!(server
        .cli(&["lock", "release", &lease, "--json"])
        .status
        .success());
    let again = server.cli(&["lock", "renew", &lease]);
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("unknown"));

    let next = json_of(&server.cli(&["lock", "acquire", "report/7", "--json"]));
    assert!(
        palisade_core::json::read(&next["epoch"]) > palisade_core::json::read(&acquired["epoch"])
    );
}

#[test]
fn bad_input_fails_with_a_message_and_the_server_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(&dir.path().join("data"));
    // Bad usage exits 2 (the documented code), with the rule in people's words.
    for (args, says) in [
        (&["lock", "acquire", "has space"][..], "allowed are"),
        (
            &["lock", "acquire", "ok", "--ttl", "0s"],
            "shorter than the 10ms minimum",
        ),
        (
            &["lock", "acquire", "ok", "--ttl", "99h"],
            "99h is longer than the 1h maximum",
        ),
        (
            &["lock", "acquire", "ok", "--wait", "1h"],
            "longer than the 5m maximum",
        ),
        (&["lock", "acquire", "ok", "--class", "bogus"], "critical"),
        (&["lock", "acquire", "ok", "--holder", ""], "holder"),
    ] {
        let output = server.cli(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.starts_with("error: "), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    for (args, says) in [
        (
            &["lock", "list", "--endpoint", "notaurl"][..],
            "not a coordinator URL",
        ),
        (
            &["resource", "put", "ok", "k", "v", "--token", ""],
            "no token given",
        ),
        (
            &["resource", "activate", "ok", "--token", " "],
            "no token given",
        ),
    ] {
        let output = std::process::Command::new(BINARY)
            .args(args)
            .env_remove("PALISADE_TOKEN")
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    assert!(server.cli(&["lock", "acquire", "ok"]).status.success());
}

/// An unreachable coordinator exits 4; with `--json` the error is JSON on stdout, with the same
/// exit code inside.
#[test]
fn an_unreachable_coordinator_exits_with_4() {
    let output = std::process::Command::new(BINARY)
        .args(["lock", "list", "--endpoint", "http://127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(4));
    let output = std::process::Command::new(BINARY)
        .args(["lock", "list", "--json", "--endpoint", "http://127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(4));
    let error: Value = serde_json::from_slice(&output.stdout).expect("stdout is JSON");
    assert_eq!(error["error"]["exit_code"], 4, "{error}");
    assert!(error["error"]["message"]
        .as_str()
        .unwrap()
        .contains("127.0.0.1:1"));
}

#[test]
fn sigterm_stops_the_server_cleanly_and_keeps_leases() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = ServerProcess::start(&dir.path().join("data"));
    let acquired = json_of(&server.cli(&["lock", "acquire", "kept", "--ttl", "1m", "--json"]));
    assert!(server.terminate().success());
    let server = ServerProcess::start(&dir.path().join("data"));
    let shown = json_of(&server.cli(&["lock", "show", "kept", "--json"]));
    assert_eq!(shown["epoch"], acquired["epoch"]);
    let key = std::fs::metadata(dir.path().join("data").join("signing.key")).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&key.permissions()) & 0o777,
        0o600
    );
}

/// Logs written to a file or a pipe (journald, a log collector) are plain text: no colour
/// escapes.
#[test]
fn logs_to_a_pipe_carry_no_colour_codes() {
    use std::io::{BufRead as _, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(BINARY)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut logged = Vec::new();
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        let done = line.starts_with("palisade coordinator listening on");
        logged.push(line);
        if done {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(logged.iter().any(|l| l.contains("INFO")), "{logged:#?}");
    assert!(
        logged.iter().all(|l| !l.contains('\u{1b}')),
        "colour codes in a pipe: {logged:#?}"
    );
}
