//! The HTTP/JSON API against a real coordinator (redb in a temp dir, loopback TCP): the happy
//! path, every bad input of the issue's list, and that the server keeps serving after each.

use palisade_core::token::decode_public_key;
use palisade_core::{LockName, TokenVerifier};
use palisade_server::{RunningServer, ServerConfig};
use reqwest::StatusCode;
use serde_json::{json, Value};

struct Fixture {
    server: Option<RunningServer>,
    base: String,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let config = ServerConfig {
        data_dir: dir.path().join("data"),
        listen: "127.0.0.1:0".parse().unwrap(),
        cluster: None,
        ..Default::default()
    };
    let server = palisade_server::start(config).await.unwrap();
    Fixture {
        base: format!("http://{}", server.local_addr),
        server: Some(server),
        http: reqwest::Client::new(),
        _dir: dir,
    }
}

impl Fixture {
    async fn post(&self, path: &str, body: &str) -> (StatusCode, Value) {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str) -> (StatusCode, String) {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        (response.status(), response.text().await.unwrap())
    }

    async fn acquire(&self, lock: &str, body: Value) -> (StatusCode, Value) {
        self.post(&format!("/v1/locks/{lock}/acquire"), &body.to_string())
            .await
    }
}

#[tokio::test]
async fn p1_p4_acquire_returns_a_verifiable_token_and_increasing_epochs() {
    let f = fixture().await;
    let (status, first) = f
        .acquire(
            "report%2F7",
            json!({"ttl_ms": 5_000, "holder": "w1", "class": "critical"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["lock"], "report/7");
    assert_eq!(first["holder"], "w1");
    assert_eq!(first["ttl_ms"], 5_000);
    for field in ["epoch", "lease_id", "token"] {
        assert!(!first[field].is_null(), "{field} missing in {first}");
    }

    // The token verifies with the key the server publishes, for this lock only.
    let (_, keys) = f.get("/v1/keys").await;
    let keys: Value = serde_json::from_str(&keys).unwrap();
    let key = decode_public_key(keys["keys"][0]["public_key"].as_str().unwrap()).unwrap();
    let verifier = TokenVerifier::new([key]);
    let lock = LockName::new("report/7").unwrap();
    let claims = verifier
        .verify(first["token"].as_str().unwrap(), Some(&lock))
        .unwrap();
    assert_eq!(
        claims.epoch.0,
        palisade_core::json::read(&first["epoch"]).unwrap()
    );
    assert_eq!(claims.key_id.to_string(), keys["keys"][0]["key_id"]);

    let lease = first["lease_id"].as_str().unwrap();
    let (status, renewed) = f.post(&format!("/v1/leases/{lease}/renew"), "").await;
    assert_eq!(status, StatusCode::OK, "{renewed}");
    let (status, _) = f.post(&format!("/v1/leases/{lease}/release"), "").await;
    assert_eq!(status, StatusCode::OK);
    let (status, second) = f.acquire("report%2F7", json!({})).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        palisade_core::json::read(&second["epoch"]) > palisade_core::json::read(&first["epoch"])
    );
    assert_eq!(second["holder"], "anonymous");
}

#[tokio::test]
async fn list_show_health_and_metrics() {
    let f = fixture().await;
    let (_, granted) = f
        .acquire("jobs.a", json!({"class": "efficiency", "holder": "h"}))
        .await;
    let (status, list) = f.get("/v1/locks").await;
    assert_eq!(status, StatusCode::OK);
    let list: Value = serde_json::from_str(&list).unwrap();
    assert_eq!(list["locks"][0]["lock"], "jobs.a");
    assert_eq!(list["locks"][0]["class"], "efficiency");
    assert_eq!(list["locks"][0]["epoch"], granted["epoch"]);
    let (status, show) = f.get("/v1/locks/jobs.a").await;
    assert_eq!(status, StatusCode::OK);
    assert!(show.contains("\"held\":true"), "{show}");
    // Held since: the grant's wall-clock time, in the list and the lock's own answer.
    let since = serde_json::from_str::<Value>(&show).unwrap()["granted_unix_ms"]
        .as_u64()
        .expect("a held lock says since when");
    let now = palisade_core::clock::now_ms();
    assert!(since <= now && now - since < 60_000, "{since} vs {now}");
    assert_eq!(list["locks"][0]["granted_unix_ms"], since);
    let (_, free) = f.get("/v1/locks/nobody").await;
    assert!(free.contains("\"held\":false"), "{free}");
    assert_eq!(f.get("/healthz").await.0, StatusCode::OK);
    assert_eq!(f.get("/readyz").await.0, StatusCode::OK);
    let (status, metrics) = f.get("/metrics").await;
    assert_eq!(status, StatusCode::OK);
    for name in [
        "palisade_leases_granted_total 1",
        "palisade_ownership_transitions_total{class=\"efficiency\",transition=\"granted\"} 1",
        "palisade_acquire_duration_seconds_count 1",
        "palisade_leases_active 1",
        "palisade_renewal_failures_total 0",
    ] {
        assert!(metrics.contains(name), "{name} missing from:\n{metrics}");
    }
}

#[tokio::test]
async fn bad_input_gets_a_json_error_and_the_server_keeps_serving() {
    let f = fixture().await;
    let held = f.acquire("busy", json!({"holder": "first"})).await.1;
    for (path, body, status, code) in bad_requests() {
        let (got, error) = f.post(&path, &body).await;
        assert_eq!(got, status, "{path} {body:.60}: {error}");
        assert_eq!(error["error"], code, "{path} {body:.60}: {error}");
        assert!(
            error["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{error}"
        );
    }
    // A released lease is unknown afterwards.
    let lease = held["lease_id"].as_str().unwrap();
    assert_eq!(
        f.post(&format!("/v1/leases/{lease}/release"), "").await.0,
        StatusCode::OK
    );
    let (status, error) = f.post(&format!("/v1/leases/{lease}/renew"), "").await;
    assert_eq!(
        (status, error["error"].as_str()),
        (StatusCode::NOT_FOUND, Some("unknown_lease"))
    );
    // Still serving.
    assert_eq!(f.acquire("busy", json!({})).await.0, StatusCode::OK);
    let (_, metrics) = f.get("/metrics").await;
    assert!(
        metrics.contains("palisade_renewal_failures_total 2"),
        "{metrics}"
    );
}

/// Requests the API must refuse (with lock `busy` held): path, body, status, error code.
fn bad_requests() -> Vec<(String, String, StatusCode, &'static str)> {
    vec![
        (
            "/v1/locks/bad%20name/acquire".into(),
            "{}".into(),
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        ),
        (
            format!("/v1/locks/{}/acquire", "x".repeat(257)),
            "{}".into(),
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        ),
        (
            "/v1/locks/a/acquire".into(),
            r#"{"ttl_ms":0}"#.into(),
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        ),
        (
            "/v1/locks/a/acquire".into(),
            r#"{"ttl_ms":3600001}"#.into(),
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        ),
        (
            "/v1/locks/a/acquire".into(),
            r#"{"wait_ms":300001}"#.into(),
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        ),
        (
            "/v1/locks/a/acquire".into(),
            r#"{"class":"urgent"}"#.into(),
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        ),
        (
            "/v1/locks/a/acquire".into(),
            r#"{"ttl":5}"#.into(),
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        ),
        (
            "/v1/locks/a/acquire".into(),
            r#"{"ttl_ms":"#.into(),
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        ),
        (
            "/v1/locks/a/acquire".into(),
            r#"{"holder":""}"#.into(),
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        ),
        (
            "/v1/locks/a/acquire".into(),
            format!(r#"{{"holder":"{}"}}"#, "h".repeat(100_000)),
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
        ),
        (
            "/v1/locks/busy/acquire".into(),
            "{}".into(),
            StatusCode::CONFLICT,
            "lock_held",
        ),
        (
            "/v1/locks/busy/acquire".into(),
            r#"{"wait_ms":50}"#.into(),
            StatusCode::CONFLICT,
            "lock_held",
        ),
        (
            "/v1/leases/notanumber/renew".into(),
            "".into(),
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        ),
        (
            "/v1/leases/000000000000000000000000000f4240/renew".into(),
            "".into(),
            StatusCode::NOT_FOUND,
            "unknown_lease",
        ),
        (
            "/v1/leases/000000000000000000000000000f4240/release".into(),
            "".into(),
            StatusCode::NOT_FOUND,
            "unknown_lease",
        ),
        (
            "/v1/nothing".into(),
            "".into(),
            StatusCode::NOT_FOUND,
            "not_found",
        ),
    ]
}

#[tokio::test]
async fn p8_graceful_shutdown_keeps_every_acknowledged_lease() {
    let mut f = fixture().await;
    let (_, granted) = f.acquire("kept", json!({"ttl_ms": 60_000})).await;
    let data_dir = f._dir.path().join("data");
    f.server.take().unwrap().shutdown().await.unwrap();
    let config = ServerConfig {
        data_dir,
        listen: "127.0.0.1:0".parse().unwrap(),
        cluster: None,
        ..Default::default()
    };
    let server = palisade_server::start(config).await.unwrap();
    let base = format!("http://{}", server.local_addr);
    let show: Value = reqwest::get(format!("{base}/v1/locks/kept"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(show["epoch"], granted["epoch"]);
    assert!(
        show["granted_unix_ms"].as_u64().is_some_and(|ms| ms > 0),
        "held since survives a restart: {show}"
    );
    // The lease id is not listed (it is the capability), but it still renews the lease.
    assert!(show.get("lease_id").is_none(), "{show}");
    let lease = granted["lease_id"].as_str().unwrap();
    let renewed = reqwest::Client::new()
        .post(format!("{base}/v1/leases/{lease}/renew"))
        .send()
        .await
        .unwrap();
    assert_eq!(renewed.status(), StatusCode::OK);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_second_server_on_the_same_data_dir_refuses_to_start() {
    let f = fixture().await;
    let config = ServerConfig {
        data_dir: f._dir.path().join("data"),
        listen: "127.0.0.1:0".parse().unwrap(),
        cluster: None,
        ..Default::default()
    };
    let error = palisade_server::start(config).await.err().expect("refused");
    assert!(
        error.to_string().contains("is open in another process"),
        "{error}"
    );
}

#[tokio::test]
async fn abandoned_waiters_leave_the_queue_and_real_waiters_get_their_place() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let f = fixture().await;
    let (status, _) = f
        .acquire("q%2F1", json!({"ttl_ms": 60_000, "holder": "owner"}))
        .await;
    assert_eq!(status, StatusCode::OK);
    // Fill the lock's queue (1,024 places) with acquires that wait a minute, whose clients
    // then go away: each sends its request, waits until it is queued, and closes its socket.
    let addr = f.base.trim_start_matches("http://").to_owned();
    let body = r#"{"ttl_ms":1000,"wait_ms":60000,"holder":"gone"}"#;
    let request = format!(
        "POST /v1/locks/q%2F1/acquire HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut sockets = Vec::new();
    for _ in 0..palisade_core::limits::MAX_WAITERS_PER_LOCK {
        let mut socket = tokio::net::TcpStream::connect(&addr).await.unwrap();
        socket.write_all(request.as_bytes()).await.unwrap();
        sockets.push(socket);
    }
    let queued = |metrics: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with("palisade_waiters"))
            .and_then(|l| l.split_whitespace().last()?.parse::<f64>().ok())
            .unwrap_or(0.0) as usize
    };
    for _ in 0..500 {
        if queued(&f.get("/metrics").await.1) == sockets.len() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(queued(&f.get("/metrics").await.1), sockets.len());
    for mut socket in sockets {
        socket.shutdown().await.unwrap();
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(
            std::time::Duration::from_millis(1),
            socket.read_to_end(&mut rest),
        )
        .await;
    }
    // The server notices the closed connections and drops their waits promptly: a real waiter
    // is queued (its wait then times out, 409), never refused for a full queue (429).
    let mut last = StatusCode::OK;
    for _ in 0..100 {
        let (status, _) = f
            .acquire(
                "q%2F1",
                json!({"ttl_ms": 1000, "wait_ms": 50, "holder": "real"}),
            )
            .await;
        last = status;
        if status != StatusCode::TOO_MANY_REQUESTS {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_ne!(
        last,
        StatusCode::TOO_MANY_REQUESTS,
        "abandoned waits still fill the queue"
    );
    for _ in 0..500 {
        if queued(&f.get("/metrics").await.1) == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(queued(&f.get("/metrics").await.1), 0, "no waiter is left");
}
