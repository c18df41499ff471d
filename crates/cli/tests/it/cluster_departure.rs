//! Members that leave, leave: a member removed from the membership (`palisade cluster remove`)
//! stops campaigning and exits 10 with one line that says why, instead of standing for election
//! for ever and logging each refused vote (issue 46: ~13 ERROR lines a second). Real processes
//! over mutual TLS, as the README's walkthrough runs them, with the default log filter.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, PeerFiles, BINARY};
use serde_json::Value;

/// The exit code of a removed member (`palisade serve`, README's table).
const REMOVED: i32 = 10;
/// At most this many lines in a removed member's log from its removal until it exits: the
/// refusals of its last vote requests (one per peer), the removal, the stop, the error.
const MOST_LINES_AFTER_REMOVAL: usize = 12;

/// A `palisade serve` member whose stderr goes to a file (the log an operator reads).
struct Member {
    child: Child,
    log: PathBuf,
}

impl Member {
    fn start(dir: &Path, id: u64, cluster: &str, join: bool, peers: &PeerFiles) -> Self {
        let log = dir.join(format!("member-{id}.log"));
        let mut command = Command::new(BINARY);
        command
            .args(["serve", "--node-id", &id.to_string(), "--cluster", cluster])
            .args(peers.args(id))
            .arg("--data-dir")
            .arg(dir.join(format!("member-{id}")))
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::options()
                    .create(true)
                    .append(true)
                    .open(&log)
                    .unwrap(),
            );
        if join {
            command.arg("--join");
        }
        Self {
            child: command.spawn().unwrap(),
            log,
        }
    }

    fn lines(&self) -> Vec<String> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines().map(str::to_owned).collect()
    }

    /// Waits (bounded) until a line of its log contains `text`.
    fn logged(&self, text: &str, within: Duration) {
        let deadline = Instant::now() + within;
        while !self.lines().iter().any(|line| line.contains(text)) {
            assert!(
                Instant::now() < deadline,
                "no {text:?} in\n{}",
                self.lines().join("\n")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits (bounded) until it exits by itself; its exit status.
    fn exits_within(&mut self, within: Duration, since_line: usize) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            let lines = self.lines();
            assert!(
                Instant::now() < deadline,
                "still running {within:?} after its removal, {} lines logged since:\n{}",
                lines.len() - since_line,
                lines[since_line..].join("\n")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, then waits (at most 10 s) for it to exit.
    fn terminate(&mut self) -> ExitStatus {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "no exit within 10 s of SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Three founding members and a fourth added with `--join` and `cluster add`, over mutual TLS.
struct Cluster {
    dir: tempfile::TempDir,
    peers: PeerFiles,
    /// `--cluster` with all four.
    four: String,
    /// The three founders' URLs (`--endpoint`).
    endpoints: String,
    members: Vec<Member>,
}

impl Cluster {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let peers = PeerFiles::generate(&dir.path().join("peers"), &[1, 2, 3, 4]);
        let ports: Vec<u16> = (0..4).map(|_| free_port()).collect();
        let entry = |id: usize| format!("{id}=127.0.0.1:{}", ports[id - 1]);
        let three = (1..=3).map(entry).collect::<Vec<_>>().join(",");
        let four = format!("{three},{}", entry(4));
        let endpoints = ports[..3]
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let members = (1..=3)
            .map(|id| Member::start(dir.path(), id, &three, false, &peers))
            .collect();
        let mut cluster = Self {
            dir,
            peers,
            four,
            endpoints,
            members,
        };
        cluster.leader();
        cluster.members.push(cluster.start_member(4, true));
        cluster.members[3].logged("coordinator listening", Duration::from_secs(20));
        let added = cli(
            &["cluster", "add", "4", &format!("127.0.0.1:{}", ports[3])],
            &cluster.endpoints,
        );
        assert!(added.status.success(), "{}", stderr(&added));
        // A voter, caught up, campaigning if it hears no leader (before, it did for ever).
        cluster.members[3].logged("elections on", Duration::from_secs(30));
        cluster
    }

    fn start_member(&self, id: u64, join: bool) -> Member {
        Member::start(self.dir.path(), id, &self.four, join, &self.peers)
    }

    /// Waits (bounded) until `cluster status` names a leader; the status.
    fn leader(&self) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let output = cli(&["cluster", "status", "--json"], &self.endpoints);
            if output.status.success() {
                let status: Value = serde_json::from_slice(&output.stdout).unwrap();
                if status["leader"].as_u64().is_some() {
                    return status;
                }
            }
            assert!(Instant::now() < deadline, "no leader within 30 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn remove_four(&self) {
        let removed = cli(&["cluster", "remove", "4"], &self.endpoints);
        assert!(removed.status.success(), "{}", stderr(&removed));
    }

    /// The three others serve on, as three voters.
    fn serves_as_three(&self) {
        let status = self.leader();
        assert_eq!(status["members"].as_array().unwrap().len(), 3, "{status}");
        static GRANTS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = GRANTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let granted = cli(
            &["lock", "acquire", &format!("departure/{n}")],
            &self.endpoints,
        );
        assert!(granted.status.success(), "{}", stderr(&granted));
    }
}

fn cli(args: &[&str], endpoints: &str) -> Output {
    Command::new(BINARY)
        .args(args)
        .args(["--endpoint", endpoints])
        .env("RUST_LOG", "error")
        .output()
        .unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Asserts a removed member's log from line `since` on: bounded, with one line that says it
/// was removed and how to bring it back.
fn left_quietly(member: &Member, since: usize) {
    let lines = member.lines();
    let after = &lines[since..];
    assert!(
        after.len() <= MOST_LINES_AFTER_REMOVAL,
        "{} lines logged from the removal to the exit:\n{}",
        after.len(),
        after.join("\n")
    );
    let told = after
        .iter()
        .filter(|l| l.contains("removed from the cluster"))
        .count();
    assert!(
        told >= 1,
        "no line says it was removed:\n{}",
        after.join("\n")
    );
    assert!(
        after
            .iter()
            .any(|l| l.contains("--join") && l.contains("cluster add 4")),
        "no line names the way back:\n{}",
        after.join("\n")
    );
}

/// Before, the removed member stayed up, stood for election every ~0.25 s and logged each
/// peer's refusal as an ERROR (~13 lines a second). Now the refusals of its vote requests by a
/// majority of its voters, as a non-member's, tell it it was removed: it logs it once and
/// exits 10, and the three others serve on throughout.
#[test]
fn a_removed_member_leaves_quietly_and_exits_10() {
    let mut cluster = Cluster::start();
    let since = cluster.members[3].lines().len();
    cluster.remove_four();
    let status = cluster.members[3].exits_within(Duration::from_secs(30), since);
    assert_eq!(status.code(), Some(REMOVED), "{status}");
    left_quietly(&cluster.members[3], since);
    cluster.serves_as_three();
    // Started again over the same data directory: its log is behind what its peers hold, so
    // it never campaigns; it idles without a word until it is stopped.
    let again = cluster.members[3].lines().len();
    cluster.members[3] = cluster.start_member(4, false);
    idles_quietly(&mut cluster.members[3], again);
    cluster.serves_as_three();
}

/// A member removed while it was down never receives the membership that removes it (no
/// leader replicates to a non-member): started again, its log is behind its peers', so it
/// never campaigns and idles without a word; a SIGTERM stops it cleanly (exit 0).
#[test]
fn a_member_removed_while_down_idles_quietly_when_started_again() {
    let mut cluster = Cluster::start();
    let stopped = cluster.members[3].terminate();
    assert!(stopped.success(), "SIGTERM: {stopped}");
    cluster.remove_four();
    cluster.serves_as_three();
    let since = cluster.members[3].lines().len();
    cluster.members[3] = cluster.start_member(4, false);
    idles_quietly(&mut cluster.members[3], since);
    cluster.serves_as_three();
}

/// Watches a removed member for 10 s: still running, and no more than its start-up lines plus
/// [`MOST_LINES_AFTER_REMOVAL`] logged; then SIGTERM stops it cleanly.
fn idles_quietly(member: &mut Member, since: usize) {
    member.logged("coordinator listening", Duration::from_secs(20));
    std::thread::sleep(Duration::from_secs(10));
    let lines = member.lines();
    assert!(
        lines.len() - since <= MOST_LINES_AFTER_REMOVAL,
        "{} lines in 10 s:\n{}",
        lines.len() - since,
        lines[since..].join("\n")
    );
    let stopped = member.terminate();
    assert!(stopped.success(), "SIGTERM: {stopped}");
}
