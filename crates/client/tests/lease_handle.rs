//! The client against a real coordinator on loopback: keepalive, conservative loss detection,
//! release on drop, watch, and error mapping.

use std::time::Duration;

use palisade_client::{AcquireOptions, Client, ClientError, LeaseState};
use palisade_server::{RunningServer, ServerConfig};
use tokio::time::{sleep, timeout, Instant};

async fn server() -> (RunningServer, Client, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let config = ServerConfig {
        data_dir: dir.path().join("data"),
        listen: "127.0.0.1:0".parse().unwrap(),
        cluster: None,
        ..Default::default()
    };
    let server = palisade_server::start(config).await.unwrap();
    let client = Client::connect(&[format!("http://{}", server.local_addr)])
        .await
        .unwrap();
    (server, client, dir)
}

fn options(lock: &str, ttl_ms: u64) -> AcquireOptions {
    let mut options = AcquireOptions::new(lock);
    options.ttl = Duration::from_millis(ttl_ms);
    options
}

#[tokio::test]
async fn the_keepalive_holds_a_lease_well_past_its_ttl() {
    let (_server, client, _dir) = server().await;
    // Renewals every third of a second-long TTL: generous enough for a loaded CI machine.
    let lease = client.acquire(options("k/1", 1_000)).await.unwrap();
    sleep(Duration::from_millis(2_500)).await;
    assert!(lease.is_valid(), "{:?}", lease.state());
    let info = client.describe("k/1").await.unwrap();
    assert!(info.held);
    assert_eq!(info.epoch, lease.epoch());
    let stats = client.stats();
    assert!(stats.renewals >= 3, "{stats:?}");
    assert_eq!(
        (stats.renewal_failures, stats.leases_lost),
        (0, 0),
        "{stats:?}"
    );
}

#[tokio::test]
async fn validity_is_counted_from_the_send_time_so_the_holder_gives_up_first() {
    let (server, client, _dir) = server().await;
    let ttl = Duration::from_millis(400);
    let mut lease = client.acquire(options("k/2", 400)).await.unwrap();
    let answered = Instant::now();
    // The coordinator counts the TTL from its commit, which is after the send: the holder's
    // deadline is never later than the answer's arrival plus the TTL.
    let LeaseState::Held { valid_until } = lease.state() else {
        panic!("not held: {:?}", lease.state())
    };
    assert!(valid_until <= answered + ttl);
    server.shutdown().await.unwrap();
    let reason = timeout(Duration::from_secs(5), lease.lost())
        .await
        .expect("loss noticed");
    assert!(!reason.is_empty());
    assert!(!lease.is_valid());
    // The failures the coordinator never saw are counted here; the keepalive gives up at its
    // next try (the handle noticed the validity end on its own clock).
    let mut stats = client.stats();
    for _ in 0..100 {
        if stats.leases_lost == 1 {
            break;
        }
        sleep(Duration::from_millis(20)).await;
        stats = client.stats();
    }
    assert_eq!((stats.acquires, stats.leases_lost), (1, 1), "{stats:?}");
    assert!(stats.renewal_failures >= 1, "{stats:?}");
}

#[tokio::test]
async fn a_lease_released_behind_the_holders_back_is_reported_lost() {
    let (_server, client, _dir) = server().await;
    let mut lease = client.acquire(options("k/3", 300)).await.unwrap();
    client.release(lease.lease_id()).await.unwrap();
    let reason = timeout(Duration::from_secs(5), lease.lost())
        .await
        .expect("loss noticed");
    assert!(reason.contains("unknown"), "{reason}");
    assert!(matches!(lease.state(), LeaseState::Lost { .. }));
    let stats = client.stats();
    assert_eq!(
        (stats.leases_lost, stats.renewal_failures),
        (1, 1),
        "{stats:?}"
    );
}

#[tokio::test]
async fn dropping_a_handle_releases_its_lease() {
    let (_server, client, _dir) = server().await;
    let first = client.acquire(options("k/4", 60_000)).await.unwrap();
    let epoch = first.epoch();
    drop(first);
    let mut waiting = options("k/4", 1_000);
    waiting.wait = Duration::from_secs(5);
    let second = client.acquire(waiting).await.unwrap();
    assert!(second.epoch() > epoch);
    second.release().await.unwrap();
    assert!(!client.describe("k/4").await.unwrap().held);
}

#[tokio::test]
async fn errors_are_typed() {
    let (_server, client, _dir) = server().await;
    let _held = client.acquire(options("k/5", 10_000)).await.unwrap();
    let err = client
        .acquire_once(&options("k/5", 10_000))
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Held(_)), "{err:?}");
    let err = client
        .acquire_once(&options("bad name", 10_000))
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::InvalidArgument(_)), "{err:?}");
    let err = client
        .renew("0123456789abcdef0123456789abcdef")
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::UnknownLease(_)), "{err:?}");
    let unreachable = Client::connect(&["http://127.0.0.1:1"]).await.unwrap_err();
    assert!(
        matches!(unreachable, ClientError::Unavailable(_)),
        "{unreachable:?}"
    );
}

#[tokio::test]
async fn several_endpoints_fall_through_to_a_reachable_one() {
    let (server, _client, _dir) = server().await;
    let endpoints = [
        "http://127.0.0.1:1".to_string(),
        format!("http://{}", server.local_addr),
    ];
    let client = Client::connect(&endpoints).await.unwrap();
    assert_eq!(client.keys().await.unwrap().len(), 1);
}

#[tokio::test]
async fn watch_reports_the_current_state_then_each_transition() {
    let (_server, client, _dir) = server().await;
    let mut events = client.watch("k/6").await.unwrap();
    let current = events.message().await.unwrap().unwrap();
    assert_eq!(current.kind, "current");
    assert!(!current.state.unwrap().held);
    let lease = client.acquire(options("k/6", 10_000)).await.unwrap();
    let epoch = lease.epoch();
    lease.release().await.unwrap();
    let granted = events.message().await.unwrap().unwrap();
    assert_eq!(
        (granted.kind.as_str(), granted.state.unwrap().epoch),
        ("granted", epoch)
    );
    let released = events.message().await.unwrap().unwrap();
    assert_eq!(
        (released.kind.as_str(), released.state.unwrap().epoch),
        ("released", epoch)
    );
}

#[tokio::test]
async fn p2_the_keepalive_authenticates_and_another_principal_cannot_end_the_lease() {
    use palisade_server::auth::{hash_secret, Auth};
    let dir = tempfile::tempdir().unwrap();
    let (auth_file, acl_file) = (dir.path().join("auth"), dir.path().join("acl"));
    let lines = format!(
        "orders {}\nmallory {}\n",
        hash_secret("s-orders"),
        hash_secret("s-mallory")
    );
    std::fs::write(&auth_file, lines).unwrap();
    std::fs::write(&acl_file, "orders acquire k/\nmallory acquire k/\n").unwrap();
    let auth = std::sync::Arc::new(Auth::from_files(&auth_file, &acl_file).unwrap());
    let config = ServerConfig {
        data_dir: dir.path().join("data"),
        listen: "127.0.0.1:0".parse().unwrap(),
        auth: auth.clone(),
        ..Default::default()
    };
    let server = palisade_server::start(config).await.unwrap();
    let url = [format!("http://{}", server.local_addr)];
    let as_principal = |secret: &str| {
        let credentials = palisade_client::Credentials::bearer(secret).unwrap();
        Client::connect_with(&url, credentials)
    };
    let orders = as_principal("s-orders").await.unwrap();
    let mallory = as_principal("s-mallory").await.unwrap();
    let anonymous = Client::connect(&url).await.unwrap();

    // The keepalive stream carries the credentials: the lease lives well past its TTL.
    let lease = orders.acquire(options("k/auth", 600)).await.unwrap();
    assert_eq!(lease.grant().principal, "orders");
    let id = lease.lease_id().to_owned();
    assert!(matches!(
        mallory.release(&id).await,
        Err(ClientError::PermissionDenied(_))
    ));
    assert!(matches!(
        mallory.renew(&id).await,
        Err(ClientError::PermissionDenied(_))
    ));
    assert!(matches!(
        anonymous.release(&id).await,
        Err(ClientError::Unauthenticated(_))
    ));
    sleep(Duration::from_millis(1_500)).await;
    assert!(lease.is_valid(), "{:?}", lease.state());
    // mallory sees the lock but not the lease id.
    let info = mallory.describe("k/auth").await.unwrap();
    assert!(info.held && info.lease_id.is_empty());
    assert_eq!(orders.describe("k/auth").await.unwrap().lease_id, id);
    // The principal is removed (as by SIGHUP): its open keepalive stream renews nothing more
    // and the holder learns the lease is lost.
    std::fs::write(
        &auth_file,
        format!("mallory {}\n", hash_secret("s-mallory")),
    )
    .unwrap();
    auth.reload().unwrap();
    let mut lease = lease;
    let reason = timeout(Duration::from_secs(5), lease.lost())
        .await
        .expect("loss noticed");
    assert!(reason.contains("removed"), "{reason}");
    server.shutdown().await.unwrap();
}

/// A lease granted after a long wait starts with little of its validity left (it counts from
/// the acquire's send time): the first renewal comes at once, not a third of the TTL after the
/// grant, so a holder that stops its work `margin` before the validity ends (`lock run`) is
/// not stopped while its lease is healthy.
#[tokio::test]
async fn a_lease_granted_after_a_long_wait_is_renewed_at_once() {
    let (_server, client, _dir) = server().await;
    let first = client.acquire(options("k/wait", 1_500)).await.unwrap();
    let mut waiting = options("k/wait", 3_000);
    waiting.wait = Duration::from_secs(10);
    let releaser = tokio::spawn(async move {
        sleep(Duration::from_millis(1_500)).await;
        first.release().await.unwrap();
    });
    let sent = Instant::now();
    let mut lease = client.acquire(waiting).await.unwrap();
    releaser.await.unwrap();
    assert!(sent.elapsed() >= Duration::from_millis(1_400), "it waited");
    // Validity left at the grant: at most 1.6 s of 3 s. Stopping 1 s before the end would
    // have come within 0.6 s; a renewal confirmed first moves the end.
    let (reason, _) = timeout(
        Duration::from_millis(2_500),
        lease.ending(Duration::from_millis(1_000)),
    )
    .await
    .unwrap_or_else(|_| ("still held".into(), Instant::now()));
    assert_eq!(reason, "still held", "{:?}", lease.state());
    assert!(lease.is_valid(), "{:?}", lease.state());
}
