//! The attacks of the trust-boundary review, tried with real processes against a coordinator
//! that has principals and an ACL (and against the open default where it matters). Each test
//! names the property it protects: P2 (an obsolete or foreign owner cannot act on a lease or
//! write), P4 (no token a resource accepts is forged or misattributed), P8 (the cluster and its
//! leases stay available to their owners).
//!
//! Before the change each of these was accepted: lease ids were the epochs (1, 2, 3, …),
//! listed at `GET /v1/locks`, and any client could renew, release or change the membership.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::{ResourceProcess, ServerProcess, BINARY};
use serde_json::Value;

/// A coordinator with principals `orders`, `billing`, `mallory`, `hoarder`, `ops` and their
/// secrets.
struct Secured {
    dir: tempfile::TempDir,
    server: ServerProcess,
}

const ACL: &str = "\
# principal right   prefix
orders      acquire orders/
orders      acquire billing/
billing     acquire billing/
mallory     acquire mallory/
mallory     read    *
mallory     limits  waiters=3,watches=2
hoarder     acquire hoarder/
hoarder     limits  leases=5
ops         admin   *
";

impl Secured {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut lines = String::new();
        for principal in ["orders", "billing", "mallory", "hoarder", "ops"] {
            let out = run(&[
                "auth",
                "new",
                principal,
                "--secret-file",
                dir.path().join(principal).to_str().unwrap(),
            ]);
            assert!(out.status.success(), "{}", stderr(&out));
            lines.push_str(&String::from_utf8(out.stdout).unwrap());
        }
        std::fs::write(dir.path().join("auth"), lines).unwrap();
        std::fs::write(dir.path().join("acl"), ACL).unwrap();
        let server = ServerProcess::start_with(
            &[
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--auth-file",
                dir.path().join("auth").to_str().unwrap(),
                "--acl-file",
                dir.path().join("acl").to_str().unwrap(),
            ],
            &dir.path().join("data"),
        );
        Self { dir, server }
    }

    fn token_file(&self, principal: &str) -> PathBuf {
        self.dir.path().join(principal)
    }

    fn secret(&self, principal: &str) -> String {
        std::fs::read_to_string(self.token_file(principal))
            .unwrap()
            .trim()
            .to_owned()
    }

    fn cli(&self, principal: &str, args: &[&str]) -> Output {
        self.server.cli_as(&self.token_file(principal), args)
    }

    /// `lock acquire NAME --json` as `principal`.
    fn acquire(&self, principal: &str, lock: &str) -> Value {
        let out = self.cli(
            principal,
            &["lock", "acquire", lock, "--ttl", "1m", "--json"],
        );
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    fn http(&self, principal: Option<&str>, method: &str, path: &str, body: &str) -> (u16, Value) {
        let secret = principal.map(|p| self.secret(p));
        let (status, body) = self.server.http(method, path, secret.as_deref(), body);
        (
            status,
            serde_json::from_str(&body).unwrap_or(Value::String(body)),
        )
    }
}

fn run(args: &[&str]) -> Output {
    std::process::Command::new(BINARY)
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn p2_a_principal_cannot_renew_or_release_another_principals_lease() {
    let s = Secured::start();
    let granted = s.acquire("orders", "orders/1");
    let lease = granted["lease_id"].as_str().unwrap().to_owned();
    assert_eq!(lease.len(), 32, "an opaque 128-bit id: {lease}");
    assert_eq!(granted["principal"], "orders");

    // Knowing the id is not enough: mallory is refused, by the CLI (gRPC) and by HTTP.
    let out = s.cli("mallory", &["lock", "release", &lease]);
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("permission denied"),
        "{}",
        stderr(&out)
    );
    for action in ["renew", "release"] {
        let (status, body) = s.http(
            Some("mallory"),
            "POST",
            &format!("/v1/leases/{lease}/{action}"),
            "",
        );
        assert_eq!(
            (status, body["error"].as_str()),
            (403, Some("permission_denied")),
            "{body}"
        );
    }
    // The attack of the review: release ids 1..20. They are not lease ids any more, in either
    // form.
    for id in 1..=20u64 {
        let (status, _) = s.http(
            Some("mallory"),
            "POST",
            &format!("/v1/leases/{id}/release"),
            "",
        );
        assert_eq!(status, 400, "id {id}");
        let (status, _) = s.http(
            Some("mallory"),
            "POST",
            &format!("/v1/leases/{id:032x}/release"),
            "",
        );
        assert_eq!(status, 404, "id {id:032x}");
    }
    // A listing shows mallory (read on every lock) the lock and its principal, not the id.
    let (status, list) = s.http(Some("mallory"), "GET", "/v1/locks", "");
    assert_eq!(status, 200);
    let listed = &list["locks"][0];
    assert_eq!(
        (listed["lock"].as_str(), listed["principal"].as_str()),
        (Some("orders/1"), Some("orders"))
    );
    assert!(listed.get("lease_id").is_none(), "{list}");
    let out = s.cli("mallory", &["lock", "show", "orders/1", "--json"]);
    assert!(!String::from_utf8_lossy(&out.stdout).contains(&lease));

    // The lease is untouched: its holder renews it; an admin sees its id and may end it.
    assert!(s.cli("orders", &["lock", "renew", &lease]).status.success());
    let (_, shown) = s.http(Some("ops"), "GET", "/v1/locks/orders%2F1", "");
    assert_eq!(shown["lease_id"].as_str(), Some(lease.as_str()));
    let out = s.cli("ops", &["lock", "release", &lease]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn p2_p8_requests_without_credentials_or_rights_are_refused_with_401_and_403() {
    let s = Secured::start();
    // No credentials, or unknown ones: 401 on every lock and cluster route, as JSON.
    for (method, path) in [
        ("POST", "/v1/locks/orders%2F1/acquire"),
        ("GET", "/v1/locks"),
        ("GET", "/v1/locks/orders%2F1"),
        ("GET", "/v1/cluster"),
        ("POST", "/v1/cluster/members"),
        ("POST", "/v1/cluster/members/2/lost"),
        ("GET", "/v1/backup"),
        ("POST", "/v1/keys/0123456789abcdef/retire"),
    ] {
        let (status, body) = s.http(None, method, path, "{}");
        assert_eq!(
            (status, body["error"].as_str()),
            (401, Some("unauthenticated")),
            "{path}: {body}"
        );
        let (status, _) = s.server.http(method, path, Some("not-a-secret"), "{}");
        assert_eq!(status, 401, "{path}");
    }
    let out = s.server.cli(&["lock", "acquire", "orders/1"]);
    assert_eq!(out.status.code(), Some(6));
    assert!(stderr(&out).contains("unauthenticated"), "{}", stderr(&out));
    // What anyone may read: the public keys, health, readiness, metrics.
    for path in ["/v1/keys", "/healthz", "/readyz", "/metrics"] {
        assert_eq!(s.server.http("GET", path, None, "").0, 200, "{path}");
    }
    // Known, but without the right: 403, and nothing was granted.
    let (status, body) = s.http(
        Some("mallory"),
        "POST",
        "/v1/locks/orders%2F1/acquire",
        "{}",
    );
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("permission_denied")),
        "{body}"
    );
    let (status, _) = s.http(Some("billing"), "GET", "/v1/locks/orders%2F1", "");
    assert_eq!(status, 403);
    let (_, list) = s.http(Some("ops"), "GET", "/v1/locks", "");
    assert_eq!(list["locks"].as_array().map(Vec::len), Some(0), "{list}");
    // The attack of the review: a client adding a dead voter. Only an admin may change the
    // membership (this single node then says it is not a cluster).
    let member = r#"{"id": 9, "addr": "127.0.0.1:1"}"#;
    let (status, body) = s.http(Some("mallory"), "POST", "/v1/cluster/members", member);
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("permission_denied")),
        "{body}"
    );
    let (status, _) = s.http(Some("orders"), "DELETE", "/v1/cluster/members/1", "");
    assert_eq!(status, 403);
    // A backup is an admin's (P6: it is what a restore starts from).
    assert_eq!(s.http(Some("mallory"), "GET", "/v1/backup", "").0, 403);
    let (status, backup) = s.http(Some("ops"), "GET", "/v1/backup", "");
    assert_eq!(status, 200, "{backup}");
    let (status, body) = s.http(Some("ops"), "POST", "/v1/cluster/members", member);
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("not_a_cluster")),
        "{body}"
    );
    // Declaring a member's store lost weakens a member's probation (P8): an admin's too.
    let lost = "/v1/cluster/members/2/lost";
    assert_eq!(s.http(Some("mallory"), "POST", lost, "").0, 403);
    let (status, body) = s.http(Some("ops"), "POST", lost, "");
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("not_a_cluster")),
        "{body}"
    );
    // Retiring a signing key is an admin's too (P4).
    let retire = "/v1/keys/0123456789abcdef/retire";
    assert_eq!(s.http(Some("mallory"), "POST", retire, "").0, 403);
    let (status, body) = s.http(Some("ops"), "POST", retire, "");
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("not_a_cluster")),
        "{body}"
    );
}

#[test]
fn p4_the_token_names_its_principal_and_a_resource_can_require_one() {
    let s = Secured::start();
    let resource = ResourceProcess::start_with(
        &s.dir.path().join("store"),
        "strict",
        &s.server.url,
        &["--require-principal", "billing/=billing"],
    );
    // orders may acquire billing/7 at the coordinator, but the resource accepts writes to
    // billing/ only from billing's tokens: a valid signature and the newest epoch are not
    // enough.
    let wrong = s.acquire("orders", "billing/7");
    let token = wrong["token"].as_str().unwrap();
    let out = resource.cli(&["put", "billing/7", "invoice", "x", "--token", token]);
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("principal orders"),
        "{}",
        stderr(&out)
    );
    let out = s.cli(
        "orders",
        &["lock", "release", wrong["lease_id"].as_str().unwrap()],
    );
    assert!(out.status.success());
    let right = s.acquire("billing", "billing/7");
    let token = right["token"].as_str().unwrap();
    let out = resource.cli(&["put", "billing/7", "invoice", "y", "--token", token]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Locks no rule covers accept any principal.
    let other = s.acquire("orders", "orders/3");
    let out = resource.cli(&[
        "put",
        "orders/3",
        "k",
        "v",
        "--token",
        other["token"].as_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn p2_an_acl_change_takes_effect_on_sighup_and_a_broken_file_changes_nothing() {
    let s = Secured::start();
    s.acquire("orders", "orders/1");
    let acl = s.dir.path().join("acl");
    std::fs::write(&acl, ACL.replace("orders      acquire orders/\n", "")).unwrap();
    let pid = nix::unistd::Pid::from_raw(s.server.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    let refused = |principal: &str, lock: &str| {
        let out = s.cli(principal, &["lock", "acquire", lock]);
        out.status.code() == Some(6)
    };
    // The reload is asynchronous: wait for it (bounded).
    let mut revoked = false;
    for _ in 0..100 {
        if refused("orders", "orders/2") {
            revoked = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(revoked, "orders kept its right after SIGHUP");
    // A file that does not parse is refused; the policy in force stays, and so does the
    // server.
    std::fs::write(&acl, "orders everything *\n").unwrap();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(refused("orders", "orders/3"));
    assert!(!refused("billing", "billing/1"));
}

#[test]
fn a_non_loopback_listen_address_without_auth_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    // Refused before anything binds: no socket is opened on another interface.
    let out = run(&[
        "serve",
        "--listen",
        "0.0.0.0:0",
        "--data-dir",
        dir.path().join("data").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let message = stderr(&out);
    assert!(
        message.contains("--insecure") && message.contains("--auth-file"),
        "{message}"
    );
    assert!(
        !Path::new(&dir.path().join("data")).exists(),
        "nothing was created"
    );
    // Half a configuration is refused too.
    let out = run(&["serve", "--auth-file", "/nonexistent"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

#[test]
fn p2_on_an_open_loopback_coordinator_lease_ids_are_never_listed() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(&dir.path().join("data"));
    let out = server.cli(&["lock", "acquire", "open/1", "--json"]);
    let granted: Value = serde_json::from_slice(&out.stdout).unwrap();
    let lease = granted["lease_id"].as_str().unwrap();
    assert_eq!(granted["principal"], "anonymous");
    let (_, list) = server.http("GET", "/v1/locks", None, "");
    assert!(!list.contains(lease), "{list}");
    let (_, shown) = server.http("GET", "/v1/locks/open%2F1", None, "");
    assert!(!shown.contains(lease), "{shown}");
    // The holder, who has the id, still renews and releases.
    assert!(server.cli(&["lock", "release", lease]).status.success());
}

#[test]
fn p4_an_operator_revoked_key_is_refused_even_while_the_coordinator_publishes_it() {
    let s = Secured::start();
    let (_, keys) = s.http(None, "GET", "/v1/keys", "");
    let key_id = keys["keys"][0]["key_id"].as_str().unwrap().to_owned();
    let granted = s.acquire("orders", "orders/9");
    let token = granted["token"].as_str().unwrap();
    let trusting = ResourceProcess::start(&s.dir.path().join("a"), "strict", &s.server.url);
    let out = trusting.cli(&["put", "orders/9", "k", "v", "--token", token]);
    assert!(out.status.success(), "{}", stderr(&out));
    let revoking = ResourceProcess::start_with(
        &s.dir.path().join("b"),
        "strict",
        &s.server.url,
        &["--revoke-key", &key_id],
    );
    let out = revoking.cli(&["put", "orders/9", "k", "v", "--token", token]);
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    assert!(stderr(&out).contains("invalid_token"), "{}", stderr(&out));
}

/// Issue 26, item 8: a lease does not outlive its principal's right. After the ACL loses
/// `orders acquire orders/` (SIGHUP), renewing a lease acquired before is refused over HTTP
/// (403), over gRPC (the CLI exits 6) and on the keepalive stream (the client's lease is lost),
/// and a watch stream of a lock the principal may no longer read ends with PERMISSION_DENIED.
#[test]
fn p2_a_lease_and_its_streams_do_not_outlive_the_principals_right() {
    let s = Secured::start();
    let before = s.acquire("orders", "orders/1");
    let lease = before["lease_id"].as_str().unwrap().to_owned();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = runtime.block_on(async {
        let credentials = palisade_client::Credentials::bearer(&s.secret("orders")).unwrap();
        palisade_client::Client::connect_with(&[&s.server.url], credentials)
            .await
            .unwrap()
    });
    let (mut kept, mut watch) = runtime.block_on(async {
        let mut options = palisade_client::AcquireOptions::new("orders/2");
        options.ttl = std::time::Duration::from_secs(3);
        let kept = client.acquire(options).await.unwrap();
        let watch = client.watch("orders/1").await.unwrap();
        (kept, watch)
    });
    // Before the change every renew is accepted.
    let (status, _) = s.http(
        Some("orders"),
        "POST",
        &format!("/v1/leases/{lease}/renew"),
        "",
    );
    assert_eq!(status, 200);

    let acl = s.dir.path().join("acl");
    std::fs::write(&acl, ACL.replace("orders      acquire orders/\n", "")).unwrap();
    let pid = nix::unistd::Pid::from_raw(s.server.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    // The reload is asynchronous: wait until an HTTP renew is refused (bounded).
    let mut refused = None;
    for _ in 0..100 {
        let (status, body) = s.http(
            Some("orders"),
            "POST",
            &format!("/v1/leases/{lease}/renew"),
            "",
        );
        if status != 200 {
            refused = Some((status, body));
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let (status, body) = refused.expect("the HTTP renew was still accepted after SIGHUP");
    assert_eq!(status, 403, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("acquire right"),
        "{body}"
    );
    // gRPC: the CLI's renew.
    let out = s.cli("orders", &["lock", "renew", &lease]);
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    // The keepalive stream: the client's lease is lost well before it would have been renewed
    // past its TTL; the watch ends with PERMISSION_DENIED.
    runtime.block_on(async {
        let reason = tokio::time::timeout(std::time::Duration::from_secs(10), kept.lost())
            .await
            .expect("the keepalive kept renewing after the right was removed");
        assert!(!reason.is_empty());
        let ended = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            loop {
                match watch.message().await {
                    Ok(Some(_)) => continue,
                    Ok(None) => return None,
                    Err(status) => return Some(status),
                }
            }
        })
        .await
        .expect("the watch stream stayed open after the read right was removed");
        let status = ended.expect("the watch ended without saying why");
        assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    });
    // billing's rights did not change.
    let other = s.acquire("billing", "billing/1");
    let (status, _) = s.http(
        Some("billing"),
        "POST",
        &format!("/v1/leases/{}/renew", other["lease_id"].as_str().unwrap()),
        "",
    );
    assert_eq!(status, 200);
}

/// Issue 26, item 10: one principal cannot fill a lock's waiter slots or open watches without
/// end. mallory (`limits waiters=3,watches=2`) gets 429 `principal_limit` on its fourth acquire
/// in flight and RESOURCE_EXHAUSTED on its third watch, while orders is served as before.
#[test]
fn p8_a_principal_at_its_limits_is_refused_and_the_others_are_served() {
    let s = Secured::start();
    s.acquire("mallory", "mallory/1");
    let secret = s.secret("mallory");
    let address = s.server.url.trim_start_matches("http://").to_owned();
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let (secret, address) = (secret.clone(), address.clone());
            std::thread::spawn(move || {
                common::http_request(
                    &address,
                    "POST",
                    "/v1/locks/mallory%2F1/acquire",
                    Some(&secret),
                    r#"{"ttl_ms": 1000, "wait_ms": 4000}"#,
                )
            })
        })
        .collect();
    // Wait (bounded) until the three are queued.
    let mut queued = false;
    for _ in 0..100 {
        let (_, body) = s.http(Some("mallory"), "GET", "/v1/locks/mallory%2F1", "");
        if body["waiters"] == 3 {
            queued = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(30));
    }
    assert!(queued, "the three waiters never queued");
    let (status, body) = s.http(
        Some("mallory"),
        "POST",
        "/v1/locks/mallory%2F2/acquire",
        r#"{"ttl_ms": 1000}"#,
    );
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"], "principal_limit", "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("waiters=N"),
        "{body}"
    );
    // Another principal is served, and may queue on its own lock.
    s.acquire("orders", "orders/1");
    let (metrics_status, metrics) = s.http(Some("ops"), "GET", "/metrics", "");
    assert_eq!(metrics_status, 200);
    assert!(
        metrics
            .as_str()
            .unwrap()
            .contains("palisade_acquires_refused_total{reason=\"principal_limit\"} 1"),
        "{metrics}"
    );
    for waiter in waiters {
        let (status, _) = waiter.join().unwrap();
        assert_eq!(status, 409, "the waiters time out: the lock stays held");
    }
    // The slots came back: mallory may acquire again.
    s.acquire("mallory", "mallory/3");

    // Watches: two streams, the third refused; closing one frees its slot.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let credentials = palisade_client::Credentials::bearer(&secret).unwrap();
        let client = palisade_client::Client::connect_with(&[&s.server.url], credentials)
            .await
            .unwrap();
        let first = client.watch("mallory/1").await.unwrap();
        let _second = client.watch("mallory/1").await.unwrap();
        let refused = client.watch("mallory/1").await;
        assert!(
            matches!(&refused, Err(e) if e.to_string().contains("watches")),
            "{:?}",
            refused.map(|_| ())
        );
        drop(first);
        let mut again = None;
        for _ in 0..100 {
            if let Ok(watch) = client.watch("mallory/1").await {
                again = Some(watch);
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(30)).await;
        }
        assert!(again.is_some(), "a closed watch kept its slot");
    });
}

/// P8 for the other principals: a principal cannot take the lease table for itself. hoarder
/// (`limits leases=5`) sends 16 acquires at once, over HTTP and gRPC: exactly 5 are granted
/// (the lease table counts them in the step that grants, so racing acquires never overshoot)
/// and 11 get 429 `principal_limit` / `RESOURCE_EXHAUSTED`; another principal is served; a
/// release gives one back.
#[test]
fn p8_a_principal_never_holds_more_leases_than_its_limit() {
    let s = Secured::start();
    let secret = s.secret("hoarder");
    let address = s.server.url.trim_start_matches("http://").to_owned();
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(16));
    let racers: Vec<_> = (0..16)
        .map(|i| {
            let (secret, address, barrier) = (secret.clone(), address.clone(), barrier.clone());
            let url = s.server.url.clone();
            std::thread::spawn(move || -> Result<String, String> {
                barrier.wait();
                if i % 2 == 0 {
                    let (status, body) = common::http_request(
                        &address,
                        "POST",
                        &format!("/v1/locks/hoarder%2F{i}/acquire"),
                        Some(&secret),
                        r#"{"ttl_ms": 60000}"#,
                    );
                    let body: Value = serde_json::from_str(&body).unwrap();
                    match status {
                        200 => Ok(body["lease_id"].as_str().unwrap().to_owned()),
                        429 => {
                            assert_eq!(body["error"], "principal_limit", "{body}");
                            Err(body["message"].as_str().unwrap().to_owned())
                        }
                        other => panic!("{other}: {body}"),
                    }
                } else {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    runtime.block_on(async {
                        let credentials = palisade_client::Credentials::bearer(&secret).unwrap();
                        let client = palisade_client::Client::connect_with(&[&url], credentials)
                            .await
                            .unwrap();
                        let options = palisade_client::AcquireOptions {
                            ttl: std::time::Duration::from_secs(60),
                            ..palisade_client::AcquireOptions::new(format!("hoarder/{i}"))
                        };
                        match client.acquire_once(&options).await {
                            Ok(grant) => Ok(grant.lease_id),
                            Err(error) => Err(error.to_string()),
                        }
                    })
                }
            })
        })
        .collect();
    let results: Vec<_> = racers.into_iter().map(|r| r.join().unwrap()).collect();
    let granted: Vec<&String> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(granted.len(), 5, "{results:?}");
    for refusal in results.iter().filter_map(|r| r.as_ref().err()) {
        assert!(refusal.contains("hoarder limits leases=N"), "{refusal}");
    }
    let (_, locks) = s.http(Some("ops"), "GET", "/v1/locks", "");
    let held = locks["locks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["principal"] == "hoarder")
        .count();
    assert_eq!(held, 5, "{locks}");
    // Another principal is served.
    s.acquire("orders", "orders/1");
    let (_, metrics) = s.http(Some("ops"), "GET", "/metrics", "");
    assert!(
        metrics
            .as_str()
            .unwrap()
            .contains("palisade_acquires_refused_total{reason=\"principal_limit\"} 11"),
        "{metrics}"
    );
    // A release gives one back, and only one.
    let (status, body) = s.http(
        Some("hoarder"),
        "POST",
        &format!("/v1/leases/{}/release", granted[0]),
        "",
    );
    assert_eq!(status, 200, "{body}");
    s.acquire("hoarder", "hoarder/again");
    let out = s.cli(
        "hoarder",
        &["lock", "acquire", "hoarder/more", "--ttl", "1m"],
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains("leases=N"), "{}", stderr(&out));
}

/// One name per meaning: the bearer secret is `PALISADE_AUTH_TOKEN` (read: the right secret
/// acquires, a wrong one is refused with exit 6); the old `PALISADE_TOKEN` is still read as the
/// bearer secret (the documented interface), and refused (exit 2, naming
/// `PALISADE_FENCE_TOKEN`) by the commands where it meant an ownership token.
#[test]
fn the_bearer_secret_and_the_ownership_token_have_one_variable_each() {
    let s = Secured::start();
    let with_env = |args: &[&str], name: &str, value: &str| {
        std::process::Command::new(BINARY)
            .args(args)
            .args(["--endpoint", &s.server.url])
            .env("RUST_LOG", "warn")
            .env_remove("PALISADE_TOKEN")
            .env_remove("PALISADE_AUTH_TOKEN")
            .env_remove("PALISADE_FENCE_TOKEN")
            .env(name, value)
            .output()
            .unwrap()
    };
    let acquire = ["lock", "acquire", "orders/env", "--ttl", "1m"];
    let granted = with_env(&acquire, "PALISADE_AUTH_TOKEN", &s.secret("orders"));
    assert!(granted.status.success(), "{}", stderr(&granted));
    let refused = with_env(&acquire, "PALISADE_AUTH_TOKEN", "not-the-secret-of-anyone");
    assert_eq!(refused.status.code(), Some(6), "{}", stderr(&refused));
    let acquire = ["lock", "acquire", "orders/old-name", "--ttl", "1m"];
    let old = with_env(&acquire, "PALISADE_TOKEN", &s.secret("orders"));
    assert!(old.status.success(), "{}", stderr(&old));
    assert!(
        stderr(&old).contains("PALISADE_AUTH_TOKEN"),
        "{}",
        stderr(&old)
    );
    let put = ["resource", "put", "orders/x", "k", "v"];
    let as_fence = std::process::Command::new(BINARY)
        .args(put)
        .env("RUST_LOG", "warn")
        .env_remove("PALISADE_FENCE_TOKEN")
        .env("PALISADE_TOKEN", "pt1.AAAA")
        .output()
        .unwrap();
    assert_eq!(as_fence.status.code(), Some(2), "{}", stderr(&as_fence));
    assert!(
        stderr(&as_fence).contains("PALISADE_FENCE_TOKEN"),
        "{}",
        stderr(&as_fence)
    );
}
