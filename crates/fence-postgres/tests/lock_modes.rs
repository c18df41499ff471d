//! Adapters in different modes sharing PostgreSQL's tables (P2): each lock is fenced in one
//! mode, recorded by the first adapter that fences it.

mod common;

use std::sync::Arc;

use palisade_core::{Epoch, HolderId, LockName, TokenSigner, TokenVerifier};
use palisade_fence::{Activation, FenceError, FenceMode, FencedResource, Verifier, Write};
use palisade_fence_postgres::PostgresFence;

async fn adapter(mode: FenceMode, signer: &TokenSigner) -> PostgresFence {
    let verifier = Arc::new(Verifier::new(TokenVerifier::new([signer.verifying_key()])));
    PostgresFence::connect(&common::postgres_url(), 2, mode, verifier)
        .await
        .expect("connect to the test PostgreSQL")
        .with_floors(std::sync::Arc::new(palisade_fence::StaticFloors::new()))
}

/// A write of the key `fresh`.
fn fresh<'a>(lock: &'a LockName, token: &'a str, value: &'a [u8]) -> Write<'a> {
    Write {
        lock,
        key: "fresh",
        value,
        token,
        seq: None,
    }
}

#[tokio::test]
async fn p2_a_lock_activated_by_one_adapter_is_refused_by_a_strict_adapter() {
    // Before, the strict adapter accepted epoch 7 on a fresh key of a lock whose activated
    // fence was 9: the modes' fences mean different things, and nothing recorded which one a
    // lock used.
    let signer = TokenSigner::from_secret_bytes(&[5; 32]);
    let lock = LockName::new(format!("modes/{}", std::process::id())).unwrap();
    let token = |epoch| {
        signer.sign(
            &lock,
            Epoch(epoch),
            &HolderId::new("h").unwrap(),
            &palisade_core::Principal::anonymous(),
            0,
        )
    };
    let activated = adapter(FenceMode::Activated, &signer).await;
    let strict = adapter(FenceMode::Strict, &signer).await;
    let activation = activated.activate(&lock, &token(9)).await.unwrap();
    assert!(
        matches!(activation, Activation::Activated { .. }),
        "{activation:?}"
    );
    match strict.write(fresh(&lock, &token(7), b"old owner")).await {
        Err(FenceError::Integrity(why)) => {
            assert!(why.contains("activated mode"), "{why}")
        }
        other => panic!("a strict adapter wrote a lock fenced in activated mode: {other:?}"),
    }
    assert!(strict.read(&lock, "fresh").await.unwrap().is_none());
    // The activated adapter keeps working on its lock.
    assert!(activated
        .write(fresh(&lock, &token(9), b"owner"))
        .await
        .is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adapters_claiming_a_new_lock_at_once_all_see_its_mode() {
    // Many first writes of one lock at once: each claim either records the mode or waits for
    // the one that did, and then reads it (a claim's own snapshot predates that commit).
    let signer = TokenSigner::from_secret_bytes(&[6; 32]);
    let mut adapters = Vec::new();
    for _ in 0..8 {
        adapters.push(adapter(FenceMode::Strict, &signer).await);
    }
    for round in 0..10 {
        let lock = LockName::new(format!("modes/race/{}/{round}", std::process::id())).unwrap();
        let start = Arc::new(tokio::sync::Barrier::new(adapters.len()));
        let mut tasks = Vec::new();
        for (epoch, fence) in (1u64..).zip(&adapters) {
            let token = signer.sign(
                &lock,
                Epoch(epoch),
                &HolderId::new("h").unwrap(),
                &palisade_core::Principal::anonymous(),
                0,
            );
            let (fence, lock, start) = (fence.clone(), lock.clone(), start.clone());
            tasks.push(tokio::spawn(async move {
                // Each adapter holds a connection already, so the claims meet in the database.
                start.wait().await;
                fence.write(fresh(&lock, &token, b"v")).await
            }));
        }
        for task in tasks {
            let outcome = task.await.unwrap();
            assert!(outcome.is_ok(), "round {round}: {outcome:?}");
        }
    }
}
