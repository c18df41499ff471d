//! The ledger's HTTP routes under requests a careless or hostile client sends, and the fake
//! receiver's protocol as `HttpReceiver` maps it.

use std::sync::Arc;
use std::time::Duration;

use palisade_effects::http::{routes, Served};
use palisade_effects::model::now_ms;
use palisade_effects::{
    Answer, Attempt, Begin, BeginRequest, Capability, HttpLedger, HttpReceiver, Ledger,
    LedgerError, LocalLedger, OpId, Receiver, ReceiverError, RedbStore, SendResult, Settlement,
    Status,
};
use palisade_fake_receiver::{Fake, Faults};
use palisade_fence::conformance::Harness;

async fn serve(router: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    format!("http://{address}")
}

async fn ledger_at(h: &Harness, secret: Option<&str>) -> (String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = RedbStore::open(&dir.path().join("effects.redb")).unwrap();
    let served = Served::new(
        LocalLedger::new(store, h.verifier.clone()),
        secret.map(str::to_owned),
    );
    let url = serve(axum::Router::new().nest("/v1/effects", routes(served))).await;
    (url, dir)
}

fn request(h: &Harness, id: &OpId) -> BeginRequest {
    BeginRequest {
        id: id.clone(),
        token: h.token(&id.lock, 3),
        payload: b"x".to_vec(),
        receiver: "r".into(),
        capability: Capability::Idempotent,
        attempt_timeout_ms: 10_000,
    }
}

/// P7: a reconciler's and a person's requests need the admin secret; owners need only their
/// token; a ledger without a secret refuses the admin requests.
#[tokio::test]
async fn admin_requests_need_the_secret_and_owners_their_token() {
    let h = Harness::new();
    let (url, _dir) = ledger_at(&h, Some("the-right-secret-123")).await;
    let id = OpId::new(h.lock("http-admin"), "a").unwrap();
    let owner = HttpLedger::new(&url, None).unwrap();
    assert!(matches!(
        owner.begin(request(&h, &id)).await.unwrap(),
        Begin::Send { .. }
    ));
    for secret in [None, Some("the-wrong-secret-123".to_owned())] {
        let intruder = HttpLedger::new(&url, secret).unwrap();
        let refused = intruder.reattempt(&id, 1, 1_000).await;
        assert!(matches!(refused, Err(LedgerError::Storage(ref m)) if m.contains("admin secret")));
        let refused = intruder
            .settle(None, &id, 1, Settlement::Performed { reference: None })
            .await;
        assert!(refused.is_err());
        let verdict = palisade_effects::Verdict::Done;
        assert!(intruder
            .resolve(&id, verdict, "me", "because")
            .await
            .is_err());
    }
    assert_eq!(owner.get(&id).await.unwrap().unwrap().attempt, 1);
    // The owner settles under its token, without the secret.
    let answer = owner
        .settle(
            Some(&h.token(&id.lock, 3)),
            &id,
            1,
            Settlement::Performed { reference: None },
        )
        .await
        .unwrap();
    assert!(matches!(answer, Answer::Recorded { .. }));
    let admin = HttpLedger::new(&url, Some("the-right-secret-123".into())).unwrap();
    assert!(admin.stats().await.is_ok());
    // A ledger with no secret at all refuses every admin request.
    let (url, _dir) = ledger_at(&h, None).await;
    let admin = HttpLedger::new(&url, Some("anything-at-all-000".into())).unwrap();
    assert!(admin.reattempt(&id, 1, 1_000).await.is_err());
}

/// Malformed and oversized requests are refused with a client error and record nothing.
#[tokio::test]
async fn malformed_requests_are_refused_and_record_nothing() {
    let h = Harness::new();
    let (url, _dir) = ledger_at(&h, None).await;
    let http = reqwest::Client::new();
    let lock = h.lock("http-bad");
    let too_big = serde_json::json!({
        "id": {"lock": lock.as_str(), "op": "a"}, "token": h.token(&lock, 3),
        "payload": "A".repeat(200 * 1024), "receiver": "r", "capability": "none",
        "attempt_timeout_ms": 1000,
    });
    let bad_op = serde_json::json!({
        "id": {"lock": lock.as_str(), "op": "has space"}, "token": h.token(&lock, 3),
        "payload": "", "receiver": "r", "capability": "none", "attempt_timeout_ms": 1000,
    });
    let bad_capability = serde_json::json!({
        "id": {"lock": lock.as_str(), "op": "a"}, "token": h.token(&lock, 3),
        "payload": "", "receiver": "r", "capability": "maybe", "attempt_timeout_ms": 1000,
    });
    for body in [too_big, bad_op, bad_capability] {
        let response = http
            .post(format!("{url}/v1/effects/begin"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(response.status().is_client_error(), "{}", response.status());
    }
    let garbage = http
        .post(format!("{url}/v1/effects/begin"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert!(garbage.status().is_client_error());
    for query in ["state=bogus", "state=in_flight,,"] {
        let response = http
            .get(format!("{url}/v1/effects?{query}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{query}");
    }
    let response = http
        .get(format!("{url}/v1/effects/op?id=no-colon"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let ledger = HttpLedger::new(&url, None).unwrap();
    assert!(ledger
        .list(&Default::default())
        .await
        .unwrap()
        .iter()
        .all(|r| r.id.lock != lock));
}

fn attempt(op: &str, deadline_ms: u64, payload: &[u8]) -> Attempt {
    let id = OpId::parse(op).unwrap();
    Attempt {
        key: id.idempotency_key(),
        id,
        n: 1,
        epoch: 3,
        deadline_ms,
        payload: payload.to_vec(),
    }
}

async fn receiver(capability: Capability) -> (HttpReceiver, Arc<Fake>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::open(dir.path(), capability, Faults::default()).unwrap();
    let url = serve(palisade_fake_receiver::router(fake.clone())).await;
    let client = HttpReceiver::new("r", capability, url, Duration::from_secs(5)).unwrap();
    (client, fake, dir)
}

/// The fake receiver by capability: idempotent replays a key and refuses it with another
/// payload; lookup refuses a late request without performing it and answers lookups; none
/// performs every delivery and has no lookup.
#[tokio::test]
async fn the_fake_receiver_keeps_its_capabilitys_promises() {
    let later = now_ms() + 60_000;
    let (idempotent, fake, _d1) = receiver(Capability::Idempotent).await;
    let first = idempotent.send(&attempt("x:a", later, b"1")).await;
    let again = idempotent.send(&attempt("x:a", later, b"1")).await;
    assert_eq!(first, again);
    let other = idempotent.send(&attempt("x:a", later, b"2")).await;
    assert!(matches!(other, SendResult::Refused { .. }), "{other:?}");
    let performed = fake
        .events()
        .iter()
        .filter(|e| e.kind == "performed")
        .count();
    assert_eq!(performed, 1);

    let (lookup, fake, _d2) = receiver(Capability::Lookup).await;
    let late = lookup.send(&attempt("x:b", now_ms() - 1, b"1")).await;
    assert!(matches!(late, SendResult::Expired { .. }), "{late:?}");
    let key = OpId::parse("x:b").unwrap().idempotency_key();
    assert_eq!(lookup.status(&key).await.unwrap(), Status::NotPerformed);
    lookup.send(&attempt("x:b", later, b"1")).await;
    assert!(matches!(
        lookup.status(&key).await.unwrap(),
        Status::Performed { .. }
    ));
    let kinds: Vec<String> = fake.events().into_iter().map(|e| e.kind).collect();
    assert_eq!(kinds, ["refused_late", "performed"]);

    let (none, fake, _d3) = receiver(Capability::None).await;
    none.send(&attempt("x:c", later, b"1")).await;
    none.send(&attempt("x:c", later, b"1")).await;
    assert_eq!(fake.events().len(), 2, "no deduplication: two effects");
    let key = OpId::parse("x:c").unwrap().idempotency_key();
    assert!(matches!(
        none.status(&key).await,
        Err(ReceiverError::Unsupported(_))
    ));
    assert!(none.compensate(&key).await.unwrap().starts_with("comp-"));
}

/// The record survives a restart, and a torn last line (a crash mid-write) is dropped.
#[tokio::test]
async fn the_fake_receivers_record_is_durable_and_torn_lines_are_dropped() {
    let dir = tempfile::tempdir().unwrap();
    {
        let fake = Fake::open(dir.path(), Capability::None, Faults::default()).unwrap();
        let url = serve(palisade_fake_receiver::router(fake.clone())).await;
        let client = HttpReceiver::new("r", Capability::None, url, Duration::from_secs(5)).unwrap();
        client.send(&attempt("x:d", now_ms() + 60_000, b"1")).await;
    }
    let path = palisade_fake_receiver::record_path(dir.path());
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str("{\"kind\":\"perf");
    std::fs::write(&path, text).unwrap();
    let fake = Fake::open(dir.path(), Capability::None, Faults::default()).unwrap();
    assert_eq!(fake.events().len(), 1);
    assert_eq!(
        palisade_fake_receiver::read_record(dir.path())
            .unwrap()
            .len(),
        1
    );
}
