//! `palisade effects …` and `palisade receiver serve` as users run them: a real coordinator, a
//! reference store hosting the embedded ledger, and the fake receiver as a process whose own
//! durable record counts the effects it performed.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::{free_port, ResourceProcess, ServerProcess, BINARY};
use serde_json::Value;

const SECRET: &str = "effects-test-admin-secret";

/// A fake receiver process on a fixed loopback port (so it can be started again there).
struct Receiver {
    child: Child,
    url: String,
    dir: PathBuf,
}

impl Receiver {
    fn start(dir: &Path, port: u16, capability: &str, faults: &[&str]) -> Self {
        let child = Command::new(BINARY)
            .args(["receiver", "serve", "--capability", capability])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--data-dir")
            .arg(dir)
            .args(faults)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start palisade receiver serve");
        let url = format!("http://127.0.0.1:{port}");
        for _ in 0..500 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Self {
            child,
            url,
            dir: dir.to_owned(),
        }
    }

    /// Effects of kind `performed` for operation `op`, from the durable record.
    fn performed(&self, op: &str) -> usize {
        let text = std::fs::read_to_string(self.dir.join("effects.jsonl")).unwrap_or_default();
        text.lines()
            .map(|line| serde_json::from_str::<Value>(line).unwrap())
            .filter(|e| e["kind"] == "performed" && e["op"] == op)
            .count()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Setup {
    _dir: tempfile::TempDir,
    root: PathBuf,
    coordinator: ServerProcess,
    store: ResourceProcess,
    secret_file: PathBuf,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_owned();
    let secret_file = root.join("secret");
    std::fs::write(&secret_file, SECRET).unwrap();
    let coordinator = ServerProcess::start(&root.join("coordinator"));
    let store = ResourceProcess::start_with(
        &root.join("store"),
        "strict",
        &coordinator.url,
        &["--effects-admin-secret-file", secret_file.to_str().unwrap()],
    );
    Setup {
        _dir: dir,
        root,
        coordinator,
        store,
        secret_file,
    }
}

impl Setup {
    fn token(&self, lock: &str) -> String {
        self.grant(lock)["token"].as_str().unwrap().to_owned()
    }

    fn grant(&self, lock: &str) -> Value {
        let output = self
            .coordinator
            .cli(&["lock", "acquire", lock, "--ttl", "30s", "--json"]);
        assert!(output.status.success(), "{output:?}");
        serde_json::from_slice(&output.stdout).unwrap()
    }

    fn effects(&self, args: &[&str], admin: bool) -> Output {
        let mut command = Command::new(BINARY);
        command
            .arg("effects")
            .args(args)
            .args(["--ledger", &self.store.url])
            .env("RUST_LOG", "warn");
        if admin {
            command.arg("--admin-secret-file").arg(&self.secret_file);
        }
        command.output().expect("run palisade effects")
    }

    fn perform(
        &self,
        op: &str,
        token: &str,
        payload: &str,
        receiver: &Receiver,
        capability: &str,
    ) -> Output {
        self.effects(
            &[
                "perform",
                op,
                "--token",
                token,
                "--payload",
                payload,
                "--receiver",
                "pay",
                "--receiver-url",
                &receiver.url,
                "--capability",
                capability,
                "--send-timeout-ms",
                "300",
                "--attempt-timeout-ms",
                "1000",
                "--json",
            ],
            false,
        )
    }

    fn show(&self, op: &str) -> Value {
        let output = self.effects(&["show", op, "--json"], false);
        assert!(output.status.success(), "{output:?}");
        serde_json::from_slice(&output.stdout).unwrap()
    }
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// P7: one effect per operation, whoever retries it; an operation id names one payload; an
/// owner superseded under the lock cannot begin an attempt (nothing reaches the receiver).
#[test]
fn p7_perform_records_before_sending_and_never_twice() {
    let s = setup();
    let receiver = Receiver::start(&s.root.join("rx"), free_port(), "idempotent", &[]);
    let grant = s.grant("invoice/7");
    let token = grant["token"].as_str().unwrap().to_owned();
    let first = s.perform(
        "invoice/7:charge",
        &token,
        "amount=10",
        &receiver,
        "idempotent",
    );
    assert!(first.status.success(), "{}", stderr(&first));
    let record: Value = serde_json::from_slice(&first.stdout).unwrap();
    assert_eq!(record["state"], "succeeded");
    assert_eq!(record["attempt"], 1);
    // A retry of the same operation sends nothing: it is final.
    let again = s.perform(
        "invoice/7:charge",
        &token,
        "amount=10",
        &receiver,
        "idempotent",
    );
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(s.show("invoice/7:charge")["attempt"], 1);
    // Another payload under the same operation id is refused.
    let other = s.perform(
        "invoice/7:charge",
        &token,
        "amount=99",
        &receiver,
        "idempotent",
    );
    assert_eq!(other.status.code(), Some(5), "refused by the ledger");
    assert!(
        stderr(&other).contains("another payload"),
        "{}",
        stderr(&other)
    );
    // A newer owner begins an attempt; the older one can begin none.
    let release = s
        .coordinator
        .cli(&["lock", "release", grant["lease_id"].as_str().unwrap()]);
    assert!(release.status.success(), "{release:?}");
    let newer = s.token("invoice/7");
    let refund = s.perform(
        "invoice/7:refund",
        &newer,
        "amount=10",
        &receiver,
        "idempotent",
    );
    assert!(refund.status.success(), "{}", stderr(&refund));
    let stale = s.perform("invoice/7:note", &token, "x", &receiver, "idempotent");
    assert_eq!(stale.status.code(), Some(5));
    assert!(stderr(&stale).contains("stale epoch"), "{}", stderr(&stale));
    let missing = s.effects(&["show", "invoice/7:note"], false);
    assert!(!missing.status.success());
    assert_eq!(receiver.performed("invoice/7:charge"), 1);
    assert_eq!(receiver.performed("invoice/7:note"), 0);
    // A forged token begins nothing either.
    let forged = s.perform("invoice/7:forged", "pt1.AAAA", "x", &receiver, "idempotent");
    assert_eq!(forged.status.code(), Some(5));
    assert!(
        stderr(&forged).contains("invalid token"),
        "{}",
        stderr(&forged)
    );
}

/// P7: a receiver without deduplication or lookup whose answer was lost is never retried: the
/// operation goes to review, a person's verdict needs the admin secret and is recorded with
/// who and why, and the receiver performed the effect exactly once.
#[test]
fn p7_an_unknown_outcome_without_dedup_goes_to_review_and_a_person_resolves() {
    let s = setup();
    let receiver = Receiver::start(
        &s.root.join("rx"),
        free_port(),
        "none",
        &["--timeout-after", "1", "--hang-ms", "1000"],
    );
    let token = s.token("mail/3");
    let output = s.perform("mail/3:welcome", &token, "hello", &receiver, "none");
    assert_eq!(output.status.code(), Some(9), "{}", stderr(&output));
    let listed = s.effects(&["list", "--state", "needs_review", "--json"], false);
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1);
    // Running it again does not send it again.
    let again = s.perform("mail/3:welcome", &token, "hello", &receiver, "none");
    assert_eq!(again.status.code(), Some(9));
    std::thread::sleep(Duration::from_millis(1_200)); // the hung answer arrives nowhere
    assert_eq!(receiver.performed("mail/3:welcome"), 1);
    let args = [
        "resolve",
        "mail/3:welcome",
        "--verdict",
        "done",
        "--by",
        "alice",
        "--why",
        "the gateway's log shows it",
    ];
    let denied = s.effects(&args, false);
    assert!(!denied.status.success());
    assert!(
        stderr(&denied).contains("admin secret"),
        "{}",
        stderr(&denied)
    );
    let resolved = s.effects(&args, true);
    assert!(resolved.status.success(), "{}", stderr(&resolved));
    let record = s.show("mail/3:welcome");
    assert_eq!(record["state"], "reconciled");
    assert_eq!(record["review"]["by"], "alice");
    assert_eq!(record["review"]["verdict"], "done");
    assert_eq!(receiver.performed("mail/3:welcome"), 1);
}

/// P7: an idempotent receiver that was down leaves the operation unknown; once it is back,
/// `palisade effects reconcile` retries with the same key and the operation is reconciled —
/// one effect in the receiver's record. Reconciling needs the admin secret.
#[test]
fn p7_reconcile_finishes_an_operation_left_in_doubt() {
    let s = setup();
    let port = free_port();
    let dir = s.root.join("rx");
    let absent = Receiver {
        child: Command::new("true").spawn().unwrap(),
        url: format!("http://127.0.0.1:{port}"),
        dir: dir.clone(),
    };
    let token = s.token("order/5");
    let output = s.perform("order/5:ship", &token, "parcel", &absent, "idempotent");
    assert_eq!(output.status.code(), Some(9), "{}", stderr(&output));
    assert_eq!(s.show("order/5:ship")["state"], "unknown");
    let receiver = Receiver::start(&dir, port, "idempotent", &[]);
    let reconcile = |admin| {
        s.effects(
            &[
                "reconcile",
                "--receiver",
                "pay",
                "--receiver-url",
                &receiver.url,
                "--capability",
                "idempotent",
                "--json",
            ],
            admin,
        )
    };
    assert!(!reconcile(false).status.success());
    let report = reconcile(true);
    assert!(report.status.success(), "{}", stderr(&report));
    let report: Value = serde_json::from_slice(&report.stdout).unwrap();
    assert_eq!(report["retried"], 1, "{report}");
    assert_eq!(report["performed"], 1, "{report}");
    let record = s.show("order/5:ship");
    assert_eq!(record["state"], "reconciled");
    assert_eq!(receiver.performed("order/5:ship"), 1);
    // The ledger's gauges and the reconciliation counter are on the store's /metrics.
    let metrics = reqwest_get(&format!("{}/metrics", s.store.url));
    assert!(
        metrics.contains("palisade_effects_operations{state=\"reconciled\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("palisade_effects_reconciliations_total{result=\"retried\"} 1"));
    assert!(metrics.contains("palisade_effects_review_queue 0"));
}

fn reqwest_get(url: &str) -> String {
    let address = url.trim_start_matches("http://");
    let (host, path) = address.split_once('/').unwrap();
    common::http_request(host, "GET", &format!("/{path}"), None, "").1
}
