//! A held lease's keepalive follows the leader: the leader of a 3-member cluster stops, a new
//! one is elected, and the lease stays held past several TTLs (P8: the acknowledged lease is
//! not lost; every lease restarts at its full TTL under the new leader).

use std::collections::BTreeMap;
use std::time::Duration;

use palisade_client::{AcquireOptions, Client};
use palisade_cluster::{format_members, ClusterConfig};
use palisade_server::ServerConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_survives_a_leader_change() {
    let dir = tempfile::tempdir().unwrap();
    let mut addrs = BTreeMap::new();
    for id in 1..=3u64 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        addrs.insert(id, format!("127.0.0.1:{port}"));
    }
    let list = format_members(&addrs);
    let mut servers = BTreeMap::new();
    for (id, addr) in &addrs {
        let config = ServerConfig {
            data_dir: dir.path().join(format!("n{id}")),
            listen: addr.parse().unwrap(),
            cluster: Some(ClusterConfig::parse(*id, &list, false).unwrap()),
            insecure_peers: true,
            ..Default::default()
        };
        servers.insert(
            format!("http://{addr}"),
            palisade_server::start(config).await.unwrap(),
        );
    }
    let urls: Vec<String> = servers.keys().cloned().collect();
    let client = Client::connect(&urls).await.unwrap();
    let mut options = AcquireOptions::new("keepalive/failover");
    options.ttl = Duration::from_millis(3_000);
    let mut lease = client.acquire(options).await.unwrap();
    let epoch = lease.epoch();

    // The client's target is the leader now (it answered the acquire): stop it.
    let leader_url = client.current_endpoint();
    servers
        .remove(&leader_url)
        .unwrap()
        .shutdown()
        .await
        .unwrap();

    // Several TTLs later the lease is still held: the keepalive found the new leader.
    tokio::select! {
        reason = lease.lost() => panic!("lease lost across the leader change: {reason}"),
        () = tokio::time::sleep(Duration::from_millis(9_000)) => {}
    }
    assert!(lease.is_valid());
    let info = client.describe("keepalive/failover").await.unwrap();
    assert!(info.held);
    assert_eq!(info.epoch, epoch);
    assert_ne!(client.current_endpoint(), leader_url);
    lease.release().await.unwrap();
    for (_, server) in servers {
        server.shutdown().await.unwrap();
    }
}
