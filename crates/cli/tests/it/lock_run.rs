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
        let args = [lock.as_str(), "--ttl", "500ms", "--grace", "500ms"];
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
