//! The web console in a real browser: headless Chromium (Debian's `chromium`, which
//! `scripts/test` installs) loads `/ui/` from a running coordinator after real acquires and a
//! real stale write, and the test checks what a person would see: the lock with its epoch, the
//! ownership transitions, the ownership timeline with the refused stale write marked on the
//! stale holder's lock, the rates, the audit's findings; audit probes hidden; the page fits
//! 1,280 px. Screenshots are kept in `target/test-artefacts/` (`console.png`: the page as it
//! opens; `console-probes.png`: with the audit's probe traffic shown).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{ResourceProcess, ServerProcess, BINARY};
use serde_json::Value;

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn chromium() -> PathBuf {
    if let Ok(path) = std::env::var("PALISADE_CHROMIUM") {
        return PathBuf::from(path);
    }
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .expect(
            "no Chromium: run ./scripts/test (it installs Debian's chromium), or set \
             PALISADE_CHROMIUM",
        )
}

/// Runs headless Chromium on `url` with `args` (`--dump-dom`, `--screenshot=…`): a profile
/// of its own, no network beyond loopback, virtual time so the page's polling settles.
fn browse(profile: &Path, url: &str, args: &[&str]) -> Output {
    Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--window-size=1280,1500",
            "--virtual-time-budget=4000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .output()
        .expect("run chromium")
}

fn artefacts() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-artefacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn acquire(server: &ServerProcess, args: &[&str]) -> Value {
    let mut all = vec!["lock", "acquire"];
    all.extend_from_slice(args);
    all.push("--json");
    let out = server.cli(&all);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// P1 made visible: after a lease expires and a new owner writes, the old owner's write is
/// refused by the store, and the console shows the lock at its new epoch, the transitions that
/// led there, the stale_epoch rejection with both epochs, and the audit's critical finding.
/// Client-chosen text (a holder full of markup) is shown as text, never run.
#[test]
fn p1_console_shows_the_lock_its_epoch_and_the_refused_stale_write_in_a_browser() {
    let dir = tempfile::tempdir().unwrap();
    let (server, store) = start_with_a_critical_policy(dir.path());
    let (a_epoch, b_epoch) = a_stale_write_refused(&server, &store);
    // The audit's probe: its leases and its refused write are labelled, and hidden by default.
    let (status, probe) = server.http("POST", "/v1/audit/probe", None, "");
    assert_eq!(status, 200, "{probe}");
    acquire(
        &server,
        &[
            "bare/1",
            "--ttl",
            "1h",
            "--holder",
            "<img src=x onerror=\"document.title='pwned'\">",
        ],
    );

    let url = format!("{}/ui/", server.url);
    let profile = dir.path().join("chromium");
    let out = browse(&profile, &url, &["--dump-dom"]);
    assert!(out.status.success(), "chromium failed: {}", stderr(&out));
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    let checks = assert_the_page_shows_it(&dom, a_epoch, b_epoch);
    let first_render: u64 = dom
        .split("data-first-render-ms=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    let weight: usize = ["/ui/", "/ui/app.js", "/ui/style.css"]
        .iter()
        .map(|path| server.http("GET", path, None, "").1.len())
        .sum();
    eprintln!(
        "console: {checks} checks passed, page weight {weight} bytes (3 files), first render \
         {first_render} ms (virtual time)"
    );
    keep_a_screenshot(&profile, &url, "console.png");
    keep_a_screenshot(&profile, &format!("{url}#probes"), "console-probes.png");
}

/// A coordinator whose policy names `report/*` critical with a reference store as its
/// boundary, and `bare/*` critical with none; and that store.
fn start_with_a_critical_policy(dir: &Path) -> (ServerProcess, ResourceProcess) {
    let policy = dir.join("policy.toml");
    std::fs::write(&policy, "default_class = \"efficiency\"\n").unwrap();
    let server = ServerProcess::start_with_policy(&policy, &dir.join("data"));
    let store = ResourceProcess::start(&dir.join("store"), "strict", &server.url);
    std::fs::write(
        &policy,
        format!(
            "default_class = \"efficiency\"\n\
             [[lock]]\npattern = \"report/*\"\nclass = \"critical\"\n\
             boundary = {{ kind = \"resource\", url = \"{}\" }}\n\
             [[lock]]\npattern = \"bare/*\"\nclass = \"critical\"\n",
            store.url
        ),
    )
    .unwrap();
    server.reload_policy_until(|shown| shown.to_string().contains("bare/*"));
    (server, store)
}

/// Owner A's lease expires; owner B acquires and writes; A wakes up and writes: refused by the
/// store. Returns A's and B's epochs.
fn a_stale_write_refused(server: &ServerProcess, store: &ResourceProcess) -> (u64, u64) {
    let a = acquire(
        server,
        &["report/7", "--ttl", "50ms", "--holder", "worker-a"],
    );
    std::thread::sleep(std::time::Duration::from_millis(150));
    let b = acquire(server, &["report/7", "--ttl", "1h", "--holder", "worker-b"]);
    let (a_epoch, b_epoch) = (
        palisade_core::json::read(&a["epoch"]).unwrap(),
        palisade_core::json::read(&b["epoch"]).unwrap(),
    );
    assert!(b_epoch > a_epoch);
    let put = |value: &str, owner: &Value| {
        store.cli(&[
            "put",
            "report/7",
            "summary",
            value,
            "--token",
            owner["token"].as_str().unwrap(),
        ])
    };
    let out = put("from B", &b);
    assert!(out.status.success(), "{}", stderr(&out));
    // B renews once: the timeline marks the renewal on B's bar.
    let renewed = server.cli(&["lock", "renew", b["lease_id"].as_str().unwrap()]);
    assert!(renewed.status.success(), "{}", stderr(&renewed));
    let out = put("from A", &a);
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    (a_epoch, b_epoch)
}

/// What a person must see on the page: the lock at B's epoch, the transitions, the refused
/// stale write with both epochs, the audit's critical finding, and a holder's markup as text,
/// with no error banner. Returns how many checks passed.
fn assert_the_page_shows_it(dom: &str, a_epoch: u64, b_epoch: u64) -> usize {
    let short = |epoch: u64| format!("…{}", &epoch.to_string()[13..]);
    let checks = [
        // The lock, at B's epoch, held by B; its epoch shown short, whole on hover.
        format!("data-lock=\"report/7\" data-epoch=\"{b_epoch}\""),
        "<td>worker-b</td>".to_owned(),
        format!("title=\"{b_epoch}\" data-epoch=\"{b_epoch}\">{}</td>", short(b_epoch)),
        // The transitions: A granted, A expired, B granted.
        format!("data-kind=\"granted\" data-lock=\"report/7\" data-epoch=\"{a_epoch}\" data-holder=\"worker-a\""),
        format!("data-kind=\"expired\" data-lock=\"report/7\" data-epoch=\"{a_epoch}\" data-holder=\"worker-a\""),
        format!("data-kind=\"granted\" data-lock=\"report/7\" data-epoch=\"{b_epoch}\" data-holder=\"worker-b\""),
        // The timeline: A's bar ends in an expiry, B's is open, and A's refused write is a
        // mark on report/7's lane naming A's epoch and A.
        format!("class=\"lease\" data-lock=\"report/7\" data-epoch=\"{a_epoch}\" data-holder=\"worker-a\" data-end=\"expired\""),
        format!("class=\"lease\" data-lock=\"report/7\" data-epoch=\"{b_epoch}\" data-holder=\"worker-b\" data-end=\"held\""),
        format!("class=\"refusal\" data-lock=\"report/7\" data-epoch=\"{a_epoch}\" data-holder=\"worker-a\" data-reason=\"stale_epoch\""),
        // The rates: two grants of report/7 (and bare/1's), one expiry, one refusal (the probe's
        // own refused write is hidden with the probe).
        "data-series=\"refusals\" data-total=\"1\"".to_owned(),
        "data-series=\"ends\" data-total=\"1\"".to_owned(),
        "data-series=\"grants\" data-total=\"3\"".to_owned(),
        // The refused stale write in the table, with the epoch it claimed.
        format!("data-reason=\"stale_epoch\" data-lock=\"report/7\" data-epoch=\"{a_epoch}\""),
        // The audit's critical finding about the lock with no boundary.
        "data-code=\"no_boundary\"".to_owned(),
        "<td class=\"sev-critical\">critical</td>".to_owned(),
        // Markup in a holder is text.
        "&lt;img src=x onerror=\"document.title='pwned'\"&gt;".to_owned(),
        "data-first-render-ms=".to_owned(),
        // Nothing wider than the 1,280 px window.
        "data-fits=\"true\"".to_owned(),
    ];
    for check in &checks {
        assert!(
            dom.contains(check.as_str()),
            "the page lacks {check:?}:\n{dom}"
        );
    }
    let b_bar = format!(
        "class=\"lease\" data-lock=\"report/7\" data-epoch=\"{b_epoch}\" data-holder=\"worker-b\""
    );
    let bar = &dom[dom.find(&b_bar).unwrap()..];
    let bar = &bar[..bar.find("</g>").unwrap()];
    assert!(
        bar.contains("class=\"renewal\""),
        "B's renewal is on its bar: {bar}"
    );
    let probes = dom.matches("data-probe=\"true\"").count();
    assert!(probes > 0, "the probe's transitions are labelled:\n{dom}");
    assert_eq!(
        dom.matches("data-probe=\"true\" hidden=\"\"").count(),
        probes,
        "every probe transition is hidden by default:\n{dom}"
    );
    assert!(
        !dom.contains("<img src=\"x\""),
        "markup from a client ran:\n{dom}"
    );
    assert!(!dom.contains("<title>pwned"), "{dom}");
    assert!(
        !dom.contains("id=\"banner\">"),
        "an error banner shows:\n{dom}"
    );
    checks.len() + 2
}

/// Takes a screenshot of `url` into `target/test-artefacts/NAME` and checks it is one.
fn keep_a_screenshot(profile: &Path, url: &str, name: &str) {
    let screenshot = artefacts().join(name);
    let _ = std::fs::remove_file(&screenshot);
    let out = browse(
        profile,
        url,
        &[&format!("--screenshot={}", screenshot.display())],
    );
    assert!(out.status.success(), "chromium failed: {}", stderr(&out));
    let png = std::fs::read(&screenshot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{} bytes",
        png.len()
    );
    eprintln!(
        "screenshot: {}",
        screenshot.canonicalize().unwrap().display()
    );
}

/// The console is read-only and authenticated like `read`: without credentials the page says
/// so and shows no data; with `#token=` of a principal that may read, it shows the locks; the
/// feed shows only the locks the caller may read.
#[test]
fn console_needs_read_credentials_and_shows_only_readable_locks() {
    let dir = tempfile::tempdir().unwrap();
    let mut lines = String::new();
    for principal in ["ops", "orders"] {
        let out = Command::new(BINARY)
            .args(["auth", "new", principal, "--secret-file"])
            .arg(dir.path().join(principal))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        lines.push_str(&String::from_utf8(out.stdout).unwrap());
    }
    std::fs::write(dir.path().join("auth"), lines).unwrap();
    std::fs::write(
        dir.path().join("acl"),
        "ops admin *\norders acquire orders/\norders read orders/\n",
    )
    .unwrap();
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
    let secret = |p: &str| {
        std::fs::read_to_string(dir.path().join(p))
            .unwrap()
            .trim()
            .to_owned()
    };
    for lock in ["orders/1", "payroll/1"] {
        let out = server.cli_as(
            &dir.path().join("ops"),
            &["lock", "acquire", lock, "--ttl", "1h"],
        );
        assert!(out.status.success(), "{}", stderr(&out));
    }
    // The files carry no data and need no credentials; every route with data does.
    assert_eq!(server.http("GET", "/ui/", None, "").0, 200);
    for path in ["/v1/audit", "/v1/policy", "/v1/transitions", "/v1/locks"] {
        assert_eq!(server.http("GET", path, None, "").0, 401, "{path}");
    }
    // The audit and the policy need read on every lock; the feed filters.
    assert_eq!(
        server
            .http("GET", "/v1/audit", Some(&secret("orders")), "")
            .0,
        403
    );
    let (status, body) = server.http("GET", "/v1/transitions", Some(&secret("orders")), "");
    assert_eq!(status, 200);
    assert!(
        body.contains("orders/1") && !body.contains("payroll/1"),
        "{body}"
    );
    // A bad query is a JSON error, like every other.
    let (status, body) = server.http("GET", "/v1/transitions?after=x", Some(&secret("ops")), "");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("invalid_argument"), "{body}");
    // Probing is for admins.
    assert_eq!(
        server
            .http("POST", "/v1/audit/probe", Some(&secret("orders")), "")
            .0,
        403
    );

    let profile = dir.path().join("chromium");
    let out = browse(&profile, &format!("{}/ui/", server.url), &["--dump-dom"]);
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(dom.contains("refused these credentials"), "{dom}");
    assert!(!dom.contains("data-lock=\"orders/1\""), "{dom}");
    let out = browse(
        &profile,
        &format!("{}/ui/#token={}", server.url, secret("ops")),
        &["--dump-dom"],
    );
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(dom.contains("data-lock=\"orders/1\""), "{dom}");
    assert!(dom.contains("data-lock=\"payroll/1\""), "{dom}");
    assert!(
        !dom.contains(&secret("ops")),
        "the secret stays out of the page"
    );
}

/// The console opened on a follower of a 3-member cluster follows the leader, as the clients
/// do: the page that loads is the leader's, with the lock held through the cluster and its
/// epoch, and no error banner.
#[test]
fn the_console_opened_on_a_follower_follows_the_leader() {
    let dir = tempfile::tempdir().unwrap();
    let ports: Vec<u16> = (0..3).map(|_| common::free_port()).collect();
    let cluster = (1..=3)
        .map(|id| format!("{id}=127.0.0.1:{}", ports[id - 1]))
        .collect::<Vec<_>>()
        .join(",");
    let members: Vec<ServerProcess> = (1..=3)
        .map(|id: usize| {
            let id_text = id.to_string();
            ServerProcess::start_with(
                &[
                    "serve",
                    "--node-id",
                    &id_text,
                    "--cluster",
                    &cluster,
                    "--insecure-peers",
                ],
                &dir.path().join(format!("n{id}")),
            )
        })
        .collect();
    let endpoints = ports
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    // A lock held through the cluster (the client follows the leader); bounded wait for one.
    let granted = (0..200)
        .find_map(|_| {
            let out = Command::new(BINARY)
                .args([
                    "lock",
                    "acquire",
                    "console/follower",
                    "--ttl",
                    "60s",
                    "--json",
                ])
                .args(["--endpoint", &endpoints])
                .env("RUST_LOG", "error")
                .output()
                .unwrap();
            if out.status.success() {
                return Some(serde_json::from_slice::<Value>(&out.stdout).unwrap());
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
            None
        })
        .expect("no leader within 10 s");
    let epoch = palisade_core::json::read(&granted["epoch"]).unwrap();
    let status: Value =
        serde_json::from_str(&members[0].http("GET", "/v1/cluster", None, "").1).unwrap();
    let leader = status["leader"].as_u64().expect("a leader");
    let follower = members
        .iter()
        .enumerate()
        .find(|(i, _)| *i as u64 + 1 != leader)
        .map(|(_, m)| m)
        .unwrap();
    let profile = tempfile::tempdir().unwrap();
    let out = browse(
        profile.path(),
        &format!("{}/ui/", follower.url),
        &["--dump-dom"],
    );
    assert!(out.status.success(), "chromium failed: {}", stderr(&out));
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        dom.contains(&format!(
            "data-lock=\"console/follower\" data-epoch=\"{epoch}\""
        )),
        "the leader's console with the lock was not shown:\n{dom}"
    );
    assert!(
        !dom.contains("id=\"banner\">"),
        "an error banner shows:\n{dom}"
    );
}
