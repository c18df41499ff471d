//! Fuzzing the reference store's HTTP front end over real TCP: arbitrary lock names, keys,
//! values, token and sequence headers, including signed tokens altered in one place. No
//! answer is a 5xx, every refusal is a JSON error, no altered token is ever accepted (P4),
//! and afterwards the store still accepts the newest owner and refuses the older one (P2).
//! `PALISADE_FUZZ_CASES` cases (default 300, fixed seed); `scripts/fuzz` runs many more.

use std::time::Duration;

use palisade_fence::FenceMode;
use palisade_resource::{KeySource, ResourceConfig};
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
            .map_or(RngSeed::Fixed(0x7265_736f), RngSeed::Fixed),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

#[derive(Debug, Clone)]
enum Token {
    None,
    Text(String),
    Valid,
    /// The valid token with one character replaced.
    Altered(prop::sample::Index, char),
}

#[derive(Debug, Clone)]
enum Request {
    Put {
        lock: String,
        key: String,
        value: Vec<u8>,
        token: Token,
        seq: Option<String>,
    },
    Get {
        lock: String,
        key: String,
    },
    Activate {
        lock: String,
        token: Token,
    },
    Fence {
        lock: String,
    },
}

fn token() -> impl Strategy<Value = Token> {
    prop_oneof![
        1 => Just(Token::None),
        1 => ".{0,80}".prop_map(Token::Text),
        1 => Just(Token::Valid),
        3 => (any::<prop::sample::Index>(), proptest::char::range('-', 'z'))
            .prop_map(|(at, c)| Token::Altered(at, c)),
    ]
}

fn request() -> impl Strategy<Value = Request> {
    let lock = prop_oneof![Just("fz".to_owned()), ".{0,40}"];
    let key = prop_oneof![Just("k".to_owned()), ".{0,40}"];
    let seq = proptest::option::of(prop_oneof![
        ".{0,20}",
        any::<u64>().prop_map(|n| n.to_string())
    ]);
    prop_oneof![
        4 => (lock.clone(), key.clone(), proptest::collection::vec(any::<u8>(), 0..2048), token(), seq)
            .prop_map(|(lock, key, value, token, seq)| Request::Put { lock, key, value, token, seq }),
        1 => (lock.clone(), key).prop_map(|(lock, key)| Request::Get { lock, key }),
        2 => (lock.clone(), token()).prop_map(|(lock, token)| Request::Activate { lock, token }),
        1 => lock.prop_map(|lock| Request::Fence { lock }),
    ]
}

fn encode(segment: &str) -> String {
    utf8_percent_encode(segment, NON_ALPHANUMERIC).to_string()
}

/// The token text a case sends, and whether it is the exact signed token.
fn token_text(token: &Token, valid: &str) -> (Option<String>, bool) {
    match token {
        Token::None => (None, false),
        Token::Text(text) => (Some(text.clone()), text == valid),
        Token::Valid => (Some(valid.to_owned()), true),
        Token::Altered(at, c) => {
            let mut chars: Vec<char> = valid.chars().collect();
            let i = at.index(chars.len());
            chars[i] = *c;
            let text: String = chars.into_iter().collect();
            let exact = text == valid;
            (Some(text), exact)
        }
    }
}

/// Acquires `lock`: its token and lease id.
async fn acquire(http: &reqwest::Client, coordinator: &str, lock: &str) -> (String, String) {
    let granted: Value = http
        .post(format!("{coordinator}/v1/locks/{lock}/acquire"))
        .json(&json!({"ttl_ms": 60000}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let lease = &granted["lease_id"];
    let lease = lease
        .as_str()
        .map_or_else(|| lease.to_string(), str::to_owned);
    (
        granted["token"].as_str().expect("a token").to_owned(),
        lease,
    )
}

async fn fuzz(mode: FenceMode) {
    let dir = tempfile::tempdir().unwrap();
    let coordinator = palisade_server::start(palisade_server::ServerConfig {
        data_dir: dir.path().join("coordinator"),
        listen: "127.0.0.1:0".parse().unwrap(),
        cluster: None,
        ..Default::default()
    })
    .await
    .unwrap();
    let coordinator_url = format!("http://{}", coordinator.local_addr);
    let resource = palisade_resource::start(ResourceConfig {
        data_dir: dir.path().join("resource"),
        listen: "127.0.0.1:0".parse().unwrap(),
        mode,
        keys: KeySource::Coordinator(coordinator_url.clone()),
        principals: Vec::new(),
        revoked_keys: Vec::new(),
        coordinator_ca: None,
        key_refresh: palisade_resource::DEFAULT_KEY_REFRESH,
        effects_admin_secret: None,
        tls: None,
    })
    .await
    .unwrap();
    let base = format!("http://{}", resource.local_addr);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let (valid, lease) = acquire(&http, &coordinator_url, "fz").await;
    let handle = tokio::runtime::Handle::current();
    let (http2, base2, valid2) = (http.clone(), base.clone(), valid.clone());
    let outcome = tokio::task::spawn_blocking(move || {
        let mut runner = TestRunner::new(config());
        runner
            .run(&request(), |request| {
                handle.block_on(one_case(&http2, &base2, &valid2, request))
            })
            .map_err(|failure| failure.to_string())
    })
    .await
    .unwrap();
    if let Err(failure) = outcome {
        panic!("{mode:?}: {failure}");
    }
    // The store still serves, and (strict) P2: after a hand-off the newest owner writes and
    // the fuzzed owner's token is refused as stale.
    let fence = http
        .get(format!("{base}/v1/fences/fz"))
        .send()
        .await
        .unwrap();
    assert!(fence.status().is_success(), "the store still answers");
    if mode == FenceMode::Strict {
        let released = http
            .post(format!("{coordinator_url}/v1/leases/{lease}/release"))
            .send()
            .await
            .unwrap();
        assert!(released.status().is_success());
        let (newer, _) = acquire(&http, &coordinator_url, "fz").await;
        let put = |token: String| {
            http.put(format!("{base}/v1/kv/fz/after"))
                .header("palisade-token", token)
                .body("v")
                .send()
        };
        assert_eq!(put(newer).await.unwrap().status().as_u16(), 200);
        assert_eq!(
            put(valid).await.unwrap().status().as_u16(),
            409,
            "P2: stale"
        );
    }
    resource.shutdown().await;
    coordinator.shutdown().await.unwrap();
}

async fn one_case(
    http: &reqwest::Client,
    base: &str,
    valid: &str,
    request: Request,
) -> Result<(), TestCaseError> {
    let (sent, exact) = match &request {
        Request::Put {
            lock,
            key,
            value,
            token,
            seq,
        } => {
            let (text, exact) = token_text(token, valid);
            let mut sent = http
                .put(format!("{base}/v1/kv/{}/{}", encode(lock), encode(key)))
                .body(value.clone());
            if let Some(text) = text {
                sent = sent.header("palisade-token", text);
            }
            if let Some(seq) = seq {
                sent = sent.header("palisade-seq", seq.as_str());
            }
            (sent, exact)
        }
        Request::Get { lock, key } => (
            http.get(format!("{base}/v1/kv/{}/{}", encode(lock), encode(key))),
            false,
        ),
        Request::Activate { lock, token } => {
            let (text, exact) = token_text(token, valid);
            let mut sent = http.post(format!("{base}/v1/fences/{}/activate", encode(lock)));
            if let Some(text) = text {
                sent = sent.header("palisade-token", text);
            }
            (sent, exact)
        }
        Request::Fence { lock } => (
            http.get(format!("{base}/v1/fences/{}", encode(lock))),
            false,
        ),
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
    let writes = matches!(request, Request::Put { .. } | Request::Activate { .. });
    if writes && status.is_success() && !exact {
        return Err(TestCaseError::fail(format!(
            "P4: an altered or foreign token was accepted: {request:?} -> {status}: {text}"
        )));
    }
    let absent = status == reqwest::StatusCode::NOT_FOUND && matches!(request, Request::Get { .. });
    if status.is_client_error() && !absent {
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p2_p4_arbitrary_requests_to_a_strict_store_never_accept_a_forgery() {
    fuzz(FenceMode::Strict).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p2_p4_arbitrary_requests_to_a_sequenced_store_never_accept_a_forgery() {
    fuzz(FenceMode::Sequenced).await;
}
