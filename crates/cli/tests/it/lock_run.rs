//! `palisade lock run NAME -- CMD`, with real processes and real signals: the command gets the
//! lease in its environment and its exit code is passed on; a lease lost mid-run (the
//! coordinator stopped with SIGSTOP, so no renewal is confirmed) stops the command — SIGTERM to
//! its process group, SIGKILL after the grace period — and `lock run` exits with 75.

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::common::{ServerProcess, BINARY};

/// `palisade lock run ARGS --endpoint URL -- sh -c SCRIPT`, started.
fn lock_run(server: &ServerProcess, args: &[&str], script: &str) -> Child {
    Command::new(BINARY)
        .args(["lock", "run"])
        .args(args)
        .args(["--endpoint", &server.url, "--", "sh", "-c", script])
        .env("RUST_LOG", "warn")
        .env("PALISADE_BIN", BINARY)
        .env_remove("PALISADE_TOKEN")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run palisade lock run")
}

/// Waits (at most 20 s) until `path` exists.
fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits (at most 30 s) for `child` to exit.
fn exit_of(child: &mut Child) -> ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "lock run did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stderr_of(child: &mut Child) -> String {
    let mut text = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut text).unwrap();
    text
}

#[test]
fn p1_lock_run_gives_the_command_its_lease_and_passes_its_exit_code_on() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(&dir.path().join("data"));
    let out = dir.path().join("env");
    // The command sees its lease; a second `lock run` of the same lock, from inside it, finds
    // the lock held (exit 3) — one holder at a time (P1).
    let script = format!(
        "printf '%s %s %s' \"$PALISADE_LOCK\" \"$PALISADE_EPOCH\" \"$PALISADE_LEASE_ID\" > {out}; \
         test -n \"$PALISADE_FENCE_TOKEN\" || exit 90; \
         \"$PALISADE_BIN\" lock run job/a --endpoint {url} -- true; echo \" inner=$?\" >> {out}; \
         exit 7",
        out = out.display(),
        url = server.url,
    );
    let mut run = lock_run(&server, &["job/a"], &script);
    let status = exit_of(&mut run);
    assert_eq!(status.code(), Some(7), "{}", stderr_of(&mut run));
    let seen = std::fs::read_to_string(&out).unwrap();
    let fields: Vec<&str> = seen.split_whitespace().collect();
    assert_eq!(fields[0], "job/a", "{seen}");
    assert!(fields[1].parse::<u64>().unwrap() > 0, "{seen}");
    assert_eq!(fields.last(), Some(&"inner=3"), "{seen}");
    // Released when the command ended: the next run gets it at once.
    let mut next = lock_run(&server, &["job/a"], "exit 0");
    assert_eq!(exit_of(&mut next).code(), Some(0));
}

#[test]
fn p1_a_lease_lost_mid_run_stops_the_command_and_exits_75() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(&dir.path().join("data"));
    let coordinator = Pid::from_raw(server.child.id() as i32);
    // A command that stops cleanly on SIGTERM, and one that ignores it (SIGKILL after the
    // grace period reaches it, and every process of its group).
    let cases = [
        (
            "polite",
            "trap 'echo stopped > {dir}/polite.stopped; exit 0' TERM",
        ),
        ("stubborn", "trap '' TERM"),
    ];
    for (name, trap) in cases {
        let started = dir.path().join(format!("{name}.started"));
        let script = format!(
            "{trap}; touch {started}; while :; do sleep 0.05; done",
            trap = trap.replace("{dir}", &dir.path().display().to_string()),
            started = started.display(),
        );
        let lock = format!("job/{name}");
        let args = [lock.as_str(), "--ttl", "1s", "--grace", "300ms"];
        let mut run = lock_run(&server, &args, &script);
        wait_for(&started);
        // No renewal can be confirmed: the lease is lost at its TTL.
        kill(coordinator, Signal::SIGSTOP).unwrap();
        let began = Instant::now();
        let status = exit_of(&mut run);
        kill(coordinator, Signal::SIGCONT).unwrap();
        let stderr = stderr_of(&mut run);
        assert_eq!(status.code(), Some(75), "{name}: {stderr}");
        assert!(stderr.contains("was lost"), "{name}: {stderr}");
        assert!(began.elapsed() < Duration::from_secs(10), "{name}");
    }
    assert!(dir.path().join("polite.stopped").exists());
}

#[test]
fn signals_sent_to_lock_run_reach_the_command_and_the_lease_is_released() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(&dir.path().join("data"));
    let started = dir.path().join("started");
    let script = format!(
        "trap 'exit 5' TERM; touch {}; while :; do sleep 0.05; done",
        started.display()
    );
    let mut run = lock_run(&server, &["job/signal"], &script);
    wait_for(&started);
    kill(Pid::from_raw(run.id() as i32), Signal::SIGTERM).unwrap();
    assert_eq!(exit_of(&mut run).code(), Some(5), "{}", stderr_of(&mut run));
    let mut next = lock_run(&server, &["job/signal"], "exit 0");
    assert_eq!(exit_of(&mut next).code(), Some(0));
}

/// True while a process of process group `group` runs (a zombie, dead and waiting to be
/// reaped by whoever inherited it, does not).
fn group_runs(group: i32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|entry| {
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // pid (comm) state ppid pgrp …: the fields after the command's closing parenthesis.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        fields.len() > 2 && fields[0] != "Z" && fields[2] == group.to_string()
    })
}

/// P1: the command is gone before the lock can change hands. A command that ignores SIGTERM
/// runs under a 6 s lease; the coordinator is stopped (SIGSTOP), so no renewal is confirmed,
/// and continued 6.5 s later, when a second client asks for the lock and gets it. The lease's
/// validity (the send time of the last confirmed renewal plus the TTL) ended before that, and
/// the command's process group was gone by then: SIGTERM came --grace before the end, SIGKILL
/// at it. Before, SIGTERM came at the end, when the lock could change hands, and SIGKILL
/// --grace later (10 s by default): the command ran on while the next owner held the lock.
#[test]
fn p1_the_command_is_gone_before_the_lock_can_change_hands() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(&dir.path().join("data"));
    let coordinator = Pid::from_raw(server.child.id() as i32);
    let pid_file = dir.path().join("pid");
    let script = format!(
        "trap '' TERM; echo $$ > {pid}.tmp; mv {pid}.tmp {pid}; while :; do sleep 0.05; done",
        pid = pid_file.display()
    );
    let args = ["job/overlap", "--ttl", "6s", "--grace", "2900ms"];
    let mut run = lock_run(&server, &args, &script);
    wait_for(&pid_file);
    let group: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    kill(coordinator, Signal::SIGSTOP).unwrap();
    let stopped = Instant::now();
    let continue_at = stopped + Duration::from_millis(6_500);
    // Watch the command's process group until the coordinator is continued.
    let mut gone_at = None;
    while Instant::now() < continue_at {
        let alive = group_runs(group);
        if !alive && gone_at.is_none() {
            gone_at = Some(stopped.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    kill(coordinator, Signal::SIGCONT).unwrap();
    let next = server.cli(&["lock", "acquire", "job/overlap", "--wait", "20s", "--json"]);
    assert!(next.status.success(), "{next:?}");
    let status = exit_of(&mut run);
    let stderr = stderr_of(&mut run);
    assert_eq!(status.code(), Some(75), "{stderr}");
    let gone_at = gone_at.unwrap_or_else(|| {
        panic!("the command still ran when the lock could change hands (6.5 s): {stderr}")
    });
    eprintln!("the command was gone {gone_at:?} after the coordinator stopped (lease 6 s)");
}

#[test]
fn lock_run_keeps_the_bearer_secret_from_the_command_and_refuses_a_grace_too_long() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(&dir.path().join("data"));
    let seen = dir.path().join("seen");
    let script = format!(
        "printf '[%s][%s]' \"$PALISADE_AUTH_TOKEN\" \"$PALISADE_FENCE_TOKEN\" > {}",
        seen.display()
    );
    let run = |pass: &[&str]| {
        let status = Command::new(BINARY)
            .args(["lock", "run", "job/env", "--endpoint", &server.url])
            .args(pass)
            .args(["--", "sh", "-c", &script])
            .env("PALISADE_AUTH_TOKEN", "the-bearer-secret")
            .env_remove("PALISADE_TOKEN")
            .status()
            .unwrap();
        assert!(status.success());
        std::fs::read_to_string(&seen).unwrap()
    };
    let kept = run(&[]);
    assert!(kept.starts_with("[]["), "{kept}");
    assert!(!kept.ends_with("[]"), "the fence token is given: {kept}");
    assert!(run(&["--pass-auth-token"]).starts_with("[the-bearer-secret]"));
    let refused = Command::new(BINARY)
        .args(["lock", "run", "job/env", "--ttl", "2s", "--grace", "1s"])
        .args(["--endpoint", &server.url, "--", "true"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--grace"));
}

/// `--json` says whose exit code `lock run` ends with: a command may exit 75 or 3 itself,
/// the codes `lock run` uses for a lease lost and a lock held.
#[test]
fn lock_run_json_says_whose_exit_code_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(&dir.path().join("data"));
    let out = Command::new(BINARY)
        .args([
            "--json",
            "lock",
            "run",
            "job/json",
            "--endpoint",
            &server.url,
        ])
        .args(["--", "sh", "-c", "echo working; exit 75"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    let report: serde_json::Value = serde_json::from_str(last).unwrap();
    assert_eq!(report["exit_code"], 75, "{report}");
    assert_eq!(report["exit_code_by"], "command", "{report}");
    assert_eq!(report["command_exit_code"], 75, "{report}");
    assert!(report["lease_lost"].is_null(), "{report}");
    assert_eq!(report["lock"], "job/json");
}
