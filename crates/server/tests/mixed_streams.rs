//! Many keepalive and watch streams at once on a few connections (issue 26, item 13): a
//! review saw 244 of 250 keepalive leases expire and a call stall 17–22 s with 250 keepalive
//! and 250 watch streams from one Python grpcio client. Here the same load comes from tonic
//! clients on five connections, and on one, against a real coordinator on loopback; every lease must stay
//! held, every renew be answered, and every watch see its lock's release. (P8: a coordinator
//! that keeps its promises to renewing holders; P1 is not at stake, no lock changes hands.)

use std::time::Duration;

use palisade_proto::v1 as pb;
use palisade_server::ServerConfig;
use tokio_stream::StreamExt as _;

const LEASES: usize = 250;
const WATCHES: usize = 250;
const TTL_MS: u64 = 4_000;
const RENEW_EVERY: Duration = Duration::from_millis(500);
const RUN_FOR: Duration = Duration::from_secs(8);

type Client = pb::coordinator_client::CoordinatorClient<tonic::transport::Channel>;

/// Keeps `lease_id` alive on one keepalive stream until `stop`, then releases it; returns the
/// longest gap between two answers and how many renews were refused.
async fn keep_alive(
    mut client: Client,
    lease_id: String,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> (Duration, usize) {
    let (requests, outbound) = tokio::sync::mpsc::channel(4);
    let outbound = tokio_stream::wrappers::ReceiverStream::new(outbound);
    let mut answers = client.keepalive(outbound).await.unwrap().into_inner();
    let renewed = lease_id.clone();
    let sender = tokio::spawn(async move {
        while !*stop.borrow() {
            let renew = pb::RenewRequest {
                lease_id: renewed.clone(),
            };
            if requests.send(renew).await.is_err() {
                break;
            }
            let _ = tokio::time::timeout(RENEW_EVERY, stop.changed()).await;
        }
    });
    let (mut longest, mut refused) = (Duration::ZERO, 0);
    let mut last = tokio::time::Instant::now();
    while let Some(answer) = answers.next().await {
        longest = longest.max(last.elapsed());
        last = tokio::time::Instant::now();
        if answer.is_err() {
            refused += 1;
            break;
        }
    }
    sender.await.unwrap();
    client
        .release(pb::ReleaseRequest { lease_id })
        .await
        .unwrap();
    (longest, refused)
}

/// Watches `lock` until it is seen released; returns the event kinds seen.
async fn watch_until_released(mut client: Client, lock: String) -> Vec<String> {
    let mut events = client
        .watch(pb::WatchRequest {
            lock,
            prefix: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let mut kinds = Vec::new();
    while let Some(event) = events.next().await {
        let kind = event.unwrap().kind;
        let released = kind == "released";
        kinds.push(kind);
        if released {
            break;
        }
    }
    kinds
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p8_five_hundred_keepalive_and_watch_streams_on_five_connections_are_all_served() {
    serve_mixed_streams(5).await;
}

/// grpcio (Python, C++) shares one subchannel between channels to the same address unless
/// told otherwise: all 500 streams of the review travelled on one connection. At 256 streams
/// per connection, the 250 watches (which never end) left 6 keepalives a slot, and the other
/// 244 queued in the client until their leases expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p8_five_hundred_keepalive_and_watch_streams_on_one_connection_are_all_served() {
    serve_mixed_streams(1).await;
}

async fn serve_mixed_streams(connections: usize) {
    #[allow(non_snake_case)]
    let CHANNELS = connections;
    let dir = tempfile::tempdir().unwrap();
    let server = palisade_server::start(ServerConfig {
        data_dir: dir.path().join("data"),
        listen: "127.0.0.1:0".parse().unwrap(),
        ..Default::default()
    })
    .await
    .unwrap();
    let url = format!("http://{}", server.local_addr);
    let mut channels = Vec::new();
    for _ in 0..CHANNELS {
        channels.push(Client::connect(url.clone()).await.unwrap());
    }
    let mut leases = Vec::new();
    for i in 0..LEASES {
        let granted = channels[i % CHANNELS]
            .acquire(pb::AcquireRequest {
                lock: format!("mixed/{i}"),
                ttl_ms: Some(TTL_MS),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        leases.push(granted);
    }
    let watches: Vec<_> = (0..WATCHES)
        .map(|i| {
            let client = channels[(i + 1) % CHANNELS].clone();
            tokio::spawn(watch_until_released(client, format!("mixed/{i}")))
        })
        .collect();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let keepalives: Vec<_> = leases
        .iter()
        .enumerate()
        .map(|(i, lease)| {
            let client = channels[i % CHANNELS].clone();
            tokio::spawn(keep_alive(client, lease.lease_id.clone(), stopped.clone()))
        })
        .collect();
    // Meanwhile a plain HTTP client is served.
    tokio::time::sleep(RUN_FOR / 2).await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let shown = http
        .get(format!("{url}/v1/locks/mixed%2F0"))
        .send()
        .await
        .unwrap();
    assert!(shown.status().is_success());
    tokio::time::sleep(RUN_FOR / 2).await;
    // After twice the TTL, every lease is still held by the epoch it was granted.
    for (i, lease) in leases.iter().enumerate() {
        let described = channels[0].describe(pb::DescribeRequest {
            lock: format!("mixed/{i}"),
        });
        let info = tokio::time::timeout(Duration::from_secs(5), described)
            .await
            .expect("a describe among the streams is answered")
            .unwrap()
            .into_inner();
        assert!(info.held, "mixed/{i} is still held");
        assert_eq!(info.epoch, lease.epoch);
    }
    // Each keepalive stops and releases its lease at once.
    stop.send(true).unwrap();
    let mut longest = Duration::ZERO;
    let mut refused = 0;
    for keepalive in keepalives {
        let (gap, failed) = keepalive.await.unwrap();
        longest = longest.max(gap);
        refused += failed;
    }
    assert_eq!(refused, 0, "renews refused");
    assert!(
        longest < Duration::from_millis(TTL_MS),
        "a keepalive waited {longest:?} for an answer"
    );
    for watch in watches {
        let kinds = tokio::time::timeout(Duration::from_secs(10), watch)
            .await
            .expect("every watch saw its release")
            .unwrap();
        assert_eq!(kinds.first().map(String::as_str), Some("current"));
        assert_eq!(kinds.last().map(String::as_str), Some("released"));
    }
}
