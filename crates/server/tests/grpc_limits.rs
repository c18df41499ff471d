//! gRPC requests are bounded like HTTP bodies (issue 26, item 12): a message over 64 KiB is
//! refused before it is decoded, and the server keeps serving; a request with a body and no
//! valid credentials is refused from its headers, before its body is read.

use palisade_proto::v1 as pb;
use palisade_server::ServerConfig;

#[tokio::test]
async fn p8_a_grpc_message_over_the_body_limit_is_refused_and_the_server_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let config = ServerConfig {
        data_dir: dir.path().join("data"),
        listen: "127.0.0.1:0".parse().unwrap(),
        cluster: None,
        ..Default::default()
    };
    let server = palisade_server::start(config).await.unwrap();
    let mut client =
        pb::coordinator_client::CoordinatorClient::connect(format!("http://{}", server.local_addr))
            .await
            .unwrap();
    let huge = pb::AcquireRequest {
        lock: "x".repeat(palisade_server::http::MAX_BODY_BYTES + 1),
        ..Default::default()
    };
    let status = client.acquire(huge).await.unwrap_err();
    assert!(
        matches!(
            status.code(),
            tonic::Code::OutOfRange | tonic::Code::ResourceExhausted
        ),
        "{status:?}"
    );
    assert!(status.message().contains("too large"), "{status:?}");
    let fine = pb::AcquireRequest {
        lock: "a".into(),
        ..Default::default()
    };
    let granted = client.acquire(fine).await.unwrap().into_inner();
    assert!(granted.epoch > 0);
}

/// A coordinator that needs credentials (one principal, `writer`, may acquire anything).
async fn start_with_auth(dir: &std::path::Path) -> palisade_server::RunningServer {
    let (auth_file, acl_file) = (dir.join("auth"), dir.join("acl"));
    let line = format!("writer {}\n", palisade_server::auth::hash_secret(SECRET));
    std::fs::write(&auth_file, line).unwrap();
    std::fs::write(&acl_file, "writer acquire *\n").unwrap();
    let auth = palisade_server::auth::Auth::from_files(&auth_file, &acl_file).unwrap();
    palisade_server::start(ServerConfig {
        data_dir: dir.join("data"),
        listen: "127.0.0.1:0".parse().unwrap(),
        auth: std::sync::Arc::new(auth),
        ..Default::default()
    })
    .await
    .unwrap()
}

const SECRET: &str = "limits-writer-secret-0123456789abcdefghij";

#[tokio::test]
async fn p8_a_body_without_credentials_is_refused_before_it_is_read() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let dir = tempfile::tempdir().unwrap();
    let server = start_with_auth(dir.path()).await;
    // HTTP: headers announcing 60,000 bytes, and not one of them sent. Before, the server
    // waited for the body (and buffered it) and answered 401 only after reading it, or 408
    // after 10 s; now the headers alone get the 401.
    let mut socket = tokio::net::TcpStream::connect(server.local_addr)
        .await
        .unwrap();
    socket
        .write_all(
            b"POST /v1/locks/a/acquire HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n\
              Content-Length: 60000\r\n\r\n",
        )
        .await
        .unwrap();
    let mut answer = vec![0u8; 1024];
    let n = tokio::time::timeout(std::time::Duration::from_secs(3), socket.read(&mut answer))
        .await
        .expect("answered from the headers alone")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(answer.contains("unauthenticated"), "{answer}");
    // gRPC: a message started and never finished, without credentials: UNAUTHENTICATED at once.
    let tcp = tokio::net::TcpStream::connect(server.local_addr)
        .await
        .unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let request = http::Request::post(format!(
        "http://{}/palisade.v1.Coordinator/Acquire",
        server.local_addr
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(())
    .unwrap();
    let (response, mut send) = client.send_request(request, false).unwrap();
    send.send_data(bytes::Bytes::from_static(&[0, 0, 0, 0xf0, 0]), false)
        .unwrap();
    let response = tokio::time::timeout(std::time::Duration::from_secs(3), response)
        .await
        .expect("answered from the headers alone")
        .unwrap();
    assert_eq!(
        response.headers().get("grpc-status").map(|v| v.as_bytes()),
        Some(&b"16"[..]),
        "{response:?}"
    );
    // With credentials, the same routes serve.
    let mut client =
        pb::coordinator_client::CoordinatorClient::connect(format!("http://{}", server.local_addr))
            .await
            .unwrap();
    let mut request = tonic::Request::new(pb::AcquireRequest {
        lock: "a".into(),
        ..Default::default()
    });
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {SECRET}").parse().unwrap());
    assert!(client.acquire(request).await.unwrap().into_inner().epoch > 0);
    let unauthenticated = client
        .acquire(pb::AcquireRequest {
            lock: "b".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(unauthenticated.code(), tonic::Code::Unauthenticated);
    drop(send);
}
