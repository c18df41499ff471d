//! TLS on the client port, with real processes (P2: only a lease's owner acts on it; P4: no
//! forged or misattributed token is accepted). A coordinator with `--tls-cert`, `--tls-key`
//! and `--client-ca` serves HTTPS and gRPC over TLS only; clients authenticate with a client
//! certificate (its common name is the principal) or a bearer secret; a certificate from
//! another CA names nobody; the reference store fetches the coordinator's keys over TLS with
//! the CA it is given, and refuses to fetch them in clear from a non-loopback address.

use crate::common;

use std::path::PathBuf;
use std::process::{Command, Output};

use common::{http_request, ResourceProcess, ServerProcess, BINARY};
use serde_json::Value;

const ACL: &str = "\
orders   acquire orders/
stranger read    nothing/
ops      admin   *
";

struct Tls {
    dir: tempfile::TempDir,
    _server: ServerProcess,
    /// `https://127.0.0.1:PORT`
    url: String,
}

impl Tls {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        palisade_drill::certs::client_credentials(&dir.path().join("pki"), &["orders", "stranger"])
            .unwrap();
        // Another CA's client certificate naming the administrator.
        palisade_drill::certs::client_credentials(&dir.path().join("rogue"), &["ops"]).unwrap();
        let out = run(&[
            "auth",
            "new",
            "ops",
            "--secret-file",
            dir.path().join("ops.secret").to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        std::fs::write(dir.path().join("auth"), out.stdout).unwrap();
        std::fs::write(dir.path().join("acl"), ACL).unwrap();
        let file = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
        let server = ServerProcess::start_with(
            &[
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--tls-cert",
                &file("pki/server.pem"),
                "--tls-key",
                &file("pki/server.key"),
                "--client-ca",
                &file("pki/client-ca.pem"),
                "--auth-file",
                &file("auth"),
                "--acl-file",
                &file("acl"),
            ],
            &dir.path().join("data"),
        );
        let url = server.url.replace("http://", "https://");
        Self {
            dir,
            _server: server,
            url,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `palisade ARGS --endpoint https://… EXTRA` (no credentials from the environment).
    fn cli(&self, args: &[&str], extra: &[&str]) -> Output {
        Command::new(BINARY)
            .args(args)
            .args(["--endpoint", &self.url])
            .args(extra)
            .env("RUST_LOG", "warn")
            .env_remove("PALISADE_TOKEN")
            .env_remove("PALISADE_CA")
            .output()
            .unwrap()
    }

    /// The flags of a client presenting `pki`'s certificate for `principal`, trusting the
    /// coordinator's CA.
    fn as_client(&self, pki: &str, principal: &str) -> Vec<String> {
        let file = |name: String| {
            self.path(&format!("{pki}/{name}"))
                .to_string_lossy()
                .into_owned()
        };
        vec![
            "--ca".into(),
            self.path("pki/server-ca.pem")
                .to_string_lossy()
                .into_owned(),
            "--cert".into(),
            file(format!("client-{principal}.pem")),
            "--key".into(),
            file(format!("client-{principal}.key")),
        ]
    }
}

fn run(args: &[&str]) -> Output {
    Command::new(BINARY)
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

fn acquire_json(out: &Output) -> Value {
    assert!(out.status.success(), "{}", stderr(out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn p2_p4_clients_over_tls_are_who_their_certificate_or_bearer_says_and_nobody_else() {
    let t = Tls::start();
    let acquire = ["lock", "acquire", "orders/1", "--ttl", "1m", "--json"];

    // A client certificate the client CA signed names its principal: the lease (and the
    // signed token) belong to `orders`.
    let orders = t.as_client("pki", "orders");
    let granted = acquire_json(&t.cli(&acquire, &strs(&orders)));
    assert_eq!(granted["principal"], "orders");
    assert!(palisade_core::json::read(&granted["epoch"]).unwrap() >= 1);

    // A certified principal without the right is refused as such (403, exit 6).
    let stranger = t.as_client("pki", "stranger");
    let out = t.cli(&acquire, &strs(&stranger));
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("permission denied"),
        "{}",
        stderr(&out)
    );

    // Another CA's certificate naming the administrator: the handshake fails, nothing is
    // granted.
    let rogue = t.as_client("rogue", "ops");
    let out = t.cli(&["lock", "acquire", "anything", "--json"], &strs(&rogue));
    assert!(
        !out.status.success(),
        "a foreign CA's certificate was accepted"
    );
    // Under --json the failure is a JSON error, and no grant.
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(answer["error"]["exit_code"].is_u64(), "{answer}");
    assert!(answer.get("token").is_none(), "{answer}");

    // A bearer secret works over TLS too (no client certificate).
    let ca = t.path("pki/server-ca.pem").to_string_lossy().into_owned();
    let token = t.path("ops.secret").to_string_lossy().into_owned();
    let out = t.cli(
        &["lock", "acquire", "ops/1", "--json"],
        &["--ca", &ca, "--token-file", &token],
    );
    assert_eq!(acquire_json(&out)["principal"], "ops");

    // TLS without credentials is unauthenticated (exit 6), not anonymous.
    let out = t.cli(&["lock", "acquire", "orders/2"], &["--ca", &ca]);
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));

    // An https endpoint without the CA is refused before connecting, naming --ca; a wrong CA
    // fails the handshake.
    let out = t.cli(&acquire, &[]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--ca"), "{}", stderr(&out));
    let wrong_ca = t.path("rogue/server-ca.pem").to_string_lossy().into_owned();
    let out = t.cli(&acquire, &["--ca", &wrong_ca, "--token-file", &token]);
    assert!(
        !out.status.success(),
        "a server certificate from another CA was trusted"
    );

    // Clear text on the port is answered with an error naming https, and nothing else.
    let address = t.url.trim_start_matches("https://");
    let (status, body) = http_request(address, "GET", "/v1/locks", None, "");
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("tls_required") && body.contains("https://"),
        "{body}"
    );

    // The HTTP commands (reqwest) speak TLS with the same flags: the cluster view of a
    // single node, as the administrator.
    let out = t.cli(
        &["cluster", "status", "--json"],
        &["--ca", &ca, "--token-file", &token],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["mode"], "single", "{status}");
}

#[test]
fn p4_the_store_trusts_keys_fetched_over_tls_with_its_ca_and_never_in_clear_from_afar() {
    let t = Tls::start();
    let file = |name: &str| t.path(name).to_string_lossy().into_owned();
    let (ca, cert, key) = (
        file("pki/server-ca.pem"),
        file("pki/server.pem"),
        file("pki/server.key"),
    );
    // The store fetches the keys over TLS and serves TLS itself.
    let store = ResourceProcess::start_with(
        &t.path("store"),
        "strict",
        &t.url,
        &["--ca", &ca, "--tls-cert", &cert, "--tls-key", &key],
    );
    let store_url = store.url.replace("http://", "https://");
    let granted = acquire_json(&t.cli(
        &["lock", "acquire", "orders/1", "--ttl", "1m", "--json"],
        &strs(&t.as_client("pki", "orders")),
    ));
    let token = granted["token"].as_str().unwrap();
    let put = |value: &str, extra: &[&str]| {
        Command::new(BINARY)
            .args(["resource", "put", "orders/1", "k", value, "--token", token])
            .args(["--resource", &store_url])
            .args(extra)
            .env("RUST_LOG", "warn")
            .env_remove("PALISADE_CA")
            .output()
            .unwrap()
    };
    let out = put("v1", &["--ca", &ca]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Without the CA the client does not trust the store's certificate.
    assert!(!put("v2", &[]).status.success());

    // An https coordinator without the CA, or a clear-text one that is not on loopback: the
    // store refuses to start (before any request is sent) and says what to do.
    for (coordinator, needle) in [
        (t.url.as_str(), "--ca"),
        ("http://192.0.2.1:7420", "--trust-key"),
    ] {
        let out = Command::new(BINARY)
            .args(["resource", "serve", "--listen", "127.0.0.1:0"])
            .args(["--coordinator", coordinator])
            .arg("--data-dir")
            .arg(t.path("refused"))
            .env("RUST_LOG", "warn")
            .env_remove("PALISADE_CA")
            .output()
            .unwrap();
        assert!(!out.status.success(), "{coordinator}");
        assert!(stderr(&out).contains(needle), "{}", stderr(&out));
    }
}

#[test]
fn bad_tls_files_or_flags_refuse_to_start_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    palisade_drill::certs::client_credentials(&dir.path().join("pki"), &[]).unwrap();
    let file = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    let serve = |extra: &[&str]| {
        Command::new(BINARY)
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(extra)
            .env("RUST_LOG", "warn")
            .output()
            .unwrap()
    };
    // A key that is not the certificate's.
    let out = serve(&[
        "--tls-cert",
        &file("pki/server.pem"),
        "--tls-key",
        &file("pki/client-ca.key"),
    ]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("client-ca.key"), "{}", stderr(&out));
    // A missing file is named.
    let out = serve(&[
        "--tls-cert",
        &file("nope.pem"),
        "--tls-key",
        &file("pki/server.key"),
    ]);
    assert!(stderr(&out).contains("nope.pem"), "{}", stderr(&out));
    // An ACL with nothing to authenticate its principals.
    std::fs::write(dir.path().join("acl"), "orders acquire orders/\n").unwrap();
    let out = serve(&["--acl-file", &file("acl")]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--client-ca"), "{}", stderr(&out));
    // --client-ca needs --tls-cert and --acl-file (clap names them).
    let out = serve(&["--client-ca", &file("pki/client-ca.pem")]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--tls-cert"), "{}", stderr(&out));
}
