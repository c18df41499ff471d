//! Cluster members authenticate each other (P1, P4, P8): three real processes with peer
//! certificates form a cluster over mutual TLS, and the attacks of the review are refused — a
//! forged Raft message from a client connection, a certificate from another CA, a certificate
//! of a node that is not a member, a certificate used to speak as another node, each as a
//! unary call and on the append stream. Before, the
//! forged AppendEntries from a client connection was decoded and applied: one carrying a
//! `LeaderStart` made every member publish the attacker's signing key.

use crate::common;

use std::process::{Command, Output};
use std::time::Duration;

use common::{free_port, PeerFiles, ServerProcess, BINARY};
use palisade_proto::v1 as pb;
use pb::raft_client::RaftClient;
use serde_json::Value;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::Code;

struct Cluster {
    _dir: tempfile::TempDir,
    peers: PeerFiles,
    ports: Vec<u16>,
    endpoints: String,
    _members: Vec<ServerProcess>,
}

impl Cluster {
    fn start() -> Self {
        Self::start_with(tempfile::tempdir().unwrap(), |_| Vec::new())
    }

    /// Three members with peer credentials and the `serve` arguments `extra` makes from the
    /// test directory.
    fn start_with(dir: tempfile::TempDir, extra: impl Fn(&std::path::Path) -> Vec<String>) -> Self {
        let peers = PeerFiles::generate(&dir.path().join("pki"), &[1, 2, 3, 9]);
        let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let list = (1..=3)
            .map(|id| format!("{id}=127.0.0.1:{}", ports[id - 1]))
            .collect::<Vec<_>>()
            .join(",");
        let members = (1..=3u64)
            .map(|id| {
                let mut args = vec![
                    "serve".to_owned(),
                    "--node-id".into(),
                    id.to_string(),
                    "--cluster".into(),
                    list.clone(),
                ];
                args.extend(peers.args(id));
                args.extend(extra(dir.path()));
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                ServerProcess::start_with(&args, &dir.path().join(format!("n{id}")))
            })
            .collect();
        let endpoints = ports
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        Self {
            _dir: dir,
            peers,
            ports,
            endpoints,
            _members: members,
        }
    }

    fn cli(&self, args: &[&str]) -> Output {
        Command::new(BINARY)
            .args(args)
            .args(["--endpoint", &self.endpoints])
            .env("RUST_LOG", "warn")
            .output()
            .unwrap()
    }

    /// A Raft client to member 1 over clear text (what any client of the port can open).
    async fn clear_text(&self) -> RaftClient<Channel> {
        let channel = Endpoint::from_shared(format!("http://127.0.0.1:{}", self.ports[0]))
            .unwrap()
            .connect()
            .await
            .unwrap();
        RaftClient::new(channel)
    }

    /// A Raft client to member 1 over TLS, presenting `node`'s certificate from `pki`.
    async fn tls(&self, pki: &std::path::Path, node: u64) -> Result<RaftClient<Channel>, String> {
        self.tls_as(pki, &format!("node-{node}")).await
    }

    /// A Raft client to member 1 over TLS (asking for `node-1.palisade`), presenting `pki`'s
    /// `NAME.pem` and `NAME.key`.
    async fn tls_as(
        &self,
        pki: &std::path::Path,
        name: &str,
    ) -> Result<RaftClient<Channel>, String> {
        let read = |name: &str| std::fs::read(pki.join(name)).unwrap();
        let ca = std::fs::read(self.peers.dir.join("ca.pem")).unwrap();
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca))
            .identity(Identity::from_pem(
                read(&format!("{name}.pem")),
                read(&format!("{name}.key")),
            ))
            .domain_name("node-1.palisade");
        let channel = Endpoint::from_shared(format!("https://127.0.0.1:{}", self.ports[0]))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .map_err(|e| format!("{e:?}"))?;
        Ok(RaftClient::new(channel))
    }
}

/// An AppendEntries claiming to come from node `from` (the payload need not even decode: the
/// sender is refused before it is read).
fn forged_append(from: u64) -> tonic::Request<pb::RaftPayload> {
    let mut request = tonic::Request::new(pb::RaftPayload {
        json: br#"{"vote":{"leader_id":{"term":999,"node_id":2},"committed":true},"prev_log_id":null,"entries":[],"leader_commit":null}"#.to_vec(),
    });
    let metadata = request.metadata_mut();
    metadata.insert("palisade-raft-from", from.to_string().parse().unwrap());
    metadata.insert("palisade-raft-store", "00".parse().unwrap());
    request.set_timeout(Duration::from_secs(5));
    request
}

/// The same AppendEntries (its payload `json`) sent on the append stream: the member's refusal
/// of the stream, or its answer to the stream's first message.
async fn forged_on_stream(
    client: &mut RaftClient<Channel>,
    from: u64,
    json: &[u8],
) -> tonic::Status {
    let (metadata, _, mut message) = forged_append(from).into_parts();
    message.json = json.to_vec();
    let mut request = tonic::Request::new(tokio_stream::iter([message]));
    *request.metadata_mut() = metadata;
    request.set_timeout(Duration::from_secs(5));
    match client.append_stream(request).await {
        Err(status) => status,
        Ok(answers) => match answers.into_inner().message().await {
            Err(status) => status,
            Ok(answer) => panic!("a forged append on the stream was answered: {answer:?}"),
        },
    }
}

fn refused_without_a_word(status: &tonic::Status) {
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    let said = format!("{status:?}");
    for secret in ["store", "term", "member 1", "leader"] {
        assert!(!said.to_lowercase().contains(secret), "{said}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p1_p4_p8_members_speak_over_mutual_tls_and_refuse_everyone_else() {
    let cluster = Cluster::start();
    // The members found the cluster over mutual TLS; clients use the port in clear as before.
    let mut granted = None;
    for _ in 0..100 {
        let out = cluster.cli(&["lock", "acquire", "peers/1", "--json"]);
        if out.status.success() {
            granted = Some(serde_json::from_slice::<Value>(&out.stdout).unwrap());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let granted = granted.expect("the TLS cluster elects a leader and grants");
    assert!(palisade_core::json::read(&granted["epoch"]).unwrap() >= 1);

    // 1. A forged AppendEntries from a client connection: refused before decoding, and the
    //    answer names no store, term or member.
    let status = cluster
        .clear_text()
        .await
        .append_entries(forged_append(2))
        .await
        .unwrap_err();
    refused_without_a_word(&status);
    let forged = forged_append(2).into_inner().json;
    refused_without_a_word(&forged_on_stream(&mut cluster.clear_text().await, 2, &forged).await);
    let status = cluster
        .clear_text()
        .await
        .identify(pb::RaftPayload { json: Vec::new() })
        .await
        .unwrap_err();
    refused_without_a_word(&status);

    // 2. A certificate from another CA, naming a member: the handshake fails.
    let dir = tempfile::tempdir().unwrap();
    let foreign = PeerFiles::generate(dir.path(), &[2]);
    let refused = match cluster.tls(&foreign.dir, 2).await {
        Err(_) => true,
        Ok(mut client) => client.append_entries(forged_append(2)).await.is_err(),
    };
    assert!(refused, "a certificate of another CA was accepted");

    // 3. A certificate of the cluster's CA for node 9, which is not a member.
    let mut outsider = cluster.tls(&cluster.peers.dir, 9).await.unwrap();
    refused_without_a_word(&outsider.append_entries(forged_append(9)).await.unwrap_err());
    refused_without_a_word(&forged_on_stream(&mut outsider, 9, &forged).await);
    // 4. Node 3's certificate speaking as node 2.
    let mut impostor = cluster.tls(&cluster.peers.dir, 3).await.unwrap();
    refused_without_a_word(&impostor.append_entries(forged_append(2)).await.unwrap_err());
    refused_without_a_word(&forged_on_stream(&mut impostor, 2, &forged).await);
    // 5. Node 2's own certificate is admitted: its message is read (this one does not decode,
    //    so it changes nothing).
    let mut member = cluster.tls(&cluster.peers.dir, 2).await.unwrap();
    let mut undecodable = forged_append(2);
    undecodable.get_mut().json = b"{}".to_vec();
    let status = member.append_entries(undecodable).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let status = forged_on_stream(&mut member, 2, b"{}").await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");

    // The cluster still serves, and publishes only its members' keys.
    let out = cluster.cli(&["lock", "acquire", "peers/2", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let second: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        palisade_core::json::read(&second["epoch"]) > palisade_core::json::read(&granted["epoch"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p4_on_one_port_a_client_certificate_is_never_a_member_nor_a_member_certificate_a_client() {
    // Members with peer credentials and client TLS on the same port; clients authenticate by
    // certificate only (no auth file). `impostor` holds a client certificate that also names
    // node-2.palisade, and even the admin right.
    let dir = tempfile::tempdir().unwrap();
    let clients = dir.path().join("clients");
    palisade_drill::certs::client_credentials(&clients, &["orders"]).unwrap();
    palisade_drill::certs::client_certificate(&clients, "impostor", &["node-2.palisade"]).unwrap();
    std::fs::write(
        dir.path().join("acl"),
        "orders acquire orders/\nimpostor admin *\n",
    )
    .unwrap();
    let cluster = Cluster::start_with(dir, |root| {
        let file = |name: &str| root.join(name).to_string_lossy().into_owned();
        [
            "--tls-cert",
            &file("clients/server.pem"),
            "--tls-key",
            &file("clients/server.key"),
            "--client-ca",
            &file("clients/client-ca.pem"),
            "--acl-file",
            &file("acl"),
        ]
        .map(str::to_owned)
        .to_vec()
    });
    let https = cluster.endpoints.replace("http://", "https://");
    let file = |name: &str| clients.join(name).to_string_lossy().into_owned();
    let client = |cert: &str, key: &str, args: &[&str]| {
        Command::new(BINARY)
            .args(args)
            .args(["--endpoint", &https, "--ca", &file("server-ca.pem")])
            .args(["--cert", cert, "--key", key])
            .env("RUST_LOG", "warn")
            .env_remove("PALISADE_TOKEN")
            .output()
            .unwrap()
    };
    // The members elect a leader over mutual TLS on the port that shows clients another
    // certificate; a client certificate acquires through whichever member is asked (followers
    // name the leader by its https URL).
    let (orders_cert, orders_key) = (file("client-orders.pem"), file("client-orders.key"));
    let mut granted = None;
    for _ in 0..100 {
        let out = client(
            &orders_cert,
            &orders_key,
            &["lock", "acquire", "orders/1", "--json"],
        );
        if out.status.success() {
            granted = Some(serde_json::from_slice::<Value>(&out.stdout).unwrap());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(granted.expect("a leader grants")["principal"], "orders");

    // The client certificate naming node-2.palisade cannot speak as node 2: the client CA
    // does not make members.
    let mut impostor = cluster.tls_as(&clients, "client-impostor").await.unwrap();
    refused_without_a_word(&impostor.append_entries(forged_append(2)).await.unwrap_err());

    // A member's certificate names no client principal: unauthenticated (exit 6).
    let peer = |name: &str| cluster.peers.dir.join(name).to_string_lossy().into_owned();
    let out = client(
        &peer("node-2.pem"),
        &peer("node-2.key"),
        &["lock", "acquire", "orders/2"],
    );
    assert_eq!(
        out.status.code(),
        Some(6),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn cluster_mode_without_peer_credentials_or_with_a_wrong_certificate_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let list = format!(
        "1=127.0.0.1:{},2=127.0.0.1:{},3=127.0.0.1:{}",
        free_port(),
        free_port(),
        free_port()
    );
    let serve = |extra: &[String]| {
        Command::new(BINARY)
            .args(["serve", "--node-id", "1", "--cluster", &list, "--data-dir"])
            .arg(dir.path().join("data"))
            .args(extra)
            .env("RUST_LOG", "error")
            .output()
            .unwrap()
    };
    let out = serve(&[]);
    assert!(!out.status.success());
    let message = String::from_utf8_lossy(&out.stderr);
    assert!(
        message.contains("--peer-cert") && message.contains("--insecure-peers"),
        "{message}"
    );
    // Node 2's certificate given to node 1.
    let peers = PeerFiles::generate(&dir.path().join("pki"), &[2]);
    let out = serve(&peers.args(2));
    assert!(!out.status.success());
    let message = String::from_utf8_lossy(&out.stderr);
    assert!(message.contains("does not name node 1"), "{message}");
}

/// P4, P8: a Raft request over a connection without a member's certificate is refused from its
/// headers, before its body is read: a message announced as 60 MiB (Raft takes up to 64 MiB),
/// of which nothing comes, is answered `UNAUTHENTICATED` at once. Before, the server waited
/// for the whole message and decoded it, then looked at the certificate: anyone who reached a
/// member's port made it buffer 64 MiB per stream.
#[tokio::test]
async fn p4_p8_a_raft_request_without_a_members_certificate_is_refused_before_its_body() {
    let cluster = Cluster::start();
    let port = cluster.ports[0];
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let request = http::Request::post(format!(
        "http://127.0.0.1:{port}/palisade.v1.Raft/AppendEntries"
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .header("palisade-raft-from", "2")
    .body(())
    .unwrap();
    let (response, mut send) = client.send_request(request, false).unwrap();
    // The 5-byte prefix of an uncompressed 60 MiB message, and not one byte of it.
    send.send_data(bytes::Bytes::from_static(&[0, 0x03, 0xc0, 0, 0]), false)
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(3), response)
        .await
        .expect("answered from the headers alone")
        .unwrap();
    assert_eq!(
        response.headers().get("grpc-status").map(|v| v.as_bytes()),
        Some(&b"16"[..]),
        "{response:?}"
    );
    drop(send);
}
