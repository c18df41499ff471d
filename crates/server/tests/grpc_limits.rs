//! gRPC requests are bounded like HTTP bodies (issue 26, item 12): a message over 64 KiB is
//! refused before it is decoded, and the server keeps serving.

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
