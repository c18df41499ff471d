//! The reference fenced store over HTTP, trusting a real coordinator's published keys: the
//! documented interface (docs/enforcement.md), each rejection, key refresh, and durability
//! across a restart.

use std::net::SocketAddr;

use palisade_fence::FenceMode;
use palisade_resource::{KeySource, ResourceConfig, RunningResource};
use palisade_server::{RunningServer, ServerConfig};
use reqwest::StatusCode;
use serde_json::{json, Value};

struct Fixture {
    coordinator: RunningServer,
    resource: Option<RunningResource>,
    resource_url: String,
    coordinator_url: String,
    http: reqwest::Client,
    dir: tempfile::TempDir,
}

async fn start_resource(
    dir: &std::path::Path,
    mode: FenceMode,
    keys: KeySource,
) -> RunningResource {
    let config = ResourceConfig {
        data_dir: dir.join("resource"),
        listen: "127.0.0.1:0".parse().unwrap(),
        mode,
        keys,
        principals: Vec::new(),
        revoked_keys: Vec::new(),
        coordinator_ca: None,
        key_refresh: palisade_resource::DEFAULT_KEY_REFRESH,
        effects_admin_secret: None,
        tls: None,
    };
    palisade_resource::start(config).await.unwrap()
}

async fn start_coordinator(dir: &std::path::Path, listen: SocketAddr) -> RunningServer {
    let config = ServerConfig {
        data_dir: dir.join("coordinator"),
        listen,
        cluster: None,
        ..Default::default()
    };
    palisade_server::start(config).await.unwrap()
}

impl Fixture {
    async fn new(mode: FenceMode) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let coordinator = start_coordinator(dir.path(), "127.0.0.1:0".parse().unwrap()).await;
        let coordinator_url = format!("http://{}", coordinator.local_addr);
        let resource = start_resource(
            dir.path(),
            mode,
            KeySource::Coordinator(coordinator_url.clone()),
        )
        .await;
        Self {
            resource_url: format!("http://{}", resource.local_addr),
            resource: Some(resource),
            coordinator,
            coordinator_url,
            http: reqwest::Client::new(),
            dir,
        }
    }

    /// Acquires `lock` (releasing `previous` first) and returns (epoch, token, lease id).
    async fn acquire(&self, lock: &str, previous: Option<String>) -> (u64, String, String) {
        if let Some(lease) = previous {
            let url = format!("{}/v1/leases/{lease}/release", self.coordinator_url);
            self.http.post(url).send().await.unwrap();
        }
        let url = format!(
            "{}/v1/locks/{}/acquire",
            self.coordinator_url,
            lock.replace('/', "%2F")
        );
        let grant: Value = self
            .http
            .post(url)
            .body("{}")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let token = grant["token"].as_str().unwrap().to_owned();
        (
            palisade_core::json::read(&grant["epoch"]).unwrap(),
            token,
            grant["lease_id"].as_str().unwrap().to_owned(),
        )
    }

    async fn put(
        &self,
        path: &str,
        token: Option<&str>,
        seq: Option<u64>,
        body: Vec<u8>,
    ) -> (StatusCode, Value) {
        let mut request = self
            .http
            .put(format!("{}/v1/kv/{path}", self.resource_url))
            .body(body);
        if let Some(token) = token {
            request = request.header("Palisade-Token", token);
        }
        if let Some(seq) = seq {
            request = request.header("Palisade-Seq", seq.to_string());
        }
        let response = request.send().await.unwrap();
        (
            response.status(),
            response.json().await.unwrap_or(Value::Null),
        )
    }

    async fn get(&self, path: &str) -> (StatusCode, Option<u64>, Vec<u8>) {
        let response = self
            .http
            .get(format!("{}/v1/kv/{path}", self.resource_url))
            .send()
            .await
            .unwrap();
        let epoch = response
            .headers()
            .get("Palisade-Epoch")
            .map(|v| v.to_str().unwrap().parse().unwrap());
        (
            response.status(),
            epoch,
            response.bytes().await.unwrap().to_vec(),
        )
    }

    async fn activate(&self, lock: &str, token: &str) -> (StatusCode, Value) {
        let url = format!("{}/v1/fences/{lock}/activate", self.resource_url);
        let response = self
            .http
            .post(url)
            .header("Palisade-Token", token)
            .send()
            .await
            .unwrap();
        (response.status(), response.json().await.unwrap())
    }

    async fn text(&self, path: &str) -> (StatusCode, String) {
        let response = self
            .http
            .get(format!("{}{path}", self.resource_url))
            .send()
            .await
            .unwrap();
        (response.status(), response.text().await.unwrap())
    }
}

#[tokio::test]
async fn p2_p4_strict_store_accepts_the_newest_owner_and_rejects_the_rest() {
    let f = Fixture::new(FenceMode::Strict).await;
    let (e1, t1, lease1) = f.acquire("report/7", None).await;
    let (status, body) = f
        .put("report%2F7/summary", Some(&t1), None, b"first".to_vec())
        .await;
    assert_eq!(
        (status, body.clone()),
        (
            StatusCode::OK,
            json!({"accepted": true, "epoch": e1.to_string()})
        )
    );
    assert_eq!(
        f.get("report%2F7/summary").await,
        (StatusCode::OK, Some(e1), b"first".to_vec())
    );

    let (e2, t2, _) = f.acquire("report/7", Some(lease1)).await;
    assert_eq!(
        f.put("report%2F7/summary", Some(&t2), None, b"second".to_vec())
            .await
            .0,
        StatusCode::OK
    );
    // The old owner wakes up and writes: rejected with the fence, value kept.
    let (status, body) = f
        .put("report%2F7/summary", Some(&t1), None, b"stale".to_vec())
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(
        (
            body["error"].as_str(),
            palisade_core::json::read(&body["fence"])
        ),
        (Some("stale_epoch"), Some(e2))
    );
    assert_eq!(f.get("report%2F7/summary").await.2, b"second".to_vec());

    // Equal epochs are never accepted twice in strict mode.
    assert_eq!(
        f.put("report%2F7/summary", Some(&t2), None, b"again".to_vec())
            .await
            .0,
        StatusCode::CONFLICT
    );

    bad_writes_are_refused_with_their_reason(&f, &t2, e2).await;
    the_fence_and_the_metrics_show_it(&f, e2).await;
}

/// Writes with no token, a malformed one, another lock's, a value over the limit, a bad lock
/// name: each refused with its reason; a missing key is not found.
async fn bad_writes_are_refused_with_their_reason(f: &Fixture, token: &str, epoch: u64) {
    let (status, body) = f.put("report%2F7/summary", None, None, b"x".to_vec()).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("missing_token"))
    );
    let (status, body) = f
        .put(
            "report%2F7/summary",
            Some("pt1.garbage"),
            None,
            b"x".to_vec(),
        )
        .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::FORBIDDEN, Some("invalid_token"))
    );
    let (other_epoch, other, _) = f.acquire("other", None).await;
    assert!(other_epoch > epoch);
    let (status, body) = f
        .put("report%2F7/summary", Some(&other), None, b"x".to_vec())
        .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::FORBIDDEN, Some("invalid_token"))
    );
    let (status, body) = f
        .put(
            "report%2F7/big",
            Some(token),
            None,
            vec![0; 2 * 1024 * 1024],
        )
        .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, Some("value_too_large"))
    );
    let (status, body) = f
        .put("bad%20lock/k", Some(token), None, b"x".to_vec())
        .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_request"))
    );
    assert_eq!(f.get("report%2F7/none").await.0, StatusCode::NOT_FOUND);
}

/// The lock's fence is the newest owner's epoch; the metrics count the accepted writes and
/// each rejection by reason.
async fn the_fence_and_the_metrics_show_it(f: &Fixture, epoch: u64) {
    let (status, fence) = f.text("/v1/fences/report%2F7").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        palisade_core::json::read(&serde_json::from_str::<Value>(&fence).unwrap()["fence"]),
        Some(epoch)
    );
    let (_, metrics) = f.text("/metrics").await;
    for line in [
        "palisade_resource_writes_accepted_total 2",
        "palisade_resource_rejections_total{reason=\"stale_epoch\"} 2",
        "palisade_resource_rejections_total{reason=\"invalid_token\"} 2",
    ] {
        assert!(metrics.contains(line), "{line} missing:\n{metrics}");
    }
}

#[tokio::test]
async fn p2_activated_store_rejects_the_old_owner_once_the_new_one_activates() {
    let f = Fixture::new(FenceMode::Activated).await;
    let (e1, t1, lease1) = f.acquire("job", None).await;
    assert_eq!(
        f.put("job/k", Some(&t1), None, b"early".to_vec()).await.1["error"],
        "not_activated"
    );
    assert_eq!(
        f.activate("job", &t1).await,
        (StatusCode::OK, json!({"fence": e1.to_string()}))
    );
    assert_eq!(
        f.put("job/k", Some(&t1), None, b"a".to_vec()).await.0,
        StatusCode::OK
    );
    assert_eq!(
        f.put("job/k", Some(&t1), None, b"b".to_vec()).await.0,
        StatusCode::OK
    );
    let (e2, t2, _) = f.acquire("job", Some(lease1)).await;
    assert_eq!(
        f.activate("job", &t2).await,
        (StatusCode::OK, json!({"fence": e2.to_string()}))
    );
    let (status, body) = f.put("job/k", Some(&t1), None, b"late".to_vec()).await;
    assert_eq!(
        (status, palisade_core::json::read(&body["fence"])),
        (StatusCode::CONFLICT, Some(e2))
    );
    assert_eq!(f.get("job/k").await.2, b"b".to_vec());
    let (_, metrics) = f.text("/metrics").await;
    assert!(
        metrics.contains("palisade_resource_activations_total 2"),
        "{metrics}"
    );
}

#[tokio::test]
async fn sequenced_store_needs_seq_and_answers_replays_with_the_recorded_outcome() {
    let f = Fixture::new(FenceMode::Sequenced).await;
    let (e1, t1, _) = f.acquire("seq", None).await;
    assert_eq!(
        f.put("seq/k", Some(&t1), None, b"x".to_vec()).await.1["error"],
        "invalid_request"
    );
    let first = f.put("seq/k", Some(&t1), Some(1), b"x".to_vec()).await;
    assert_eq!(
        first,
        (
            StatusCode::OK,
            json!({"accepted": true, "epoch": e1.to_string(), "seq": 1})
        )
    );
    let replay = f.put("seq/k", Some(&t1), Some(1), b"x".to_vec()).await;
    assert_eq!(replay.1["replay"], true);
    let (_, metrics) = f.text("/metrics").await;
    assert!(
        metrics.contains("palisade_resource_rejections_total{reason=\"replay\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn p4_keys_are_fetched_when_the_coordinator_appears_later() {
    let dir = tempfile::tempdir().unwrap();
    // A port for the coordinator that is not listening yet.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let coordinator_url = format!("http://{port}");
    let resource = start_resource(
        dir.path(),
        FenceMode::Strict,
        KeySource::Coordinator(coordinator_url.clone()),
    )
    .await;
    let resource_url = format!("http://{}", resource.local_addr);
    let http = reqwest::Client::new();
    let ready = http
        .get(format!("{resource_url}/readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);

    let _coordinator = start_coordinator(dir.path(), port).await;
    // Within the refresh interval of the failed fetch at start: the write waits for the next
    // fetch instead of being refused.
    let grant: Value = http
        .post(format!("{coordinator_url}/v1/locks/late/acquire"))
        .body("{}")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let response = http
        .put(format!("{resource_url}/v1/kv/late/k"))
        .header("Palisade-Token", grant["token"].as_str().unwrap())
        .body("v")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let ready = http
        .get(format!("{resource_url}/readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), StatusCode::OK);
}

#[tokio::test]
async fn p8_accepted_writes_survive_a_restart() {
    let mut f = Fixture::new(FenceMode::Strict).await;
    let (epoch, token, _) = f.acquire("durable", None).await;
    assert_eq!(
        f.put("durable/k", Some(&token), None, b"kept".to_vec())
            .await
            .0,
        StatusCode::OK
    );
    f.resource.take().unwrap().shutdown().await;
    let keys = KeySource::Coordinator(f.coordinator_url.clone());
    let resource = start_resource(f.dir.path(), FenceMode::Strict, keys).await;
    f.resource_url = format!("http://{}", resource.local_addr);
    assert_eq!(
        f.get("durable/k").await,
        (StatusCode::OK, Some(epoch), b"kept".to_vec())
    );
    // The fence survived too: the same token cannot write again.
    assert_eq!(
        f.put("durable/k", Some(&token), None, b"again".to_vec())
            .await
            .0,
        StatusCode::CONFLICT
    );
    let _ = &f.coordinator;
}

#[tokio::test]
async fn a_store_refuses_to_reopen_in_another_mode() {
    let dir = tempfile::tempdir().unwrap();
    let keys = KeySource::Coordinator("http://127.0.0.1:1".into());
    start_resource(dir.path(), FenceMode::Strict, keys.clone())
        .await
        .shutdown()
        .await;
    let config = ResourceConfig {
        data_dir: dir.path().join("resource"),
        listen: "127.0.0.1:0".parse().unwrap(),
        mode: FenceMode::Activated,
        keys,
        principals: Vec::new(),
        revoked_keys: Vec::new(),
        coordinator_ca: None,
        key_refresh: palisade_resource::DEFAULT_KEY_REFRESH,
        effects_admin_secret: None,
        tls: None,
    };
    let error = palisade_resource::start(config)
        .await
        .err()
        .expect("refused");
    assert!(error.to_string().contains("strict mode"), "{error}");
}
