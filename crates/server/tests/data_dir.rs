//! Durable creation of the data directory (P1/P8): a directory whose store was lost (deleted,
//! or its directory entry lost to a power cut) must not start over at epoch 1.

use palisade_server::{ServerConfig, ServerError};

fn config(dir: &std::path::Path) -> ServerConfig {
    ServerConfig {
        data_dir: dir.to_path_buf(),
        listen: "127.0.0.1:0".parse().unwrap(),
        cluster: None,
        ..Default::default()
    }
}

/// Starts a coordinator over `data` and stops it cleanly.
async fn start_and_stop(data: &std::path::Path) {
    palisade_server::start(config(data))
        .await
        .unwrap()
        .shutdown()
        .await
        .unwrap();
}

#[tokio::test]
async fn p1_a_signing_key_without_its_store_refuses_to_start_and_names_the_way_back() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    start_and_stop(&data).await;
    std::fs::remove_file(data.join(palisade_coordinator::STORE_FILE)).unwrap();
    let error = match palisade_server::start(config(&data)).await {
        Ok(_) => panic!("started over a lost store: epochs would restart at 1"),
        Err(error) => error,
    };
    assert!(matches!(error, ServerError::LostStore { .. }), "{error}");
    let message = error.to_string();
    assert!(message.contains("palisade restore"), "{message}");
    assert!(
        !data.join(palisade_coordinator::STORE_FILE).exists(),
        "nothing is created"
    );
}

#[tokio::test]
async fn a_first_start_creates_the_store_and_the_key_and_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    for _ in 0..2 {
        start_and_stop(&data).await;
    }
    assert!(data.join(palisade_coordinator::STORE_FILE).exists());
    assert!(data
        .join(palisade_coordinator::keys::SIGNING_KEY_FILE)
        .exists());
}
