//! Fuzzing the coordinator's HTTP front end over real TCP: arbitrary lock names, lease ids,
//! JSON bodies and header values. Every answer is a JSON error or a success, never a 5xx, and
//! the server keeps granting afterwards (P8: no input stops the coordinator; P1: a grant after
//! the fuzzing still gets a higher epoch). `PALISADE_FUZZ_CASES` cases (default 300, fixed
//! seed); `scripts/fuzz` runs many more with a fresh seed.

use std::time::Duration;

use palisade_server::auth::Auth;
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use proptest::prelude::*;
use proptest::test_runner::{RngSeed, TestCaseError, TestRunner};
use serde_json::{json, Value};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PALISADE_FUZZ_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(300),
        rng_seed: std::env::var("PROPTEST_RNG_SEED")
            .ok()
            .and_then(|seed| seed.parse().ok())
            .map_or(RngSeed::Fixed(0x6874_7470), RngSeed::Fixed),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A JSON value of any shape, small.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        ".{0,40}".prop_map(Value::String),
    ];
    leaf.prop_recursive(2, 8, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map(".{0,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// An acquire body: mostly the fields the API knows, with values of any type (waits stay
/// short so that a held lock never stalls the run).
fn acquire_body() -> impl Strategy<Value = String> {
    let field = |name: &'static str| {
        prop_oneof![
            Just(None),
            any_json().prop_map(Some),
            (0u64..50).prop_map(|n| Some(json!(n))),
        ]
        .prop_map(move |v| v.map(|v| (name.to_owned(), v)))
    };
    let object = (
        field("ttl_ms"),
        prop_oneof![
            Just(None),
            (0u64..20).prop_map(|n| Some(("wait_ms".to_owned(), json!(n))))
        ],
        field("holder"),
        field("class"),
        field("request_id"),
        proptest::option::of((".{0,8}", any_json())),
    )
        .prop_map(|(a, b, c, d, e, f)| {
            let map: serde_json::Map<String, Value> =
                [a, b, c, d, e, f].into_iter().flatten().collect();
            Value::Object(map).to_string()
        });
    prop_oneof![
        3 => object,
        1 => ".{0,200}",
        1 => any_json().prop_map(|v| v.to_string()),
    ]
}

#[derive(Debug, Clone)]
enum Request {
    Acquire {
        name: String,
        body: String,
        content_type: String,
    },
    Renew {
        id: String,
    },
    Release {
        id: String,
    },
    Show {
        name: String,
    },
}

fn request() -> impl Strategy<Value = Request> {
    let name = prop_oneof![".{0,300}", "[a-z/]{1,12}"];
    let id = prop_oneof![
        ".{0,40}",
        any::<u64>().prop_map(|n| n.to_string()),
        (0u64..20).prop_map(|n| n.to_string())
    ];
    prop_oneof![
        4 => (name.clone(), acquire_body(), prop_oneof!["application/json", ".{0,30}"])
            .prop_map(|(name, body, content_type)| Request::Acquire { name, body, content_type }),
        1 => id.clone().prop_map(|id| Request::Renew { id }),
        1 => id.prop_map(|id| Request::Release { id }),
        1 => name.prop_map(|name| Request::Show { name }),
    ]
}

/// A coordinator on loopback under `auth`, with its data in `dir`: the server, its base URL and
/// an HTTP client.
fn start(
    runtime: &tokio::runtime::Runtime,
    dir: &std::path::Path,
    auth: Auth,
) -> (palisade_server::RunningServer, String, reqwest::Client) {
    let server = runtime
        .block_on(palisade_server::start(palisade_server::ServerConfig {
            data_dir: dir.join("data"),
            listen: "127.0.0.1:0".parse().unwrap(),
            auth: std::sync::Arc::new(auth),
            ..Default::default()
        }))
        .unwrap();
    let base = format!("http://{}", server.local_addr);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    (server, base, http)
}

fn encode(segment: &str) -> String {
    utf8_percent_encode(segment, NON_ALPHANUMERIC).to_string()
}

#[test]
fn p1_p8_arbitrary_http_requests_get_json_answers_and_never_stop_the_coordinator() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (server, base, http) = start(&runtime, dir.path(), Auth::open());
    let first = runtime.block_on(grant_epoch(&http, &base));
    let mut runner = TestRunner::new(config());
    let outcome = runner.run(&request(), |request| {
        runtime.block_on(async {
            let sent = match &request {
                Request::Acquire {
                    name,
                    body,
                    content_type,
                } => http
                    .post(format!("{base}/v1/locks/{}/acquire", encode(name)))
                    .header("content-type", content_type.as_str())
                    .body(body.clone()),
                Request::Renew { id } => {
                    http.post(format!("{base}/v1/leases/{}/renew", encode(id)))
                }
                Request::Release { id } => {
                    http.post(format!("{base}/v1/leases/{}/release", encode(id)))
                }
                Request::Show { name } => http.get(format!("{base}/v1/locks/{}", encode(name))),
            };
            let answer = match sent.send().await {
                Ok(answer) => answer,
                // reqwest refuses some header values itself: nothing reached the server.
                Err(error) if error.is_builder() => return Ok(()),
                Err(error) => return Err(TestCaseError::fail(format!("{request:?}: {error}"))),
            };
            let status = answer.status();
            let text = answer.text().await.unwrap_or_default();
            if status.is_server_error() {
                return Err(TestCaseError::fail(format!(
                    "{request:?} -> {status}: {text}"
                )));
            }
            if status.is_client_error() {
                let body: Value = serde_json::from_str(&text).map_err(|_| {
                    TestCaseError::fail(format!("{request:?} -> {status}, not JSON: {text:?}"))
                })?;
                if !body["error"].is_string() {
                    return Err(TestCaseError::fail(format!(
                        "{request:?} -> {status}: {text}"
                    )));
                }
            }
            Ok(())
        })
    });
    if let Err(failure) = outcome {
        panic!("{failure}");
    }
    let after = runtime.block_on(grant_epoch(&http, &base));
    assert!(
        after > first,
        "P1: a grant after the fuzzing has a higher epoch"
    );
    runtime.block_on(server.shutdown()).unwrap();
}

/// Acquires and releases a lock of its own; returns the epoch.
async fn grant_epoch(http: &reqwest::Client, base: &str) -> u64 {
    let granted: Value = http
        .post(format!("{base}/v1/locks/fuzz-probe/acquire"))
        .json(&json!({"ttl_ms": 1000}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let epoch = palisade_core::json::read(&granted["epoch"]).expect("a grant");
    let lease = granted["lease_id"].clone();
    let lease = lease
        .as_str()
        .map_or_else(|| lease.to_string(), str::to_owned);
    http.post(format!("{base}/v1/leases/{lease}/release"))
        .send()
        .await
        .unwrap();
    epoch
}

/// An `Authorization` value: arbitrary text, or near misses of `secret` (one character changed,
/// truncated, extended, another scheme, another case), or the secret itself.
fn authorization(secret: &'static str) -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        Just(None),
        ".{0,80}".prop_map(Some),
        ".{0,80}".prop_map(|s| Some(format!("Bearer {s}"))),
        (0..secret.len(), any::<char>()).prop_map(move |(at, c)| {
            let mut near: Vec<char> = secret.chars().collect();
            near[at] = c;
            Some(format!("Bearer {}", near.into_iter().collect::<String>()))
        }),
        (0..secret.len()).prop_map(move |n| Some(format!("Bearer {}", &secret[..n]))),
        ".{1,8}".prop_map(move |s| Some(format!("Bearer {secret}{s}"))),
        prop_oneof![Just("Basic"), Just("BEARER"), Just("Token"), Just("")]
            .prop_map(move |scheme| Some(format!("{scheme} {secret}"))),
        Just(Some(format!("Bearer {secret}"))),
    ]
}

#[test]
fn p2_p8_arbitrary_credentials_never_pass_for_a_principal_and_never_stop_the_coordinator() {
    const SECRET: &str = "fuzz-reader-secret-0123456789abcdefghij";
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (auth_file, acl_file) = (dir.path().join("auth"), dir.path().join("acl"));
    let line = format!("reader {}\n", palisade_server::auth::hash_secret(SECRET));
    std::fs::write(&auth_file, line).unwrap();
    // The only principal may read: no credentials may acquire, release or change anything.
    std::fs::write(&acl_file, "reader read *\n").unwrap();
    let auth = Auth::from_files(&auth_file, &acl_file).unwrap();
    let (server, base, http) = start(&runtime, dir.path(), auth);
    let routes = prop_oneof![
        Just(("POST", "/v1/locks/a/acquire")),
        Just((
            "POST",
            "/v1/leases/0123456789abcdef0123456789abcdef/release"
        )),
        Just(("POST", "/v1/leases/0123456789abcdef0123456789abcdef/renew")),
        Just(("POST", "/v1/cluster/members")),
        Just(("GET", "/v1/locks")),
        Just(("GET", "/v1/locks/a")),
    ];
    let mut runner = TestRunner::new(config());
    let outcome = runner.run(
        &(routes, authorization(SECRET)),
        |((method, path), authorization)| {
            runtime.block_on(async {
                let mut request = match method {
                    "GET" => http.get(format!("{base}{path}")),
                    _ => http.post(format!("{base}{path}")).body("{}"),
                };
                if let Some(value) = &authorization {
                    request = request.header("authorization", value.as_str());
                }
                let answer = match request.send().await {
                    Ok(answer) => answer,
                    Err(error) if error.is_builder() => return Ok(()),
                    Err(error) => return Err(TestCaseError::fail(error.to_string())),
                };
                let status = answer.status().as_u16();
                let text = answer.text().await.unwrap_or_default();
                let valid = authorization
                    .as_deref()
                    .and_then(|v| v.strip_prefix("Bearer ").or(v.strip_prefix("bearer ")))
                    .is_some_and(|s| s.trim() == SECRET);
                let expected: &[u16] = match (valid, method) {
                    (false, _) => &[401],
                    (true, "GET") => &[200],
                    // No such lease (404) or not the reader's to end (403).
                    (true, _) if path.starts_with("/v1/leases/") => &[403, 404],
                    (true, _) => &[403],
                };
                if !expected.contains(&status) {
                    return Err(TestCaseError::fail(format!(
                        "{method} {path} with {authorization:?} -> {status}: {text}"
                    )));
                }
                Ok(())
            })
        },
    );
    if let Err(failure) = outcome {
        panic!("{failure}");
    }
    runtime.block_on(server.shutdown()).unwrap();
}
