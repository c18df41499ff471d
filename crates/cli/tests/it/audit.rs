//! `palisade serve --policy` and `palisade audit` with real processes: a demo setup with one
//! problem of each kind planted, each found; then the problems removed (policy reloaded on
//! SIGHUP) and the audit passes.

use crate::common;

use std::path::Path;
use std::process::Output;

use common::{free_port, ResourceProcess, ServerProcess};
use serde_json::Value;

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Acquires `lock`: its epoch, token and lease id.
fn token(server: &ServerProcess, lock: &str, ttl: &str) -> (u64, String, String) {
    let out = server.cli(&["lock", "acquire", lock, "--ttl", ttl, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let grant: Value = serde_json::from_slice(&out.stdout).unwrap();
    (
        palisade_core::json::read(&grant["epoch"]).unwrap(),
        grant["token"].as_str().unwrap().to_owned(),
        grant["lease_id"].as_str().unwrap().to_owned(),
    )
}

fn put(resource: &ResourceProcess, lock: &str, token: &str) -> Output {
    resource.cli(&["put", lock, "k", "v", "--token", token])
}

/// A store that accepts every write: what a boundary that does not fence looks like from the
/// outside. Planted so the probe has something to catch.
fn lying_store() -> String {
    use axum::routing::{get, put};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let app = axum::Router::new()
                .route(
                    "/v1/info",
                    get(|| async {
                        axum::Json(serde_json::json!({"mode": "strict", "restore_required": false}))
                    }),
                )
                .route(
                    "/v1/fences/{lock}",
                    get(|| async { axum::Json(serde_json::json!({"fence": 0})) }),
                )
                .route(
                    "/v1/kv/{lock}/{key}",
                    put(|| async { axum::Json(serde_json::json!({"accepted": true})) }),
                );
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    url
}

fn write_policy(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

fn codes(report: &Value) -> Vec<(String, String, String)> {
    report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["severity"].as_str().unwrap().to_owned(),
                f["code"].as_str().unwrap().to_owned(),
                f["subject"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// P1/P4/P5/P6 seen from outside: the audit finds a critical lock with no boundary, a boundary
/// that does not answer, a fence above the coordinator's epoch (another signer's tokens were
/// accepted), a store copied back from an old copy, an efficiency lock whose writes are
/// fenced, a receiver that cannot enforce with no fallback, and — with `--probe` — a boundary
/// that accepts an obsolete epoch, while the real store refuses it. Exit 8 while any critical
/// finding stands, 0 once they are gone.
#[test]
fn p1_p5_p6_audit_finds_each_planted_problem_and_passes_once_they_are_fixed() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.toml");
    write_policy(&policy, "default_class = \"efficiency\"\n");
    let server = ServerProcess::start_with_policy(&policy, &dir.path().join("data"));
    // Coordinator A: someone else's signer, trusted by the store by mistake. Started after
    // this one, so its clock floor — and every epoch it issues — is above this one's.
    let other = ServerProcess::start(&dir.path().join("other"));
    let store = store_trusting(dir.path(), &[&other, &server]);
    let restored = store_copied_back(dir.path(), &server);
    let liar = lying_store();
    let closed = format!("http://127.0.0.1:{}", free_port());
    let boundaries = Boundaries {
        store: &store.url,
        restored: &restored.url,
        closed: &closed,
        liar: &liar,
    };
    write_policy(&policy, &boundaries.policy());
    // The reload is asynchronous: wait until the policy shows six rules.
    server
        .reload_policy_until(|shown| shown["policy"]["rules"].as_array().map(Vec::len) == Some(6));
    let planted = plant_writes(&server, &other, &store);
    audit_finds_every_problem(&server, &boundaries, planted.foreign_epoch);

    // Fixed: the policy names a boundary for every critical lock, the misclassified and the
    // foreign-fenced locks are released, the broken boundaries are gone.
    write_policy(
        &policy,
        &format!(
            "default_class = \"efficiency\"\n[[lock]]\npattern = \"report/*\"\nclass = \
             \"critical\"\nboundary = {{ kind = \"resource\", url = \"{}\" }}\n",
            store.url
        ),
    );
    server.reload();
    for lease in planted.leases {
        let out = server.cli(&["lock", "release", &lease]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    audit_passes(&server);
}

/// A reference store that trusts the keys of each of `coordinators`.
fn store_trusting(dir: &std::path::Path, coordinators: &[&ServerProcess]) -> ResourceProcess {
    let keys: Vec<Value> = coordinators
        .iter()
        .flat_map(|s| {
            let (status, body) = s.http("GET", "/v1/keys", None, "");
            assert_eq!(status, 200);
            let keys: Value = serde_json::from_str(&body).unwrap();
            keys["keys"].as_array().unwrap().clone()
        })
        .collect();
    let key_file = dir.join("keys.json");
    std::fs::write(&key_file, serde_json::json!({ "keys": keys }).to_string()).unwrap();
    ResourceProcess::spawn(
        &dir.join("store"),
        &["--trust-key", key_file.to_str().unwrap()],
    )
}

/// A store copied back from an older copy of its directory: it refuses writes until
/// `palisade resource restore`, and says so.
fn store_copied_back(dir: &std::path::Path, server: &ServerProcess) -> ResourceProcess {
    let restored_dir = dir.join("restored");
    let mut restored = ResourceProcess::start(&restored_dir, "strict", &server.url);
    let (_, first, first_lease) = token(server, "restored/1", "1h");
    assert!(put(&restored, "restored/1", &first).status.success());
    restored.kill9();
    common::cp_a(&restored_dir, &dir.join("restored-copy"));
    let mut restored = ResourceProcess::start(&restored_dir, "strict", &server.url);
    assert!(server
        .cli(&["lock", "release", &first_lease])
        .status
        .success());
    let (_, second, _) = token(server, "restored/1", "1h");
    assert!(put(&restored, "restored/1", &second).status.success());
    // Stopped cleanly, so its witness has seen the second epoch (a kill -9 may leave the
    // witness up to 200 ms behind: docs/operations.md).
    assert!(restored.terminate().success());
    std::fs::remove_dir_all(&restored_dir).unwrap();
    common::cp_a(&dir.join("restored-copy"), &restored_dir);
    ResourceProcess::start(&restored_dir, "strict", &server.url)
}

/// The boundaries the planted policy names.
struct Boundaries<'a> {
    /// The store that trusts another signer's keys too.
    store: &'a str,
    /// The store copied back.
    restored: &'a str,
    /// Nothing listens there.
    closed: &'a str,
    /// A store that accepts every write.
    liar: &'a str,
}

impl Boundaries<'_> {
    /// A policy with a problem per lock pattern.
    fn policy(&self) -> String {
        format!(
            r#"default_class = "efficiency"
[[lock]]
pattern = "report/*"
class = "critical"
boundary = {{ kind = "resource", url = "{store}" }}
[[lock]]
pattern = "bare/*"
class = "critical"
[[lock]]
pattern = "gone/*"
class = "critical"
boundary = {{ kind = "resource", url = "{closed}" }}
[[lock]]
pattern = "liar/*"
class = "critical"
boundary = {{ kind = "resource", url = "{liar}" }}
[[lock]]
pattern = "pay/*"
class = "critical"
boundary = {{ kind = "effects", url = "{store}", capability = "none" }}
[[lock]]
pattern = "restored/*"
class = "critical"
boundary = {{ kind = "resource", url = "{restored}" }}
"#,
            store = self.store,
            closed = self.closed,
            liar = self.liar,
            restored = self.restored,
        )
    }
}

/// What [`plant_writes`] left: the foreign owner's epoch and the leases to release.
struct Planted {
    foreign_epoch: u64,
    leases: Vec<String>,
}

/// Another signer's owner writes report/1 at a high epoch, so this coordinator's owner is
/// refused; an efficiency lock's writes go to the fenced store; a critical lock is held with
/// no boundary; and a misclassified acquire is refused (exit 7).
fn plant_writes(server: &ServerProcess, other: &ServerProcess, store: &ResourceProcess) -> Planted {
    for i in 0..4 {
        token(other, &format!("warmup/{i}"), "1h");
    }
    let (foreign_epoch, foreign, _) = token(other, "report/1", "1h");
    assert!(put(store, "report/1", &foreign).status.success());
    // This coordinator's holder of report/1 is at a lower epoch: its writes are refused.
    let (epoch, own, report1_lease) = token(server, "report/1", "1h");
    assert!(epoch < foreign_epoch, "{epoch} vs {foreign_epoch}");
    assert_eq!(put(store, "report/1", &own).status.code(), Some(5));
    // An efficiency lock whose writes go to a fenced store; a critical lock with no boundary.
    let (_, cache, cache_lease) = token(server, "cache/1", "1h");
    assert!(put(store, "cache/1", &cache).status.success());
    let (_, _, bare_lease) = token(server, "bare/1", "1h");
    // The policy decides the class: asking efficiency for a critical lock is refused (7).
    let out = server.cli(&["lock", "acquire", "report/2", "--class", "efficiency"]);
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("critical by the policy"),
        "{}",
        stderr(&out)
    );

    Planted {
        foreign_epoch,
        leases: vec![report1_lease, cache_lease, bare_lease],
    }
}

/// `palisade audit --probe` finds every planted problem, for scripts and for people; the real
/// store refused the probe's obsolete epoch.
fn audit_finds_every_problem(server: &ServerProcess, at: &Boundaries, foreign_epoch: u64) {
    let out = server.cli(&["audit", "--probe", "--json"]);
    assert_eq!(out.status.code(), Some(8), "{}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let found = codes(&report);
    let target = |url: &str| format!("resource {url}");
    for (severity, code, subject) in [
        ("critical", "no_boundary", "bare/*".to_owned()),
        ("critical", "no_boundary", "bare/1".to_owned()),
        ("critical", "boundary_unreachable", target(at.closed)),
        ("critical", "fence_ahead", "report/1".to_owned()),
        ("critical", "probe_accepted", target(at.liar)),
        ("critical", "no_fallback", "pay/*".to_owned()),
        ("critical", "restore_required", target(at.restored)),
        ("warning", "efficiency_fenced", "cache/1".to_owned()),
        ("critical", "probe_failed", target(at.closed)),
    ] {
        assert!(
            found
                .iter()
                .any(|f| f.0 == severity && f.1 == code && f.2 == subject),
            "{severity} {code} {subject} not in {found:?}"
        );
    }
    // The real store refused the probe's obsolete epoch.
    let real = report["boundaries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["target"] == target(at.store).as_str())
        .unwrap();
    assert_eq!(real["probe"]["result"], "refused", "{real}");
    let report1 = report["locks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["lock"] == "report/1")
        .unwrap();
    assert_eq!(
        palisade_core::json::read(&report1["fence"]),
        Some(foreign_epoch)
    );
    assert_eq!(report1["stale_rejections"], 1, "{report1}");

    // For people: the findings, most severe first.
    let out = server.cli(&["audit"]);
    assert_eq!(out.status.code(), Some(8));
    let text = stdout(&out);
    assert!(text.contains("CRITICAL  fence_ahead"), "{text}");
    assert!(
        stderr(&out).contains("critical finding"),
        "{}",
        stderr(&out)
    );
}

/// Once fixed, `palisade audit` passes (within 5 s: the reload is asynchronous), and the probe
/// shows the store refusing the obsolete epoch.
fn audit_passes(server: &ServerProcess) {
    let mut last = None;
    for _ in 0..100 {
        let out = server.cli(&["audit", "--json"]);
        if out.status.success() {
            last = None;
            break;
        }
        last = Some(stdout(&out));
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(last.is_none(), "the audit still fails: {last:?}");
    let out = server.cli(&["audit", "--probe"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert!(
        stdout(&out).contains("refused after epoch"),
        "{}",
        stdout(&out)
    );
}

/// `--require-policy` refuses a critical lock with no boundary, and needs `--policy`; a bad
/// policy file stops the coordinator from starting with the rule named.
#[test]
fn require_policy_refuses_critical_locks_without_a_boundary() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.toml");
    write_policy(
        &policy,
        "default_class = \"critical\"\n[[lock]]\npattern = \"cache/*\"\nclass = \"efficiency\"\n\
         [[lock]]\npattern = \"report/*\"\nclass = \"critical\"\n\
         boundary = { kind = \"resource\", url = \"http://127.0.0.1:1\" }\n",
    );
    let server = ServerProcess::start_with(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--policy",
            policy.to_str().unwrap(),
            "--require-policy",
        ],
        &dir.path().join("data"),
    );
    let out = server.cli(&["lock", "acquire", "orders/1"]);
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("names no boundary"),
        "{}",
        stderr(&out)
    );
    let out = server.cli(&["lock", "acquire", "cache/1", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let grant: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(grant["class"], "efficiency");
    let out = server.cli(&["lock", "acquire", "report/1", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Over HTTP the refusal is a 409 with its own code.
    let (status, body) = server.http("POST", "/v1/locks/orders%2F2/acquire", None, "{}");
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("refused_by_policy"), "{body}");
    let (_, metrics) = server.http("GET", "/metrics", None, "");
    assert!(
        metrics.contains("palisade_acquires_refused_total{reason=\"policy_no_boundary\"} 2"),
        "{metrics}"
    );

    for (args, expect) in [
        (vec!["--require-policy"], "required arguments"),
        (vec!["--policy", "/nonexistent/policy.toml"], "No such file"),
    ] {
        let out = std::process::Command::new(common::BINARY)
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path().join("other"))
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success());
        assert!(stderr(&out).contains(expect), "{}", stderr(&out));
    }
    write_policy(&policy, "[[lock]]\npattern = \"a\"\nclass = \"bogus\"\n");
    let out = std::process::Command::new(common::BINARY)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("other"))
        .arg("--policy")
        .arg(&policy)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("bogus"), "{}", stderr(&out));
}

/// P2 at a store that admits only the lock's owners: the probe's tokens name a principal the
/// ACL lets acquire the probed lock (here `orders`, the only one for `invoice/`), so a store
/// started with `--require-principal invoice/=orders` is probed for what it is, and passes.
/// Before, the tokens named `palisade-audit`: such a store refused the probe's newer token as
/// `invalid_token`, and a store refusing only that principal could pass the probe.
#[test]
fn p2_the_probe_names_the_locks_owner_so_a_store_admitting_only_owners_is_probed() {
    let dir = tempfile::tempdir().unwrap();
    let mut auth = String::new();
    for principal in ["orders", "ops"] {
        let out = std::process::Command::new(common::BINARY)
            .args(["auth", "new", principal, "--secret-file"])
            .arg(dir.path().join(principal))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        auth.push_str(&stdout(&out));
    }
    std::fs::write(dir.path().join("auth"), auth).unwrap();
    std::fs::write(
        dir.path().join("acl"),
        "orders acquire invoice/\nops admin *\n",
    )
    .unwrap();
    let policy = dir.path().join("policy.toml");
    write_policy(&policy, "default_class = \"critical\"\n");
    let server = ServerProcess::start_with(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--auth-file",
            dir.path().join("auth").to_str().unwrap(),
            "--acl-file",
            dir.path().join("acl").to_str().unwrap(),
            "--policy",
            policy.to_str().unwrap(),
        ],
        &dir.path().join("data"),
    );
    let store = ResourceProcess::start_with(
        &dir.path().join("store"),
        "strict",
        &server.url,
        &["--require-principal", "invoice/=orders"],
    );
    write_policy(
        &policy,
        &format!(
            "[[lock]]\npattern = \"invoice/*\"\nclass = \"critical\"\n\
             boundary = {{ kind = \"resource\", url = \"{}\" }}\n",
            store.url
        ),
    );
    server.reload();
    let ops = std::fs::read_to_string(dir.path().join("ops")).unwrap();
    let loaded = (0..100).any(|_| {
        let (_, body) = server.http("GET", "/v1/policy", Some(ops.trim()), "");
        let shown: Value = serde_json::from_str(&body).unwrap_or_default();
        let one = shown["policy"]["rules"].as_array().map(Vec::len) == Some(1);
        if !one {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        one
    });
    assert!(loaded, "the reloaded policy did not show within 5 s");
    let out = server.cli_as(&dir.path().join("ops"), &["audit", "--probe", "--json"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{report:#}\n{}", stderr(&out));
    let probe = &report["boundaries"][0]["probe"];
    assert_eq!(probe["result"], "refused", "{report:#}");
    probe_labels_only_for_admins(&server, &ops, &dir.path().join("orders"));
}

/// The feed labels the probe's leases for an admin only: the lock's owner (or a boundary with
/// its read credentials) sees them as any other lease, so nothing tells the probe apart.
fn probe_labels_only_for_admins(server: &ServerProcess, ops: &str, orders: &Path) {
    let probes = |secret: &str| -> usize {
        let (_, body) = server.http("GET", "/v1/transitions", Some(secret), "");
        let feed: Value = serde_json::from_str(&body).unwrap();
        let entries = feed["transitions"].as_array().unwrap();
        assert!(!entries.is_empty(), "{feed}");
        entries.iter().filter(|e| e["probe"] == true).count()
    };
    assert!(
        probes(ops.trim()) > 0,
        "an admin sees which leases were the probe's"
    );
    let orders = std::fs::read_to_string(orders).unwrap();
    assert_eq!(probes(orders.trim()), 0, "the lock's owner does not");
}
